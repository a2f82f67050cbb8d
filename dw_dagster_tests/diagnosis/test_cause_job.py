"""IncrementalLoadDiagnoser runs the other causes next to the watermark one and combines them."""

import datetime as dt
from pathlib import Path

import dagster as dg

from dw_dagster.databases import DatabaseResource, DuckDBDatabase
from dw_dagster.diagnosis.combine import combine_findings
from dw_dagster.diagnosis.causes.dead_letter import DeadLetterTable
from dw_dagster.diagnosis.job import IncrementalLoadDiagnoser
from dw_dagster.pipelines.incremental import IncrementalLoadSpec
from dw_dagster.core.models import Incident

DAILY = dg.DailyPartitionsDefinition(start_date="2024-03-01", end_date="2024-03-08")
SPEC = IncrementalLoadSpec(source_table="app.events", target_table="app.events", merge_key="id", partition_column="ts",
                           watermark_column="ts", columns=["id", "ts", "customer_id"])


def _diagnoser(**kw):
    return IncrementalLoadDiagnoser(
        target_asset=dg.AssetKey("events"), source_resource_key="src", target_resource_key="wh",
        pipeline_root=lambda: Path("."), pipeline_file="unused.yaml", manifest_path=lambda: Path("unused.json"),
        partitions_def=DAILY, domains_file=lambda: Path("unused.yaml"), dbt_asset_keys={}, verify_checks=[], **kw)


def test_other_causes_inside_the_diagnoser(tmp_path):
    src, wh = DuckDBDatabase(tmp_path / "src.duckdb"), DuckDBDatabase(tmp_path / "wh.duckdb")
    src.execute("CREATE SCHEMA app; CREATE TABLE app.events (id INT, ts TIMESTAMP, customer_id INT)")
    src.execute("INSERT INTO app.events SELECT i, TIMESTAMP '2024-03-05 00:00:00' + INTERVAL (i) HOUR, "
                "CASE WHEN i IN (4, 7) THEN NULL ELSE i END FROM range(1, 11) t(i)")
    wh.execute("CREATE SCHEMA app; CREATE TABLE app.events (id INT, ts TIMESTAMP, customer_id INT NOT NULL)")
    for r in src.fetch_all("SELECT id, ts, customer_id FROM app.events WHERE id NOT IN (4, 7, 9)"):
        wh.execute(f"INSERT INTO app.events VALUES ({r[0]}, TIMESTAMP '{r[1]}', {r[2]})")
    wh.execute("CREATE TABLE app.events_dlq (id INT, payload VARCHAR, error VARCHAR)")
    wh.execute("INSERT INTO app.events_dlq VALUES (4, '{}', 'missing required field'), (7, '{}', 'missing required field')")
    resources = {"src": DatabaseResource(url=f"duckdb:///{tmp_path / 'src.duckdb'}"),
                 "wh": DatabaseResource(url=f"duckdb:///{tmp_path / 'wh.duckdb'}")}
    incident = Incident(id="inc-x", asset_key=["events"], source="manual", detected_at=dt.datetime.now(dt.timezone.utc),
                        summary="3 rows short", gap_rows=3, window_start=dt.datetime(2024, 3, 5, tzinfo=dt.timezone.utc),
                        window_end=dt.datetime(2024, 3, 6, tzinfo=dt.timezone.utc))
    diagnoser = _diagnoser(dead_letter=DeadLetterTable("app.events_dlq", ["id"], "payload", "error"))
    with dg.instance_for_test() as instance:
        context = dg.build_op_context(instance=instance, resources=resources)
        window = diagnoser._scan_window(incident, {})
        assert window == (dt.datetime(2024, 3, 5), dt.datetime(2024, 3, 6))
        found = diagnoser._other_causes(context, incident, SPEC, resources["src"].get_database(),
                                        resources["wh"].get_database(), window)
    kinds = [f.kind for f in found]
    assert kinds == ["required_null_dead_letter", "duplicate_load"]  # no asset graph here, no dw/schema snapshots
    nulls = found[0]
    assert (nulls.explained_rows, nulls.unexplained_rows, nulls.details["variant"]) == (2, 1, "dead_letter")
    assert nulls.details["pushed_down"] is False and nulls.window == ["2024-03-05"]
    combined = combine_findings(incident.gap_rows, found)
    assert (combined.explained_rows, combined.unexplained_rows) == (2, 1)
    assert [f.kind for f in combined.findings] == ["required_null_dead_letter", "duplicate_load", "unexplained"]
    # without a window from the incident: the latest scan_days loaded partitions
    loads = {pk: {"partition_start": f"{pk}T00:00:00", "partition_end": f"2024-03-0{int(pk[-1]) + 1}T00:00:00"}
             for pk in ("2024-03-01", "2024-03-02", "2024-03-03")}
    no_window = incident.model_copy(update={"window_start": None, "window_end": None})
    assert _diagnoser(scan_days=2)._scan_window(no_window, loads) == (dt.datetime(2024, 3, 2), dt.datetime(2024, 3, 4))


