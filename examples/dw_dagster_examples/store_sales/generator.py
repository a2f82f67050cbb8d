"""Deterministic point-of-sale data for the grocery store-sales incident (DESIGN.md §3).

The source stands in for an IBM Informix POS consolidation database: one ``pos.sales_line``
table with ``sales_line_id``, ``store_id``, ``region``, ``sale_ts`` (when the line was rung up),
``posted_ts`` (when it reached the consolidation database) and ``net_sales DECIMAL(18,2)``.

Calibration at ``scale=1.0`` (the figures of the incident):

- 300 stores in five regions; Southwest has 55 of them.
- 28 days of sales, 2026-11-01 to 2026-11-28 (UTC), 07:00:00 to 21:59:59 each day; every
  store-day's last line is rung up at exactly 21:59:59 (the closing batch), which is why some
  late lines tie with the loader's high-watermark.
- 19 Southwest stores lose their uplink on 2026-11-26 and 2026-11-27 and post those two days'
  lines, 212,400 in all, when they come back online on 2026-11-28 from 09:00.
- Southwest has 11,800,000 lines in all, so the 212,400 back-dated lines are 1.8 % of it.

Lines per store-day carry a store size factor, weekday seasonality and daily noise; totals are
apportioned with the largest-remainder method so the calibrated figures are exact integers. At
``scale`` s every count is ``round(count × s)``.

The generator *posts* rows up to a point in time (``posted_until``): a first call with an early
cutoff fills the database as it was before the outage ended, a later call posts the rest, the way
the real consolidation database filled up.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import sqlglot

from dw_dagster import Database
from dw_dagster.databases import DuckDBDatabase

SEED = 20261126
FIRST_DAY = dt.date(2026, 11, 1)
DAYS = 28
LAST_DAY = FIRST_DAY + dt.timedelta(days=DAYS - 1)
REGION_STORES = {"Northeast": 72, "Southeast": 64, "Midwest": 60, "Southwest": 55, "West": 49}
OUTAGE_REGION = "Southwest"
OUTAGE_STORES = 19
OUTAGE_DAYS = (dt.date(2026, 11, 26), dt.date(2026, 11, 27))
RECOVERY_START = dt.datetime(2026, 11, 28, 9, 0, 0)
# Figures at scale 1.0
BACKDATED_LINES = 212_400
SOUTHWEST_LINES = 11_800_000
OPEN_SECONDS = 7 * 3600  # first line at 07:00:00
SPAN_SECONDS = 15 * 3600 - 1  # last line at 21:59:59
WEEKDAY_FACTOR = {0: 0.96, 1: 0.94, 2: 0.97, 3: 1.0, 4: 1.08, 5: 1.2, 6: 1.12}

# When the two phases of the incident are posted: before the stores come back (what the
# nightly loads saw) and after the 2026-11-28 business day.
BEFORE_RECOVERY = dt.datetime(2026, 11, 28, 0, 30, 0)
AFTER_RECOVERY = dt.datetime(2026, 11, 29, 0, 30, 0)

# Below MIN_SCALE an offline store-day would get fewer than two lines; MAX_SCALE is 640M lines.
MIN_SCALE = 0.0004
MAX_SCALE = 10.0

SOURCE_TABLE = "pos.sales_line"
SOURCE_DDL = (
    "CREATE TABLE IF NOT EXISTS pos.sales_line ("
    " sales_line_id BIGINT PRIMARY KEY,"
    " store_id INTEGER NOT NULL,"
    " region VARCHAR(32) NOT NULL,"
    " sale_ts TIMESTAMP NOT NULL,"
    " posted_ts TIMESTAMP NOT NULL,"
    " net_sales DECIMAL(18,2) NOT NULL)"
)


@dataclass(frozen=True)
class StoreDay:
    """One store's lines on one day: how many, and whether they were posted late."""

    day_index: int
    day: dt.date
    store_id: int
    region: str
    lines: int
    backdated: bool
    recovery_slot: int  # order in which an offline store came back (0 for online stores)


