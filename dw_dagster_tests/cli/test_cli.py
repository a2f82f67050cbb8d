"""The commands a user types, run as subprocesses."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DW_", "DAGSTER_HOME"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("cli_demo")
    proc = subprocess.run([str(BIN / "dw-dagster"), "demo", "store-sales", "--json", "--scale", "0.002", "--workdir", str(work)],
                          capture_output=True, text=True, env=_env(), cwd=work, timeout=900)
    return proc, work


def test_demo_json_reports_the_loop(demo_run):
    proc, work = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["cause"] == "late_rows_behind_watermark"
    assert out["window"] == ["2026-11-26", "2026-11-27"]
    assert out["approver"] == "dana.ortiz@grocer.example"
    ident = out["approval_identity"]  # how the approver was verified: the stand-in provider's login
    assert ident["method"] == "oidc" and ident["issuer"].startswith("http://127.0.0.1:") and ident["email"] == out["approver"]
    assert {r["approver"].split(" ")[0] for r in out["refused"]} == {"dw-dagster", "dana.ortiz@grocer.example",
                                                                     "sam.lee@grocer.example"}
    assert out["gap_before"]["Southwest"] > 1.7 and out["gap_before"]["West"] == 0.0
    assert set(out["gap_after"].values()) == {0.0}
    assert "store_sales_line" in out["receipt_assets"] and len(out["receipt_assets"]) == 4
    assert (out["incident_source"], out["page_annotated"], out["page_resolved"]) == ("lightup", True, True)
    assert "detect" in proc.stderr and "receipt" in proc.stderr  # the timeline goes to stderr with --json
    assert (work / "dagster_home" / "dagster.yaml").exists()


def test_receipts_and_change_sets_read_back_from_the_instance(demo_run):
    _, work = demo_run
    key = (work / "dagster_home" / "approval_signing.key").read_text().strip()
    env = _env(DAGSTER_HOME=str(work / "dagster_home"), DW_APPROVAL_SIGNING_KEY=key)
    rec = subprocess.run([str(BIN / "dw-dagster"), "receipts", "--asset", "store_sales_line", "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert rec.returncode == 0, rec.stderr[-2000:]
    (r,) = json.loads(rec.stdout)
    assert r["cause_kind"] == "late_rows_behind_watermark" and r["verified"] is True
    cs = subprocess.run([str(BIN / "dw-dagster"), "change-sets", "--json"], capture_output=True, text=True, env=env, timeout=120)
    (row,) = json.loads(cs.stdout)["change_sets"]
    assert row["state"] == "applied" and "approved by dana.ortiz@grocer.example (verified by OIDC issuer" in row["status"]
    other_key = subprocess.run([str(BIN / "dw-dagster"), "change-sets", "--json"], capture_output=True, text=True,
                               env={**env, "DW_APPROVAL_SIGNING_KEY": "some-other-deployment-key"}, timeout=120)
    assert "signature does NOT verify" in json.loads(other_key.stdout)["change_sets"][0]["status"]
    domains = ["--domains", str(work / "store_sales" / "domains.yaml")]
    wrong = subprocess.run([str(BIN / "dw-dagster"), "approve", row["id"], "--approver", "dana.ortiz@grocer.example", *domains],
                           capture_output=True, text=True, env={**env, "DW_APPROVAL_SIGNING_KEY": "x" * 32}, timeout=120)
    assert wrong.returncode == 2 and "not the key kept with this instance" in wrong.stderr, wrong.stderr[-500:]
    typed = subprocess.run([str(BIN / "dw-dagster"), "approve", row["id"], "--approver", "dana.ortiz@grocer.example", *domains],
                           capture_output=True, text=True, env=env, timeout=120)
    assert typed.returncode == 3 and typed.stderr.strip().splitlines()[-1].startswith("refused: ")
    assert "is applied; it takes no decision now" in typed.stderr and "Traceback" not in typed.stderr
    verify = subprocess.run([str(BIN / "dw-dagster"), "receipts", "verify"], capture_output=True, text=True, env=env, timeout=120)
    assert verify.returncode == 0 and "4 receipt(s) verified" in verify.stdout, verify.stderr[-2000:]


def test_change_sets_show_and_the_patch_the_owner_merges(demo_run):
    _, work = demo_run
    env = _env(DAGSTER_HOME=str(work / "dagster_home"))
    (row,) = json.loads(subprocess.run([str(BIN / "dw-dagster"), "change-sets", "--json"], capture_output=True, text=True,
                                       env=env, timeout=120).stdout)["change_sets"]
    shown = subprocess.run([str(BIN / "dw-dagster"), "change-sets", "show", row["id"], "--json"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    full = json.loads(shown.stdout)
    assert full["state"] == "applied" and full["change_set"]["window"] == ["2026-11-26", "2026-11-27"]
    assert [d["decision"] for d in full["decisions"] if d["counts"]] == ["approve"]
    assert {"window-1", "rebuild", "verify", "receipt"} <= {s["stage"] for s in full["stages"]}
    assert all(s["state"] == "succeeded" for s in full["stages"])
    patch = subprocess.run([str(BIN / "dw-dagster"), "change-sets", "show", row["id"], "--patch"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert patch.returncode == 0 and patch.stdout == full["change_set"]["diff"] and patch.stdout.startswith("diff --git")
    # the demo's owner merged exactly this diff: it reverses cleanly on the pipeline repository
    (repo,) = [p.parent for p in (work / "store_sales").rglob(".git")]
    assert subprocess.run(["git", "apply", "-R", "--check", "-p1", "-"], cwd=repo, input=patch.stdout, text=True,
                          capture_output=True).returncode == 0
    text = subprocess.run([str(BIN / "dw-dagster"), "change-sets", "show", row["id"]], capture_output=True, text=True,
                          env=env, timeout=120).stdout
    assert text.startswith("state: applied") and "decision: approve by dana.ortiz@grocer.example (oidc)" in text
    assert f"### Change set {row['id']}, proposed " in text and "waiting for approval" not in text
    unknown = subprocess.run([str(BIN / "dw-dagster"), "change-sets", "show", "cs-nope", "--patch"], capture_output=True,
                             text=True, env=env, timeout=120)
    assert unknown.returncode == 2 and "no change set 'cs-nope'" in unknown.stderr and unknown.stdout == ""


def test_demo_refuses_bad_input_before_touching_the_disk(tmp_path):
    mine = tmp_path / "store_sales" / "mine.txt"
    mine.parent.mkdir()
    mine.write_text("not the demo's")
    for scale in ("-1", "0.00001", "inf", "nan"):
        proc = subprocess.run([str(BIN / "dw-dagster"), "demo", "store-sales", "--scale", scale, "--workdir", str(tmp_path)],
                              capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=300)
        assert proc.returncode == 2 and "--scale" in proc.stderr
    proc = subprocess.run([str(BIN / "dw-dagster"), "demo", "store-sales", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "was not made by the demo" in proc.stderr
    assert mine.read_text() == "not the demo's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store_sales"]


def test_definitions_validate(tmp_path):
    proc = subprocess.run([str(BIN / "dagster"), "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
                          capture_output=True, text=True, env=_env(DW_STORE_SALES_HOME=str(tmp_path / "home"),
                                                                   DW_ORDERS_HOME=str(tmp_path / "orders")),
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "Validation successful for code location store_sales" in out and "Validation successful for code location orders" in out


def test_blast_radius_command(tmp_path):
    from dw_dagster_tests.lineage.test_blast_radius import C15

    m = tmp_path / "manifest.json"
    m.write_text(json.dumps(C15))
    proc = subprocess.run([str(BIN / "dw-dagster"), "blast-radius", "--manifest", str(m), "--select", "stg_orders", "--json"],
                          capture_output=True, text=True, timeout=60)
    out = json.loads(proc.stdout)
    assert out["nodes"] == ["model.p.stg_orders", "model.p.orders"]
    assert out["exposures"] == ["exposure.p.revenue_dashboard"] and out["owners"] == ["ann@x.example"]
    bad = subprocess.run([str(BIN / "dw-dagster"), "blast-radius", "--manifest", str(m), "--select", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no dbt node 'nope'" in bad.stderr


def test_user_errors_are_one_line_not_tracebacks(tmp_path):
    """What a newcomer tried on a clean clone: each is a clear message and a usage exit code."""
    import socket

    home = tmp_path / "dh"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    dw = str(BIN / "dw-dagster")

    def run(*args, env=None, cwd=tmp_path):
        return subprocess.run([dw, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                              env=_env(**(env or {})))

    nodomains = run("approve", "cs-nope", "--approver", "a@b.example", "--dagster-home", str(home))
    assert nodomains.returncode == 2 and "no domains file" in nodomains.stderr
    domains = tmp_path / "domains.yaml"
    domains.write_text("domains:\n  - name: d\n    assets: [[x]]\n    approvers: [a@b.example]\n")
    nokey = run("approve", "cs-nope", "--approver", "a@b.example", "--dagster-home", str(home), "--domains", str(domains))
    assert nokey.returncode == 2 and "DW_APPROVAL_SIGNING_KEY" in nokey.stderr and "must hold" in nokey.stderr
    unknown = run("approve", "cs-nope", "--approver", "a@b.example", "--dagster-home", str(home), "--domains", str(domains),
                  env={"DW_APPROVAL_SIGNING_KEY": "k" * 32})
    assert unknown.returncode == 2 and "no change set 'cs-nope'" in unknown.stderr
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"nodes": "x", "sources": 5}))
    shape = run("blast-radius", "--manifest", str(bad), "--select", "x")
    assert shape.returncode == 2 and "not a dbt manifest" in shape.stderr
    empty = run("demo", "store-sales", "--workdir", "")
    assert empty.returncode == 2 and "must name a folder" in empty.stderr
    relative = run("change-sets", env={"DAGSTER_HOME": "dh"})
    assert relative.returncode == 0 and "no change sets" in relative.stdout
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "dagster.yaml").write_text("storage: [unclosed\n")
    opened = run("change-sets", "--dagster-home", str(broken))
    assert opened.returncode == 2 and "cannot open the Dagster instance" in opened.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = run("fake-paging", "--port", str(s.getsockname()[1]))
    assert busy.returncode == 1 and "cannot serve on 127.0.0.1" in busy.stderr
    for p in (unknown, shape, empty, relative, opened, busy):
        assert "Traceback" not in p.stderr


def test_every_demo_runs_from_its_registered_module():
    """``dw-dagster demo NAME`` loads the example's demo module by name (the CLI imports no example);
    each defines a DEMO spec whose name and default scale are the command's."""
    from dw_dagster_examples.cli import DEMOS, demo, demo_spec
    from dw_dagster_dev.demo import DemoSpec

    assert sorted(DEMOS) == sorted(demo.commands)
    for name, module in DEMOS.items():
        spec = demo_spec(name)
        assert isinstance(spec, DemoSpec) and spec.name == name and spec.location_module.startswith(module.rsplit(".", 1)[0])
        scale = next((p for p in demo.commands[name].params if p.name == "scale"), None)  # the access demo has no data scale
        assert spec.min_scale <= spec.default_scale <= spec.max_scale
        assert scale is None and spec.min_scale == spec.max_scale or scale.default == spec.default_scale


