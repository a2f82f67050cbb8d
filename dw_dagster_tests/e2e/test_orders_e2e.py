"""The whole orders-stream loop on a real Dagster instance and embedded DuckDB, sensors evaluated
through Dagster: volume and dead-letter detection, the REQUIRED-NULL cause, the change set with a
migration and a replay, refusals and the owner's approval, migrate → replay → rebuild → verify →
receipt, and the numbers at each stage."""

import datetime as dt

import io
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.databases import DuckDBDatabase
from dw_dagster.core.domains import DOMAINS_FILE_ENV
from dw_dagster_examples.orders import generator as g
from dw_dagster_examples.orders import home as h
from dw_dagster_examples.orders import paths as p
from dw_dagster_examples.orders.demo import NOT_LISTED, OWNER, run_orders_demo
from dw_dagster_dev.demo import Timeline
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core.models import ChangeSet, UndoPlan, utcnow
from dw_dagster.core import records
from dw_dagster.repair.stages import stage_plan
from dw_dagster.changes.steps import step_op_name, step_results

SCALE = 0.01
PARKED = round(3_912 * SCALE)
REASON = "shipping_country: missing required field"
MODELS = ["fct_daily_gmv", "finance_gmv_by_payment_method", "finance_gmv_mtd"]
STAGES = ["migration-1", "replay-2", "rebuild", "verify", "receipt"]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    root = tmp_path_factory.mktemp("orders")
    (root / "dagster_home").mkdir()
    with pytest.MonkeyPatch.context() as mp, dg.instance_for_test(temp_dir=str(root / "dagster_home")) as instance:
        mp.setenv(h.HOME_ENV, str(root / "home"))
        mp.delenv(DOMAINS_FILE_ENV, raising=False)  # restored after the module (the location sets its own)
        mp.delenv(p.SCALE_ENV, raising=False)
        printed = io.StringIO()
        result = run_orders_demo(home=root / "home", instance=instance, scale=SCALE, log=Timeline(printed))
        result.printed_timeline = printed.getvalue()
        yield result, instance, root / "home"


def change_set(instance) -> ChangeSet:
    (cs,) = records.change_sets(instance)
    return cs


def test_detection_volume_9_percent_under_and_the_parked_rows(loop):
    result, instance, _ = loop
    e = g.expected(SCALE)
    assert result.volume_before_pct == e.deviation_pct and -9.5 < e.deviation_pct < -8.5
    assert result.parked_rows == e.parked_rows == PARKED
    assert result.parked_reasons == {REASON: PARKED}
    assert result.gap_before == {"day": "2026-11-24", "source": e.source_by_day[g.INCIDENT_DAY],
                                 "target": e.incident_landed, "rows": PARKED,
                                 "pct": round(PARKED / e.source_by_day[g.INCIDENT_DAY] * 100, 3)}
    # before the repair the nightly model lacked the gift cards parked on Tuesday
    before = result.gift_cards_before
    assert before["passed"] is False and before["source_orders"] - before["model_orders"] == PARKED


def test_one_incident_for_the_two_failed_checks(loop):
    result, instance, _ = loop
    (inc,) = records.incidents(instance)
    assert inc.id == result.incident_id and inc.check_name == "daily_volume" and inc.asset_key == ["orders"]
    assert (inc.window_start, inc.window_end) == (dt.datetime(2026, 11, 24, tzinfo=dt.timezone.utc),
                                                  dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc))
    e = g.expected(SCALE)
    assert inc.gap_rows == round(e.baseline_mean - e.incident_landed) and inc.gap_pct == e.deviation_pct
    runs = instance.get_runs(filters=dg.RunsFilter(tags={c.INCIDENT_TAG: inc.id}))
    assert [r.job_name for r in runs] == ["dw_diagnose_incident"]