def _apportion(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder, stable ties)."""
    s = sum(weights)
    raw = [total * w / s for w in weights]
    out = [int(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def stores() -> list[tuple[int, str]]:
    """The 300 stores as (store_id, region); ids start at 1001 and run region by region."""
    out, sid = [], 1001
    for region, n in REGION_STORES.items():
        for _ in range(n):
            out.append((sid, region))
            sid += 1
    return out


def outage_store_ids() -> list[int]:
    """The 19 Southwest stores that went offline, in the order they came back online."""
    sw = [s for s, r in stores() if r == OUTAGE_REGION]
    return random.Random(SEED).sample(sw, OUTAGE_STORES)


def plan(scale: float = 1.0) -> list[StoreDay]:
    """Lines per store and day at ``scale``; exact for the Southwest and back-dated totals.

    Raises:
        ValueError: if ``scale`` is so small that an offline store-day would have no lines.
    """
    if not MIN_SCALE <= scale <= MAX_SCALE:  # also false for nan
        raise ValueError(f"scale {scale} is out of range: use {MIN_SCALE} to {MAX_SCALE}")
    backdated_total = round(BACKDATED_LINES * scale)
    sw_total = round(SOUTHWEST_LINES * scale)
    rng = random.Random(SEED)
    store_factor = {sid: rng.uniform(0.7, 1.3) for sid, _ in stores()}
    offline = outage_store_ids()
    slot = {sid: i for i, sid in enumerate(offline)}
    cells = []
    for d in range(DAYS):
        day = FIRST_DAY + dt.timedelta(days=d)
        for sid, region in stores():
            w = store_factor[sid] * WEEKDAY_FACTOR[day.weekday()] * rng.uniform(0.97, 1.03)
            late = sid in slot and day in OUTAGE_DAYS
            cells.append((d, day, sid, region, w, late))
    sw_normal = [c for c in cells if c[3] == OUTAGE_REGION and not c[5]]
    sw_late = [c for c in cells if c[5]]
    lines: dict[tuple[int, int], int] = {}
    for group, total in ((sw_normal, sw_total - backdated_total), (sw_late, backdated_total)):
        for c, n in zip(group, _apportion(total, [c[4] for c in group])):
            lines[(c[0], c[2])] = n
    per_weight = (sw_total - backdated_total) / sum(c[4] for c in sw_normal)
    out = []
    for d, day, sid, region, w, late in cells:
        n = lines.get((d, sid), max(1, round(per_weight * w)))
        out.append(StoreDay(d, day, sid, region, n, late, slot.get(sid, 0)))
    return out


_ROWS_SQL = """
SELECT
  CAST(p.day_index AS BIGINT) * 10000000000 + CAST(p.store_id AS BIGINT) * 1000000 + r.i AS sales_line_id,
  p.store_id,
  p.region,
  p.day + to_seconds({open} + CASE WHEN p.lines = 1 THEN {span} ELSE (r.i * {span}) // (p.lines - 1) END) AS sale_ts,
  CASE WHEN p.backdated
       THEN TIMESTAMP '{recovery}' + to_seconds(p.recovery_slot * 900 + (r.i * 14400) // p.lines)
       ELSE p.day + to_seconds({open} + CASE WHEN p.lines = 1 THEN {span} ELSE (r.i * {span}) // (p.lines - 1) END
                               + 5 + ((p.store_id * 31 + r.i * 17) % 120))
  END AS posted_ts,
  CAST((((CAST(p.day_index AS BIGINT) * 7919 + p.store_id * 104729 + r.i * 1299709) % 4990) + 49) / 100 AS DECIMAL(18,2)) AS net_sales
FROM plan p, range(p.lines) r(i)
"""


def _plan_table(cells: list[StoreDay]) -> pa.Table:
    return pa.table(
        {
            "day_index": [c.day_index for c in cells],
            "day": [dt.datetime.combine(c.day, dt.time()) for c in cells],
            "store_id": [c.store_id for c in cells],
            "region": [c.region for c in cells],
            "lines": [c.lines for c in cells],
            "backdated": [c.backdated for c in cells],
            "recovery_slot": [c.recovery_slot for c in cells],
        }
    )


def rows_sql(posted_after: dt.datetime | None, posted_until: dt.datetime) -> str:
    """DuckDB SQL producing the sales lines posted in (posted_after, posted_until], from a ``plan`` relation."""
    body = _ROWS_SQL.format(open=OPEN_SECONDS, span=SPAN_SECONDS, recovery=RECOVERY_START.isoformat(sep=" "))
    cond = f"posted_ts <= TIMESTAMP '{posted_until.isoformat(sep=' ')}'"
    if posted_after is not None:
        cond += f" AND posted_ts > TIMESTAMP '{posted_after.isoformat(sep=' ')}'"
    return f"SELECT * FROM ({body}) WHERE {cond} ORDER BY sales_line_id"


def generate_batches(
    scale: float, posted_until: dt.datetime, posted_after: dt.datetime | None = None, batch_rows: int = 200_000
) -> Iterator[pa.RecordBatch]:
    """Stream the lines posted in (posted_after, posted_until] as Arrow batches, built in DuckDB."""
    import duckdb

    con = duckdb.connect()
    try:
        con.register("plan", _plan_table(plan(scale)))
        yield from con.sql(rows_sql(posted_after, posted_until)).to_arrow_reader(batch_rows)
    finally:
        con.close()


def _state_get(db: Database) -> dt.datetime | None:
    rows = db.fetch_all("SELECT max(posted_until) FROM pos.generator_state")
    return rows[0][0] if rows else None


def post_lines(db: Database, scale: float, posted_until: dt.datetime) -> int:
    """Post every line with ``posted_ts`` up to ``posted_until`` that is not in ``db`` yet.

    Creates ``pos.sales_line`` (and ``pos.generator_state``, which remembers the cutoff) if needed.
    Works on DuckDB natively and on any SQLAlchemy database (PostgreSQL in the tests).

    Returns:
        The number of lines inserted by this call.
    """
    for ddl in ("CREATE SCHEMA IF NOT EXISTS pos", SOURCE_DDL,
                "CREATE TABLE IF NOT EXISTS pos.generator_state (posted_until TIMESTAMP NOT NULL, scale DOUBLE NOT NULL)"):
        db.execute(sqlglot.transpile(ddl, read="duckdb", write=db.dialect)[0])
    after = _state_get(db)
    if after is not None and posted_until <= after:
        return 0
    if isinstance(db, DuckDBDatabase):
        with db.connect() as con:
            count = "SELECT count(*) FROM pos.sales_line"
            before = con.execute(count).fetchall()[0][0]
            con.register("plan", _plan_table(plan(scale)))
            con.execute(f"INSERT INTO pos.sales_line {rows_sql(after, posted_until)}")
            con.execute("INSERT INTO pos.generator_state VALUES (?, ?)", [posted_until, scale])
            return con.execute(count).fetchall()[0][0] - before
    inserted = 0
    import sqlalchemy as sa

    engine = db._engine  # SqlAlchemyDatabase
    meta = sa.MetaData()
    t = sa.Table("sales_line", meta, autoload_with=engine, schema="pos")
    with engine.begin() as con:
        for batch in generate_batches(scale, posted_until, after, batch_rows=20_000):
            con.execute(t.insert(), batch.to_pylist())
            inserted += batch.num_rows
        con.exec_driver_sql(
            "INSERT INTO pos.generator_state VALUES (%(u)s, %(s)s)", {"u": posted_until, "s": scale}
        )
    return inserted


def post_straggler_day(db: Database, day: dt.date, lines: int, posted: dt.datetime) -> int:
    """Post ``lines`` more Southwest lines sold on ``day`` and posted at ``posted``: a straggler store
    that sends one more back-dated day after the incident was diagnosed (``demo --fail-verify``: the
    repair's window misses that partition, so its verify finds the gap still open). Returns the lines posted."""
    outage = outage_store_ids()
    start = dt.datetime.combine(day, dt.time(0)) + dt.timedelta(seconds=OPEN_SECONDS)
    values = ", ".join(
        f"({i}, {outage[i % len(outage)]}, '{OUTAGE_REGION}', TIMESTAMP '{start + dt.timedelta(minutes=7 * i)}', "
        f"TIMESTAMP '{posted}', {12.5 + i % 7:.2f})" for i in range(lines))
    db.execute(f"INSERT INTO pos.sales_line SELECT (SELECT max(sales_line_id) FROM pos.sales_line) + 1 + v.i, v.store_id, "
               f"v.region, v.sale_ts, v.posted_ts, v.net_sales FROM (VALUES {values}) AS v(i, store_id, region, sale_ts, "
               "posted_ts, net_sales)")
    return lines

