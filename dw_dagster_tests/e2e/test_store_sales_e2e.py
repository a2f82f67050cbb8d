"""The whole store-sales loop on a real Dagster instance, sensors evaluated through Dagster."""

import io
from pathlib import Path

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.databases import DuckDBDatabase
from dw_dagster_examples.store_sales import home as h
from dw_dagster_examples.store_sales.definitions import build_definitions
from dw_dagster_examples.store_sales.demo import OWNER, run_store_sales_demo
from dw_dagster_dev.demo import Timeline
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core import records
from dw_dagster.core.windows import RANGE_END_TAG, RANGE_START_TAG

SCALE = 0.002


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    root = tmp_path_factory.mktemp("store_sales")
    (root / "dagster_home").mkdir()
    with pytest.MonkeyPatch.context() as mp, dg.instance_for_test(temp_dir=str(root / "dagster_home")) as instance:
        mp.setenv(h.HOME_ENV, str(root / "home"))
        printed = io.StringIO()
        result = run_store_sales_demo(home=root / "home", instance=instance, scale=SCALE, log=Timeline(printed))
        result.printed_timeline = printed.getvalue()
        yield result, instance, root / "home"


def test_gap_before_is_southwest_only(loop):
    result, _, _ = loop
    assert result.gap_before["Southwest"] == pytest.approx(1.8, abs=0.01)
    assert {r: p for r, p in result.gap_before.items() if r != "Southwest"} == {
        "Midwest": 0.0, "Northeast": 0.0, "Southeast": 0.0, "West": 0.0}
    assert result.gap_rows_before == round(212_400 * SCALE)


def test_cause_window_and_blast_radius(loop):
    result, instance, _ = loop
    assert result.cause == "late_rows_behind_watermark"
    assert result.window == ["2026-11-26", "2026-11-27"]
    (diag,) = records.diagnoses(instance)
    cause = diag.primary
    assert cause.explained_rows == result.gap_rows_before and cause.unexplained_rows == 0
    assert cause.details["tied_with_watermark_rows"] == 19
    assert cause.details["proposed_lookback_hours"] == 72
    assert [m.name for m in diag.blast_radius.models] == ["fct_store_sales_daily", "region_sales_daily", "region_sales_mtd"]
    assert [e.owner_email for e in diag.blast_radius.exposures] == ["priya.raman@grocer.example"]


def test_the_store_pnl_is_needed_by_8_and_its_extract_refreshed_before(loop):
    """Issue 31: ``demo store-sales --json`` names the Store P&L exposure's ``needed_by`` and the Tableau
    extract refresh (the fake Tableau) after the verified receipt, before the deadline."""
    import datetime as dt
    import json

    result, _, _ = loop
    out = json.loads(result.to_json())
    assert out["needed_by"] == {"store_pnl": "08:00 America/Chicago"}
    (b,) = out["bi_refreshed"]
    assert (b["exposure"], b["tool"], b["before_deadline"], b["error"]) == ("store_pnl", "tableau", True, None)
    assert dt.datetime.fromisoformat(b["refreshed_at"]) <= dt.datetime.fromisoformat(b["deadline"])
    assert "store_pnl (tableau) refreshed at" in result.printed_timeline


def test_change_set_diff_and_refusals(loop):
    result, instance, home = loop
    cs = records.find_change_set(instance, result.change_set_id)
    assert "-watermark_column: sale_ts" in cs.diff and "+watermark_column: posted_ts" in cs.diff
    assert "+lookback_hours: 72" in cs.diff
    assert cs.new_tests == ["dbt_project/tests/assert_fct_store_sales_daily_counts_match_landed_rows.sql"]
    assert (h.repo_dir(home) / cs.new_tests[0]).exists()  # merged by the owner's step
    refused = {r["approver"]: r["reason"] for r in records.refusals(instance, cs.id)}
    assert set(refused) == {c.PROPOSER, OWNER, "sam.lee@grocer.example"}
    assert "needs a verified identity" in refused[OWNER]  # the owner's email typed by someone else
    assert "not an approver" in refused["sam.lee@grocer.example"]  # logged in, verified, not listed
    (approval,) = records.approvals(instance, cs.id)
    assert approval.approver == OWNER == result.approver
    assert approval.identity.method == "oidc" and approval.identity.issuer == result.approval_identity["issuer"]
    assert result.approval_identity["method"] == "oidc" and result.approval_identity["issuer"].startswith("http://127.0.0.1:")


