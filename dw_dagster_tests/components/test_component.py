"""DataOpsComponent on a project of its own (not the repository's examples).

A fresh ``dg`` project in a temporary folder holds its own DuckDB table pair (``src.sales`` in a
"source" file, its copy ``wh.sales`` in a "warehouse" file), its own asset that loads the copy by
high-watermark through the public helpers (``load_partition`` and ``load_metadata``), and one
``defs.yaml`` of the component. The tests drive ``dg`` on it, and the whole loop in process: a late
batch of rows behind the watermark makes the reconciliation check fail, the incident sensor opens
an incident and diagnoses it, the change set proposes a lookback and a one-day window, the owner
approves after logging in at the (fake) identity provider, the diff is merged, the remediation
sensor runs the stages and the receipt verifies.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import duckdb
import httpx
import pytest

from dw_dagster_dev.fakes.oidc_server import start_oidc_server

OWNER = "ana.silva@shop.example"
BIN = Path(sys.executable).parent
DAY1, DAY2 = dt.datetime(2026, 11, 1), dt.datetime(2026, 11, 2)

ASSETS_PY = '''\
import dagster as dg
from dw_dagster import DatabaseResource, LoadResult, load_metadata, load_partition
from dw_dagster.pipelines.incremental import IncrementalLoadSpec

REPO = __import__("pathlib").Path(__file__).resolve().parents[4]
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-04")

src_sales = dg.AssetSpec(["src", "sales"], description="sales in the shop's database")


@dg.asset(key=["sales"], deps=[src_sales], partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run(),
          owners=["ana.silva@shop.example"])
def sales(context: dg.AssetExecutionContext, source: DatabaseResource, warehouse: DatabaseResource):
    spec = IncrementalLoadSpec.from_file(REPO / "pipelines" / "sales.yaml")
    results = []
    for pk in context.partition_keys:
        tw = DAILY.time_window_for_partition_key(pk)
        results.append(load_partition(source.get_database(), warehouse.get_database(), spec, pk,
                                      tw.start.replace(tzinfo=None), tw.end.replace(tzinfo=None)))
    return dg.MaterializeResult(metadata=load_metadata(results))
'''

PIPELINE = """\
source_table: src.sales
target_table: wh.sales
merge_key: id
partition_column: sale_ts
watermark_column: sale_ts
lookback_hours: 0
arrival_column: posted_ts
columns: [id, region, sale_ts, posted_ts, amount]
"""


def defs_yaml(issuer: str) -> str:
    return textwrap.dedent(f"""\
        type: dw_dagster.DataOpsComponent
        attributes:
          domains:
            domains:
              - name: sales
                assets: [[sales]]
                approvers: [{OWNER}]
            identity:
              oidc: {{issuer: "{issuer}", audience: dw-dagster}}
          databases:
            source: {{url: "duckdb:///{{{{ env.SALES_SOURCE }}}}"}}
            warehouse: {{url: "duckdb:///{{{{ env.SALES_WAREHOUSE }}}}"}}
          assets:
            - key: sales
              table: wh.sales
              database: warehouse
              checks:
                reconciliation:
                  source: {{database: source, table: src.sales, asset: src/sales}}
                  slice_by: [region]
                  measures: [amount]
              pipeline:
                incremental_load: {{source_database: source, repo: ../../../.., file: pipelines/sales.yaml}}
        """)


def inline_domains(issuer: str):
    """The domains written inline in the component's defs.yaml (what its approval job holds)."""
    import yaml

    from dw_dagster.core.domains import Domains

    return Domains.model_validate(yaml.safe_load(defs_yaml(issuer))["attributes"]["domains"])


def _rows(day: dt.datetime, first_id: int, n: int, region: str, posted_delay=dt.timedelta(minutes=5)):
    return [(first_id + i, region, day + dt.timedelta(minutes=30 * i), day + dt.timedelta(minutes=30 * i) + posted_delay,
             10 + i) for i in range(n)]


