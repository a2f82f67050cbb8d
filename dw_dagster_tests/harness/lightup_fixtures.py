"""A fake Lightup on loopback seeded with a small store-sales pair of DuckDB tables."""

import contextlib
import datetime as dt
from pathlib import Path

from dw_dagster.databases import DuckDBDatabase
from dw_dagster_dev.fakes.lightup_server import FakeLightup, FakeLightupServer, seed_store_sales

DAY = 86400
#: the tables' days: 2026-11-20 .. 2026-11-24; Southwest is missing in the target from 11-23
SOUTHWEST_MISSING = 200


def make_tables(folder: Path) -> tuple[DuckDBDatabase, DuckDBDatabase]:
    """pos.sales_line in a source and a warehouse DuckDB file; the warehouse lacks 200 Southwest rows."""
    src, wh = DuckDBDatabase(folder / "pos_db.duckdb"), DuckDBDatabase(folder / "wh.duckdb")
    for d in (src, wh):
        d.execute("CREATE SCHEMA IF NOT EXISTS pos; CREATE OR REPLACE TABLE pos.sales_line (sales_line_id INT, "
                  "region VARCHAR, sale_ts TIMESTAMP, net_sales DECIMAL(18,2))")
    src.execute("INSERT INTO pos.sales_line SELECT i, CASE WHEN i % 2 = 0 THEN 'Southwest' ELSE 'West' END, "
                "TIMESTAMP '2026-11-20' + INTERVAL (i % 5) DAY, 1.50 FROM range(1000) t(i)")
    wh.execute(f"ATTACH '{src.path}' AS s (READ_ONLY); INSERT INTO pos.sales_line SELECT * FROM s.pos.sales_line "
               "WHERE NOT (region = 'Southwest' AND sale_ts >= TIMESTAMP '2026-11-23')")
    return src, wh


def epoch(day: str) -> float:
    return dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc).timestamp()


@contextlib.contextmanager
def fake_lightup(folder: Path, access_ttl_s: float = 300.0):
    """Yields (server, state, ids, credential path); datapoints collected, no incidents yet unless monitors run."""
    src, wh = make_tables(folder)
    state = FakeLightup(access_ttl_s=access_ttl_s)
    ids = seed_store_sales(state, f"duckdb:///{src.path}", f"duckdb:///{wh.path}",
                           collect_start=dt.date(2026, 11, 18), collect_end=dt.date(2026, 11, 26))
    with FakeLightupServer(state) as server:
        cred = server.write_credential(folder / "lightup-api-credential.json")
        yield server, state, ids, cred


def add_sales_monitor(state: FakeLightup, ids: dict[str, str]) -> str:
    """A monitor on the net_sales compare metric (the seed has one on the row counts only); returns its uuid.

    Its incidents read the ``sales_source``/``sales_target`` datapoints, so a fault on those paths
    fails them and leaves the row-count incidents alone.
    """
    with state.lock:
        ids["sales_monitor"] = state.add_monitor("net_sales compare within 0.5 %", ids["sales_compare"], 0.5)
    return ids["sales_monitor"]
