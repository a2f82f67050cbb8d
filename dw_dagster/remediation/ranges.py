"""Run requests for a bounded window of partitions: the one place that knows Dagster's range tags.

Dagster 1.13 has no public "backfill this partition range" request for sensors
(``shared/reference/dagster_1_13.md`` §2). A single run over a range is requested with the
``dagster/asset_partition_range_start``/``_end`` tags (``ASSET_PARTITION_RANGE_START_TAG`` /
``ASSET_PARTITION_RANGE_END_TAG`` in ``dagster._core.storage.tags``); assets need
``BackfillPolicy.single_run()``. When ``RunRequest.for_asset_partition_range`` ships, only this
module changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dagster as dg

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def window_run_request(
    *,
    run_key: str,
    assets: Sequence[dg.AssetKey],
    partition_keys: Sequence[str],
    tags: Mapping[str, str] | None = None,
    job_name: str | None = None,
) -> dg.RunRequest:
    """One run over the contiguous partition range spanned by ``partition_keys``.

    Raises:
        ValueError: ``partition_keys`` is empty.
    """
    if not partition_keys:
        raise ValueError("a window needs at least one partition key")
    keys = sorted(partition_keys)
    return dg.RunRequest(
        run_key=run_key,
        job_name=job_name,
        asset_selection=list(assets),
        tags={**(tags or {}), RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]},
    )


def bound_window(
    partitions_def: dg.PartitionsDefinition, wanted: Sequence[str], max_partitions: int
) -> tuple[list[str], list[str], list[str]]:
    """Split wanted partition keys into (window, outside the definition, over the cap).

    Keys the partitions definition does not contain are reported, never invented; the window is
    the first ``max_partitions`` valid keys in order, the rest are reported as over the cap.
    """
    valid = set(partitions_def.get_partition_keys())
    inside = sorted(k for k in set(wanted) if k in valid)
    outside = sorted(k for k in set(wanted) if k not in valid)
    return inside[:max_partitions], outside, inside[max_partitions:]
