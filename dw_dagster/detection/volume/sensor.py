"""A sensor that watches the row counts of many tables cheaply and opens an incident on an anomaly.

:func:`build_volume_sensor` reads, on every tick, the row count of each watched table
(:class:`VolumeTable`) from its warehouse's catalog, scores each changed count against that
table's own baseline with the volume check's method
(:func:`dw_dagster.checks.volume.score_against_baseline`: z-score or MAD band, sensitivity,
``min_history``, a floor on the band width, never below 0 rows), records counts in the
row-count history store (:mod:`.store`) and shows them as ``AssetObservation``\\ s (each one, or a
summary above 1,000 tables), and opens one :class:`~dw_dagster.core.models.Incident`
(``source="volume_sensor"``) per anomaly.

How the counts are read: :mod:`.counts`; how their history is kept between ticks: :mod:`.history`.

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

import contextlib
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import dagster as dg

from dw_dagster.core.links import describe
from dw_dagster.checks.volume import BaselineScore, score_against_baseline
from dw_dagster.core import keys as c
from dw_dagster.core.models import Incident, stable_hash, utcnow
from dw_dagster.databases import Database
from dw_dagster.core.ledger import asset_str
from dw_dagster.detection.incidents import (
    diagnosis_request,
    diagnosis_run_key,
    incident_observation,
    incident_shown,
    open_incident,
    record_unless_open,
    rediagnosis_requests,
)
from dw_dagster.detection.volume.counts import ROW_COUNT_KEY, TableCount, VolumeTable, _first_line, fetch_row_counts
from dw_dagster.detection.volume.history import (
    VOLUME_BASELINE_N_KEY,
    VOLUME_CHANGE_KEY,
    VOLUME_DEAD_LETTER_KEY,
    VOLUME_DEVIATION_KEY,
    VOLUME_LOWER_KEY,
    VOLUME_MEAN_KEY,
    VOLUME_OPEN_INCIDENT_KEY,
    VOLUME_PARTITION_KEY,
    VOLUME_SOURCE_KEY,
    VOLUME_STATUS_KEY,
    VOLUME_TABLE_KEY,
    VOLUME_TABLE_TAG,
    VOLUME_UPPER_KEY,
    TableHistory,
    _append,
    _cursor_at,
    _cursor_text,
    _HistoryCache,
    _observed,
    _parse_cursor,
    history_from_observations,
)
from dw_dagster.detection.volume import store as history_store
from dw_dagster.detection.volume.store import MAX_SENSOR_CHARS, VolumeHistoryStore, assets_with_records, store_for
from dw_dagster.dagster_private import public

#: statuses that open an incident
ANOMALY_STATUSES = frozenset({"low", "high", "no_rows", "grew"})

#: outcomes of a tick that record no count
_NOT_RECORDED = ("unchanged", "missing", "error", "unconfirmed", "history_pending")

#: ``observations="auto"`` shows every recorded count up to this many tables, a summary above
AUTO_SUMMARY_TABLES = 1000
#: seconds after which an open incident another process opened, with no ``dw/incident`` observation in
#: the event log, is shown by this sensor (that process's tick was not kept); before, it may still be storing it
SHOWN_GRACE_S = 120.0

#: metadata key: counts recorded since the table's previous observation and not shown one by one
VOLUME_UNOBSERVED_KEY = c.VOLUME_UNOBSERVED_KEY


# -- counting ---------------------------------------------------------------------------------


# -- history ----------------------------------------------------------------------------------


# -- databases --------------------------------------------------------------------------------


def _is_database(v: object) -> bool:
    return hasattr(v, "fetch_all") and isinstance(getattr(v, "dialect", None), str)


def _as_database(key: str, res: object) -> Database:
    if hasattr(res, "get_database"):
        return res.get_database()
    if _is_database(res):
        return res  # type: ignore[return-value]
    kind = type(res).__name__
    if kind == "SnowflakeResource":
        from dw_dagster.databases.snowflake import SnowflakeDatabase

        return SnowflakeDatabase(res)
    if kind == "BigQueryResource":
        from dw_dagster.databases.bigquery import BigQueryDatabase

        return BigQueryDatabase(res)
    raise TypeError(f"resource {key!r} is a {kind}: not a DatabaseResource, Database, SnowflakeResource or BigQueryResource")


def _resource(context: dg.SensorEvaluationContext, key: str, stack: contextlib.ExitStack) -> object:
    """A resource by key: from the context (the daemon builds the sensor's required resources),
    else built from the code location's top-level resources (``build_sensor_context(definitions=...)``
    does not build them)."""
    with contextlib.suppress(Exception):
        return getattr(context.resources, key)
    repo = context.repository_def
    defs = repo.get_top_level_resources() if repo is not None else {}
    if key not in defs:
        raise KeyError(f"no warehouse {key!r}: not in databases= and not a resource of this code location")
    built = stack.enter_context(dg.build_resources({key: defs[key]}, instance=context.instance))
    return getattr(built, key)


# -- the sensor -------------------------------------------------------------------------------


@dataclasses.dataclass
class _Outcome:
    spec: VolumeTable
    status: str
    rows: int | None = None
    detail: str = ""


@dataclasses.dataclass
class _Waiting:
    """A count that may be shown in ``observations="summary"``, within the tick's budget."""

    rank: tuple[int, float]  # (0 status changed, 1 due again, 2 never shown; shown longest ago first)
    spec_id: str
    status: str
    event: dg.AssetObservation


