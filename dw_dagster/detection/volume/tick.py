"""One tick of the volume sensor: read the history, count, score, record, show, summarise.

:func:`~dw_dagster.detection.volume.sensor.build_volume_sensor` checks its arguments into a
:class:`VolumeSettings` and keeps one :class:`VolumeTicker` per sensor definition (the state
between ticks: the in-process history cache, the tables whose history is still unread, empty
readings waiting to be confirmed, incidents shown); each evaluation is one :class:`_Tick` (what that
tick gathers). The rules are the sensor module's docstring; this module only orders them and
times them: the tick's log line ends with where its time went (history, catalog, counting,
scoring, storing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg

from dw_dagster.checks.volume import BaselineScore, score_against_baseline
from dw_dagster.core import keys as c
from dw_dagster.core.ledger import asset_str, ledger_for
from dw_dagster.core.links import describe
from dw_dagster.core.models import Incident, stable_hash, utcnow
from dw_dagster.databases import Database
from dw_dagster.detection.incidents import SHOWN_GRACE_S as _INCIDENT_GRACE_S
from dw_dagster.detection.incidents import (
    diagnosis_request,
    diagnosis_run_key,
    incident_observation,
    incident_shown,
    record_all_unless_open,
    rediagnosis_requests,
    unshown_incident_observations,
)
from dw_dagster.detection.volume import store as history_store
from dw_dagster.detection.volume.collector import collector_paused
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
    _cursor_writer,
    _HistoryCache,
    _observed,
    _parse_cursor,
    history_from_observations,
)
from dw_dagster.detection.volume.store import VolumeHistoryStore, assets_with_records, store_for

#: statuses that open an incident
ANOMALY_STATUSES = frozenset({"low", "high", "no_rows", "grew"})

#: outcomes of a tick that record no count
_NOT_RECORDED = ("unchanged", "missing", "error", "unconfirmed", "history_pending")

#: seconds after which an open incident another process opened, with no ``dw/incident`` observation in
#: the event log, is shown by this sensor (that process's tick was not kept); before, it may still be storing it
SHOWN_GRACE_S = _INCIDENT_GRACE_S

#: metadata key: counts recorded since the table's previous observation and not shown one by one
VOLUME_UNOBSERVED_KEY = c.VOLUME_UNOBSERVED_KEY


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


# -- small records ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Outcome:
    spec: VolumeTable
    status: str
    rows: int | None = None
    detail: str = ""


@dataclasses.dataclass
class _Scored:
    """A count scored as an anomaly: recorded once the tick's incidents are (together, :meth:`VolumeTicker._anomalies`)."""

    spec: VolumeTable
    cnt: TableCount
    h: TableHistory
    status: str
    sc: BaselineScore | None
    change: int | None


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


@dataclasses.dataclass(frozen=True)
class VolumeSettings:
    """What :func:`~dw_dagster.detection.volume.sensor.build_volume_sensor` was given, checked
    (see its docstring for each field)."""

    specs: tuple[VolumeTable, ...]
    databases: Mapping[str, Database | Callable[[], Database]]
    name: str
    method: str
    sensitivity: float
    min_history: int
    history_length: int
    min_band_pct: float
    min_same_weekday: int
    record_unchanged_every_seconds: float
    confirm_empty_seconds: float
    row_counts: str
    summary_mode: bool
    max_observations_per_tick: int
    diagnosis_job_name: str | None
    clock: Callable[[], dt.datetime] | None


