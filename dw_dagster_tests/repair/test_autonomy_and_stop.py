"""Autonomy levels L0-L4, the org-wide stop and expiry with escalation, each tried on a real repair.

The repair is small but real: ``orders`` is a daily-partitioned asset copying one day of source
rows into a DuckDB warehouse table (delete + insert), checked by a reconciliation check; the
remediation sensor, the window job, the checks job and the receipt job are dw_dagster's own.
"""

import datetime as dt
import textwrap

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.checks import build_reconciliation_checks
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.core.domains import DomainsFileError, load_domains
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core.models import BlastRadius, ChangeSet, Diagnosis, utcnow
from dw_dagster.core import records
from dw_dagster.approval.job import approve_in_process
from dw_dagster.guard.stop import active_stop, set_stop
from dw_dagster.approval.autonomy import build_expiry_sensor, expired_ids
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.repair.undo import build_undo_jobs

OWNER = "dana.ortiz@grocer.example"
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-06")
ORDERS = dg.AssetKey("orders")


def _domains(path, level: str, classes=("rerun_window", "rebuild_models")) -> None:
    allowed = f"    allowed_change_classes: [{', '.join(classes)}]\n" if level in ("L3", "L4") else ""
    path.write_text(textwrap.dedent(f"""\
        domains:
          - name: orders
            assets: [[orders]]
            approvers: [{OWNER}]
            escalation: [data-oncall@grocer.example]
            autonomy: {level}
            identity: unverified
        """) + allowed)


@pytest.fixture
def world(tmp_path, monkeypatch):
    domains = tmp_path / "domains.yaml"
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    src, wh = DuckDBDatabase(tmp_path / "src.duckdb"), DuckDBDatabase(tmp_path / "wh.duckdb")
    for db in (src, wh):
        db.execute("CREATE TABLE orders (id INT, day DATE, region VARCHAR, amount DECIMAL(18,2))")
    src.execute("INSERT INTO orders SELECT i, DATE '2026-11-01' + CAST(i % 5 AS INTEGER), ['EU','US'][i % 2 + 1], 1.25 FROM range(100) t(i)")
    # the warehouse misses 11-03 and 11-04 for US
    wh.execute(f"ATTACH '{src.path}' AS s (READ_ONLY); INSERT INTO orders SELECT * FROM s.orders "
               "WHERE NOT (region = 'US' AND day IN (DATE '2026-11-03', DATE '2026-11-04'))")

    @dg.asset(key=ORDERS, partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run())
    def orders(context: dg.AssetExecutionContext, source: DatabaseResource, warehouse: DatabaseResource) -> None:
        w = warehouse.get_database()
        for pk in context.partition_keys:
            w.execute(f"DELETE FROM orders WHERE day = DATE '{pk}'; ATTACH '{src.path}' AS s (READ_ONLY); "
                      f"INSERT INTO orders SELECT * FROM s.orders WHERE day = DATE '{pk}'")

    recon = build_reconciliation_checks(asset=ORDERS, source_asset="orders_source", source_table="orders",
                                        target_table="orders", slice_by=["region"], measures=["amount"], key_columns=["id"],
                                        source_resource_key="source", target_resource_key="warehouse", name="compare")
    check_key = dg.AssetCheckKey(ORDERS, "compare")
    verify_job = dg.define_asset_job("verify_orders", selection=dg.AssetSelection.checks(check_key))
    window_job = dg.define_asset_job("rerun_orders", selection=dg.AssetSelection.assets(ORDERS), partitions_def=DAILY)
    rebuild_job = dg.define_asset_job("rebuild_nothing", selection=dg.AssetSelection.assets(ORDERS))

    def diagnoser(context, incident):
        d = Diagnosis(id="dg-" + incident.id, incident_id=incident.id, asset_key=incident.asset_key, created_at=utcnow(),
                      causes=[], blast_radius=BlastRadius(root="orders"), gap_rows=incident.gap_rows, unexplained_rows=0)
        return d, change_set(incident_id=incident.id)

    diag = build_diagnosis_job(diagnoser=diagnoser)
    defs = dg.Definitions(
        assets=[orders, dg.AssetSpec("orders_source")], asset_checks=[recon],
        jobs=[verify_job, window_job, rebuild_job, diag, build_receipt_job()],
        sensors=[build_check_incident_sensor(check_keys=[check_key], diagnosis_job_name=diag.name),
                 build_remediation_sensor(partitions_def=DAILY, window_job=window_job, rebuild_job=rebuild_job,
                                          verify_job=verify_job, receipt_job=build_receipt_job(),
                                          undo_jobs=build_undo_jobs(["warehouse"])),
                 build_expiry_sensor()],
        resources={"source": DatabaseResource(url=f"duckdb:///{src.path}"), "warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")},
        executor=dg.in_process_executor,
    )
    with dg.instance_for_test() as instance:
        yield defs, instance, domains, wh