def test_nothing_to_test_without_required_columns_or_dead_letter(tmp_path):
    wh = DuckDBDatabase(tmp_path / "wh.duckdb")
    wh.execute("CREATE SCHEMA app; CREATE TABLE app.events (id INT, ts TIMESTAMP, customer_id INT)")
    incident = Incident(id="inc-y", asset_key=["events"], source="manual", detected_at=dt.datetime.now(dt.timezone.utc),
                        summary="", gap_rows=0)
    with dg.instance_for_test() as instance:
        context = dg.build_op_context(instance=instance)
        found = _diagnoser(check_duplicates=False, check_upstream=False)._other_causes(context, incident, SPEC, wh, wh, None)
    assert found == []


def test_upstream_and_schema_causes_with_an_asset_graph(tmp_path):
    from dw_dagster.diagnosis.causes.schema_change import schema_metadata, take_schema_snapshot

    @dg.asset(key="raw_events")
    def raw_events():
        return None

    @dg.asset(key="events", deps=[raw_events])
    def events():
        return None

    graph = dg.Definitions(assets=[raw_events, events]).resolve_asset_graph()
    wh = DuckDBDatabase(tmp_path / "wh.duckdb")
    wh.execute("CREATE SCHEMA app; CREATE TABLE app.events (id INT, ts TIMESTAMP, customer_id INT)")
    incident = Incident(id="inc-z", asset_key=["events"], source="manual", detected_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5),
                        summary="", gap_rows=7)
    with dg.instance_for_test() as instance:
        snap = lambda: dg.AssetObservation("raw_events", metadata=schema_metadata(take_schema_snapshot(wh, "app.events")))  # noqa: E731
        instance.report_runless_asset_event(snap())
        instance.report_runless_asset_event(dg.AssetMaterialization("raw_events"))
        wh.execute("ALTER TABLE app.events DROP COLUMN customer_id")
        instance.report_runless_asset_event(snap())
        instance.report_runless_asset_event(dg.AssetMaterialization("events"))
        instance.report_runless_asset_event(dg.AssetMaterialization("events"))  # again, on the same upstream data
        context = dg.build_op_context(instance=instance)
        d = _diagnoser(check_duplicates=False, asset_graph=lambda: graph)
        found = d._other_causes(context, incident, SPEC, wh, wh, None)
    assert [f.kind for f in found] == ["upstream_not_refreshed_or_failed", "schema_change"]
    assert found[0].details["upstream"][0]["signals"] == ["not_refreshed_between_runs"]
    assert "customer_id dropped" in found[1].summary and found[1].unexplained_rows == 7
    combined = combine_findings(incident.gap_rows, found)
    assert (combined.explained_rows, combined.unexplained_rows) == (0, 7)  # neither counts rows: all unexplained
    assert combined.findings[0].kind == "upstream_not_refreshed_or_failed" and combined.findings[-1].kind == "unexplained"