def test_cause_dead_letter_reason_source_change_and_column_mode(loop):
    result, instance, _ = loop
    (diag,) = records.diagnoses(instance)
    cause = diag.primary
    assert cause.kind == result.cause == "required_null_dead_letter"
    assert (cause.explained_rows, cause.unexplained_rows, cause.confidence) == (PARKED, 0, 1.0)
    d = cause.details
    assert d["variant"] == "dead_letter" and {k: v for k, v in d["nulls_per_column"].items() if v} == {"shipping_country": PARKED}
    assert d["required_columns_source"].startswith("target catalog")
    assert d["dead_letter"]["errors"] == [{"error": REASON, "rows": PARKED}] and d["dlq_keys_equal_missing_null_keys"]
    assert d["window"] == ["2026-11-24T00:00:00", "2026-11-25T00:00:00"]
    assert d["column_modes"] == {"shipping_country": {"type": "VARCHAR", "mode": "REQUIRED"}} == {
        k: {"type": "VARCHAR", "mode": v} for k, v in result.column_mode.items()}
    change = d["source_change"]
    (grp,) = change["groups"]
    cell = next(x for x in g.plan(SCALE) if x.day == g.INCIDENT_DAY)
    assert (grp["value"], grp["rows"], change["nulls_before_window"]) == ("gift_card", PARKED, 0)
    assert dt.datetime.fromisoformat(grp["first"]) >= g.RELEASE_TS > dt.datetime.fromisoformat(grp["last_carried"])
    assert grp["carried_before_first_null"] == sum(cell.gift_cards_by_hour[:g.RELEASE_TS.hour])
    assert "payment_method = 'gift_card'" in result.source_change and "shipping_country is REQUIRED" in cause.summary
    assert any("information_schema.columns" in ev.sql for ev in cause.evidence)


def test_the_mage_runs_of_the_window_are_evidence_and_the_stream_ran_green(loop):
    result, instance, _ = loop
    (diag,) = records.diagnoses(instance)
    cause = diag.primary
    mage = cause.details["mage"]
    # the fake Mage of the story: the stream running since the first day, one finance_daily run per night
    assert result.mage_runs == mage["statuses"] == {"orders_stream": ["running"], "finance_daily": ["completed"]}
    assert mage["green_throughout"] is True and mage["window"] == ["2026-11-24T00:00:00+00:00", "2026-11-25T00:00:00+00:00"]
    assert "Mage: the stream ran green throughout (Mage pipeline orders_stream" in cause.summary
    assert cause.confidence == 1.0  # no failed or cancelled run: the data-only cause keeps its confidence
    stream, nightly = mage["timeline"]
    assert stream.startswith("Mage orders_stream run 1 running 2026-10-21 00:05:00Z → still running at ")
    assert nightly.startswith("Mage finance_daily run ") and " completed 2026-11-24 02:00:00Z → 2026-11-24 02:04:00Z; " \
        "blocks: load_orders completed, gmv_by_day completed" in nightly
    assert [e.description.split(" (")[0] for e in cause.evidence if e.database.startswith("mage ")] == [
        "Mage pipeline orders_stream", "Mage pipeline finance_daily"]


def test_blast_radius_reaches_the_lightdash_dashboard(loop):
    _, instance, _ = loop
    (diag,) = records.diagnoses(instance)
    br = diag.blast_radius
    assert br.root == "source.store_sales.analytics.orders"
    assert [(m.name, m.depth, m.asset_key) for m in br.models] == [
        ("fct_daily_gmv", 1, ["fct_daily_gmv"]), ("finance_gmv_by_payment_method", 2, ["finance_gmv_by_payment_method"]),
        ("finance_gmv_mtd", 2, ["finance_gmv_mtd"])]
    assert len(br.tests) == 7
    (exp,) = br.exposures
    assert (exp.label, exp.type, exp.owner_name, exp.owner_email) == ("Daily GMV", "dashboard", "Nadia Okafor",
                                                                      "nadia.okafor@shop.example")
    assert exp.url.startswith("https://lightdash.") and "maya.chen@shop.example" in br.owners


def test_the_daily_gmv_dashboard_is_named_with_its_deadline_and_refreshed_in_lightdash(loop):
    """Issue 31: ``demo orders --json`` names the Lightdash dashboard's ``needed_by`` and its refresh (the
    fake Lightdash: cache invalidated, each chart's query run again) after the verified receipt."""
    import json

    result, _, _ = loop
    out = json.loads(result.to_json())
    assert out["needed_by"] == {"daily_gmv": "07:30 America/New_York"}
    (b,) = out["bi_refreshed"]
    assert (b["exposure"], b["tool"], b["before_deadline"], b["error"]) == ("daily_gmv", "lightdash", True, None)
    assert dt.datetime.fromisoformat(b["refreshed_at"]) <= dt.datetime.fromisoformat(b["deadline"])
    assert "daily_gmv (lightdash) refreshed at" in result.printed_timeline


