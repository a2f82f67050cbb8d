"""A sensor that watches the row counts of many tables cheaply and opens an incident on an anomaly.

:func:`build_volume_sensor` reads, on every tick, the row count of each watched table
(:class:`VolumeTable`) from its warehouse's catalog, scores each changed count against that
table's own baseline with the volume check's method
(:func:`dw_dagster.checks.volume.score_against_baseline`: z-score or MAD band, sensitivity,
``min_history``, a floor on the band width, never below 0 rows), records counts in the
row-count history store (:mod:`.store`) and shows them as ``AssetObservation``\\ s (each one, or a
summary above 1,000 tables), and opens one :class:`~dw_dagster.core.models.Incident`
(``source="volume_sensor"``) per anomaly.

How the counts are read: :mod:`.counts`; how their history is kept between ticks: :mod:`.history`;
one tick in order, with where its time went in its log line: :mod:`.tick`.

Failures never fail the tick: a missing table is listed in the skip reason and the log; a warehouse
that cannot be reached, or whose catalog query fails, has its tables skipped for this tick with a
logged error while the others are scored (a DuckDB file whose write lock another process holds
for more than :data:`DUCKDB_LOCK_WAIT_S` seconds too); an unexpected error is logged and the tick
is skipped with the cursor unchanged.

Incidents
---------

A count scored ``low``, ``high`` or ``no_rows`` (0 rows under a baseline band above 0) or, for a
dead-letter spec, any growth against the previous recorded count (``grew``, with the increase in
rows) opens one incident: an ``AssetObservation`` with ``dw/incident`` / ``dw/incident_id`` on the
table's asset, and a ``RunRequest`` of ``diagnosis_job_name`` when given (run key: the incident's,
:func:`~dw_dagster.detection.incidents.diagnosis_run_key`; the incident id hashes the table, the
partition, the window between the previous recorded count and this one and the count, so it
never repeats). While the asset has an open incident (no receipt closed it,
:func:`dw_dagster.detection.incidents.open_incident`), no other is opened; the observation names
the open one instead, and an anomaly is new evidence for an incident whose diagnosis failed.
Every tick requests again the diagnosis of each of its incidents still waiting for it (a tick
whose requests were lost, a "Test sensor" evaluation), under the same run key: the daemon
launches it once (:func:`~dw_dagster.detection.incidents.rediagnosis_requests`). ``insufficient_history`` is an explicit
status of its own: neither a pass nor an incident.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.databases import Database
from dw_dagster.detection.volume.counts import VolumeTable, _first_line
from dw_dagster.detection.volume.store import MAX_SENSOR_CHARS
from dw_dagster.detection.volume.tick import ANOMALY_STATUSES, SHOWN_GRACE_S, VolumeSettings, VolumeTicker
from dw_dagster.dagster_private import public

#: ``observations="auto"`` shows every recorded count up to this many tables, a summary above
AUTO_SUMMARY_TABLES = 1000

#: metadata key: counts recorded since the table's previous observation and not shown one by one
VOLUME_UNOBSERVED_KEY = c.VOLUME_UNOBSERVED_KEY

__all__ = ["ANOMALY_STATUSES", "AUTO_SUMMARY_TABLES", "SHOWN_GRACE_S", "VOLUME_UNOBSERVED_KEY", "build_volume_sensor",
           "watched_asset_keys"]


@public
def build_volume_sensor(
    *,
    tables: Sequence[VolumeTable],
    databases: Mapping[str, Database | Callable[[], Database]] | None = None,
    name: str = c.VOLUME_SENSOR,
    method: str = "zscore",
    sensitivity: float = 3.0,
    min_history: int = 7,
    history_length: int = 28,
    min_band_pct: float = 2.0,
    min_same_weekday: int = 3,
    record_unchanged_every_seconds: float = 86_400,
    confirm_empty_seconds: float = 120,
    row_counts: Literal["metadata", "count"] = "metadata",
    observations: Literal["auto", "every_count", "summary"] = "auto",
    max_observations_per_tick: int = 1000,
    minimum_interval_seconds: int = 300,
    diagnosis_job_name: str | None = None,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
    clock: Callable[[], dt.datetime] | None = None,
) -> dg.SensorDefinition:
    """A sensor that watches the row counts of many tables and opens an incident per anomaly.

    Each tick: one catalog query per warehouse (plus ``COUNT(*)`` batches where the module
    docstring says so), each changed count scored against its table's baseline and recorded
    as an ``AssetObservation``, one incident per anomalous table (see the module docstring for
    where counts come from, when they are recorded and how the history is kept).

    Args:
        tables: the watched tables (:class:`VolumeTable`); ids must be unique.
        databases: warehouse key → :class:`~dw_dagster.databases.Database` or a zero-argument
            callable returning one (called every tick). A spec's ``database`` not in this mapping
            is a Dagster resource key (declared as a required resource of the sensor).
        name: sensor name.
        method: ``"zscore"`` (mean and sample stddev, Elementary's) or ``"mad"`` (median and
            1.4826 × median absolute deviation), as in :func:`~dw_dagster.checks.build_volume_check`.
        sensitivity: band half-width in standard deviations (or scaled MADs); default 3.
        min_history: fewest earlier recorded counts (partitions, for a partitioned spec) needed
            to score; fewer gives the status ``insufficient_history``, never a pass or an incident.
        history_length: earlier recorded counts (partitions) in a baseline; default 28.
        min_band_pct: floor on the band half-width in % of the baseline mean (default 2 %), so a
            near-constant count does not alert on noise.
        min_same_weekday: for a spec counting one day's partition (an ISO date) with at least
            ``min_history`` earlier recorded days, the baseline is the earlier recorded days of
            the same weekday when at least this many are in the history, else every earlier
            recorded day: the volume check's rule (weekly
            seasonality: a quiet weekend is scored against weekends, a weekday against its own
            weekday). 0 turns it off. The band's floor (``min_band_pct``) and its lower bound
            (never below 0 rows) are the check's too.
        record_unchanged_every_seconds: an unchanged count is recorded again after this many
            seconds (default 86,400 s: once a day); changed counts are recorded every tick.
        confirm_empty_seconds: a table (or partition) that held rows and reads empty is scored only
            when a tick at least this many seconds later still reads it empty (default 120 s): an
            empty reading right after a truncate-and-reload is a table being written, not a drop.
            Until then it is ``unconfirmed``: no incident, no observation, never in the baseline.
        row_counts: ``"metadata"`` (default; catalog row counts where exact) or ``"count"``
            (``COUNT(*)`` batches on every warehouse; counts views too).
        observations: which recorded counts are shown as ``AssetObservation``\\ s on the asset page
            (every recorded count is kept in the row-count history store either way,
            :mod:`.store`). ``"every_count"``: each one. ``"summary"``: every anomaly that opens an
            incident, with the incident; a count whose status differs from the table's last
            observation (an anomaly an open incident covers included); and a
            table's current count once every ``record_unchanged_every_seconds`` (and when first
            seen), with ``dw/volume_unobserved_counts`` (counts recorded since the previous
            observation) - at most ``max_observations_per_tick`` of these per tick, status
            changes first, then the tables shown longest ago; the others wait for the next tick.
            ``"auto"`` (default): ``"every_count"`` up to 1,000 tables, ``"summary"`` above.
        max_observations_per_tick: the budget of ``"summary"`` (anomalies and incidents are
            never held back); default 1,000 (storing an event costs the daemon 1-6 ms).
        minimum_interval_seconds: seconds between ticks (default 300).
        diagnosis_job_name: a job built by :func:`dw_dagster.diagnosis.job.build_diagnosis_job`;
            each new incident requests one run of it. None: incidents only.
        default_status: STOPPED unless told otherwise.
        clock: returns the tick time (aware UTC); for tests.

    A day partition that has not ended at tick time (``days_ago(0)``: today so far) is still
    filling: a count below its band is recorded with the status ``filling``, never ``low`` or
    ``no_rows``, and opens no incident (a count above its band is still ``high``).

    Returns:
        A ``SensorDefinition``. Its cursor is ``{"v": 1, "epoch", "tick", "tables"}``, a token
        for the in-process history cache; a missing or unreadable cursor rebuilds the history
        from the observations. The skip reason summarises the tick (recorded counts by status,
        unchanged tables, missing tables, warehouse errors).

    Raises:
        ValueError: no tables, duplicate spec ids, an unknown ``method`` or ``row_counts``,
            ``min_history`` < 1 or > ``history_length``, a negative ``confirm_empty_seconds``, an
            unknown ``observations``, ``max_observations_per_tick`` < 1 or a ``name`` longer than
            128 characters (the history store's key).

    Examples:
        .. code-block:: python

            sensor = build_volume_sensor(
                tables=[VolumeTable("pos.sales_line", "store_sales_line"),
                        VolumeTable("pos.sales_line_dlq", "store_sales_line", dead_letter=True),
                        VolumeTable("pos.sales_line", "store_sales_line", partition_column="sale_ts")],
                diagnosis_job_name=c.DIAGNOSIS_JOB,
            )
            defs = dg.Definitions(sensors=[sensor], resources={"warehouse": DatabaseResource(url=...)})
    """
    specs = list(tables)
    if not specs:
        raise ValueError("build_volume_sensor needs at least one table")
    if not all(isinstance(s, VolumeTable) for s in specs):
        raise TypeError("tables must be VolumeTable specs")
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"duplicate volume table specs: {', '.join(dup)}")
    if method not in ("zscore", "mad"):
        raise ValueError(f"method must be 'zscore' or 'mad', got {method!r}")
    if row_counts not in ("metadata", "count"):
        raise ValueError(f"row_counts must be 'metadata' or 'count', got {row_counts!r}")
    if observations not in ("auto", "every_count", "summary"):
        raise ValueError(f"observations must be 'auto', 'every_count' or 'summary', got {observations!r}")
    if not 0 < len(name) <= MAX_SENSOR_CHARS:
        raise ValueError(f"name must be 1 to {MAX_SENSOR_CHARS} characters, got {len(name)}")
    if max_observations_per_tick < 1:
        raise ValueError(f"max_observations_per_tick must be >= 1, got {max_observations_per_tick}")
    if confirm_empty_seconds < 0:
        raise ValueError(f"confirm_empty_seconds must be >= 0, got {confirm_empty_seconds}")
    if min_same_weekday < 0:
        raise ValueError(f"min_same_weekday must be >= 0, got {min_same_weekday}")
    if not 1 <= min_history <= history_length:
        raise ValueError(f"need 1 <= min_history <= history_length, got {min_history} and {history_length}")
    dbs = dict(databases or {})
    resource_keys = {s.database for s in specs if s.database not in dbs}
    summary_mode = observations == "summary" or (observations == "auto" and len(specs) > AUTO_SUMMARY_TABLES)
    ticker = VolumeTicker(VolumeSettings(
        specs=tuple(specs), databases=dbs, name=name, method=method, sensitivity=sensitivity, min_history=min_history,
        history_length=history_length, min_band_pct=min_band_pct, min_same_weekday=min_same_weekday,
        record_unchanged_every_seconds=record_unchanged_every_seconds, confirm_empty_seconds=confirm_empty_seconds,
        row_counts=row_counts, summary_mode=summary_mode, max_observations_per_tick=max_observations_per_tick,
        diagnosis_job_name=diagnosis_job_name, clock=clock))

    @dg.sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        job_name=diagnosis_job_name,
        required_resource_keys=resource_keys or None,
        description=f"Row counts of {len(specs)} tables from warehouse metadata, scored against each table's "
        f"baseline ({method}, {sensitivity} σ, {history_length} observations); opens dw_dagster incidents.",
    )
    def _sensor(context: dg.SensorEvaluationContext):
        try:
            return ticker.evaluate(context)
        except Exception as e:  # the tick never raises: log, skip, keep the cursor
            context.log.exception(f"{name}: tick failed")
            return dg.SensorResult(skip_reason=f"tick failed: {type(e).__name__}: {_first_line(e)}"[:1000],
                                   cursor=context.cursor)

    return _sensor


def watched_asset_keys(tables: Iterable[VolumeTable]) -> list[dg.AssetKey]:
    """The distinct asset keys of ``tables``, in order (e.g. to declare them as ``AssetSpec``\\ s)."""
    return list(dict.fromkeys(s.asset_key for s in tables))  # type: ignore[misc]