def _insert(path: Path, rows) -> None:
    con = duckdb.connect(str(path))
    con.execute("CREATE SCHEMA IF NOT EXISTS src")
    con.execute("CREATE TABLE IF NOT EXISTS src.sales (id BIGINT, region VARCHAR, sale_ts TIMESTAMP, posted_ts TIMESTAMP, "
                "amount DECIMAL(18,2))")
    con.executemany("INSERT INTO src.sales VALUES (?, ?, ?, ?, ?)", rows)
    con.close()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A dg project: pyproject, package, the asset, the pipeline file in a git repository."""
    root = tmp_path / "shop"
    pkg = root / "src" / "shop_data"
    (pkg / "defs" / "sales").mkdir(parents=True)
    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "shop-data"
        version = "0.0.1"
        [tool.dg]
        directory_type = "project"
        [tool.dg.project]
        root_module = "shop_data"
        """))
    (pkg / "__init__.py").write_text("")
    (pkg / "definitions.py").write_text(textwrap.dedent("""\
        from pathlib import Path
        import dagster as dg

        @dg.definitions
        def defs():
            return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
        """))
    (pkg / "defs" / "__init__.py").write_text("")
    (pkg / "defs" / "sales" / "assets.py").write_text(ASSETS_PY)
    (root / "pipelines").mkdir()
    (root / "pipelines" / "sales.yaml").write_text(PIPELINE)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    monkeypatch.setenv("SALES_SOURCE", str(tmp_path / "source.duckdb"))
    monkeypatch.setenv("SALES_WAREHOUSE", str(tmp_path / "warehouse.duckdb"))
    monkeypatch.syspath_prepend(str(root / "src"))
    yield root
    for m in [m for m in sys.modules if m.startswith("shop_data")]:
        del sys.modules[m]


@pytest.fixture(scope="module")
def idp():
    server = start_oidc_server(users={OWNER: {"sub": "sub-ana", "email_verified": True}},
                               clients={"dw-dagster": {"redirect_uris": ["http://127.0.0.1/callback"]}}, default_user=OWNER)
    yield server
    server.stop()


def _load_defs(root: Path) -> dg.Definitions:
    from dagster.components import load_from_defs_folder

    return load_from_defs_folder(path_within_project=root / "src" / "shop_data")