def test_change_set_holds_the_migration_and_the_replay(loop):
    result, instance, _ = loop
    cs = change_set(instance)
    assert cs.id == result.change_set_id and cs.cause_kind == "required_null_dead_letter" and cs.domain == "orders"
    assert cs.change_classes == ["schema_migration", "replay_dead_letter", "rebuild_models"]
    assert cs.window == [] and cs.diff == "" and cs.approvers == [OWNER]
    assert [s.kind for s in cs.steps] == ["migration", "replay"]
    mig, rep = cs.steps
    assert mig.sql == result.migration_forward == ["ALTER TABLE analytics.orders ALTER COLUMN shipping_country DROP NOT NULL"]
    assert mig.rollback_sql == ["ALTER TABLE analytics.orders ALTER COLUMN shipping_country SET NOT NULL"]
    assert mig.spec["migration"]["change"] == {"table": "analytics.orders", "column": "shipping_country",
                                               "kind": "nullability", "nullable": True}
    assert rep.expected_rows == rep.spec["expected_rows"] == cs.expected_recovered_rows == PARKED == result.expected_rows
    assert rep.spec["reasons"] == [REASON] and rep.spec["key"] == "order_id"
    assert rep.sql[0].startswith("INSERT INTO analytics.orders (order_id,")
    assert [list(k) for k in cs.rebuild_assets] == [[m] for m in MODELS]
    assert cs.verify_checks == [["orders", "daily_volume"], ["orders", "dead_letter"], ["orders", "parked_rows_replayed"],
                                ["orders", "no_new_dead_letters"], ["orders", "mage_rerun"], ["fct_daily_gmv", "gift_card_gmv"]]
    (rerun,) = cs.manual_steps
    assert (rerun.kind, rerun.target, rerun.after, rerun.check) == ("mage_rerun", "finance_daily", ["migration-1", "replay-2"],
                                                                     ["orders", "mage_rerun"])
    assert rerun.summary.startswith("rerun `finance_daily` in Mage after steps 1–2")
    assert rerun.command == 'mage-agent run_pipeline {"pipeline_uuid": "finance_daily"}'
    assert rerun.url.endswith("/pipelines/finance_daily/triggers")
    assert result.migration == {"forward": result.migration_forward, "rollback": mig.rollback_sql}
    assert stage_plan(cs, []) == STAGES
    assert "SET NOT NULL" in cs.undo and "DELETE FROM analytics.orders WHERE order_id IN" in cs.undo
    (md,) = [r.asset_observation.metadata["dw/change_set_steps_md"].value for r in records.iter_observations(
        instance, dg.AssetKey("orders")) if "dw/change_set_steps_md" in r.asset_observation.metadata]
    assert "**migration-1**" in md and "**replay-2**" in md and "SET NOT NULL;" in md
    assert "1. rerun `finance_daily` in Mage after steps 1–2" in md


def test_refusals_then_the_owners_approval(loop):
    result, instance, _ = loop
    cs = change_set(instance)
    refused = {r["approver"]: r["reason"] for r in records.refusals(instance, cs.id)}
    assert set(refused) == {c.PROPOSER, OWNER, NOT_LISTED}
    assert "cannot approve" in refused[c.PROPOSER] and "not an approver of domain 'orders'" in refused[NOT_LISTED]
    assert "needs a verified identity" in refused[OWNER]  # typed, not logged in
    (approval,) = records.approvals(instance, cs.id)
    assert approval.approver == OWNER == result.approver and approval.decision == "approve"
    assert approval.identity.method == "oidc" and result.approval_identity["method"] == "oidc"