def test_the_examples_commands_come_through_entry_points_and_are_named_when_missing():
    """``dw-dagster`` adds ``demo`` and ``fake-*`` from the examples distribution's entry points; without it
    each says how to install it (exit 2), and a plugin that fails to load does not break the others."""
    from importlib.metadata import EntryPoint

    import click

    from dw_dagster.cli import main as cli_main
    from dw_dagster.cli.main import EXAMPLE_COMMANDS, PLUGIN_GROUP, _add_plugins
    from dw_dagster_examples.cli import COMMANDS

    assert sorted(COMMANDS) == sorted(EXAMPLE_COMMANDS)
    for name, command in COMMANDS.items():
        assert cli_main.commands[name] is command
    bare = click.Group("bare")
    import importlib.metadata as md

    real = md.entry_points
    broken = EntryPoint("fake-lightup", "dw_dagster_examples.no_such_module:cmd", PLUGIN_GROUP)
    try:
        md.entry_points = lambda group=None: [broken] if group == PLUGIN_GROUP else real(group=group)
        _add_plugins(bare)
    finally:
        md.entry_points = real
    assert sorted(bare.commands) == sorted(EXAMPLE_COMMANDS)
    from click.testing import CliRunner

    missing = CliRunner().invoke(bare, ["demo", "store-sales", "--scale", "0.01"])
    assert missing.exit_code == 2 and "pip install dw-dagster-examples" in missing.output
    failed = CliRunner().invoke(bare, ["fake-lightup", "--port", "0"])
    assert failed.exit_code == 1 and "dw_dagster_examples.no_such_module:cmd cannot be loaded" in failed.output