@dataclasses.dataclass
class _Tick:
    """What one evaluation gathers, from its history to its result."""

    context: dg.SensorEvaluationContext
    now: dt.datetime
    started: float
    notes: list[str] = dataclasses.field(default_factory=list)
    wh_errors: list[str] = dataclasses.field(default_factory=list)
    touched: set[str] = dataclasses.field(default_factory=set)  # spec ids whose history this tick changed
    outcomes: list[_Outcome] = dataclasses.field(default_factory=list)
    counts: dict[str, TableCount] = dataclasses.field(default_factory=dict)
    queries: int = 0
    events: list[dg.AssetObservation] = dataclasses.field(default_factory=list)
    waiting: list[_Waiting] = dataclasses.field(default_factory=list)
    anomalies: list[_Scored] = dataclasses.field(default_factory=list)  # recorded after the tick's incidents
    requests: list[dg.RunRequest] = dataclasses.field(default_factory=list)
    opened_assets: set[dg.AssetKey] = dataclasses.field(default_factory=set)
    opened_ids: list[str] = dataclasses.field(default_factory=list)  # incidents this tick shows first
    evidence: dict[str, str] = dataclasses.field(default_factory=dict)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)  # phase -> seconds
    store: VolumeHistoryStore | None = None
    key: tuple[str, int] | None = None
    previous_key: tuple[str, int] | None = None
    history: dict[str, TableHistory] = dataclasses.field(default_factory=dict)
    new_history: dict[str, TableHistory] = dataclasses.field(default_factory=dict)
    # this evaluation's id (its store rows and its cursor name it) and the id of the tick it started from
    writer: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:16])
    parent: str | None = None

    @property
    def now_ts(self) -> float:
        return self.now.timestamp()

    def timed(self, phase: str, since: float) -> None:
        self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - since