def change_set(incident_id="inc-x", expires_in_h=24.0, classes=("pipeline_code", "rerun_window"), undo_plan=None) -> ChangeSet:
    now = utcnow()
    content = dict(id="cs-orders0001", incident_id=incident_id, diagnosis_id="dg-" + incident_id, domain="orders",
                   proposer=c.PROPOSER, created_at=now, expires_at=now + dt.timedelta(hours=expires_in_h), approvers=[OWNER],
                   cause_kind="late_rows_behind_watermark", summary="rerun 11-03..11-04", target_asset=["orders"],
                   window=["2026-11-03", "2026-11-04"], diff="", files=[], rebuild_assets=[],
                   verify_checks=[["orders", "compare"]], change_classes=list(classes), undo="rerun again",
                   undo_plan=undo_plan)
    return ChangeSet.seal(**content)


def detect(defs, instance) -> LocalSensorDaemon:
    assert not defs.resolve_job_def("verify_orders").execute_in_process(instance=instance, raise_on_error=False).get_asset_check_evaluations()[0].passed
    return LocalSensorDaemon(defs, instance, log_level="WARNING")


def repair(daemon: LocalSensorDaemon) -> list[str]:
    stages = []
    for _ in range(6):
        tick = daemon.tick("dw_remediation_sensor")
        assert not tick.failed_run_ids
        if not tick.run_ids:
            break
        stages.append(daemon.instance.get_run_by_id(tick.run_ids[0]).tags[c.STAGE_TAG])
    return stages


def gap(wh) -> int:
    return 100 - wh.fetch_all("SELECT count(*) FROM orders")[0][0]


# -- the same incident at each level -----------------------------------------------------------

def test_l0_records_the_incident_and_diagnoses_nothing(world):
    defs, instance, domains, wh = world
    _domains(domains, "L0")
    tick = detect(defs, instance).tick("dw_check_incident_sensor")
    assert tick.run_ids == [] and len(records.incidents(instance)) == 1
    assert records.diagnoses(instance) == [] and gap(wh) == 20


def test_l1_diagnoses_and_proposes_nothing(world):
    defs, instance, domains, wh = world
    _domains(domains, "L1")
    daemon = detect(defs, instance)
    assert len(daemon.tick("dw_check_incident_sensor").run_ids) == 1
    assert len(records.diagnoses(instance)) == 1 and records.change_sets(instance) == []
    assert repair(daemon) == [] and gap(wh) == 20


def test_l2_waits_for_the_owner(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    (cs,) = records.change_sets(instance)
    tick = daemon.tick("dw_remediation_sensor")
    assert tick.run_ids == [] and "waiting for approval by dana.ortiz" in tick.skip_reason
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0
    (r,) = records.receipts(instance, ORDERS)
    assert r.approver == OWNER and r.verified


def test_l3_runs_listed_reversible_classes_unasked_with_receipt(world):
    defs, instance, domains, wh = world
    _domains(domains, "L3")
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0
    (a,) = records.approvals(instance)
    assert a.approver == "dw-dagster/autonomy:L3" and "pipeline code still merged by its owner" in a.comment
    (r,) = records.receipts(instance, ORDERS)
    assert r.approver == "dw-dagster/autonomy:L3" and r.signature_valid and r.verified and r.undo


def test_l3_waits_when_a_class_is_not_listed(world):
    defs, instance, domains, wh = world
    _domains(domains, "L3", classes=("rebuild_models",))
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    assert repair(daemon) == [] and records.approvals(instance) == [] and gap(wh) == 20


def test_l4_lowered_before_the_repair_starts_lets_the_owner_decide(world):
    defs, instance, domains, wh = world
    _domains(domains, "L4", classes=("rerun_window", "schema_migration"))
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    (cs,) = records.change_sets(instance)
    from dw_dagster.approval.autonomy import record_autonomous_approval

    assert record_autonomous_approval(instance, cs, load_domains(domains).get("orders")) is not None
    _domains(domains, "L2")  # lowered before any stage was dispatched
    tick = daemon.tick("dw_remediation_sensor")
    assert tick.run_ids == [] and "autonomy L4 was withdrawn" in tick.skip_reason
    (withdrawn,) = [e for e in tick.events if "dw/approval_withdrawn" in e.metadata]
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)  # not "already decided": the owner decides now
    assert ok, msg
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0
    (r,) = records.receipts(instance, ORDERS)
    assert r.approver == OWNER and r.verified and r.outcome == "applied"


