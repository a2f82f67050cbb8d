"""Deterministic POS data for the migration story: ten tables of the consolidation database, two waves.

Wave 1 moves the selling side (``regions``, ``stores``, ``products``, ``price_changes``, ``sales_line``);
wave 2 the rest (``inventory``, ``returns``, ``promotions``, ``tenders``, ``loyalty_members``). The
sales lines cover the seven days before yesterday (UTC); a few Southwest stores post two of those
days late, back-dated, after the warehouse's incremental load already passed them
(:func:`post_late_lines`); later one more back-dated batch lands (:func:`post_source_update`).

The source is a DuckDB file (the embedded default) or a PostgreSQL schema ``pos`` (``--source
postgres``): the same DDL and rows, written through SQL and Arrow.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import pyarrow as pa

from dw_dagster import Database

SEED = 20261203
REGIONS = ["Midwest", "Northeast", "Southeast", "Southwest", "West"]
STORES = 40
DAYS = 7
LATE_STORES = (3, 8, 13)  # Southwest stores whose uplink was down
DEMO_SCHEMA_MARK = "made by dw-dagster demo migration"

WAVE1 = ["regions", "stores", "products", "price_changes", "sales_line"]
WAVE2 = ["inventory", "returns", "promotions", "tenders", "loyalty_members"]

DDL = {
    "regions": "region_id INTEGER PRIMARY KEY, name VARCHAR(32) NOT NULL",
    "stores": "store_id INTEGER PRIMARY KEY, region VARCHAR(32) NOT NULL, opened DATE NOT NULL, sqft INTEGER",
    "products": "product_id INTEGER PRIMARY KEY, name VARCHAR(64) NOT NULL, category VARCHAR(32) NOT NULL, "
                "unit_price DECIMAL(10,2) NOT NULL",
    "price_changes": "change_id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL, changed_at TIMESTAMP NOT NULL, "
                     "old_price DECIMAL(10,2) NOT NULL, new_price DECIMAL(10,2) NOT NULL",
    "sales_line": "sales_line_id BIGINT PRIMARY KEY, store_id INTEGER NOT NULL, region VARCHAR(32) NOT NULL, "
                  "sale_ts TIMESTAMP NOT NULL, posted_ts TIMESTAMP NOT NULL, net_sales DECIMAL(18,2) NOT NULL",
    "inventory": "store_id INTEGER NOT NULL, product_id INTEGER NOT NULL, on_hand INTEGER NOT NULL, "
                 "counted_at TIMESTAMP NOT NULL, PRIMARY KEY (store_id, product_id)",
    "returns": "return_id INTEGER PRIMARY KEY, sales_line_id BIGINT NOT NULL, store_id INTEGER NOT NULL, "
               "amount DECIMAL(18,2) NOT NULL, returned_at TIMESTAMP NOT NULL",
    "promotions": "promo_id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL, starts DATE NOT NULL, ends DATE NOT NULL, "
                  "discount_pct DECIMAL(5,2) NOT NULL",
    "tenders": "tender_id INTEGER PRIMARY KEY, sales_line_id BIGINT NOT NULL, tender_type VARCHAR(16) NOT NULL, "
               "amount DECIMAL(18,2) NOT NULL",
    "loyalty_members": "member_id INTEGER PRIMARY KEY, store_id INTEGER NOT NULL, joined DATE NOT NULL, "
                       "tier VARCHAR(16) NOT NULL",
}


def first_day(today: dt.date | None = None) -> dt.date:
    """The first sale day: eight days before ``today`` (UTC), so every day is a closed partition."""
    return (today or dt.datetime.now(dt.timezone.utc).date()) - dt.timedelta(days=DAYS + 1)


def _region(store: int) -> str:
    return REGIONS[store % len(REGIONS)]


def _lines(day0: dt.date, scale: float) -> list[tuple]:
    """Every sales line: (id, store, region, sale_ts, posted_ts, net_sales); late ones posted after the last load."""
    rng = random.Random(SEED)
    out, n = [], 0
    per_store = max(2, round(12 * scale / 0.01))
    late_days = (DAYS - 3, DAYS - 2)
    for d in range(DAYS):
        day = dt.datetime.combine(day0 + dt.timedelta(days=d), dt.time(7))
        for s in range(1, STORES + 1):
            for i in range(per_store):
                n += 1
                sale = day + dt.timedelta(seconds=rng.randrange(0, 14 * 3600))
                late = _region(s) == "Southwest" and s in LATE_STORES and d in late_days
                posted = (dt.datetime.combine(day0 + dt.timedelta(days=DAYS), dt.time(9)) if late
                          else sale + dt.timedelta(minutes=rng.randrange(1, 30)))
                out.append((n, s, _region(s), sale, posted, Decimal(rng.randrange(100, 9000)) / 100))
    return out


def _rows(table: str, day0: dt.date, scale: float) -> list[tuple]:
    rng = random.Random(f"{SEED}:{table}")
    t0 = dt.datetime.combine(day0, dt.time(6))
    if table == "regions":
        return [(i + 1, r) for i, r in enumerate(REGIONS)]
    if table == "stores":
        return [(s, _region(s), day0 - dt.timedelta(days=400 + s), 8000 + 150 * s) for s in range(1, STORES + 1)]
    if table == "products":
        return [(p, f"product {p}", ["dairy", "bakery", "produce", "frozen"][p % 4], Decimal(rng.randrange(99, 2999)) / 100)
                for p in range(1, 201)]
    if table == "price_changes":
        return [(c, 1 + c % 200, t0 + dt.timedelta(minutes=7 * c), Decimal(rng.randrange(99, 2999)) / 100,
                 Decimal(rng.randrange(99, 2999)) / 100) for c in range(1, 301)]
    if table == "inventory":
        return [(s, p, rng.randrange(0, 400), t0 + dt.timedelta(hours=s)) for s in range(1, STORES + 1)
                for p in range(1, 26)]
    if table == "returns":
        return [(r, 1 + 5 * r, 1 + r % STORES, Decimal(rng.randrange(100, 5000)) / 100, t0 + dt.timedelta(hours=r))
                for r in range(1, 121)]
    if table == "promotions":
        return [(p, 1 + 3 * p % 200, day0 + dt.timedelta(days=p % 5), day0 + dt.timedelta(days=5 + p % 5),
                 Decimal(rng.randrange(500, 3000)) / 100) for p in range(1, 61)]
    if table == "tenders":
        return [(t, 1 + t, ["cash", "card", "voucher"][t % 3], Decimal(rng.randrange(100, 9000)) / 100)
                for t in range(1, 401)]
    if table == "loyalty_members":
        return [(m, 1 + m % STORES, day0 - dt.timedelta(days=m), ["bronze", "silver", "gold"][m % 3])
                for m in range(1, 251)]
    raise KeyError(table)


def _insert(db: Database, table: str, rows: list[tuple]) -> None:
    """Insert ``rows`` into ``pos.table`` (multi-row VALUES, in chunks)."""
    from dw_dagster.databases import sql

    for i in range(0, len(rows), 500):
        chunk = rows[i:i + 500]
        values = ", ".join("(" + ", ".join(sql.literal(v).sql(dialect=db.dialect) for v in r) + ")" for r in chunk)
        db.execute(f"INSERT INTO pos.{table} VALUES {values}")


def create_source(db: Database, scale: float, today: dt.date | None = None) -> dict[str, int]:
    """Create the ten tables and fill them, the late sales lines left out; returns rows per table.

    On PostgreSQL the schema ``pos`` is dropped first only when an earlier demo made it (its comment).

    Raises:
        RuntimeError: a ``pos`` schema exists on PostgreSQL that the demo did not make.
    """
    day0 = first_day(today)
    if db.dialect == "postgres":
        mark = db.fetch_all("SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 'pos'")
        if mark and mark[0][0] != DEMO_SCHEMA_MARK:
            raise RuntimeError("a schema pos exists in this PostgreSQL database and was not made by the demo; "
                               "use another database (--source-url)")
        db.execute("DROP SCHEMA IF EXISTS pos CASCADE")
        db.execute("CREATE SCHEMA pos")
        db.execute(f"COMMENT ON SCHEMA pos IS '{DEMO_SCHEMA_MARK}'")
    else:
        db.execute("CREATE SCHEMA IF NOT EXISTS pos")
    counts = {}
    for table, ddl in DDL.items():
        db.execute(f"DROP TABLE IF EXISTS pos.{table}")
        db.execute(f"CREATE TABLE pos.{table} ({ddl})")
        rows = [r for r in _lines(day0, scale) if r[4] < _cutoff(day0)] if table == "sales_line" else _rows(table, day0, scale)
        _insert(db, table, rows)
        counts[table] = len(rows)
    return counts


def _cutoff(day0: dt.date) -> dt.datetime:
    """When the last nightly load of the history ran: the late lines were posted after it."""
    return dt.datetime.combine(day0 + dt.timedelta(days=DAYS), dt.time(1))


def post_late_lines(db: Database, scale: float, today: dt.date | None = None) -> tuple[int, list[str]]:
    """The offline stores come back and post their back-dated lines; returns (rows, their sale days)."""
    day0 = first_day(today)
    late = [r for r in _lines(day0, scale) if r[4] >= _cutoff(day0)]
    _insert(db, "sales_line", late)
    return len(late), sorted({r[3].date().isoformat() for r in late})


def post_source_update(db: Database, n: int = 25, today: dt.date | None = None) -> tuple[int, str]:
    """One more back-dated batch lands in the source behind the warehouse's watermark; returns (rows, the day)."""
    day0 = first_day(today)
    day = day0 + dt.timedelta(days=1)
    start = int(db.fetch_all("SELECT max(sales_line_id) FROM pos.sales_line")[0][0]) + 1
    posted = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0)
    rows = [(start + i, 23, _region(23), dt.datetime.combine(day, dt.time(12)) + dt.timedelta(minutes=i), posted,
             Decimal("19.99")) for i in range(n)]
    _insert(db, "sales_line", rows)
    return n, day.isoformat()


def table_batches(db: Database, table: str):
    """All rows of ``pos.table`` as Arrow batches (what the copy loaders move)."""
    return db.fetch_batches(f"SELECT * FROM pos.{table}")


__all__ = ["DDL", "WAVE1", "WAVE2", "create_source", "first_day", "post_late_lines", "post_source_update", "table_batches",
           "pa"]
