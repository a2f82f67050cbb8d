"""A day x region asset that dw_dagster can snapshot, rerun, verify and undo by partition.

The repair reads the asset's own PartitionsDefinition: a partition's rows are the day's half-open
range on the time column (the New York day, 25 hours on 1 November) AND the static dimension's
own column, named in the asset's ``dw/partition_columns`` metadata (default: the dimension's name).
"""

import dagster as dg

from dw_dagster.databases.partitions import partition_filter, predicate

PARTITIONS = dg.MultiPartitionsDefinition({
    "day": dg.DailyPartitionsDefinition(start_date="2026-11-01", timezone="America/New_York"),
    "area": dg.StaticPartitionsDefinition(["US", "EU"]),
})


@dg.asset(partitions_def=PARTITIONS, backfill_policy=dg.BackfillPolicy.single_run(),
          metadata={"dw/partition_columns": {"area": "region"}})  # the dimension "area" is the column region
def sales(context: dg.AssetExecutionContext) -> None:
    ...  # load context.partition_keys (keys join the dimensions sorted by name: "US|2026-11-01")


# the rows an undo snapshot of partition US|2026-11-01 keeps (sale_ts: a naive UTC timestamp)
WHERE = predicate(partition_filter(PARTITIONS, ["US|2026-11-01"], "sale_ts", {"area": "region"})).sql("postgres")