def test_l3_lowered_mid_repair_ends_with_a_receipt_and_the_owner_may_continue(world):
    """The window ran under autonomy L3, then the owner lowers the domain to L2: nothing more runs
    unasked, a receipt says what was done and what was not; the owner's approval finishes it."""
    defs, instance, domains, wh = world
    _domains(domains, "L3")
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    first = daemon.tick("dw_remediation_sensor")  # the autonomous approval, then window-1 runs
    assert len(first.run_ids) == 1 and gap(wh) == 0
    _domains(domains, "L2")
    halt = daemon.tick("dw_remediation_sensor")  # withdrawn; nothing in flight: the halt receipt runs
    assert [daemon.instance.get_run_by_id(r).tags[c.STAGE_TAG] for r in halt.run_ids] == ["receipt-halt"]
    (r,) = records.receipts(instance, ORDERS)
    assert r.outcome.startswith("halted after window-1") and "autonomy L3 was withdrawn" in r.outcome
    assert not r.verified and r.approver == "dw-dagster/autonomy:L3"
    waiting = daemon.tick("dw_remediation_sensor")
    assert waiting.run_ids == [] and "halted" in waiting.skip_reason
    (cs,) = records.change_sets(instance)
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    assert repair(daemon) == ["verify", "receipt"]  # window-1 is not run again
    final = records.receipts(instance, ORDERS)[0]
    assert final.outcome == "applied" and final.verified and final.approver == OWNER
    assert final.previous_hash == r.content_hash(__import__("dw_dagster.receipts.job", fromlist=["x"]).receipt_markdown(r))


def test_l3_lowered_while_a_stage_is_running_ends_with_a_receipt(world, monkeypatch):
    """The owner lowers the domain to L2 *while* window-1 runs under autonomy L3: a tick during the
    run dispatches nothing (the stage in flight finishes first), the window finishes, then a
    `receipt-halt` receipt says what was done; no further stage runs unasked."""
    defs, instance, domains, wh = world
    _domains(domains, "L3")
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    from dw_dagster.core.ledger import ledger_for

    during: list = []
    get_database = DatabaseResource.get_database

    def lowered_while_running(self):
        if not during and self.url.endswith("wh.duckdb"):  # window-1's asset opens the warehouse: it is running
            (cs,) = records.change_sets(instance)
            (st,) = ledger_for(instance).stages(cs.id, cs.version).values()
            assert (st.stage, st.state, instance.get_run_by_id(st.run_id).is_finished) == ("window-1", "started", False)
            _domains(domains, "L2")
            during.append(sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)))
        return get_database(self)

    monkeypatch.setattr(DatabaseResource, "get_database", lowered_while_running)
    first = daemon.tick("dw_remediation_sensor")
    assert [instance.get_run_by_id(r).tags[c.STAGE_TAG] for r in first.run_ids] == ["window-1"] and gap(wh) == 0
    (mid,) = during
    assert not mid.run_requests and "the stage in flight finishes first" in mid.skip_message
    assert "autonomy L3 was withdrawn" in mid.skip_message
    halt = daemon.tick("dw_remediation_sensor")
    assert [instance.get_run_by_id(r).tags[c.STAGE_TAG] for r in halt.run_ids] == ["receipt-halt"], halt
    assert not halt.failed_run_ids and daemon.refusals == []
    (r,) = records.receipts(instance, ORDERS)
    assert r.outcome.startswith("halted after window-1") and "autonomy L3 was withdrawn" in r.outcome
    assert not r.verified and r.approver == "dw-dagster/autonomy:L3" and set(r.run_ids) == {"window-1"}
    assert repair(daemon) == [] and records.change_sets(instance)  # nothing more runs unasked
    (cs,) = records.change_sets(instance)
    from dw_dagster.core.ledger import ledger_for

    assert ledger_for(instance).change_set_row(cs.id).state == "halted"
    assert set(ledger_for(instance).stages(cs.id, cs.version)) == {"window-1", "receipt-halt"}


