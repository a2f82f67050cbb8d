"""The row-count history of each watched table: observation keys, the in-process cache and the cursor.

History, cursor and observations
--------------------------------

Every recorded count is kept in the row-count history store (:mod:`.store`: one row per table
in the ledger's database, its last ``history_length`` counts) and shown on the table's asset as
an ``AssetObservation`` with ``dagster/row_count`` and ``dw/volume_table`` (plus status, band and
change keys) - each one, or a summary (``build_volume_sensor(observations=...)``). The baseline of
a table is its last ``history_length`` recorded counts (for a partitioned spec: the newest count
of each of its last ``history_length`` other partitions).

Observation metadata: ``dagster/row_count`` (rows; of the partition for a partitioned spec),
``dw/volume_table`` (the spec id ``database:table[#partition_column]``), ``dw/volume_status``
(``ok``, ``low``, ``high``, ``no_rows``, ``grew``, ``insufficient_history``),
``dw/volume_source`` (where the count came from), ``dw/volume_partition``, ``dw/volume_change``
(rows since the previous recorded count of the same partition), ``dw/volume_baseline_n``
(baseline size), ``dw/volume_mean`` / ``dw/volume_lower`` / ``dw/volume_upper`` (rows: the
band's centre - the median for ``method="mad"`` - and bounds), ``dw/volume_deviation_pct`` (% from
the centre), ``dw/volume_dead_letter`` and ``dw/volume_open_incident``.

*When a count is recorded.* Only when it changed since the table's last recorded count (or its
partition changed), or when the last one is ``record_unchanged_every_seconds`` old (default one
day), so an unchanged table writes one event per day, not one per tick. Every recorded count is
scored against the counts recorded before it (the tested value is never part of its own
baseline); an unchanged count is not scored again. Measured: the Dagster daemon stores a tick's
asset events one by one (``report_runless_asset_event``), 6 ms per event on a SQLite instance on
disk and 1 ms in memory, so recording 5,000 tables on every tick would cost it 5-30 s per tick;
with this rule the first tick writes one observation per table and later ticks only the tables
that changed.

*Where the rolling history is cached.* Reading 5,000 assets' history from the event log costs
2.6 ms per asset on SQLite (13 s), too slow for every tick; keeping it in the sensor cursor was
measured too: 5,000 tables × 28 counts is 1.3 MB of JSON, 0.44-0.62 MB zlib-compressed, and
Dagster stores the cursor with *every* tick (``TickData.cursor``; skipped ticks are kept 7 days
by default), i.e. about 1.2 GB of tick rows per week at one tick per 5 minutes. So the rolling
history lives in the sensor's process (a code server - ``dagster dev``, ``dagster code-server``,
a container of a deployment - evaluates every tick of a sensor in the same long-lived process),
and the cursor is a small token ``{"v": 1, "epoch": ..., "tick": n}`` naming the in-memory
snapshot it belongs to. The cache is used only when the cursor names the snapshot this process
holds (the last two are kept, so a tick whose result the daemon failed to store is simply
evaluated again); otherwise - no cursor, an unreadable cursor ("Starting from scratch" is
logged), a restarted code server, another replica - the history is read back from the store
(one query per 1,000 tables), and from the observations (:func:`history_from_observations`,
~2 ms per asset) only for tables the store does not hold yet, spread over ticks (:mod:`.store`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Sequence

import dagster as dg

from dw_dagster.detection.volume.counts import ROW_COUNT_KEY, VolumeTable, _first_line
from dw_dagster.core import keys as c

# the volume sensor's metadata keys, named here as well for the modules that import them from here
VOLUME_TABLE_KEY = c.VOLUME_TABLE_KEY
VOLUME_STATUS_KEY = c.VOLUME_STATUS_KEY
VOLUME_SOURCE_KEY = c.VOLUME_SOURCE_KEY
VOLUME_PARTITION_KEY = c.VOLUME_PARTITION_KEY
VOLUME_CHANGE_KEY = c.VOLUME_CHANGE_KEY
VOLUME_BASELINE_N_KEY = c.VOLUME_BASELINE_N_KEY
VOLUME_MEAN_KEY = c.VOLUME_MEAN_KEY
VOLUME_LOWER_KEY = c.VOLUME_LOWER_KEY
VOLUME_UPPER_KEY = c.VOLUME_UPPER_KEY
VOLUME_DEVIATION_KEY = c.VOLUME_DEVIATION_KEY
VOLUME_DEAD_LETTER_KEY = c.VOLUME_DEAD_LETTER_KEY
VOLUME_OPEN_INCIDENT_KEY = c.VOLUME_OPEN_INCIDENT_KEY
VOLUME_TABLE_TAG = c.VOLUME_TABLE_KEY

_CURSOR_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TableHistory:
    """A table's recorded counts, oldest first, as cached between ticks.

    Attributes:
        entries: ``(partition or None, rows)`` per recorded count; a partitioned spec keeps
            one entry (its newest count) per partition.
        recorded_at: epoch seconds of the newest recorded count (None: never recorded).
        observed_at: epoch seconds of the newest count shown as an ``AssetObservation`` (None: none
            yet, or not known: a history rebuilt from observations sets it to ``recorded_at``).
        observed_status: that observation's status.
        unobserved: counts recorded since that observation and not shown one by one
            (``observations="summary"``).
        last_status: the status of the newest recorded count.
    """

    entries: tuple[tuple[str | None, int], ...] = ()
    recorded_at: float | None = None
    observed_at: float | None = None
    observed_status: str | None = None
    unobserved: int = 0
    last_status: str | None = None

    @property
    def last(self) -> tuple[str | None, int] | None:
        return self.entries[-1] if self.entries else None


def _append(h: TableHistory, partition: str | None, rows: int, at: float, keep: int, partitioned: bool,
            status: str, observed: bool = True) -> TableHistory:
    """``h`` with one more recorded count of ``status``; ``observed``: the count is shown as an
    observation (else it is counted in ``unobserved``)."""
    if partitioned:
        entries = tuple(e for e in h.entries if e[0] != partition) + ((partition, rows),)
        entries = entries[-(keep + 1):]
    else:
        entries = (h.entries + ((None, rows),))[-keep:]
    # the constructor, not dataclasses.replace (which looks the fields up on every call): 50,000 a tick
    if observed:
        return TableHistory(entries, at, at, status, 0, status)
    return TableHistory(entries, at, h.observed_at, h.observed_status, h.unobserved + 1, status)


def _observed(h: TableHistory, at: float, status: str) -> TableHistory:
    """``h`` whose newest count was shown as an observation at ``at``."""
    return TableHistory(h.entries, h.recorded_at, at, status, 0, h.last_status)


def history_from_observations(
    instance: dg.DagsterInstance, tables: Sequence[VolumeTable], history_length: int,
    on_error: Callable[[str], None] | None = None,
) -> dict[str, TableHistory]:
    """Rebuild every spec's :class:`TableHistory` from its volume observations in ``instance``.

    One ``fetch_observations`` query per asset key, newest first, paged when other observations
    (incidents, receipts) sit between the volume ones; at most ``50 × (history_length + 1)``
    records are read per asset. An asset whose records cannot be read starts with no history
    (``on_error`` is told).

    Returns:
        spec id → history (empty history for specs never recorded).
    """
    by_key: dict[dg.AssetKey, list[VolumeTable]] = {}
    for s in tables:
        by_key.setdefault(s.asset_key, []).append(s)
    out = {s.id: TableHistory() for s in tables}
    page = history_length + 4
    cap = 50 * (history_length + 1)
    for key, specs in by_key.items():
        want = {s.id: s for s in specs}
        got: dict[str, list[tuple[str | None, int, float, str | None]]] = {tid: [] for tid in want}
        done: set[str] = set()
        cursor, scanned = None, 0
        try:
            while len(done) < len(want) and scanned < cap:
                res = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=key), limit=page, cursor=cursor, ascending=False)
                for rec in res.records:
                    scanned += 1
                    obs = rec.asset_observation
                    md = obs.metadata if obs else {}
                    tid = getattr(md.get(VOLUME_TABLE_KEY), "value", None)
                    if tid not in want or tid in done or ROW_COUNT_KEY not in md:
                        continue
                    part = getattr(md.get(VOLUME_PARTITION_KEY), "value", None)
                    rows = int(md[ROW_COUNT_KEY].value)
                    status = getattr(md.get(VOLUME_STATUS_KEY), "value", None)
                    lst = got[tid]
                    if want[tid].partition_column is None:
                        lst.append((None, rows, rec.timestamp, status))
                        if len(lst) >= history_length:
                            done.add(tid)
                    else:
                        if all(e[0] != part for e in lst):
                            lst.append((None if part is None else str(part), rows, rec.timestamp, status))
                        if len(lst) >= history_length + 1:
                            done.add(tid)
                if not res.has_more:
                    break
                cursor = res.cursor
                page = min(page * 4, 1000)
        except Exception as e:
            if on_error:
                on_error(f"reading the volume observations of {key.to_user_string()} failed: {_first_line(e)}")
            continue
        for tid, lst in got.items():
            if lst:
                out[tid] = TableHistory(entries=tuple((e[0], e[1]) for e in reversed(lst)), recorded_at=lst[0][2],
                                        observed_at=lst[0][2], observed_status=lst[0][3], last_status=lst[0][3])
    return out


class _HistoryCache:
    """In-process snapshots of every table's history, keyed by the cursor token ``(epoch, tick)``.

    Keeps the snapshot the last cursor named and the one built from it, nothing older."""

    def __init__(self) -> None:
        self._snaps: dict[tuple[str, int], dict[str, TableHistory]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int] | None) -> dict[str, TableHistory] | None:
        with self._lock:
            return self._snaps.get(key) if key else None

    def put(self, previous: tuple[str, int] | None, key: tuple[str, int], tables: dict[str, TableHistory]) -> None:
        with self._lock:
            keep = {k: v for k, v in self._snaps.items() if k == previous}
            keep[key] = tables
            self._snaps = keep


def _parse_cursor(text: str | None) -> tuple[tuple[str, int] | None, str | None]:
    """``((epoch, tick), None)`` for a valid cursor, ``(None, why)`` otherwise (``why`` None: no cursor)."""
    if not text:
        return None, None
    try:
        data = json.loads(text)
        if (isinstance(data, dict) and data.get("v") == _CURSOR_VERSION and isinstance(data.get("epoch"), str)
                and 0 < len(data["epoch"]) <= 64 and isinstance(data.get("tick"), int) and data["tick"] >= 0):
            return (data["epoch"], data["tick"]), None
    except ValueError:
        pass
    return None, f"Failed to interpret cursor {text[:80]!r}. Starting from scratch: rebuilding the history from observations."


def _cursor_at(text: str | None) -> float | None:
    """When the tick that wrote the cursor ended (epoch seconds), None when it does not say."""
    try:
        at = json.loads(text or "").get("at")
    except (ValueError, AttributeError):
        return None
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at) else None


def _cursor_writer(text: str | None, field: str = "writer") -> str | None:
    """The id of the tick that wrote the cursor (``field="parent"``: of the tick it started from), None when
    it does not say."""
    try:
        w = json.loads(text or "").get(field)
    except (ValueError, AttributeError):
        return None
    ok = isinstance(w, str) and 0 < len(w) <= 32 and all(ch in "0123456789abcdef" for ch in w)
    return w if ok else None


def _cursor_text(key: tuple[str, int], tables: int, writer: str | None = None, parent: str | None = None) -> str:
    """The cursor: the history snapshot's token, the table count, when this tick ended (``at``, epoch
    seconds: a store row from before the store named its writers, written after it, comes from a tick
    whose result was not kept), the id of this tick (``writer``: the next tick marks it kept,
    :meth:`~dw_dagster.detection.volume.store.VolumeHistoryStore.mark_kept`) and of the tick it started
    from (``parent``)."""
    data = {"v": _CURSOR_VERSION, "epoch": key[0], "tick": key[1], "tables": tables,
            "at": math.ceil(time.time() * 1000) / 1000}
    if writer is not None:
        data["writer"] = writer
    if parent is not None:
        data["parent"] = parent
    return json.dumps(data, sort_keys=True)
