"""The :class:`Database` protocol, its error, and Arrow helpers the engines share.

A source or warehouse is read through :class:`Database`: SQL comes in rendered by sqlglot for its
:attr:`Database.dialect`; only aggregates and small samples are fetched with
:meth:`Database.fetch_all`, bulk rows stream as Arrow record batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import pyarrow as pa
from dw_dagster.errors import DwDagsterError
from dw_dagster.dagster_private import public


@public
class DatabaseError(DwDagsterError, RuntimeError):
    """A query failed; the message names the database and the statement, never credentials."""


@runtime_checkable
class Database(Protocol):
    """What dw_dagster needs from a database: its dialect, small results, and streamed batches."""

    dialect: str
    name: str

    def fetch_all(self, sql: str) -> list[tuple]:
        """Run ``sql`` and return every row. Only for aggregates and bounded samples."""
        ...

    def fetch_batches(self, sql: str, batch_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        """Run ``sql`` and stream its rows as Arrow record batches of at most ``batch_rows`` rows."""
        ...

    def execute(self, sql: str) -> None:
        """Run a statement that returns nothing."""
        ...


def _short(sql: str) -> str:
    return " ".join(sql.split())[:300]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _rechunk(batch: pa.RecordBatch | pa.Table, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Split a record batch or table into record batches of at most ``batch_rows`` rows."""
    if isinstance(batch, pa.Table):
        yield from batch.to_batches(max_chunksize=batch_rows)
        return
    for offset in range(0, batch.num_rows, batch_rows):
        yield batch.slice(offset, batch_rows)


def _rows_to_batch(names: list[str], rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows)) if rows else [[] for _ in names]
    return pa.RecordBatch.from_arrays([pa.array(list(c)) for c in cols], names=names)