def test_an_approver_removed_from_the_domains_file_mid_repair_halts_with_a_receipt(world):
    """The owner approved; window-1 ran; then the owner is taken out of the domain's approvers: the
    approval no longer counts, no further stage is dispatched, a `receipt-halt` receipt says why."""
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    (cs,) = records.change_sets(instance)
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    first = daemon.tick("dw_remediation_sensor")
    assert [instance.get_run_by_id(r).tags[c.STAGE_TAG] for r in first.run_ids] == ["window-1"] and gap(wh) == 0
    domains.write_text(domains.read_text().replace(f"approvers: [{OWNER}]", "approvers: [sam.lee@grocer.example]"))
    halt = daemon.tick("dw_remediation_sensor")
    assert [instance.get_run_by_id(r).tags[c.STAGE_TAG] for r in halt.run_ids] == ["receipt-halt"]
    (withdrawn,) = [e for e in halt.events if "dw/approval_withdrawn" in e.metadata]
    assert f"{OWNER} is not an approver" in withdrawn.metadata["dw/approval_withdrawn"].value["reason"]
    (r,) = records.receipts(instance, ORDERS)
    assert r.outcome.startswith("halted after window-1") and f"{OWNER} is not an approver" in r.outcome
    assert not r.verified and r.approver == OWNER
    assert repair(daemon) == []
    from dw_dagster.core.ledger import ledger_for

    assert set(ledger_for(instance).stages(cs.id, cs.version)) == {"window-1", "receipt-halt"}
    assert ledger_for(instance).change_set_row(cs.id).state == "halted"
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "not an approver" in msg


# -- org-wide stop ------------------------------------------------------------------------------

def test_stop_halts_dispatch_and_approvals_wait_until_resume(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    (cs,) = records.change_sets(instance)
    set_stop(instance, True, "cto@grocer.example", "warehouse migration tonight")
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]  # recorded during the stop
    tick = daemon.tick("dw_remediation_sensor")
    assert tick.run_ids == [] and "org-wide stop by cto@grocer.example" in tick.skip_reason
    assert "warehouse migration tonight" in tick.skip_reason and gap(wh) == 20
    obs = next(records.iter_observations(instance, dg.AssetKey("dw_control")))
    assert obs.asset_observation.metadata["dw/stopped"].value is True  # visible on the asset's page
    with pytest.raises(ValueError, match="only a verified operator"):
        set_stop(instance, False, "cto@grocer.example", "done")  # a typed name lifts nothing
    from dw_dagster.approval.job import unverified_identity

    with pytest.raises(ValueError, match="not an operator"):
        set_stop(instance, False, unverified_identity("intern@grocer.example"), "done", domains=domains)
    set_stop(instance, False, unverified_identity(OWNER), "done", domains=domains)  # every domain is unverified here
    assert active_stop(instance) is None
    assert repair(daemon) == ["window-1", "verify", "receipt"] and gap(wh) == 0


def test_stop_also_holds_autonomous_levels(world):
    defs, instance, domains, wh = world
    _domains(domains, "L3")
    daemon = detect(defs, instance)
    daemon.tick("dw_check_incident_sensor")
    set_stop(instance, True, "cto@grocer.example")
    assert repair(daemon) == [] and records.approvals(instance) == []


def test_stop_cancels_queued_repair_runs(world):
    defs, instance, domains, wh = world
    run = instance.create_run_for_job(defs.resolve_job_def("verify_orders"), tags={c.CHANGE_SET_TAG: "cs-x"})
    other = instance.create_run_for_job(defs.resolve_job_def("verify_orders"))  # not a repair: left alone
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.NOT_STARTED
    state = set_stop(instance, True, "cto@grocer.example")
    assert state.cancelled_runs == [run.run_id]
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELED
    assert instance.get_run_by_id(other.run_id).status == dg.DagsterRunStatus.NOT_STARTED


# -- expiry and escalation --------------------------------------------------------------------

def test_expired_request_is_marked_escalated_and_never_granted(world):
    defs, instance, domains, wh = world  # noqa: F841
    _domains(domains, "L3")  # even a level that could run it unasked never grants an expired request
    from dw_dagster.proposals.change_sets import propose

    cs, _ = propose(instance, change_set(expires_in_h=-1))
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    daemon.tick("dw_expiry_sensor")

    def expired() -> list[dict]:
        found = [records.metadata_json(r.asset_observation.metadata, "dw/change_set_expired")
                 for r in records.iter_observations(instance, dg.AssetKey(cs.target_asset))]
        return [e for e in found if e]
    (data,) = expired()
    assert (data["change_set_id"], data["escalated_to"]) == (cs.id, "data-oncall@grocer.example")
    assert expired_ids(instance) == {cs.id}
    daemon.tick("dw_expiry_sensor")
    assert len(expired()) == 1  # marked once
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "expired" in msg
    assert repair(daemon) == [] and records.approvals(instance) == []


