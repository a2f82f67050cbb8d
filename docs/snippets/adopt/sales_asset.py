import datetime as dt
import dagster as dg
from dw_dagster import DatabaseResource, IncrementalLoadSpec, load_metadata, load_partition

DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01")

@dg.asset(key="sales", partitions_def=DAILY, backfill_policy=dg.BackfillPolicy.single_run())
def sales(context: dg.AssetExecutionContext, source: DatabaseResource, warehouse: DatabaseResource):
    spec = IncrementalLoadSpec.from_file("pipelines/sales.yaml")   # read at run time: a merged fix applies
    results = []
    for key in context.partition_keys:
        window = DAILY.time_window_for_partition_key(key)
        start, end = (t.astimezone(dt.timezone.utc).replace(tzinfo=None) for t in (window.start, window.end))
        results.append(load_partition(source.get_database(), warehouse.get_database(), spec, key, start, end))
    return dg.MaterializeResult(metadata=load_metadata(results))
