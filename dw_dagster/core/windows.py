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
from typing import NamedTuple

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


class WindowSplit(NamedTuple):
    """Partition keys sorted into what a change set may run now and what it must report.

    ``window``: existing keys, in order, at most the cap; ``over``: existing keys beyond the cap;
    ``deferred``: keys of a time-partitioned definition that do not exist *yet* (later than its
    last partition, not past its end); ``outside``: keys the definition will never hold (before its
    start, past its end, or not in its format / not among its static keys).
    """

    window: list[str]
    outside: list[str]
    over: list[str]
    deferred: list[str]


def split_window(partitions_def: dg.PartitionsDefinition, wanted: Sequence[str], max_partitions: int) -> WindowSplit:
    """Sort ``wanted`` partition keys into window / outside / over the cap / deferred (never dropped, never invented)."""
    import datetime as dt

    existing = partitions_def.get_partition_keys()
    valid = set(existing)
    inside = sorted(k for k in set(wanted) if k in valid)
    outside, deferred = [], []
    for k in sorted(set(wanted) - valid):
        if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
            try:
                start = dt.datetime.strptime(k, partitions_def.fmt)
            except ValueError:
                outside.append(k)
                continue
            last = dt.datetime.strptime(existing[-1], partitions_def.fmt) if existing else None
            end = partitions_def.end.replace(tzinfo=None) if partitions_def.end is not None else None
            if last is not None and start > last and (end is None or start < end):
                deferred.append(k)
                continue
        outside.append(k)
    return WindowSplit(inside[:max_partitions], outside, inside[max_partitions:], deferred)


def bound_window(
    partitions_def: dg.PartitionsDefinition, wanted: Sequence[str], max_partitions: int
) -> tuple[list[str], list[str], list[str]]:
    """Split wanted partition keys into (window, outside the definition or not existing yet, over the cap).

    Keys the partitions definition does not contain are reported, never invented; the window is
    the first ``max_partitions`` valid keys in order, the rest are reported as over the cap. See
    :func:`split_window` to tell "not yet" from "never".
    """
    s = split_window(partitions_def, wanted, max_partitions)
    return s.window, sorted(s.outside + s.deferred), s.over
