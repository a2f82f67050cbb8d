"""Issue 14 kinds 6 and 13: a cause whose window names partitions that do not exist, end to end.

Late rows sit in one partition before the asset's first partition, in two closed partitions, in
today's partition (it exists, ``end_offset=1``, but is still in progress) and in tomorrow's (it
does not exist yet). The proposal runs the two closed partitions, lists the one before the start
with its rows and defers the other two with when they exist or close; the approval request, the
repair, the receipt and ``dw-dagster incidents`` all say so, and the verification compares only
the partitions the repair ran, so it passes although the rows it could not touch are still
missing.

The world is a small real repair (DuckDB tables, the real diagnosis job, real proposal code,
dw_dagster's sensors and jobs) on a daily ``America/Los_Angeles`` definition, so the partitions'
windows are not UTC days either.
"""


import datetime as dt
import textwrap
from zoneinfo import ZoneInfo

import dagster as dg
import pytest
from click.testing import CliRunner

from dw_dagster.core.windows import partition_window_utc
from dw_dagster.approval.job import approve_in_process
from dw_dagster.approval.server import _change_set_html
from dw_dagster.checks import build_reconciliation_checks
from dw_dagster.cli.main import main
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import load_domains
from dw_dagster.core.models import BlastRadius, CauseFinding, Diagnosis, utcnow
from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.diagnosis.history import incident_history
from dw_dagster.diagnosis.job import build_diagnosis_job
from dw_dagster.integrations.slack import approval_request_message
from dw_dagster.proposals.watermark import propose_watermark_fix
from dw_dagster.receipts.job import build_receipt_job, receipt_markdown
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.testing.local_daemon import LocalSensorDaemon

OWNER = "dana.ortiz@grocer.example"
ZONE = "America/Los_Angeles"
ORDERS = dg.AssetKey("orders")


def _days():
    today = dt.datetime.now(ZoneInfo(ZONE)).date()
    d = {name: (today + dt.timedelta(days=n)).isoformat()
         for name, n in (("before", -9), ("a", -4), ("b", -2), ("today", 0), ("tomorrow", 1))}
    return today, d