def test_stages_ran_in_order_each_once(loop):
    result, instance, _ = loop
    cs = change_set(instance)
    (approval,) = records.approvals(instance, cs.id)
    assert list(result.run_ids) == STAGES
    runs = [instance.get_run_by_id(result.run_ids[s]) for s in STAGES]
    assert [r.job_name for r in runs] == ["dw_step_migration", "dw_step_replay", "dw_rebuild_downstream",
                                          "dw_verify", "dw_receipts"]
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    assert [r.tags["dagster/run_key"] for r in runs] == [f"{cs.id}:{cs.version[:16]}:{s}:{r.tags['dw/ticket'][:10]}" for s, r in zip(STAGES, runs)]
    starts = [instance.get_run_record_by_id(r.run_id).start_time for r in runs]
    assert starts == sorted(starts)
    assert sorted(records.refusals(instance, cs.id), key=lambda r: r["at"])[-1]["at"] < approval.decided_at.isoformat()
    mig, rep = step_results(instance, cs)
    assert (mig["stage"], mig["already_applied"], mig["refused"]) == ("migration-1", False, False)
    assert (rep["stage"], rep["inserted_rows"], rep["rejected_rows"], rep["expected_rows"]) == ("replay-2", PARKED, 0, PARKED)
    assert mig["finished_at"] <= rep["started_at"]


def test_target_equals_the_source_and_the_column_is_nullable(loop):
    result, _, home = loop
    wh = DuckDBDatabase(h.warehouse_path(home))
    cols = ", ".join(g.COLUMNS)
    got = {r[0]: dict(zip(g.COLUMNS, r)) for r in wh.fetch_all(f"SELECT {cols} FROM analytics.orders")}
    assert got == g.final_rows(SCALE)
    assert wh.fetch_all("SELECT count(*), count(DISTINCT order_id) FROM analytics.orders")[0] == (len(got), len(got))
    assert wh.fetch_all("SELECT is_nullable FROM information_schema.columns WHERE table_schema = 'analytics' "
                        "AND table_name = 'orders' AND column_name = 'shipping_country'") == [("YES",)]
    assert result.gap_after["rows"] == 0 and result.replayed_rows == result.replayed == PARKED
    assert (result.dlq_rows_before, result.dlq_rows_after, result.duplicates_after) == (PARKED, 0, 0)
    assert result.volume_gap_before == result.gap_before["pct"] > 8 and result.volume_gap_after == 0.0


def test_verification_checks_and_receipts(loop):
    result, instance, _ = loop
    cs = change_set(instance)
    assert result.ok and result.verified
    assert result.checks_after == {"daily_volume": True, "dead_letter": True, "parked_rows_replayed": True,
                                   "no_new_dead_letters": True, "mage_rerun": True, "gift_card_gmv": True}
    assert abs(result.volume_after_pct) < 1.0
    after = result.gift_cards_after
    assert after["passed"] and after["model_orders"] == after["source_orders"] == result.gift_cards_before["source_orders"]
    assert all(m == s for m, s in after["gmv"].values())
    assert result.receipt_assets == sorted(["orders", *MODELS])
    (r,) = records.receipts(instance, dg.AssetKey("orders"))
    assert r.change_set_id == cs.id and r.verified and r.signature_valid and r.approver == OWNER
    assert set(r.run_ids) == {"migration-1", "replay-2", "rebuild", "verify"}
    checks = {o.check_name: o for o in r.checks}
    assert set(checks) == {"daily_volume", "dead_letter", "parked_rows_replayed", "no_new_dead_letters", "mage_rerun"}
    # the engineer's rerun of finance_daily in Mage, started after the replay: its outcome is in the receipt
    md = checks["mage_rerun"].metadata
    assert (md["dw/mage_pipeline"], md["dw/mage_status"]) == ("finance_daily", "completed") and checks["mage_rerun"].passed
    assert result.mage_rerun == {"pipeline": "finance_daily", "run_id": md["dw/mage_run_id"], "status": "completed"}
    replay_end = step_results(instance, cs)[-1]["finished_at"]
    (outcome,) = md["dw/mage_reruns_json"]
    assert outcome["started_at"] >= replay_end[:19] and md["dw/mage_after_utc"] == replay_end
    assert checks["dead_letter"].metadata["dw/parked_rows"] == 0  # parked rows still waiting: none
    md = checks["parked_rows_replayed"].metadata
    assert (md["dw/parked_keys"], md["dw/present_once"], md["dw/replayed_rows"], md["dw/expected_rows"]) == (PARKED,) * 4
    assert checks["no_new_dead_letters"].metadata["dw/parked_rows"] == 0
    # every parked row of the selection in a recorded state, counted by the check and the receipt
    states = md["dw/parked_states_json"]
    assert states["replayed"] == PARKED and states["pending"] == 0
    assert r.evidence_summary["parked_rows_by_state"]["replayed"] == PARKED
    assert sum(r.evidence_summary["parked_rows_by_state"].values()) == sum(states.values())
    (m,) = records.receipts(instance, dg.AssetKey("fct_daily_gmv"))
    names = {o.check_name for o in m.checks}
    assert "gift_card_gmv" in names and "not_null_fct_daily_gmv_order_date" in names and all(o.passed for o in m.checks)