# -- the domains file -----------------------------------------------------------------------------

@pytest.mark.parametrize("body,line,needle", [
    ("domains:\n  - name: a\n    assets: [[x]]\n    approvers: [not-an-email]\n", 4, "not email addresses"),
    ("domains:\n  - name: a\n    assets: [[x]]\n    approvers: [a@b.c]\n    autonomy: L3\n"
     "    allowed_change_classes: [schema_migration]\n", 2, "L3 runs only reversible classes"),
    ("domains:\n  - name: a\n    assets: [[x]]\n    approvers: [a@b.c]\n    autonomy: L4\n"
     "    allowed_change_classes: [pipeline_code]\n", 6, "pipeline_code can never run without its owner"),
    ("domains:\n  - name: a\n    assets: [[x]]\n    approvers: [a@b.c]\n    autonomy: L3\n", 2, "needs allowed_change_classes"),
    ("domains:\n  - name: a\n    assets: [[x]]\n    approvers: [a@b.c]\n  - name: b\n    assets: [[x]]\n    approvers: [a@b.c]\n",
     1, "asset x is in two domains"),
    ("domains:\n  - name: a\n    assets: [[x]]\n    approvers: [a@b.c]\n    max_window_partitions: 0\n", 5, "greater than or equal to 1"),
    ("domains:\n  - name: a\n    approvers: [a@b.c]\n", 2, "owns nothing"),
], ids=["email", "l3-class", "pipeline-code", "no-classes", "overlap", "window-cap", "owns-nothing"])
def test_bad_domains_file_names_the_line(tmp_path, body, line, needle):
    p = tmp_path / "domains.yaml"
    p.write_text(body)
    with pytest.raises(DomainsFileError) as e:
        load_domains(p)
    assert f"{p}:{line}:" in str(e.value) and needle in str(e.value)


def test_domain_selection_strings_resolve_on_the_asset_graph(tmp_path):
    p = tmp_path / "domains.yaml"
    p.write_text("domains:\n  - name: sales\n    select: ['key:\"pos/*\"', 'key:orders']\n    approvers: [a@b.c]\n")
    graph = dg.Definitions(assets=[dg.AssetSpec(["pos", "lines"]), dg.AssetSpec("orders"), dg.AssetSpec("other")]).resolve_asset_graph()
    d = load_domains(p)
    assert d.for_asset(["orders"], graph).name == "sales" and d.for_asset(["pos", "lines"], graph).name == "sales"
    with pytest.raises(KeyError):
        d.for_asset(["other"], graph)


def test_cli_stop_and_resume(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    dw = str(Path(sys.executable).parent / "dw-dagster")
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    home = ["--dagster-home", str(tmp_path)]
    out = subprocess.run([dw, "stop", "--by", "CTO@grocer.example", "--reason", "incident review", *home], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("STOPPED by cto@grocer.example"), out.stderr
    bad = subprocess.run([dw, "stop", "--by", " ", *home], capture_output=True, text=True)
    assert bad.returncode == 2 and "must name who stops" in bad.stderr
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert active_stop(instance).reason == "incident review"
    domains = tmp_path / "domains.yaml"
    _domains(domains, "L2")
    refused = subprocess.run([dw, "resume", "--by", "intern@grocer.example", "--domains", str(domains), *home],
                             capture_output=True, text=True)
    assert refused.returncode == 3 and "not an operator" in refused.stderr
    out = subprocess.run([dw, "resume", "--by", OWNER, "--domains", str(domains), *home], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith(f"resumed by {OWNER}"), out.stderr
    again = subprocess.run([dw, "resume", "--by", OWNER, "--domains", str(domains), *home], capture_output=True, text=True)
    assert "no org-wide stop is in force" in again.stdout
    domains.write_text(domains.read_text().replace("identity: unverified", "identity: verified"))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        set_stop(instance, True, "cto@grocer.example")
    typed = subprocess.run([dw, "resume", "--by", OWNER, "--domains", str(domains), *home], capture_output=True, text=True)
    assert typed.returncode == 3 and "needs a verified identity" in typed.stderr