def test_gap_after_is_zero_everywhere(loop):
    result, _, _ = loop
    assert result.gap_after == {"Midwest": 0.0, "Northeast": 0.0, "Southeast": 0.0, "Southwest": 0.0, "West": 0.0}
    assert result.ok and result.verified


def test_one_window_run_over_the_range(loop):
    result, instance, _ = loop
    run = instance.get_run_by_id(result.run_ids["window-1"])
    assert (run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) == ("2026-11-26", "2026-11-27")
    cs = records.find_change_set(instance, result.change_set_id)
    assert run.tags["dagster/run_key"] == f"{cs.id}:{cs.version[:16]}:window-1:{run.tags['dw/ticket'][:10]}"
    from dw_dagster.core.ledger import ledger_for

    stages = ledger_for(instance).stages(cs.id, cs.version)
    assert {s: st.state for s, st in stages.items()} == {
        "snapshot": "succeeded", "window-1": "succeeded", "rebuild": "succeeded", "verify": "succeeded", "receipt": "succeeded"}
    assert stages["window-1"].run_id == run.run_id


def test_receipts_on_every_touched_asset(loop):
    result, instance, _ = loop
    assert result.receipt_assets == ["fct_store_sales_daily", "region_sales_daily", "region_sales_mtd", "store_sales_line"]
    (r,) = records.receipts(instance, dg.AssetKey("store_sales_line"))
    assert r.cause_kind == "late_rows_behind_watermark" and r.approver == OWNER and r.signature_valid
    assert r.partitions == ["2026-11-26", "2026-11-27"]
    assert set(r.run_ids) == {"snapshot", "window-1", "rebuild", "verify"}
    assert r.rows_before['{"region": "Southwest"}']["gap_rows"] == result.gap_rows_before
    assert r.rows_after['{"region": "Southwest"}']["gap_rows"] == 0
    assert {o.check_name for o in r.checks} == {"region_compare", "daily_volume", "null_rate"} and all(o.passed for o in r.checks)
    assert "git apply -R" in r.undo and "+watermark_column: posted_ts" in r.diff
    (m,) = records.receipts(instance, dg.AssetKey("fct_store_sales_daily"))
    assert any(o.check_name.startswith("assert_fct_store_sales_daily_counts") and o.passed for o in m.checks)
    obs = [r.asset_observation.metadata for r in records.iter_observations(instance, dg.AssetKey("store_sales_line"))]
    (md,) = [m for m in obs if c.RECEIPT_KEY in m]
    assert c.RECEIPT_MD_KEY in md


def test_every_receipt_states_what_its_repair_cost(loop):
    """The queries (here: DuckDB, no billing) and seconds of the runs that held the stages, by stage; the
    rebuild's dbt nodes with dbt's own timings (dagster-dbt's Execution Duration from run_results)."""
    from dw_dagster.receipts.job import receipt_markdown

    result, instance, _ = loop
    for r in records.receipts(instance):
        cost = r.evidence_summary[c.REPAIR_COST_KEY]
        assert cost == result.repair_cost
        assert set(cost["by_stage"]) == set(r.run_ids) and cost["runs"] == len(r.run_ids)
        assert cost["seconds"] == pytest.approx(sum(cost["by_stage"].values()), abs=0.01)
        assert cost["by_stage"]["rebuild"] > 0
        assert {"model.store_sales.fct_store_sales_daily", "model.store_sales.region_sales_daily"} <= set(cost["dbt_nodes"])
        assert any(k.startswith("test.store_sales.") for k in cost["dbt_nodes"])
        assert "**Repair cost**: 4 run(s)" in receipt_markdown(r)
    assert "the repair cost" in result.printed_timeline


