"""Run requests for a bounded window of partitions: the one place that knows Dagster's range tags.

Dagster 1.13 has no public "backfill this partition range" request for sensors
(``shared/reference/dagster_1_13.md`` §2). A single run over a range is requested with the
``dagster/asset_partition_range_start``/``_end`` tags (``ASSET_PARTITION_RANGE_START_TAG`` /
``ASSET_PARTITION_RANGE_END_TAG`` in ``dagster._core.storage.tags``); assets need
``BackfillPolicy.single_run()``. When ``RunRequest.for_asset_partition_range`` ships, only this
module changes.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import dagster as dg
from dw_dagster.dagster_private import public

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def window_run_request(
    *,
    run_key: str,
    assets: Sequence[dg.AssetKey],
    partition_keys: Sequence[str],
    tags: Mapping[str, str] | None = None,
    job_name: str | None = None,
    ordered_keys: Sequence[str] | None = None,
    partitions_def: dg.PartitionsDefinition | None = None,
) -> dg.RunRequest:
    """One run over the contiguous partition range spanned by ``partition_keys``.

    The range's ends are the first and last key in ``ordered_keys`` (the partitions definition's
    own order: a static definition's keys are not alphabetical, a multi-partition's are ordered by
    dimension); without it, in string order (right for time keys in a sortable format only).

    Multi-dimensional keys (``2024-03-09|us``) need ``partitions_def``: Dagster reads a range of
    them as a rectangle (every date between × every region between), so the run is refused when
    that rectangle holds a partition the window does not.

    Raises:
        ValueError: ``partition_keys`` is empty, or multi-dimensional without ``partitions_def``
            or not a full rectangle.
    """
    if not partition_keys:
        raise ValueError("a window needs at least one partition key")
    index = {k: i for i, k in enumerate(ordered_keys or [])}
    keys = sorted(partition_keys, key=lambda k: (index.get(k, len(index)), k))
    if any("|" in k for k in keys):  # a multi-dimensional key: Dagster reads the range as a rectangle
        if not isinstance(partitions_def, dg.MultiPartitionsDefinition):
            raise ValueError(f"partition keys {keys[:3]} are multi-dimensional: pass the asset's partitions_def, so the "
                             "run's range can be checked to hold exactly these partitions")
        covered = set(partitions_def.get_partition_keys_in_range(dg.PartitionKeyRange(keys[0], keys[-1])))
        extra = sorted(covered - set(keys))
        if extra:
            raise ValueError(f"one run over {keys[0]} .. {keys[-1]} would also run {len(extra)} partition(s) not in the "
                             f"window ({', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}): a multi-dimensional "
                             "window runs as one rectangle of partitions; split it into runs per rectangle")
    return dg.RunRequest(
        run_key=run_key,
        job_name=job_name,
        asset_selection=list(assets),
        tags={**(tags or {}), RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]},
    )


@dataclass(frozen=True)
class WindowSplit:
    """Partition keys sorted into what a change set may run now and what it must report.

    ``window``: existing, closed keys, in order, at most the cap; ``over``: such keys beyond the
    cap; ``deferred``: keys of a time-partitioned definition that do not exist *yet* (later than
    its last partition, not past its end) or exist but are still in progress (``end_offset``: the
    newest partition's time window has not ended); ``outside``: keys the definition will never
    hold (before its start, past its end, not in its format, not among its static keys).
    ``available_at`` gives, per deferred key, when it will exist or close (aware UTC);
    ``reasons`` says in words why each deferred or outside key is not in the window.
    """

    window: list[str]
    outside: list[str]
    over: list[str]
    deferred: list[str]
    available_at: dict[str, dt.datetime] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


@public
def partition_window_utc(partitions_def: dg.PartitionsDefinition, key: str) -> tuple[dt.datetime, dt.datetime]:
    """The time window ``[start, end)`` of ``key`` as naive UTC datetimes.

    Works for any time-window definition (hourly, daily, weekly, in any ``timezone``), including
    the repeated hour of a fall-back day (Dagster's ``2026-11-01-01:00-0500`` key) and the
    23-hour day of a spring-forward change; the load code and the diagnosis use it so both speak
    of the same rows.

    Raises:
        ValueError: ``partitions_def`` is not time-partitioned, or ``key`` is not in its format.
    """
    if not isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        raise ValueError(f"{type(partitions_def).__name__} has no time windows")
    tw = partitions_def.time_window_for_partition_key(key)
    return (tw.start.astimezone(dt.timezone.utc).replace(tzinfo=None),
            tw.end.astimezone(dt.timezone.utc).replace(tzinfo=None))


def _exists_at(pdef: dg.TimeWindowPartitionsDefinition, start: dt.datetime, end: dt.datetime) -> dt.datetime:
    """When the partition ``[start, end)`` is created: when the window ``end_offset`` partitions
    before it ends (its own end without an offset, its start with an offset of one)."""
    t = end
    for _ in range(max(0, pdef.end_offset)):
        t = start
        prev = pdef.get_prev_partition_window(start, respect_bounds=False)
        if prev is None:
            break
        start = prev.start
    for _ in range(max(0, -pdef.end_offset)):
        nxt = pdef.get_next_partition_window(t, respect_bounds=False)
        if nxt is None:
            break
        t = nxt.end
    return t.astimezone(dt.timezone.utc)


def _holder(pdef: dg.TimeWindowPartitionsDefinition, key: str, fallback: str) -> str:
    """The partition whose time window holds the time ``key`` names, for a key that is not a
    partition's own (a Tuesday given to weekly partitions). Dagster's ``time_window_for_partition_key``
    answers the *next* window for such a key; the week that holds the Tuesday is the one before."""
    try:
        at = dt.datetime.strptime(key, pdef.fmt)
        if at.tzinfo is None:
            at = at.replace(tzinfo=zoneinfo.ZoneInfo(pdef.timezone or "UTC"))
        return pdef.get_partition_key_for_timestamp(at.timestamp())
    except Exception:  # a key Dagster parses but strptime does not (or before the first partition)
        return fallback


def _dynamic(pdef: dg.PartitionsDefinition) -> bool:
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        return any(isinstance(d.partitions_def, dg.DynamicPartitionsDefinition) for d in pdef.partitions_defs)
    return isinstance(pdef, dg.DynamicPartitionsDefinition)


def _split_multi(pdef: dg.MultiPartitionsDefinition, wanted: Sequence[str], max_partitions: int, now: dt.datetime,
                 instance) -> WindowSplit:
    """:func:`split_window` of a multi-dimensional definition with a time dimension: the time part
    of each key is judged as its own time-window definition would be (still in progress, not yet,
    never), the other parts by membership."""
    time_dim = pdef.time_window_dimension
    inside, outside, deferred, available, reasons = [], [], [], {}, {}
    parsed = {}
    for k in sorted(set(wanted)):
        try:
            parsed[k] = pdef.get_partition_key_from_str(k).keys_by_dimension
        except Exception:  # not "a|b" with one part per dimension
            outside.append(k)
            reasons[k] = "not a partition key of this definition"
    times = split_window(time_dim.partitions_def, [v[time_dim.name] for v in parsed.values()], len(parsed) + 1, now=now)
    for k, parts in parsed.items():
        bad = [f"{d.name} {parts[d.name]!r}" for d in pdef.partitions_defs if d.name != time_dim.name
               and parts[d.name] not in d.partitions_def.get_partition_keys(dynamic_partitions_store=instance)]
        t = parts[time_dim.name]
        if bad:
            outside.append(k)
            reasons[k] = f"{', '.join(bad)} is not one of the dimension's partitions"
        elif t in times.outside:
            outside.append(k)
            reasons[k] = f"{time_dim.name} {t}: {times.reasons[t]}"
        elif t in times.deferred:
            deferred.append(k)
            available[k] = times.available_at[t]
            reasons[k] = f"{time_dim.name} {t}: {times.reasons[t]}"
        else:
            inside.append(k)
    return WindowSplit(inside[:max_partitions], sorted(outside), inside[max_partitions:], deferred, available, reasons)


def split_window(partitions_def: dg.PartitionsDefinition, wanted: Sequence[str], max_partitions: int,
                 *, now: dt.datetime | None = None, instance=None) -> WindowSplit:
    """Sort ``wanted`` partition keys into window / outside / over the cap / deferred (never dropped, never invented).

    Args:
        partitions_def: the asset's partitions.
        wanted: the keys a cause reaches, in any order, repeated or not.
        max_partitions: the domain's window cap.
        now: the current time (aware, or naive UTC; default: the clock), to tell a partition still
            in progress from a closed one and when a missing one will exist.
        instance: the Dagster instance, for dynamic partitions (refused without it).

    Returns:
        A :class:`WindowSplit`; every wanted key is in exactly one of its four lists.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    now = now if now.tzinfo else now.replace(tzinfo=dt.timezone.utc)
    if _dynamic(partitions_def) and instance is None:
        raise ValueError(f"{type(partitions_def).__name__} has dynamic partitions: pass the Dagster instance that holds "
                         "them (split_window(..., instance=...))")
    if isinstance(partitions_def, dg.MultiPartitionsDefinition) and partitions_def.has_time_window_dimension:
        return _split_multi(partitions_def, wanted, max_partitions, now, instance)
    timed = isinstance(partitions_def, dg.TimeWindowPartitionsDefinition)
    existing = (partitions_def.get_partition_keys(current_time=now) if timed
                else partitions_def.get_partition_keys(dynamic_partitions_store=instance))
    valid = set(existing)
    inside, outside, deferred = [], [], []
    available: dict[str, dt.datetime] = {}
    reasons: dict[str, str] = {}
    last_start = partitions_def.time_window_for_partition_key(existing[-1]).start if timed and existing else None
    first_start = partitions_def.time_window_for_partition_key(existing[0]).start if timed and existing else None
    for k in sorted(set(wanted)):
        if not timed:
            if k in valid:
                inside.append(k)
            else:
                outside.append(k)
                reasons[k] = "not one of the definition's partitions"
            continue
        try:
            tw = partitions_def.time_window_for_partition_key(k)
            canonical = partitions_def.get_partition_key_for_timestamp(tw.start.timestamp())
        except Exception:  # not in the definition's format (Dagster raises several kinds)
            outside.append(k)
            reasons[k] = "not a partition key of this definition"
            continue
        if canonical != k:
            outside.append(k)
            holder = _holder(partitions_def, k, canonical)
            reasons[k] = f"not a partition key of this definition (its time is in partition {holder})"
        elif k in valid:
            if tw.end > now:  # end_offset: the partition exists but its time window is not over
                deferred.append(k)
                available[k] = tw.end.astimezone(dt.timezone.utc)
                reasons[k] = "still in progress"
            else:
                inside.append(k)
        elif first_start is not None and tw.start < first_start:
            outside.append(k)
            reasons[k] = "before the first partition"
        elif partitions_def.end is not None and tw.start >= partitions_def.end:
            outside.append(k)
            reasons[k] = "after the definition's end"
        elif last_start is None or tw.start > last_start:
            deferred.append(k)
            available[k] = _exists_at(partitions_def, tw.start, tw.end)
            reasons[k] = "does not exist yet"
        else:
            outside.append(k)
            reasons[k] = "excluded by the definition"
    return WindowSplit(inside[:max_partitions], outside, inside[max_partitions:], deferred, available, reasons)


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