@pytest.fixture
def world(tmp_path, monkeypatch):
    today, d = _days()
    daily = dg.DailyPartitionsDefinition(start_date=(today - dt.timedelta(days=6)).isoformat(), timezone=ZONE,
                                         end_offset=1)
    domains = tmp_path / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: orders
            assets: [[orders]]
            approvers: [{OWNER}]
            autonomy: L2
            identity: unverified
            max_window_partitions: 7
        """))
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    repo = tmp_path / "repo"
    (repo / "pipelines").mkdir(parents=True)
    (repo / "pipelines" / "orders.yaml").write_text("watermark_column: sold_at  # the load's HWM\nlookback_hours: 0\n")
    src, wh = DuckDBDatabase(tmp_path / "src.duckdb"), DuckDBDatabase(tmp_path / "wh.duckdb")
    for db in (src, wh):
        db.execute("CREATE TABLE orders (id INT, sold_at TIMESTAMP, region VARCHAR, amount DECIMAL(18,2))")
    # six rows per Pacific day from nine days ago to tomorrow, at 06:00..21:00 local time (the
    # evening ones are on the next UTC date); the late ones: ids divisible by 4 on the five days
    rows, late = [], {}
    day, i = today - dt.timedelta(days=9), 0
    while day <= today + dt.timedelta(days=1):
        start, _ = partition_window_utc(daily, day.isoformat())
        for h in (6, 9, 12, 15, 18, 21):
            i += 1
            rows.append((i, start + dt.timedelta(hours=h), "EU" if i % 2 else "US"))
            if day.isoformat() in d.values() and i % 4 == 0:
                late.setdefault(day.isoformat(), []).append(i)
        day += dt.timedelta(days=1)
    src.execute("INSERT INTO orders VALUES " + ", ".join(f"({i}, TIMESTAMP '{t.isoformat(sep=' ')}', '{r}', 2.50)"
                                                          for i, t, r in rows))
    missing = sorted(k for ids in late.values() for k in ids)
    wh.execute(f"ATTACH '{src.path}' AS s (READ_ONLY); INSERT INTO orders SELECT * FROM s.orders "
               f"WHERE id NOT IN ({', '.join(map(str, missing))})")

    @dg.asset(key=ORDERS, partitions_def=daily, backfill_policy=dg.BackfillPolicy.single_run())
    def orders(context: dg.AssetExecutionContext, warehouse: DatabaseResource) -> None:
        w = warehouse.get_database()
        for pk in context.partition_keys:
            a, b = partition_window_utc(daily, pk)
            cond = f"sold_at >= TIMESTAMP '{a.isoformat(sep=' ')}' AND sold_at < TIMESTAMP '{b.isoformat(sep=' ')}'"
            w.execute(f"DELETE FROM orders WHERE {cond}; ATTACH '{src.path}' AS s (READ_ONLY); "
                      f"INSERT INTO orders SELECT * FROM s.orders WHERE {cond}")

    recon = build_reconciliation_checks(asset=ORDERS, source_asset="orders_source", source_table="orders",
                                        target_table="orders", slice_by=["region"], measures=["amount"], key_columns=["id"],
                                        source_resource_key="source", target_resource_key="warehouse", name="compare",
                                        partition_column="sold_at", partitions_def=daily)
    check_key = dg.AssetCheckKey(ORDERS, "compare")
    verify_job = dg.define_asset_job("verify_orders", selection=dg.AssetSelection.checks(check_key))
    window_job = dg.define_asset_job("rerun_orders", selection=dg.AssetSelection.assets(ORDERS), partitions_def=daily)
    rebuild_job = dg.define_asset_job("rebuild_nothing", selection=dg.AssetSelection.assets(ORDERS))

    def diagnoser(context, incident):
        per = [{"partition": k, "explained_rows": len(v), "late_rows": len(v)} for k, v in sorted(late.items())]
        n = sum(len(v) for v in late.values())
        finding = CauseFinding(kind="late_rows_behind_watermark", summary=f"{n} late rows", confidence=1.0,
                               explained_rows=n, unexplained_rows=0, window=sorted(late),
                               details={"watermark_column": "sold_at", "arrival_column": "posted_at",
                                        "proposed_lookback_hours": 48, "per_partition": per})
        diag = Diagnosis(id="dg-" + incident.id, incident_id=incident.id, asset_key=incident.asset_key,
                         created_at=utcnow(), causes=[finding], blast_radius=BlastRadius(root="orders"),
                         gap_rows=incident.gap_rows, unexplained_rows=0)
        cs = propose_watermark_fix(incident=incident, diagnosis=diag, finding=finding,
                                   domain=load_domains(domains).get("orders"), pipeline_root=repo,
                                   pipeline_file="pipelines/orders.yaml", partitions_def=daily, rebuild_assets=[],
                                   verify_checks=[["orders", "compare"]])
        return diag, cs

    diag = build_diagnosis_job(diagnoser=diagnoser)
    defs = dg.Definitions(
        assets=[orders, dg.AssetSpec("orders_source")], asset_checks=[recon],
        jobs=[verify_job, window_job, rebuild_job, diag, build_receipt_job()],
        sensors=[build_check_incident_sensor(check_keys=[check_key], diagnosis_job_name=diag.name),
                 build_remediation_sensor(partitions_def=daily, window_job=window_job, rebuild_job=rebuild_job,
                                          verify_job=verify_job, receipt_job=build_receipt_job())],
        resources={"source": DatabaseResource(url=f"duckdb:///{src.path}"),
                   "warehouse": DatabaseResource(url=f"duckdb:///{wh.path}")},
        executor=dg.in_process_executor,
    )
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        yield defs, instance, daily, d, late, wh, home


def test_outside_and_deferred_partitions_through_proposal_approval_repair_and_receipt(world, monkeypatch):
    defs, instance, daily, d, late, wh, home = world
    rows = {k: len(v) for k, v in late.items()}
    # detection: the whole table is compared (not a repair's verify run) and is short
    first = defs.resolve_job_def("verify_orders").execute_in_process(instance=instance, raise_on_error=False)
    (ev,) = first.get_asset_check_evaluations()
    assert not ev.passed and ev.metadata["dw/gap_rows"].value == sum(rows.values())
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    assert len(daemon.tick("dw_check_incident_sensor").run_ids) == 1

    # proposal: the two closed partitions run; the rest are listed, never dropped
    (cs,) = records.change_sets(instance)
    assert cs.window == sorted([d["a"], d["b"]])
    assert [(n.partition, n.rows, n.reason) for n in cs.outside_partitions] == [
        (d["before"], rows[d["before"]], "before the first partition")]
    deferred = {n.partition: n for n in cs.deferred_details}
    assert cs.deferred_partitions == sorted([d["today"], d["tomorrow"]]) == sorted(deferred)
    assert deferred[d["today"]].reason == "still in progress"
    assert deferred[d["tomorrow"]].reason == "does not exist yet"
    today_end = partition_window_utc(daily, d["today"])[1].replace(tzinfo=dt.timezone.utc)
    # with end_offset=1 today closes at its window's end, and tomorrow's partition exists from then on
    assert deferred[d["today"]].available_at == today_end == deferred[d["tomorrow"]].available_at
    assert {k: n.rows for k, n in deferred.items()} == {d["today"]: rows[d["today"]], d["tomorrow"]: rows[d["tomorrow"]]}
    assert cs.expected_recovered_rows == rows[d["a"]] + rows[d["b"]]
    assert "not run:" in cs.summary and d["before"] in cs.summary and d["tomorrow"] in cs.summary

    # the approval request (review page and Slack) names them too
    page = _change_set_html(cs, None, "", "csrf")
    assert "outside the asset&#x27;s partitions, not run" in page and "still in progress, until" in page
    msg = approval_request_message(cs, None, dagster_url="http://localhost:3000", location="orders")
    text = str(msg)
    assert f"{d['before']} ({rows[d['before']]} row" in text and "does not exist yet, until" in text

    # approval and repair: one window run over the two closed partitions, verify, receipt
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    stages = []
    for _ in range(6):
        tick = daemon.tick("dw_remediation_sensor")
        assert not tick.failed_run_ids
        if not tick.run_ids:
            break
        run = instance.get_run_by_id(tick.run_ids[0])
        stages.append(run.tags[c.STAGE_TAG])
        if run.tags[c.STAGE_TAG] == "verify":
            (ver,) = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
            meta = ver.dagster_event.event_specific_data.metadata
            assert meta["dw/compared_partitions"].value == ", ".join(cs.window)
    assert stages == ["window-1", "window-2", "verify", "receipt"]  # two closed partitions, not contiguous
    still_missing = wh.fetch_all("SELECT count(*) FROM orders")[0][0]
    src_rows = DuckDBDatabase(home.parent / "src.duckdb").fetch_all("SELECT count(*) FROM orders")[0][0]
    assert src_rows - still_missing == rows[d["before"]] + rows[d["today"]] + rows[d["tomorrow"]]

    (r,) = records.receipts(instance, ORDERS)
    assert r.verified and r.outcome == "applied" and r.partitions == cs.window
    assert r.evidence_summary["rows_not_run"] == rows[d["before"]] + rows[d["today"]] + rows[d["tomorrow"]]
    assert [n.partition for n in r.partitions_not_run()] == [d["before"], *sorted([d["today"], d["tomorrow"]])]
    md = receipt_markdown(r)
    assert "**Not run**" in md and "before the first partition" in md and "still in progress" in md

    # the incident history and `dw-dagster incidents`
    (entry,) = incident_history(instance, ORDERS)
    assert [n.partition for n in entry.not_run] == [n.partition for n in r.partitions_not_run()]
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    out = CliRunner().invoke(main, ["incidents", "--dagster-home", str(home)])
    assert out.exit_code == 0, out.output
    assert f"not run: {d['before']} ({rows[d['before']]} row" in out.output
    assert f"not run: {d['tomorrow']} ({rows[d['tomorrow']]} row" in out.output and "does not exist yet, until" in out.output


def test_a_window_with_nothing_to_run_now_is_refused_with_the_reasons(world):
    defs, instance, daily, d, late, wh, home = world
    from dw_dagster.core.models import Incident
    from dw_dagster.proposals.watermark import ProposalError

    finding = CauseFinding(kind="late_rows_behind_watermark", summary="x", confidence=1.0, explained_rows=3,
                           unexplained_rows=0, window=[d["before"], d["tomorrow"]],
                           details={"watermark_column": "sold_at", "arrival_column": "posted_at",
                                    "proposed_lookback_hours": 24,
                                    "per_partition": [{"partition": d["before"], "explained_rows": 1},
                                                      {"partition": d["tomorrow"], "explained_rows": 2}]})
    inc = Incident(id="inc-1", asset_key=["orders"], detected_at=utcnow(), source="dw_check", summary="short",
                   gap_rows=3, gap_pct=1.0)
    diag = Diagnosis(id="dg-1", incident_id="inc-1", asset_key=["orders"], created_at=utcnow(), causes=[finding],
                     blast_radius=BlastRadius(root="orders"), gap_rows=3, unexplained_rows=0)
    with pytest.raises(ProposalError, match="before the first partition.*does not exist yet"):
        propose_watermark_fix(incident=inc, diagnosis=diag, finding=finding,
                              domain=load_domains(home.parent / "domains.yaml").get("orders"),
                              pipeline_root=home.parent / "repo", pipeline_file="pipelines/orders.yaml",
                              partitions_def=daily, rebuild_assets=[], verify_checks=[])