class VolumeTicker:
    """The volume sensor's state between ticks and its evaluation (:meth:`evaluate`)."""

    def __init__(self, settings: VolumeSettings) -> None:
        self.s = settings
        self.by_db: dict[str, list[VolumeTable]] = {}
        for spec in settings.specs:
            self.by_db.setdefault(spec.database, []).append(spec)
        self.cache = _HistoryCache()
        self.unread: set[str] = set()  # tables whose history is still to be read from observations (after a rebuild)
        self.empties: dict[tuple[str, str | None], float] = {}  # (table, partition) -> when it first read empty
        self.unsaved: set[str] = set()  # spec ids whose changed history a tick could not write (written next tick)
        self.marked: str | None = None  # the writer this process last marked kept in the store
        self.opened_in: dict[str, tuple[str, int]] = {}  # incident id -> the cursor token of the tick that showed it
        self.shown_ids: set[str] = set()  # open incidents whose dw/incident observation is known to be stored
        self.watched = sorted({asset_str(sp.asset_key) for sp in settings.specs})

    # -- scoring --------------------------------------------------------------------------------

    def score(self, s: VolumeTable, rows: int, part: str | None, h: TableHistory,
              now: dt.datetime) -> tuple[str, BaselineScore | None, int | None]:
        """(status, score, change vs the previous recorded count of the same partition)."""
        cfg = self.s
        previous = _previous(s, h, part)
        change = None if previous is None else rows - previous
        if s.dead_letter:
            if not h.entries:
                return "insufficient_history", None, None
            change = rows - (previous or 0)
            return ("grew" if change > 0 else "ok"), None, change
        earlier = [(p, r) for p, r in h.entries if s.partition_column is None or p != part][-cfg.history_length:]
        baseline = [r for _, r in earlier]
        day = _iso_day(part) if s.partition_column is not None else None
        need = cfg.min_history
        if day is not None and cfg.min_same_weekday and len(earlier) >= cfg.min_history:
            # enough history to score at all: the same weekday when it has enough days of its own
            same = [r for p, r in earlier if (d := _iso_day(p)) is not None and d.weekday() == day.weekday()]
            if len(same) >= cfg.min_same_weekday:
                baseline, need = same, min(cfg.min_history, len(same))
        sc = score_against_baseline(rows, baseline, sensitivity=cfg.sensitivity, min_history=need,
                                    min_band_pct=cfg.min_band_pct, method=cfg.method)
        status = sc.status
        if status == "no_rows" and not (sc.lower or 0) > 0:
            status = "ok"  # empty, as its baseline allows
        if status in ("low", "no_rows") and day is not None and day >= now.astimezone(dt.timezone.utc).date():
            status = "filling"  # the day has not ended: its rows are still arriving
        return status, sc, change

    def incident(self, s: VolumeTable, rows: int, part: str | None, status: str, sc: BaselineScore | None,
                 change: int | None, h: TableHistory, now: dt.datetime) -> Incident:
        method = self.s.method
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

    # -- history --------------------------------------------------------------------------------

    def store(self, context: dg.SensorEvaluationContext, notes: list[str]) -> VolumeHistoryStore | None:
        try:
            return store_for(context.instance, self.s.name)
        except Exception as e:  # noqa: BLE001 - a storage the ledger cannot share: history from observations only
            msg = f"no row-count history store ({type(e).__name__}: {_first_line(e)}); history kept in this process only"
            context.log.warning(f"{self.s.name}: {msg}")
            notes.append(msg)
            return None

    def rebuild(self, context: dg.SensorEvaluationContext, store: VolumeHistoryStore | None,
                notes: list[str]) -> tuple[dict[str, TableHistory], set[str]]:
        """(histories, ids read from the store); the tables the store lacks whose asset has any
        event go to ``unread`` (read from observations by :meth:`read_unread`, tick by tick)."""
        name, specs = self.s.name, self.s.specs
        history = {s.id: TableHistory() for s in specs}
        from_store: dict[str, TableHistory] = {}
        if store is not None:
            try:
                from_store = store.load(history, on_error=lambda m: (context.log.warning(f"{name}: {m}"), notes.append(m)),
                                        kept_until=_cursor_at(context.cursor),
                                        reader="cursor" if _cursor_writer(context.cursor) else "no_cursor")
            except Exception as e:  # noqa: BLE001
                context.log.error(f"{name}: reading the row-count history store failed: {_first_line(e)}")
        history.update(from_store)
        rest = [s for s in specs if s.id not in from_store]
        self.unread.clear()
        if rest:
            try:
                seen = assets_with_records(context.instance, [s.asset_key for s in rest])
            except Exception:  # noqa: BLE001 - read them all, as before the store
                seen = {s.asset_key for s in rest}
            self.unread.update(s.id for s in rest if s.asset_key in seen)
        return history, set(from_store)

    def read_unread(self, context: dg.SensorEvaluationContext, history: dict[str, TableHistory]) -> list[str]:
        """Read the histories of ``unread`` tables from their observations for at most
        ``REBUILD_BUDGET_S`` seconds (whole assets at a time); returns the spec ids read."""
        t0, done = time.perf_counter(), []
        by_key: dict[dg.AssetKey, list[VolumeTable]] = {}
        for s in self.s.specs:
            if s.id in self.unread:
                by_key.setdefault(s.asset_key, []).append(s)
        for members in by_key.values():  # at least one asset per tick
            history.update(history_from_observations(context.instance, members, self.s.history_length,
                                                     on_error=context.log.warning))
            for s in members:
                self.unread.discard(s.id)
                done.append(s.id)
            if time.perf_counter() - t0 >= history_store.REBUILD_BUDGET_S:
                break
        return done

    def _mark_kept(self, t: _Tick) -> None:
        """The tick the cursor comes from was kept: its store rows are read as written from now on (once per writer)."""
        w = t.parent
        if t.store is None or w is None or w == self.marked:
            return
        try:
            t.store.mark_kept(w, _cursor_writer(t.context.cursor, "parent"))
            self.marked = w
        except Exception as e:  # noqa: BLE001 - marked by the next tick; a rebuild before then records its counts again
            t.context.log.warning(f"{self.s.name}: row-count history store: tick {w} not marked kept: {_first_line(e)}")

    def _begin(self, t: _Tick) -> None:
        """The tick's history: the cached snapshot its cursor names, or rebuilt (store, observations)."""
        t0 = time.perf_counter()
        context, name = t.context, self.s.name
        key, why = _parse_cursor(context.cursor)
        history = self.cache.get(key)
        if why:
            context.log.warning(why)
            t.notes.append(why)
        t.store = self.store(context, t.notes)
        t.parent = _cursor_writer(context.cursor)
        self._mark_kept(t)
        if history is None:
            reason = "no cursor" if context.cursor is None or context.cursor == "" else (
                "unreadable cursor" if key is None else "history cache not in this process")
            history, n_store = self.rebuild(context, t.store, t.notes)
            n_unread = len(self.unread)
            history = dict(history)
            read = self.read_unread(context, history)
            t.touched.update(sid for sid in read if history[sid].entries)
            known = sum(1 for h in history.values() if h.entries)
            msg = (f"{reason}: rebuilt the history of {len(self.s.specs)} tables ({len(n_store)} from the history store, "
                   f"{len(read)} from observations; {known} with earlier counts) in {time.perf_counter() - t0:.2f} s")
            if self.unread:
                msg += f"; {len(self.unread)} of {n_unread} tables wait for their history from observations (next ticks)"
            context.log.info(f"{name}: {msg}")
            t.notes.append(msg)
            key, t.previous_key = (uuid.uuid4().hex[:16], 0), None
        else:
            t.previous_key = key
            if self.unread:
                history = dict(history)
                read = self.read_unread(context, history)
                t.touched.update(sid for sid in read if history[sid].entries)
                t.notes.append(f"read the history of {len(read)} more tables from observations"
                               + (f"; {len(self.unread)} still wait" if self.unread else ""))
        t.key, t.history, t.new_history = key, history, dict(history)
        t.timed("history", t0)

    # -- counting -------------------------------------------------------------------------------

    def _count(self, t: _Tick) -> None:
        """Every warehouse's counts; a warehouse that fails is skipped with its tables as errors."""
        context, dbs = t.context, self.s.databases
        with contextlib.ExitStack() as stack:
            for db_key, members in self.by_db.items():
                t0 = time.perf_counter()
                try:
                    if db_key in dbs:
                        v = dbs[db_key]
                        db = v if _is_database(v) else v()  # type: ignore[operator]
                    else:
                        db = _as_database(db_key, _resource(context, db_key, stack))
                    found = fetch_row_counts(db, members, now=t.now, row_counts=self.s.row_counts)  # type: ignore[arg-type]
                except Exception as e:
                    msg = f"warehouse {db_key!r} skipped this tick: {type(e).__name__}: {_first_line(e)}"
                    context.log.error(msg)
                    t.wh_errors.append(msg)
                    t.outcomes.extend(_Outcome(s, "error", detail=msg) for s in members)
                    t.timed("counting", t0)
                    continue
                t.queries += len(found.queries)
                t.timings["catalog"] = t.timings.get("catalog", 0.0) + found.catalog_s
                t.timings["counting"] = (t.timings.get("counting", 0.0)
                                         + max(0.0, time.perf_counter() - t0 - found.catalog_s))
                if found.error:
                    msg = f"warehouse {db_key!r}: catalog query failed: {found.error}"
                    context.log.error(msg)
                    t.wh_errors.append(msg)
                t.counts.update(found.counts)

    # -- recording ------------------------------------------------------------------------------

    def _score_all(self, t: _Tick) -> None:
        t0 = time.perf_counter()
        for s in self.s.specs:
            if s.id not in t.counts:
                continue
            if s.id in self.unread:
                t.outcomes.append(_Outcome(s, "history_pending"))
                continue
            cnt = t.counts[s.id]
            if cnt.rows is None:
                t.outcomes.append(_Outcome(s, "missing" if cnt.missing else "error", detail=cnt.error or ""))
                continue
            self._record(t, s, cnt)
        self._anomalies(t)
        t.timed("scoring", t0)

    def _record(self, t: _Tick, s: VolumeTable, cnt: TableCount) -> None:
        """Score one count and record it (or note it unchanged, unconfirmed)."""
        cfg, now_ts = self.s, t.now_ts
        summary_mode = cfg.summary_mode
        h = t.history.get(s.id) or TableHistory()
        rows, part = cnt.rows, cnt.partition
        assert rows is not None
        last = h.last
        changed = last is None or last != (part, rows)
        due = h.recorded_at is None or now_ts - h.recorded_at >= cfg.record_unchanged_every_seconds
        show_due = summary_mode and (h.observed_at is None or now_ts - h.observed_at >= cfg.record_unchanged_every_seconds)
        if not (changed or due):
            # shown again (or first) with its recorded status; a status change the budget held back waits here
            held = summary_mode and h.observed_at is not None and h.observed_status != h.last_status
            if (show_due or held) and h.last_status is not None:
                rank_u = (0 if held else 2 if h.observed_at is None else 1, h.observed_at or 0.0)
                t.waiting.append(_Waiting(rank_u, s.id, h.last_status, self.unchanged_event(s, h, rows, part, now_ts)))
            t.outcomes.append(_Outcome(s, "unchanged", rows))
            return
        before = _previous(s, h, part)
        if rows == 0 and before and not s.dead_letter:
            first = self.empties.setdefault((s.id, part), now_ts)
            if now_ts - first < cfg.confirm_empty_seconds:
                t.outcomes.append(_Outcome(s, "unconfirmed", rows, f"empty after {before:,} rows; scored if still "
                                           f"empty {cfg.confirm_empty_seconds:.0f} s after the first empty reading"))
                return
        self.empties.pop((s.id, part), None)
        status, sc, change = self.score(s, rows, part, h, t.now)
        if status in ANOMALY_STATUSES:  # its incident first, with the tick's others (_anomalies)
            t.anomalies.append(_Scored(s, cnt, h, status, sc, change))
            return
        self._keep(t, _Scored(s, cnt, h, status, sc, change))

    def _keep(self, t: _Tick, a: _Scored, detail: str = "", opened_now: bool = False, open_id: str | None = None) -> None:
        """Record a scored count: its observation (shown now, or waiting for the budget) and its new history."""
        cfg, s, cnt, h, status, sc, change = self.s, a.spec, a.cnt, a.h, a.status, a.sc, a.change
        rows, part, summary_mode = cnt.rows, cnt.partition, cfg.summary_mode
        assert rows is not None
        show_due = summary_mode and (h.observed_at is None or t.now_ts - h.observed_at >= cfg.record_unchanged_every_seconds)
        # summary: an anomaly that opens an incident is always shown; one an open incident already
        # covers is shown like any count (on a status change, or once a day), not on every tick
        shown = not summary_mode or opened_now
        rank = (None if shown else (0, h.observed_at or 0.0) if h.observed_status not in (None, status)
                else (2 if h.observed_at is None else 1, h.observed_at or 0.0) if show_due else None)
        if shown or rank is not None:  # the event only when it may be shown (building one costs ~0.5 ms)
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
            if open_id is not None:
                md[VOLUME_OPEN_INCIDENT_KEY] = open_id
            band = f"; band {_fmt(sc.lower)}–{_fmt(sc.upper)}" if sc is not None and sc.mean is not None else ""
            event = dg.AssetObservation(
                asset_key=s.asset_key, metadata=md,
                description=f"{s.id}: {rows:,} rows" + (f" in partition {part}" if part else "") + f", {status}{band}")
            if shown:
                t.events.append(event)
            else:
                t.waiting.append(_Waiting(rank, s.id, status, event))  # type: ignore[arg-type]
        t.new_history[s.id] = _append(h, part, rows, t.now_ts, cfg.history_length, s.partition_column is not None,
                                      status, observed=shown)
        t.touched.add(s.id)
        t.outcomes.append(_Outcome(s, status, rows, detail))

    def _anomalies(self, t: _Tick) -> None:
        """Record the tick's anomalous counts: their incidents together (``record_all_unless_open``; one open incident
        per asset: the first anomaly of an asset is its candidate), then each count as :meth:`_keep` does."""
        if not t.anomalies:
            return
        candidates: dict[dg.AssetKey, Incident] = {}
        for a in t.anomalies:
            if a.spec.asset_key not in candidates:
                assert a.cnt.rows is not None
                candidates[a.spec.asset_key] = self.incident(a.spec, a.cnt.rows, a.cnt.partition, a.status, a.sc,
                                                             a.change, a.h, t.now)
        results = dict(zip(candidates, record_all_unless_open(t.context.instance, list(candidates.values()))))
        for a in t.anomalies:
            key = a.spec.asset_key
            self._keep(t, a, *self._anomaly(t, a, candidates[key], *results[key]))

    def _anomaly(self, t: _Tick, a: _Scored, inc: Incident, new: bool,
                 existing: Incident | None) -> tuple[str, bool, str | None]:
        """The incident of an anomalous count: the one its asset's candidate opened, or the asset's open one;
        (detail, shown now, the open incident's id for the count's ``dw/volume_open_incident``)."""
        context, s, rows, status = t.context, a.spec, a.cnt.rows, a.status
        assert rows is not None
        if s.asset_key in t.opened_assets:
            return "incident opened this tick for the same asset", False, None
        if existing is not None:
            detail = f"incident {existing.id} still open"
            t.evidence[asset_str(s.asset_key)] = f"{s.id} {status} again ({rows:,} rows)"
            context.log.info(f"{s.id}: {status}; {detail}")
            if existing.source != "volume_sensor" or existing.id in self.shown_ids:
                return detail, False, existing.id
            tok = self.opened_in.get(existing.id)  # shown by a tick of this process: was it kept?
            # a tick not kept by this cursor may still have had its events stored (the daemon died before
            # the cursor), or another sensor showed it since: the event log
            if self._kept(t, existing.id) or incident_shown(context.instance, existing.id, s.asset_key):
                self.shown_ids.add(existing.id)
                return detail, False, existing.id
            row = ledger_for(context.instance).incident(existing.id) if tok is None else None
            if row is not None and time.time() - row.opened_at < SHOWN_GRACE_S:
                # opened moments ago by another process, whose tick may still be storing it: not shown now and
                # not taken as shown either (looked at again each tick: _show_unshown)
                return detail, False, existing.id
            # opened by a tick whose result was not kept (a "Test sensor" evaluation)
            t.events.append(incident_observation(existing, f"incident {existing.id}: "
                                                 f"{existing.summary} (its first tick was not kept)"))
            t.opened_assets.add(s.asset_key)
            t.opened_ids = [*t.opened_ids, existing.id]
            return detail, True, existing.id
        t.opened_assets.add(s.asset_key)
        t.opened_ids.append(inc.id)
        t.events.append(dg.AssetObservation(
            asset_key=s.asset_key, description=describe(f"incident {inc.id}: {inc.summary}", incident_id=inc.id),
            metadata={c.INCIDENT_KEY: dg.MetadataValue.json(inc.model_dump(mode="json")), c.INCIDENT_ID_KEY: inc.id}))
        context.log.warning(f"{s.id}: {inc.summary} -> incident {inc.id}")
        job = self.s.diagnosis_job_name
        if job and new:
            t.requests.append(diagnosis_request(inc, diagnosis_run_key(inc.id, 0), job, {VOLUME_TABLE_TAG: s.id}))
        return f"incident {inc.id}", True, None

    def unchanged_event(self, s: VolumeTable, h: TableHistory, rows: int, part: str | None,
                        now_ts: float) -> dg.AssetObservation:
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

    def _kept(self, t: _Tick, incident_id: str) -> bool:
        """Whether a tick of this process showed ``incident_id`` and the cursor says that tick was kept."""
        tok, previous_key = self.opened_in.get(incident_id), t.previous_key
        return tok is not None and previous_key is not None and tok[0] == previous_key[0] and tok[1] <= previous_key[1]

    def _show_unshown(self, t: _Tick) -> None:
        """Open incidents whose ``dw/incident`` observation was never stored (opened by a "Test sensor"
        evaluation, or a tick whose result was lost), whatever their table's count does now."""
        try:
            events = unshown_incident_observations(t.context.instance, self.watched, ["volume_sensor"], self.shown_ids,
                                                   skip=t.opened_ids, kept=lambda row: self._kept(t, row.incident_id)
                                                   if row.incident_id in self.opened_in else None,
                                                   grace_s=SHOWN_GRACE_S)
        except Exception as e:  # noqa: BLE001 - the counts of this tick are kept; looked at again next tick
            t.context.log.exception(f"{self.s.name}: looking for incidents never shown failed")
            t.wh_errors.append(f"incidents never shown not looked for: {type(e).__name__}: {_first_line(e)}")
            return
        for ev in events:
            t.events.append(ev)
            t.opened_assets.add(ev.asset_key)
            t.opened_ids.append(str(getattr(ev.metadata[c.INCIDENT_ID_KEY], "value", ev.metadata[c.INCIDENT_ID_KEY])))

    def _rediagnose(self, t: _Tick) -> None:
        """Incidents still waiting for their diagnosis (a lost tick, a dry run) and new evidence."""
        job = self.s.diagnosis_job_name
        if not job:
            return
        try:
            again, evidence_events = rediagnosis_requests(t.context.instance, self.watched, job, t.evidence,
                                                          sources=["volume_sensor"],
                                                          already={r.run_key for r in t.requests})
            t.requests += again
            t.events += evidence_events
        except Exception as e:  # noqa: BLE001 - the counts of this tick are kept; retried next tick
            t.context.log.exception(f"{self.s.name}: re-diagnosis requests failed")
            t.wh_errors.append(f"re-diagnosis not requested: {type(e).__name__}: {_first_line(e)}")

    def _show_waiting(self, t: _Tick) -> None:
        budget = self.s.max_observations_per_tick
        t.waiting.sort(key=lambda w: w.rank)
        for w in t.waiting[:budget]:
            t.events.append(w.event)
            t.new_history[w.spec_id] = _observed(t.new_history[w.spec_id], t.now_ts, w.status)
            t.touched.add(w.spec_id)
        held_back = max(0, len(t.waiting) - budget)
        if held_back:
            t.notes.append(f"{held_back} summary observations wait for the next tick (at most {budget} a tick)")

    def _save(self, t: _Tick) -> None:
        """Write the changed histories to the store (retried next tick when it fails)."""
        t0 = time.perf_counter()
        if t.store is not None and (t.touched or self.unsaved):
            dirty = (t.touched | self.unsaved) & t.new_history.keys()
            try:
                t.store.save({sid: t.new_history[sid] for sid in dirty}, previous={sid: t.history.get(sid) for sid in dirty},
                             writer=t.writer, parent=t.parent)
                self.unsaved.clear()
            except Exception as e:  # noqa: BLE001 - the in-process history still has them; written next tick
                self.unsaved.update(dirty)
                msg = (f"row-count history store not written ({len(dirty)} tables; retried next tick): "
                       f"{type(e).__name__}: {_first_line(e)}")
                t.context.log.error(f"{self.s.name}: {msg}")
                t.wh_errors.append(msg)
        t.timed("storing", t0)

    # -- the tick -------------------------------------------------------------------------------

    def evaluate(self, context: dg.SensorEvaluationContext) -> dg.SensorResult:
        """One tick (see the sensor module's docstring), with the cyclic collector paused
        (:func:`~dw_dagster.detection.volume.collector.collector_paused`); raises only for an unexpected error."""
        with collector_paused():
            return self._evaluate(context)

    def _evaluate(self, context: dg.SensorEvaluationContext) -> dg.SensorResult:
        t = _Tick(context=context, now=(self.s.clock or utcnow)(), started=time.perf_counter())
        self._begin(t)
        self._count(t)
        self._score_all(t)
        self._show_unshown(t)
        self._rediagnose(t)
        self._show_waiting(t)
        self._save(t)
        assert t.key is not None
        new_key = (t.key[0], t.key[1] + 1) if t.touched or t.previous_key is None else t.key
        self.opened_in.update(dict.fromkeys(t.opened_ids, new_key))
        self.cache.put(t.previous_key, new_key, t.new_history)
        summary = self._summary(t)
        phases = ", ".join(f"{p} {t.timings.get(p, 0.0):.2f} s" for p in ("history", "catalog", "counting", "scoring", "storing"))
        context.log.info(f"{self.s.name}: {summary} ({t.queries} queries, {time.perf_counter() - t.started:.2f} s: {phases})")
        cursor = _cursor_text(new_key, len(self.s.specs), t.writer, t.parent)
        if t.requests:
            return dg.SensorResult(run_requests=t.requests, asset_events=t.events, cursor=cursor)
        return dg.SensorResult(skip_reason=summary[:4000], asset_events=t.events, cursor=cursor)

    def _summary(self, t: _Tick) -> str:
        """The skip reason: recorded counts by status, unchanged, anomalies, missing, errors, notes."""
        name, context, outcomes = self.s.name, t.context, t.outcomes
        recorded = sum(1 for o in outcomes if o.status not in _NOT_RECORDED)
        by_status: dict[str, int] = {}
        for o in outcomes:
            by_status[o.status] = by_status.get(o.status, 0) + 1
        recorded_txt = ", ".join(f"{n} {st}" for st, n in sorted(by_status.items()) if st not in _NOT_RECORDED)
        parts = [f"{len(self.s.specs)} tables: {recorded} recorded" + (f" ({recorded_txt})" if recorded_txt else "")
                 + f", {by_status.get('unchanged', 0)} unchanged"
                 + (f"; {sum(1 for e in t.events if VOLUME_TABLE_KEY in e.metadata)} observations (summary)"
                    if self.s.summary_mode else "")]
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
        parts.extend(t.wh_errors)
        parts.extend(t.notes)
        return "; ".join(parts)


__all__ = ["ANOMALY_STATUSES", "SHOWN_GRACE_S", "VolumeSettings", "VolumeTicker"]