def test_rerunning_the_replay_by_hand_is_refused_and_nothing_else_runs(loop):
    """The replay step launched again by hand (its config, or the tags of the real run copied) is
    refused before it touches the warehouse: a stage runs once, and only when the sensor dispatched it."""
    from dw_dagster_examples.orders.definitions import build_definitions

    result, instance, home = loop
    cs = change_set(instance)
    defs = build_definitions(home)
    dg.Definitions.validate_loadable(defs)  # what `dagster definitions validate` checks (unique op names, ...)
    wh = DuckDBDatabase(h.warehouse_path(home))
    before = wh.fetch_all("SELECT count(*) FROM analytics.orders")[0][0]
    config = {"ops": {step_op_name("replay"): {"config": {"change_set_id": cs.id, "step_index": 1}}}}
    copied = {k: v for k, v in instance.get_run_by_id(result.run_ids["replay-2"]).tags.items() if k.startswith("dw/")}
    for tags in ({}, copied):
        run = defs.resolve_job_def("dw_step_replay").execute_in_process(instance=instance, run_config=config, tags=tags,
                                                                        raise_on_error=False)
        assert not run.success
        failure = next(e for e in run.all_events if e.is_step_failure).event_specific_data.error.message
        assert ("no dw/ticket" in failure) if not tags else ("belongs to run" in failure), failure
    (done,) = [x for x in step_results(instance, cs) if x["stage"] == "replay-2"]
    assert done["run_id"] == result.run_ids["replay-2"] and done["inserted_rows"] == PARKED
    assert wh.fetch_all("SELECT count(*) FROM analytics.orders")[0][0] == before
    # the stream goes on: nothing new to read; the sink follows the relaxed schema
    stream = defs.resolve_job_def("orders_stream").execute_in_process(instance=instance)
    md = stream.asset_materializations_for_node("orders")[-1].metadata
    assert md["dw/cdc_events"].value == 0 and "shipping_country" not in md["dw/required_columns"].value
    daemon = LocalSensorDaemon(defs, instance)
    assert daemon.tick("dw_check_incident_sensor").run_ids == []
    assert daemon.tick("dw_remediation_sensor").run_ids == []
    assert len(records.incidents(instance)) == 1


def test_a_change_set_without_steps_keeps_its_stages():
    """The store-sales shape: the stage plan is exactly what it was before steps existed."""
    now = utcnow()
    cs = ChangeSet(id="cs-x", version="v", incident_id="inc", diagnosis_id="dg", domain="store_sales", proposer=c.PROPOSER,
                   created_at=now, expires_at=now + dt.timedelta(hours=1), approvers=["a@x.example"], cause_kind="k",
                   summary="s", target_asset=["t"], window=["2026-11-26", "2026-11-27"], diff="", files=[],
                   rebuild_assets=[["m"]], undo_plan=UndoPlan(resource_key="warehouse", table="pos.sales_line",
                                                              partition_column="sale_ts", window=["2026-11-26", "2026-11-27"]))
    keys = ["2026-11-25", "2026-11-26", "2026-11-27", "2026-11-28"]
    assert stage_plan(cs, keys, undo=True) == ["snapshot", "window-1", "rebuild", "verify", "receipt"]
    assert stage_plan(cs, keys) == ["window-1", "rebuild", "verify", "receipt"]


def test_the_documented_timeline_shows_stages_the_demo_prints(loop):
    """docs/snippets/orders/orders_timeline.txt (the page's abridged timeline) uses only stage labels this run printed."""
    def stages(text: str) -> set[str]:
        return {line.split("]", 1)[1].split()[0] for line in text.splitlines() if line.startswith("[")}

    result, _, _ = loop
    documented = (Path(__file__).resolve().parents[2] / "docs/snippets/orders/orders_timeline.txt").read_text()
    assert stages(documented) and stages(documented) <= stages(result.printed_timeline)