def test_lightup_driven_timeline(loop):
    """Lightup raised it, dw_dagster commented, paged, asked Slack, and closed everything with the receipt."""
    from dw_dagster.integrations.notifications import notifications

    result, instance, _ = loop
    (inc,) = records.incidents(instance)
    assert (result.incident_source, inc.source, inc.external_id) == ("lightup", "lightup", result.lightup_incident)
    assert inc.gap_rows == result.gap_rows_before and inc.slices[0].slice == {"region": "Southwest"}
    assert [d.isoformat()[:10] for d in (inc.window_start, inc.window_end)] == ["2026-11-26", "2026-11-28"]
    assert result.page_annotated and result.page_resolved and result.lightup_closed and result.receipt_verified
    assert not result.page_retriggered and result.escalated_to == []
    assert (result.lightup_gap_after, result.lightup_comments, result.slack_messages) == (0.0, 2, 3)  # + the owner's DM
    assert result.approval_dms == ["dana.ortiz@grocer.example"] and result.unreachable == []
    assert result.review_page_url == f"http://127.0.0.1:8770/incidents/{inc.id}"
    assert result.outcome_in_messages == {"pager": True, "slack": True, "lightup": True}
    sent = [(n["channel"], n["action"]) for n in notifications(instance)]
    assert sorted(sent) == sorted([("pager", "trigger"), ("lightup", "comment"), ("pager", "annotate"),
                                   ("slack", "approval_request"), ("slack_dm:dana.ortiz@grocer.example", "approval_request"),
                                   ("lightup", "verify"), ("pager", "resolve"), ("slack", "resolved")])
    last = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(dg.AssetKey("store_sales_line"), "lightup_compare"))
    assert last.event.dagster_event.event_specific_data.passed


def test_incident_opened_exactly_once(loop):
    result, instance, home = loop
    assert [i.id for i in records.incidents(instance)] == [result.incident_id]
    # a later tick sees the passing evaluation and opens nothing
    daemon = LocalSensorDaemon(build_definitions(home), instance)
    assert daemon.tick("dw_check_incident_sensor").run_ids == []
    assert daemon.tick("dw_remediation_sensor").run_ids == []
    assert len(records.incidents(instance)) == 1


def test_rerunning_the_approved_window_twice_leaves_each_line_once(loop):
    result, instance, home = loop
    defs = build_definitions(home)
    job = defs.resolve_job_def("dw_rerun_window")
    for _ in range(2):
        assert job.execute_in_process(instance=instance, tags={RANGE_START_TAG: "2026-11-26", RANGE_END_TAG: "2026-11-27"}).success
    wh = DuckDBDatabase(h.warehouse_path(home))
    total, distinct = wh.fetch_all("SELECT count(*), count(DISTINCT sales_line_id) FROM pos.sales_line")[0]
    src = DuckDBDatabase(h.source_path(home)).fetch_all("SELECT count(*) FROM pos.sales_line")[0][0]
    assert total == distinct == src


def test_window_was_kept_before_the_rerun_for_undo(loop):
    from dw_dagster.repair.undo import partition_checksum, propose_undo, recorded_snapshot

    result, instance, home = loop
    snap = recorded_snapshot(instance, result.change_set_id, ["store_sales_line"])
    assert snap["table"] == "pos.sales_line" and snap["window"] == ["2026-11-26", "2026-11-27"]
    assert [s["keys"] for s in snap["partitions"]["slices"]] == [["2026-11-26", "2026-11-27"]]  # one range, from the definition
    rows_now, _ = partition_checksum(DuckDBDatabase(h.warehouse_path(home)), "pos.sales_line", "sale_ts", snap["partitions"])
    assert snap["rows"] + result.gap_rows_before == rows_now
    undo = propose_undo(instance, result.change_set_id)
    assert undo.change_classes == ["undo"] and undo.approvers == [OWNER]


def test_the_documented_timeline_shows_stages_the_demo_prints(loop):
    """docs/snippets/getting-started/store_sales_timeline.txt (the page's abridged timeline) uses only stage labels this run printed."""
    def stages(text: str) -> set[str]:
        return {line.split("]", 1)[1].split()[0] for line in text.splitlines() if line.startswith("[")}

    result, _, _ = loop
    documented = (Path(__file__).resolve().parents[2] / "docs/snippets/getting-started/store_sales_timeline.txt").read_text()
    assert stages(documented) and stages(documented) <= stages(result.printed_timeline)
