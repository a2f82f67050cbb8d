"""A DuckDB stand-in for the orders service's database (``shop.orders``), for the server-less path.

In production the source is MariaDB/MySQL (``DW_ORDERS_SOURCE_URL``) and the sink reads its
binlog. The demo and the tests replay the generator's change stream instead
(:class:`~dw_dagster_examples.orders.cdc.ReplaySource`); the diagnosis and the verification still
need to *query* the source, so :func:`write_source` puts the source table as it stands at a point
of the stream into a DuckDB file, with the MySQL table's columns (``cdc.source_ddl``): the same
role the POS stand-in plays in the store-sales example.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from dw_dagster.databases import DuckDBDatabase
from dw_dagster_examples.orders import generator as gen

SOURCE_TABLE = "shop.orders"

_SCHEMA = pa.schema([
    ("order_id", pa.int64()), ("customer_id", pa.int64()), ("order_ts", pa.timestamp("us")),
    ("amount", pa.decimal128(18, 2)), ("currency", pa.string()), ("payment_method", pa.string()),
    ("shipping_country", pa.string()), ("status", pa.string()), ("updated_at", pa.timestamp("us")),
])


def source_state(scale: float, until: dt.datetime | None = None) -> dict[int, dict]:
    """The source table after every change committed before ``until`` (naive UTC; None: the whole
    stream, to :data:`~dw_dagster_examples.orders.generator.STREAM_END`): ``order_id`` → row.

    Raises:
        ValueError: ``scale`` out of the generator's range.
    """
    state: dict[int, dict] = {}
    for c in gen.changes(scale):
        if until is not None and c.ts >= until:
            break
        if c.op == "delete":
            state.pop(c.order_id, None)
        else:
            state[c.order_id] = c.after
    return state


def write_source(db: DuckDBDatabase, scale: float, until: dt.datetime | None = None) -> int:
    """Replace ``shop.orders`` in ``db`` with the source as of ``until`` (see :func:`source_state`).

    ``shipping_country`` is nullable, as in the MySQL table; the key is the primary key.

    Returns:
        Rows written.
    """
    rows = list(source_state(scale, until).values())
    data = pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in _SCHEMA}, schema=_SCHEMA)
    with db.connect() as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS shop")
        con.execute("CREATE OR REPLACE TABLE shop.orders (order_id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL, "
                    "order_ts TIMESTAMP NOT NULL, amount DECIMAL(18,2) NOT NULL, currency VARCHAR NOT NULL, "
                    "payment_method VARCHAR NOT NULL, shipping_country VARCHAR, status VARCHAR NOT NULL, "
                    "updated_at TIMESTAMP NOT NULL)")
        con.register("dw_source_rows", data)
        con.execute("INSERT INTO shop.orders SELECT * FROM dw_source_rows")
        con.unregister("dw_source_rows")
    return len(rows)


__all__ = ["SOURCE_TABLE", "source_state", "write_source"]
