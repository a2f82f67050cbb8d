"""Shared by the pipeline-shape tests: a fresh ``dg`` project in a temporary folder (a git working
copy), and the loop driven in process from a failing check to a verified receipt.

``test_component.py`` does the same for an asset loaded by ``load_partition``; these helpers let
each supported pipeline shape (an asset with its own loader, a dbt incremental model) be driven
the same way: the incident sensor diagnoses, the owner logs in at the (fake) identity provider
and approves, the diff is merged, the remediation sensor runs every stage, the receipt verifies.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import dagster as dg
import httpx

from dw_dagster_tests.components.test_component import OWNER


def write_project(root: Path, files: Mapping[str, str]) -> Path:
    """A ``dg`` project ``shop_data`` at ``root`` with ``files`` (paths relative to ``root``), committed in git."""
    pkg = root / "src" / "shop_data"
    (pkg / "defs").mkdir(parents=True)
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
    (pkg / "defs" / "__init__.py").write_text("")
    (pkg / "definitions.py").write_text(textwrap.dedent("""\
        from pathlib import Path
        import dagster as dg

        @dg.definitions
        def defs():
            return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
        """))
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    commit(root, "init", first=True)
    return root


def commit(root: Path, message: str, first: bool = False) -> None:
    for args in ((["init", "-q"],) if first else ()) + (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@x",
                                                                         "commit", "-qm", message]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def forget_project_modules() -> None:
    for m in [m for m in sys.modules if m.startswith("shop_data")]:
        del sys.modules[m]


def load_defs(root: Path) -> dg.Definitions:
    from dagster.components import load_from_defs_folder

    return load_from_defs_folder(path_within_project=root / "src" / "shop_data")


def check_results(defs: dg.Definitions, instance, name: str) -> list[bool]:
    """Run the ``dw_verify`` job and return the ``passed`` of each evaluation of check ``name``."""
    run = defs.resolve_job_def("dw_verify").execute_in_process(instance=instance, raise_on_error=False)
    evals = [e.event_specific_data for e in run.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    return [e.passed for e in evals if e.check_name == name]


def approve_merge_and_repair(defs: dg.Definitions, instance, idp, domains, project: Path, *, asset: dg.AssetKey,
                             before_merge=None) -> tuple[object, list[str]]:
    """From an incident sensor tick to the receipt: approve the one change set as the owner, check
    that nothing runs before the merge, merge its diff, tick the remediation sensor until it is done.

    Returns:
        (the change set, the stages the remediation sensor ran, in order).
    """
    from dw_dagster import records
    from dw_dagster.approval.job import approve_in_process
    from dw_dagster.approval.identity import decision_nonce
    from dw_dagster.approval.identity.oidc import login
    from dw_dagster.core.identity import OidcSettings
    from dw_dagster.proposals.watermark import apply_change_set
    from dw_dagster.testing.local_daemon import LocalSensorDaemon

    daemon = LocalSensorDaemon(defs, instance)
    tick = daemon.tick("dw_check_incident_sensor")
    assert len(tick.run_ids) == 1 and not tick.failed_run_ids, tick.skip_reason
    change_sets = records.change_sets(instance, [asset])
    assert len(change_sets) == 1, [d.causes for d in records.diagnoses(instance, [asset])]
    cs = change_sets[0]
    nonce = decision_nonce(cs.id, cs.version, "approve")
    settings = OidcSettings(issuer=idp.url, audience="dw-dagster")
    token = login(settings, nonce=nonce, login_hint=OWNER,
                  open_url=lambda url: httpx.get(url, follow_redirects=True, timeout=30))
    ok, msg = approve_in_process(instance, cs.id, id_token=token, domains=domains)
    assert ok, msg
    assert not daemon.tick("dw_remediation_sensor").run_ids  # the diff is not merged yet: nothing runs
    if before_merge is not None:
        before_merge(cs)
    apply_change_set(cs, project, OWNER)
    stages = []
    for _ in range(10):
        tick = daemon.tick("dw_remediation_sensor")
        assert not tick.failed_run_ids, tick.skip_reason
        if not tick.run_ids:
            break
        stages.append(instance.get_run_by_id(tick.run_ids[0]).tags["dw/stage"])
    return cs, stages