def test_the_loop_on_a_fresh_project_ends_in_a_verified_receipt(project, idp, tmp_path):
    from dw_dagster import records, verify_receipts
    from dw_dagster.approval.job import approve_in_process
    from dw_dagster.approval.identity import decision_nonce
    from dw_dagster.approval.identity.oidc import login
    from dw_dagster.core.identity import OidcSettings
    from dw_dagster.testing.local_daemon import LocalSensorDaemon

    (project / "src" / "shop_data" / "defs" / "dataops").mkdir()
    (project / "src" / "shop_data" / "defs" / "dataops" / "defs.yaml").write_text(defs_yaml(idp.url))
    src = Path(os.environ["SALES_SOURCE"])
    _insert(src, _rows(DAY1, 1, 40, "east") + _rows(DAY2, 100, 40, "east"))
    defs = _load_defs(project)
    (tmp_path / "dagster_home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        job = defs.resolve_implicit_global_asset_job_def()
        for day in ("2026-11-01", "2026-11-02"):
            assert job.execute_in_process(instance=instance, partition_key=day, asset_selection=[dg.AssetKey("sales")]).success
        # six rows of 2 November arrive late, behind the high-watermark the load already passed
        _insert(src, _rows(DAY2 + dt.timedelta(hours=3), 500, 6, "west", posted_delay=dt.timedelta(hours=30)))
        _insert(src, _rows(DAY2 + dt.timedelta(days=1), 200, 40, "east"))
        # the next day's load reads only above the high-watermark: the late rows of 2 November stay behind
        assert job.execute_in_process(instance=instance, partition_key="2026-11-03", asset_selection=[dg.AssetKey("sales")]).success
        checks = defs.resolve_job_def("dw_verify")
        run = checks.execute_in_process(instance=instance, raise_on_error=False)
        evals = [e.event_specific_data for e in run.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
        assert [e.passed for e in evals if e.check_name == "reconciliation"] == [False]

        daemon = LocalSensorDaemon(defs, instance)
        tick = daemon.tick("dw_check_incident_sensor")
        assert len(tick.run_ids) == 1 and not tick.failed_run_ids, tick.skip_reason
        (cs,) = records.change_sets(instance)
        assert cs.window == ["2026-11-02"], cs.window
        assert "lookback_hours" in cs.diff
        assert cs.approvers == [OWNER]

        nonce = decision_nonce(cs.id, cs.version, "approve")
        settings = OidcSettings(issuer=idp.url, audience="dw-dagster")
        token = login(settings, nonce=nonce, login_hint=OWNER, open_url=lambda url: httpx.get(url, follow_redirects=True, timeout=30))
        ok, msg = approve_in_process(instance, cs.id, id_token=token, domains=inline_domains(idp.url))
        assert ok, msg
        assert not daemon.tick("dw_remediation_sensor").run_ids  # the diff is not merged yet
        from dw_dagster.proposals.watermark import apply_change_set

        apply_change_set(cs, project, OWNER)
        stages = []
        for _ in range(8):
            tick = daemon.tick("dw_remediation_sensor")
            assert not tick.failed_run_ids, tick.skip_reason
            if not tick.run_ids:
                break
            stages.append(instance.get_run_by_id(tick.run_ids[0]).tags["dw/stage"])
        assert stages[-1] == "receipt" and "verify" in stages, stages
        n, problems = verify_receipts(instance)
        assert n >= 1 and not problems, problems
        (receipt,) = records.receipts(instance, dg.AssetKey("sales"))
        assert receipt.verified and receipt.partitions == ["2026-11-02"]
        wh = duckdb.connect(os.environ["SALES_WAREHOUSE"], read_only=True)
        assert wh.execute("SELECT count(*) FROM wh.sales WHERE region = 'west'").fetchone()[0] == 6
        wh.close()


def _dg(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "NO_COLOR": "1"}
    return subprocess.run([str(BIN / "dg"), *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("dg", path=str(BIN)) is None, reason="dagster-dg-cli is not installed")
def test_dg_lists_scaffolds_checks_and_lists_defs(project, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(project / "src"), os.environ.get("PYTHONPATH")])))
    out = _dg(project, "list", "components", "--json")
    assert out.returncode == 0, out.stderr
    assert "dw_dagster.DataOpsComponent" in [i["key"] for i in json.loads(out.stdout)["items"]], out.stdout[:500]
    out = _dg(project, "scaffold", "defs", "dw_dagster.DataOpsComponent", "dataops")
    assert out.returncode == 0, out.stderr
    folder = project / "src" / "shop_data" / "defs" / "dataops"
    assert "type: dw_dagster.DataOpsComponent" in (folder / "defs.yaml").read_text()
    assert "approvers:" in (folder / "domains.yaml").read_text()
    (folder / "defs.yaml").write_text(defs_yaml("http://127.0.0.1:1"))
    out = _dg(project, "check", "yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    out = _dg(project, "list", "defs", "--json")
    assert out.returncode == 0, out.stderr
    listed = out.stdout
    for name in ("dw_remediation_sensor", "dw_check_incident_sensor", "dw_approve_change_set", "reconciliation"):
        assert name in listed, name
    # a mistake in the YAML names the file and the field
    (folder / "defs.yaml").write_text(defs_yaml("http://127.0.0.1:1").replace("slice_by: [region]", "slice_by: region\n          colour: red"))
    out = _dg(project, "check", "yaml")
    assert out.returncode != 0
    assert "defs.yaml" in out.stdout + out.stderr and "colour" in out.stdout + out.stderr