def _previous(s: VolumeTable, h: TableHistory, part: str | None) -> int | None:
    """The last recorded count of the table (unpartitioned) or of the same partition, or None."""
    if s.partition_column is None:
        return h.last[1] if h.last else None
    return next((r for p, r in reversed(h.entries) if p == part), None)


def _fmt(v: float | None) -> str:
    return "?" if v is None else f"{v:,.0f}"


def _shorten(items: list[str], n: int = 8) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _iso_day(part: str | None) -> dt.date | None:
    """The day a partition's text names (``2026-03-02``), or None when it is not an ISO date."""
    if part is None or len(part) != 10:
        return None
    try:
        return dt.date.fromisoformat(part)
    except ValueError:
        return None


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
    by_db: dict[str, list[VolumeTable]] = {}
    for s in specs:
        by_db.setdefault(s.database, []).append(s)
    cache = _HistoryCache()
    unread: set[str] = set()  # tables whose history is still to be read from observations (after a rebuild)
    summary_mode = observations == "summary" or (observations == "auto" and len(specs) > AUTO_SUMMARY_TABLES)
    empties: dict[tuple[str, str | None], float] = {}  # (table, partition) -> when it first read empty
    unsaved: set[str] = set()  # spec ids whose changed history a tick could not write to the store (written next tick)
    opened_in: dict[str, tuple[str, int]] = {}  # incident id -> the cursor token of the tick in this process that showed it
    shown_ids: set[str] = set()  # open incidents whose dw/incident observation is known to be stored
    watched = sorted({asset_str(sp.asset_key) for sp in specs})

    def _score(s: VolumeTable, rows: int, part: str | None, h: TableHistory,
               now: dt.datetime) -> tuple[str, BaselineScore | None, int | None]:
        """(status, score, change vs the previous recorded count of the same partition)."""
        previous = _previous(s, h, part)
        change = None if previous is None else rows - previous
        if s.dead_letter:
            if not h.entries:
                return "insufficient_history", None, None
            change = rows - (previous or 0)
            return ("grew" if change > 0 else "ok"), None, change
        earlier = [(p, r) for p, r in h.entries if s.partition_column is None or p != part][-history_length:]
        baseline = [r for _, r in earlier]
        day = _iso_day(part) if s.partition_column is not None else None
        need = min_history
        if day is not None and min_same_weekday and len(earlier) >= min_history:
            # enough history to score at all: the same weekday when it has enough days of its own
            same = [r for p, r in earlier if (d := _iso_day(p)) is not None and d.weekday() == day.weekday()]
            if len(same) >= min_same_weekday:
                baseline, need = same, min(min_history, len(same))
        sc = score_against_baseline(rows, baseline, sensitivity=sensitivity, min_history=need,
                                    min_band_pct=min_band_pct, method=method)
        status = sc.status
        if status == "no_rows" and not (sc.lower or 0) > 0:
            status = "ok"  # empty, as its baseline allows
        if status in ("low", "no_rows") and day is not None and day >= now.astimezone(dt.timezone.utc).date():
            status = "filling"  # the day has not ended: its rows are still arriving
        return status, sc, change

    def _incident(s: VolumeTable, rows: int, part: str | None, status: str, sc: BaselineScore | None,
                  change: int | None, h: TableHistory, now: dt.datetime) -> Incident:
        start = dt.datetime.fromtimestamp(h.recorded_at, dt.timezone.utc) if h.recorded_at else None
        where = f"{s.table} on {s.database}" + (f", partition {s.partition_column} = {part}" if part else "")
        if status == "grew":
            before = rows - (change or 0)
            summary = f"dead-letter table {where} grew by {change:,} rows ({before:,} → {rows:,})"
            gap_rows, gap_pct = int(change or 0), round((change or 0) / before * 100, 3) if before else 0.0
        else:
            mean = sc.mean if sc else None
            centre = "median" if method == "mad" else "mean"
            summary = (f"{where}: {rows:,} rows, {status} against its baseline {_fmt(sc.lower if sc else None)}–"
                       f"{_fmt(sc.upper if sc else None)} rows ({centre} {_fmt(mean)}"
                       + (f", {sc.deviation_pct:+.1f} %" if sc and sc.deviation_pct is not None else "")
                       + f", {sc.baseline_n if sc else 0} observations, {method})")
            gap_rows = int(round(mean - rows)) if mean is not None else 0
            gap_pct = round((mean - rows) / mean * 100, 3) if mean else 0.0
        if start:
            summary += f" since {start.isoformat(timespec='seconds')}"
        window = [start.isoformat() if start else None, now.isoformat()]
        return Incident(
            id="inc-" + stable_hash(["volume_sensor", s.id, part, window, rows], 12),
            asset_key=list(s.asset_key.path), source="volume_sensor", check_name=None, detected_at=now,
            summary=summary, gap_rows=gap_rows, gap_pct=gap_pct, window_start=start, window_end=now)

    def _store(context: dg.SensorEvaluationContext, notes: list[str]) -> VolumeHistoryStore | None:
        try:
            return store_for(context.instance, name)
        except Exception as e:  # noqa: BLE001 - a storage the ledger cannot share: history from observations only
            msg = f"no row-count history store ({type(e).__name__}: {_first_line(e)}); history kept in this process only"
            context.log.warning(f"{name}: {msg}")
            notes.append(msg)
            return None

    def _rebuild(context: dg.SensorEvaluationContext, store: VolumeHistoryStore | None,
                 notes: list[str]) -> tuple[dict[str, TableHistory], set[str]]:
        """(histories, ids read from the store); the tables the store lacks whose asset has any
        event go to ``unread`` (read from observations by :func:`_read_unread`, tick by tick)."""
        history = {s.id: TableHistory() for s in specs}
        from_store: dict[str, TableHistory] = {}
        if store is not None:
            try:
                from_store = store.load(history, on_error=lambda m: (context.log.warning(f"{name}: {m}"), notes.append(m)),
                                        kept_until=_cursor_at(context.cursor))
            except Exception as e:  # noqa: BLE001
                context.log.error(f"{name}: reading the row-count history store failed: {_first_line(e)}")
        history.update(from_store)
        rest = [s for s in specs if s.id not in from_store]
        unread.clear()
        if rest:
            try:
                seen = assets_with_records(context.instance, [s.asset_key for s in rest])
            except Exception:  # noqa: BLE001 - read them all, as before the store
                seen = {s.asset_key for s in rest}
            unread.update(s.id for s in rest if s.asset_key in seen)
        return history, set(from_store)

    def _read_unread(context: dg.SensorEvaluationContext, history: dict[str, TableHistory]) -> list[str]:
        """Read the histories of ``unread`` tables from their observations for at most
        ``REBUILD_BUDGET_S`` seconds (whole assets at a time); returns the spec ids read."""
        t0, done = time.perf_counter(), []
        by_key: dict[dg.AssetKey, list[VolumeTable]] = {}
        for s in specs:
            if s.id in unread:
                by_key.setdefault(s.asset_key, []).append(s)
        for members in by_key.values():  # at least one asset per tick
            history.update(history_from_observations(context.instance, members, history_length,
                                                     on_error=context.log.warning))
            for s in members:
                unread.discard(s.id)
                done.append(s.id)
            if time.perf_counter() - t0 >= history_store.REBUILD_BUDGET_S:
                break
        return done

    def _unchanged_event(s: VolumeTable, h: TableHistory, rows: int, part: str | None, now_ts: float) -> dg.AssetObservation:
        since = dt.datetime.fromtimestamp(h.recorded_at or now_ts, dt.timezone.utc).isoformat(timespec="seconds")
        md: dict[str, Any] = {ROW_COUNT_KEY: rows, VOLUME_TABLE_KEY: s.id, VOLUME_STATUS_KEY: h.last_status,
                              VOLUME_SOURCE_KEY: "unchanged", VOLUME_UNOBSERVED_KEY: h.unobserved}
        if part is not None:
            md[VOLUME_PARTITION_KEY] = part
        if s.dead_letter:
            md[VOLUME_DEAD_LETTER_KEY] = True
        return dg.AssetObservation(asset_key=s.asset_key, metadata=md, description=(
            f"{s.id}: {rows:,} rows" + (f" in partition {part}" if part else "")
            + f", {h.last_status}; unchanged since {since}"))

    def _evaluate(context: dg.SensorEvaluationContext):
        started = time.perf_counter()
        now = (clock or utcnow)()
        now_ts = now.timestamp()
        key, why = _parse_cursor(context.cursor)
        history = cache.get(key)
        notes: list[str] = []
        if why:
            context.log.warning(why)
            notes.append(why)
        store = _store(context, notes)
        touched: set[str] = set()  # spec ids whose history this tick changed (written to the store)
        if history is None:
            reason = "no cursor" if context.cursor is None or context.cursor == "" else (
                "unreadable cursor" if key is None else "history cache not in this process")
            t0 = time.perf_counter()
            history, n_store = _rebuild(context, store, notes)
            n_unread = len(unread)
            history = dict(history)
            read = _read_unread(context, history)
            touched.update(sid for sid in read if history[sid].entries)
            known = sum(1 for h in history.values() if h.entries)
            msg = (f"{reason}: rebuilt the history of {len(specs)} tables ({len(n_store)} from the history store, "
                   f"{len(read)} from observations; {known} with earlier counts) in {time.perf_counter() - t0:.2f} s")
            if unread:
                msg += f"; {len(unread)} of {n_unread} tables wait for their history from observations (next ticks)"
            context.log.info(f"{name}: {msg}")
            notes.append(msg)
            key, previous_key = (uuid.uuid4().hex[:16], 0), None
        else:
            previous_key = key
            if unread:
                history = dict(history)
                read = _read_unread(context, history)
                touched.update(sid for sid in read if history[sid].entries)
                notes.append(f"read the history of {len(read)} more tables from observations"
                             + (f"; {len(unread)} still wait" if unread else ""))

        outcomes: list[_Outcome] = []
        wh_errors: list[str] = []
        counts: dict[str, TableCount] = {}
        queries = 0
        with contextlib.ExitStack() as stack:
            for db_key, members in by_db.items():
                try:
                    if db_key in dbs:
                        v = dbs[db_key]
                        db = v if _is_database(v) else v()  # type: ignore[operator]
                    else:
                        db = _as_database(db_key, _resource(context, db_key, stack))
                    found = fetch_row_counts(db, members, now=now, row_counts=row_counts)
                except Exception as e:
                    msg = f"warehouse {db_key!r} skipped this tick: {type(e).__name__}: {_first_line(e)}"
                    context.log.error(msg)
                    wh_errors.append(msg)
                    outcomes.extend(_Outcome(s, "error", detail=msg) for s in members)
                    continue
                queries += len(found.queries)
                if found.error:
                    msg = f"warehouse {db_key!r}: catalog query failed: {found.error}"
                    context.log.error(msg)
                    wh_errors.append(msg)
                counts.update(found.counts)

        events: list[dg.AssetObservation] = []
        waiting: list[_Waiting] = []
        requests: list[dg.RunRequest] = []
        new_history = dict(history)
        opened_assets: set[dg.AssetKey] = set()
        opened_ids: list[str] = []  # incidents this tick shows first (kept when its cursor is)
        evidence: dict[str, str] = {}
        for s in specs:
            if s.id not in counts:
                continue
            if s.id in unread:
                outcomes.append(_Outcome(s, "history_pending"))
                continue
            cnt = counts[s.id]
            if cnt.rows is None:
                outcomes.append(_Outcome(s, "missing" if cnt.missing else "error", detail=cnt.error or ""))
                continue
            h = history.get(s.id) or TableHistory()
            rows, part = cnt.rows, cnt.partition
            last = h.last
            changed = last is None or last != (part, rows)
            due = h.recorded_at is None or now_ts - h.recorded_at >= record_unchanged_every_seconds
            show_due = summary_mode and (h.observed_at is None or now_ts - h.observed_at >= record_unchanged_every_seconds)
            if not (changed or due):
                # shown again (or first) with its recorded status; a status change the budget held back waits here
                held = summary_mode and h.observed_at is not None and h.observed_status != h.last_status
                if (show_due or held) and h.last_status is not None:
                    rank_u = (0 if held else 2 if h.observed_at is None else 1, h.observed_at or 0.0)
                    waiting.append(_Waiting(rank_u, s.id, h.last_status, _unchanged_event(s, h, rows, part, now_ts)))
                outcomes.append(_Outcome(s, "unchanged", rows))
                continue
            before = _previous(s, h, part)
            if rows == 0 and before and not s.dead_letter:
                first = empties.setdefault((s.id, part), now_ts)
                if now_ts - first < confirm_empty_seconds:
                    outcomes.append(_Outcome(s, "unconfirmed", rows, f"empty after {before:,} rows; scored if still "
                                             f"empty {confirm_empty_seconds:.0f} s after the first empty reading"))
                    continue
            empties.pop((s.id, part), None)
            status, sc, change = _score(s, rows, part, h, now)
            md: dict[str, Any] = {ROW_COUNT_KEY: rows, VOLUME_TABLE_KEY: s.id, VOLUME_STATUS_KEY: status,
                                  VOLUME_SOURCE_KEY: cnt.source}
            if part is not None:
                md[VOLUME_PARTITION_KEY] = part
            if change is not None:
                md[VOLUME_CHANGE_KEY] = change
            if s.dead_letter:
                md[VOLUME_DEAD_LETTER_KEY] = True
            if summary_mode:
                md[VOLUME_UNOBSERVED_KEY] = h.unobserved
            if sc is not None:
                md[VOLUME_BASELINE_N_KEY] = sc.baseline_n
                if sc.mean is not None:
                    md[VOLUME_MEAN_KEY], md[VOLUME_LOWER_KEY], md[VOLUME_UPPER_KEY] = sc.mean, sc.lower, sc.upper
                    if sc.deviation_pct is not None:
                        md[VOLUME_DEVIATION_KEY] = sc.deviation_pct
            detail, opened_now = "", False
            if status in ANOMALY_STATUSES:
                if s.asset_key in opened_assets:
                    detail = "incident opened this tick for the same asset"
                else:
                    existing = open_incident(context.instance, s.asset_key)
                    new, inc = False, None
                    if existing is None:  # the ledger: one open incident per asset (looked up again under its lock)
                        inc = _incident(s, rows, part, status, sc, change, h, now)
                        new, existing = record_unless_open(context.instance, inc)
                    if existing is not None:
                        md[VOLUME_OPEN_INCIDENT_KEY] = existing.id
                        detail = f"incident {existing.id} still open"
                        evidence[asset_str(s.asset_key)] = f"{s.id} {status} again ({rows:,} rows)"
                        context.log.info(f"{s.id}: {status}; {detail}")
                        if existing.source == "volume_sensor" and existing.id not in shown_ids:
                            tok = opened_in.get(existing.id)  # shown by a tick of this process: was it kept?
                            if tok is not None and previous_key is not None and tok[0] == previous_key[0]:
                                # a tick not kept by this cursor may still have had its events stored (the
                                # daemon died before the cursor), or another sensor showed it since: the event log
                                kept = tok[1] <= previous_key[1] or incident_shown(context.instance, existing.id,
                                                                                   s.asset_key)
                            else:
                                kept = incident_shown(context.instance, existing.id, s.asset_key,
                                                      min_age_s=0.0 if tok else SHOWN_GRACE_S)
                            if kept:
                                shown_ids.add(existing.id)
                            else:  # opened by a tick whose result was not kept (a "Test sensor" evaluation)
                                events.append(incident_observation(existing, f"incident {existing.id}: "
                                                                   f"{existing.summary} (its first tick was not kept)"))
                                opened_assets.add(s.asset_key)
                                opened_now, opened_ids = True, [*opened_ids, existing.id]
                    elif inc is not None:
                        opened_assets.add(s.asset_key)
                        opened_ids.append(inc.id)
                        detail, opened_now = f"incident {inc.id}", True
                        events.append(dg.AssetObservation(
                            asset_key=s.asset_key, description=describe(f"incident {inc.id}: {inc.summary}", incident_id=inc.id),
                            metadata={c.INCIDENT_KEY: dg.MetadataValue.json(inc.model_dump(mode="json")),
                                      c.INCIDENT_ID_KEY: inc.id}))
                        context.log.warning(f"{s.id}: {inc.summary} -> incident {inc.id}")
                        if diagnosis_job_name and new:
                            requests.append(diagnosis_request(inc, diagnosis_run_key(inc.id, 0), diagnosis_job_name,
                                                              {VOLUME_TABLE_TAG: s.id}))
            # summary: an anomaly that opens an incident is always shown; one an open incident already
            # covers is shown like any count (on a status change, or once a day), not on every tick
            shown = not summary_mode or opened_now
            rank = (None if shown else (0, h.observed_at or 0.0) if h.observed_status not in (None, status)
                    else (2 if h.observed_at is None else 1, h.observed_at or 0.0) if show_due else None)
            if shown or rank is not None:  # the event only when it may be shown (building one costs ~0.5 ms)
                band = f"; band {_fmt(sc.lower)}–{_fmt(sc.upper)}" if sc is not None and sc.mean is not None else ""
                event = dg.AssetObservation(
                    asset_key=s.asset_key, metadata=md,
                    description=f"{s.id}: {rows:,} rows" + (f" in partition {part}" if part else "") + f", {status}{band}")
                if shown:
                    events.append(event)
                else:
                    waiting.append(_Waiting(rank, s.id, status, event))  # type: ignore[arg-type]
            new_history[s.id] = _append(h, part, rows, now_ts, history_length, s.partition_column is not None,
                                        status, observed=shown)
            touched.add(s.id)
            outcomes.append(_Outcome(s, status, rows, detail))

        if diagnosis_job_name:  # incidents still waiting for their diagnosis (a lost tick, a dry run) and new evidence
            try:
                again, evidence_events = rediagnosis_requests(context.instance, watched, diagnosis_job_name, evidence,
                                                              sources=["volume_sensor"],
                                                              already={r.run_key for r in requests})
                requests += again
                events += evidence_events
            except Exception as e:  # noqa: BLE001 - the counts of this tick are kept; retried next tick
                context.log.exception(f"{name}: re-diagnosis requests failed")
                notes_txt = f"re-diagnosis not requested: {type(e).__name__}: {_first_line(e)}"
                wh_errors.append(notes_txt)
        waiting.sort(key=lambda w: w.rank)
        for w in waiting[:max_observations_per_tick]:
            events.append(w.event)
            new_history[w.spec_id] = _observed(new_history[w.spec_id], now_ts, w.status)
            touched.add(w.spec_id)
        held_back = max(0, len(waiting) - max_observations_per_tick)
        if held_back:
            notes.append(f"{held_back} summary observations wait for the next tick (at most {max_observations_per_tick} a tick)")
        if store is not None and (touched or unsaved):
            dirty = (touched | unsaved) & new_history.keys()
            try:
                store.save({sid: new_history[sid] for sid in dirty}, previous={sid: history.get(sid) for sid in dirty})
                unsaved.clear()
            except Exception as e:  # noqa: BLE001 - the in-process history still has them; written next tick
                unsaved.update(dirty)
                msg = (f"row-count history store not written ({len(dirty)} tables; retried next tick): "
                       f"{type(e).__name__}: {_first_line(e)}")
                context.log.error(f"{name}: {msg}")
                wh_errors.append(msg)
        recorded = sum(1 for o in outcomes if o.status not in _NOT_RECORDED)
        new_key = (key[0], key[1] + 1) if touched or previous_key is None else key
        opened_in.update(dict.fromkeys(opened_ids, new_key))
        cache.put(previous_key, new_key, new_history)

        by_status: dict[str, int] = {}
        for o in outcomes:
            by_status[o.status] = by_status.get(o.status, 0) + 1
        recorded_txt = ", ".join(f"{n} {st}" for st, n in sorted(by_status.items())
                                 if st not in _NOT_RECORDED)
        parts = [f"{len(specs)} tables: {recorded} recorded" + (f" ({recorded_txt})" if recorded_txt else "")
                 + f", {by_status.get('unchanged', 0)} unchanged"
                 + (f"; {sum(1 for e in events if VOLUME_TABLE_KEY in e.metadata)} observations (summary)" if summary_mode else "")]
        anomalies = [f"{o.spec.id} {o.status} ({o.rows:,} rows; {o.detail})" for o in outcomes if o.status in ANOMALY_STATUSES]
        unconfirmed = [f"{o.spec.id} ({o.detail})" for o in outcomes if o.status == "unconfirmed"]
        if unconfirmed:
            parts.append("read empty, not scored yet: " + _shorten(unconfirmed))
        if anomalies:
            parts.append("anomalies: " + _shorten(anomalies))
        missing = [o.spec.id for o in outcomes if o.status == "missing"]
        if missing:
            parts.append("missing tables: " + _shorten(missing))
            context.log.warning(f"{name}: missing tables: {', '.join(missing)}")
        failed = [f"{o.spec.id}: {o.detail}" for o in outcomes
                  if o.status == "error" and not o.detail.startswith(("warehouse ", "catalog query failed"))]
        if failed:
            parts.append("not counted: " + _shorten(failed, 4))
            context.log.error(f"{name}: tables not counted: {'; '.join(failed)}")
        parts.extend(wh_errors)
        parts.extend(notes)
        summary = "; ".join(parts)
        context.log.info(f"{name}: {summary} ({queries} queries, {time.perf_counter() - started:.2f} s)")
        cursor = _cursor_text(new_key, len(specs))
        if requests:
            return dg.SensorResult(run_requests=requests, asset_events=events, cursor=cursor)
        return dg.SensorResult(skip_reason=summary[:4000], asset_events=events, cursor=cursor)

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
            return _evaluate(context)
        except Exception as e:  # the tick never raises: log, skip, keep the cursor
            context.log.exception(f"{name}: tick failed")
            return dg.SensorResult(skip_reason=f"tick failed: {type(e).__name__}: {_first_line(e)}"[:1000],
                                   cursor=context.cursor)

    return _sensor


def watched_asset_keys(tables: Iterable[VolumeTable]) -> list[dg.AssetKey]:
    """The distinct asset keys of ``tables``, in order (e.g. to declare them as ``AssetSpec``\\ s)."""
    return list(dict.fromkeys(s.asset_key for s in tables))  # type: ignore[misc]
