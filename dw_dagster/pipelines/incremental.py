"""Incremental merge loads by high-watermark: the pipeline shape whose failures dw_dagster diagnoses.

A load reads the source rows of one partition (a day of ``partition_column``) whose
``watermark_column`` is above the high-watermark (the largest value already in the target, less
``lookback_hours``), stages them in the warehouse and merges them on ``merge_key``, so a reload
never duplicates a key. Each load reports what it used in ``dw/`` metadata (watermark, source
snapshot, row counts) so that :mod:`dw_dagster.diagnosis.causes.watermark` can later explain what it missed.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlglot import exp

from dw_dagster.databases import sql
from dw_dagster.core.config_files import read_yaml_model
from dw_dagster.databases import Database, DuckDBDatabase
from dw_dagster.errors import DwDagsterError
from dw_dagster.core import keys as c
from dw_dagster.dagster_private import public


_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,127}$")
_PLAIN_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*){0,2}$")


class LoadSpecError(DwDagsterError, ValueError):
    """The pipeline file is missing or invalid; the message names the file and the field."""


@public
class IncrementalLoadSpec(BaseModel):
    """A pipeline file (YAML) describing one incremental merge load."""

    model_config = ConfigDict(extra="forbid")

    source_table: str
    target_table: str
    merge_key: str
    partition_column: str
    watermark_column: str
    lookback_hours: float = Field(0, ge=0, le=24 * 90)
    arrival_column: str | None = None
    columns: list[str] = Field(min_length=1)

    @field_validator("source_table", "target_table")
    @classmethod
    def _plain_table(cls, v: str) -> str:
        # Config names are refused unless plain; names from elsewhere are quoted by dw_dagster.databases.sql.
        if not _PLAIN_TABLE.match(v):
            raise ValueError(f"{v!r} is not a plain [catalog.]schema.table name (letters, digits, _ and $)")
        return v

    @field_validator("merge_key", "partition_column", "watermark_column", "arrival_column")
    @classmethod
    def _plain_column(cls, v: str | None) -> str | None:
        if v is not None and not _PLAIN_NAME.match(v):
            raise ValueError(f"{v!r} is not a plain column name (letters, digits, _ and $)")
        return v

    @model_validator(mode="after")
    def _columns_loaded(self) -> "IncrementalLoadSpec":
        for c in self.columns:
            self._plain_column(c)
        for field in ("merge_key", "partition_column", "watermark_column"):
            if getattr(self, field) not in self.columns:
                raise ValueError(f"{field} {getattr(self, field)!r} must be one of the loaded columns {self.columns}")
        return self

    @classmethod
    def from_file(cls, path: str | Path) -> IncrementalLoadSpec:
        """Read and validate a pipeline YAML file.

        Raises:
            LoadSpecError: if the file is missing, not YAML, or fails validation.
        """
        return read_yaml_model(path, cls, LoadSpecError, "pipeline file")


@public
class LoadResult(BaseModel):
    """What one partition's load read: the record the late-rows diagnosis works from.

    :func:`load_partition` returns one; an asset that loads by its own code builds one per
    partition it loaded and records them with :func:`load_metadata`. Times are naive UTC (the
    databases' ``TIMESTAMP`` values); an aware time is converted to UTC when it is read back.

    The diagnosis (:mod:`dw_dagster.diagnosis.causes.watermark`) needs, of the latest load of
    each partition: the partition's window, the watermark column, ``watermark_low`` (the value
    the load read strictly above; the latest load's is the high-watermark late rows are measured
    against; None for a first load, which read everything and is not tested) and
    ``source_snapshot_ts`` (the newest arrival time in the source when the load read it; a
    source row that arrived later, with a watermark at or below the high-watermark, is a late
    row; None leaves the partition out of the test). The row counts are shown on the asset page
    and used by the duplicate-load cause; the rest is informational.
    """

    partition_key: str = Field(description="the Dagster partition key the load wrote (a day of the partition column)")
    partition_start: dt.datetime = Field(description="the partition's window start (inclusive), naive UTC")
    partition_end: dt.datetime = Field(description="the partition's window end (exclusive), naive UTC")
    watermark_column: str = Field(description="the source column the load compared with the high-watermark")
    watermark_high_before: dt.datetime | None = Field(None, description="max(watermark_column) in the target before the load")
    watermark_low: dt.datetime | None = Field(description="rows must be strictly above this to be read (the "
                                              "high-watermark less the lookback); None: the load read every row")
    lookback_hours: float = Field(0, ge=0, description="hours subtracted from the high-watermark")
    source_snapshot_ts: dt.datetime | None = Field(description="max(arrival_column) in the source when the load started")
    rows_read: int = Field(ge=0)
    rows_inserted: int | None = Field(None, ge=0, description="new keys written (None: not counted)")
    rows_updated: int | None = Field(None, ge=0, description="existing keys rewritten (None: not counted)")

    @model_validator(mode="after")
    def _window(self) -> "LoadResult":
        if self.partition_end <= self.partition_start:
            raise ValueError(f"partition_end {self.partition_end} is not after partition_start {self.partition_start}")
        return self


@public
class LoadError(DwDagsterError, RuntimeError):
    """A load cannot run as configured (nothing was written)."""


def _ddl_from_source(source: Database, spec: IncrementalLoadSpec) -> str:
    """``CREATE TABLE`` of the target with the loaded columns' types as the source's catalog has them."""
    from dw_dagster.databases.catalog import CatalogError, read_table_schema

    try:
        schema = read_table_schema(source, spec.source_table)
    except CatalogError as e:
        raise LoadError(f"the target {spec.target_table} does not exist and the source's catalog cannot give the column "
                        f"types to create it ({e}); create {spec.target_table} first") from e
    types = {c.name.lower(): c.type for c in schema.columns}
    missing = [c for c in spec.columns if c.lower() not in types]
    if missing:
        raise LoadError(f"the target {spec.target_table} does not exist and the source {spec.source_table} has no "
                        f"column(s) {missing} to take the types from; create {spec.target_table} first")
    cols = ", ".join(f"{sql.identifier(c).sql('duckdb')} {_warehouse_type(types[c.lower()], c, source, spec)}"
                     for c in spec.columns)
    return f"CREATE TABLE IF NOT EXISTS {sql.table(spec.target_table).sql('duckdb')} ({cols})"


def _warehouse_type(type_text: str, column: str, source: Database, spec: IncrementalLoadSpec) -> str:
    """The DuckDB type for a source column's catalog type, or a :class:`LoadError` when it would be a guess."""
    try:
        dtype = exp.DataType.build(type_text, dialect=source.dialect)
    except Exception:
        dtype = None
    unbounded_decimal = dtype is not None and dtype.this == exp.DataType.Type.DECIMAL and not dtype.expressions
    if dtype is None or dtype.this in (exp.DataType.Type.USERDEFINED, exp.DataType.Type.UNKNOWN) or (
            unbounded_decimal and source.dialect != "duckdb"):
        raise LoadError(f"the target {spec.target_table} does not exist and the source's type {type_text!r} of column "
                        f"{column} has no exact DuckDB equivalent; create {spec.target_table} first")
    return dtype.sql("duckdb")


def ensure_target(warehouse: DuckDBDatabase, spec: IncrementalLoadSpec, source: Database | None = None) -> None:
    """Create the target schema and table if they do not exist, with the source catalog's column types.

    Raises:
        LoadError: the target is missing and no source (or no source catalog entry) gives its types;
            a table of guessed types is never created.
    """
    t = sql.table(spec.target_table)
    exists = warehouse.fetch_all(sql.render(
        "SELECT count(*) FROM information_schema.tables WHERE lower(table_name) = lower(:n)"
        + (" AND lower(table_schema) = lower(:s)" if t.db else ""), "duckdb",
        n=sql.literal(t.name), s=sql.literal(t.db)))[0][0]
    if exists:
        return
    if source is None:
        raise LoadError(f"the target {spec.target_table} does not exist; create it first")
    ddl = _ddl_from_source(source, spec)
    if t.db:
        schema = ".".join(p.sql("duckdb") for p in (t.args.get("catalog"), t.args["db"]) if p is not None)
        warehouse.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    warehouse.execute(ddl)


def load_summary(results: Sequence[LoadResult]) -> str:
    """One line for the asset page's events: which partitions, how many rows above which watermark.

    ``"load of 2026-11-26: read 1,234 rows above sale_ts 2026-11-26 21:59:59, inserted 12"``; a
    range of partitions reads ``"load of 2026-11-26..2026-11-27 (2 partitions): ..."``.
    """
    keys = sorted(r.partition_key for r in results)
    where = keys[0] if len(keys) == 1 else f"{keys[0]}..{keys[-1]} ({len(keys)} partitions)"
    lows = sorted({r.watermark_low for r in results if r.watermark_low is not None})
    above = (f" above {results[0].watermark_column} {lows[0]:%Y-%m-%d %H:%M:%S}" if len(lows) == 1
             else f" above {len(lows)} watermarks on {results[0].watermark_column}" if lows else "")
    out = f"load of {where}: read {sum(r.rows_read for r in results):,} rows{above}"
    if all(r.rows_inserted is not None for r in results):
        out += f", inserted {sum(r.rows_inserted for r in results):,}"
    return out


@public
def load_metadata(results: Iterable[LoadResult], *, row_count: int | None = None) -> dict[str, Any]:
    """The materialization metadata that records what a load read, for the late-rows diagnosis.

    Any asset that loads incrementally records its loads this way, whatever does the loading:
    return ``dg.MaterializeResult(metadata=load_metadata([...]))`` with one :class:`LoadResult`
    per partition the run loaded (a single run over a range of partitions gives one per
    partition; Dagster copies the metadata onto each partition's materialization, and the
    diagnosis reads each partition's own entry). The asset must be partitioned (one time-window
    partitions definition): the diagnosis reads the latest load of each partition, and the
    repair reruns partitions.

    Args:
        results: one per loaded partition (:class:`LoadResult`: the partition and its window, the
            watermark column, ``watermark_low`` it read above, the source's newest arrival time
            when the load started, the rows read).
        row_count: the table's rows after the load (``dagster/row_count``), if known.

    Returns:
        ``{"dw/summary" (one line: see :func:`load_summary`), "dw/loads": {partition_key: LoadResult as JSON},
        "dw/watermark_column", "dw/lookback_hours",
        "dw/rows_read"[, "dw/rows_inserted"][, "dagster/row_count"]}`` (``dw/rows_inserted`` when
        every result counted its inserts).

    Raises:
        ValueError: no results, or results of different watermark columns.
    """

    results = list(results)
    if not results:
        raise ValueError("load_metadata needs at least one LoadResult")
    if len({r.watermark_column for r in results}) > 1:
        raise ValueError("the loads name different watermark columns")
    loads = {r.partition_key: r.model_dump(mode="json") for r in results}
    md: dict[str, Any] = {
        c.SUMMARY_KEY: load_summary(results),
        c.LOADS_KEY: dg.MetadataValue.json(loads),
        c.WATERMARK_COLUMN_KEY: results[0].watermark_column,
        c.LOOKBACK_HOURS_KEY: results[0].lookback_hours,
        c.ROWS_READ_KEY: sum(r.rows_read for r in results),
    }
    if all(r.rows_inserted is not None for r in results):
        md[c.ROWS_INSERTED_KEY] = sum(r.rows_inserted for r in results)
    if row_count is not None:
        md["dagster/row_count"] = int(row_count)
    return md


@public
def load_partition(
    source: Database,
    warehouse: DuckDBDatabase,
    spec: IncrementalLoadSpec,
    partition_key: str,
    start: dt.datetime,
    end: dt.datetime,
    batch_rows: int = 200_000,
) -> LoadResult:
    """Load one partition [start, end) of ``partition_column`` from ``source`` into the warehouse.

    Args:
        source: the operational database (DuckDB stand-in, PostgreSQL, Informix...).
        warehouse: the DuckDB warehouse holding ``spec.target_table``.
        spec: the pipeline file's contents.
        partition_key: the Dagster partition key, for the result only.
        start, end: the partition's time window, naive UTC.
        batch_rows: rows per Arrow batch moved from source to warehouse.

    Returns:
        A :class:`LoadResult`; the merge inserts new keys and updates existing ones.

    Raises:
        dw_dagster.databases.DatabaseError: when a query fails on either side.
    """
    ensure_target(warehouse, spec, source)
    target = sql.table(spec.target_table)
    hwm = warehouse.fetch_all(
        sql.render("SELECT max(:wm) FROM :t", "duckdb", wm=sql.column(spec.watermark_column), t=target)
    )[0][0]
    low = hwm - dt.timedelta(hours=spec.lookback_hours) if hwm is not None else None
    snapshot = None
    if spec.arrival_column:
        snapshot = source.fetch_all(
            sql.render("SELECT max(:a) FROM :t", source.dialect, a=sql.column(spec.arrival_column), t=sql.table(spec.source_table))
        )[0][0]
    cols = [sql.column(c) for c in spec.columns]
    query = (
        exp.select(*cols)
        .from_(sql.table(spec.source_table))
        .where(sql.column(spec.partition_column) >= sql.literal(start))
        .where(sql.column(spec.partition_column) < sql.literal(end))
    )
    if low is not None:
        query = query.where(sql.column(spec.watermark_column) > sql.literal(low))
    key = sql.identifier(spec.merge_key).sql("duckdb")
    tgt = target.sql("duckdb")
    rows_read = inserted = 0
    with warehouse.connect() as con:
        con.execute(f"CREATE OR REPLACE TEMP TABLE dw_stage AS SELECT * FROM {tgt} LIMIT 0")
        for batch in source.fetch_batches(query.sql(dialect=source.dialect), batch_rows):
            con.register("dw_batch", batch)
            con.execute("INSERT INTO dw_stage BY NAME SELECT * FROM dw_batch")
            con.unregister("dw_batch")
            rows_read += batch.num_rows
        if rows_read:
            inserted = con.execute(
                f"SELECT count(*) FROM dw_stage s WHERE NOT EXISTS (SELECT 1 FROM {tgt} t WHERE t.{key} = s.{key})"
            ).fetchall()[0][0]
            assignments = ", ".join(f"{c.sql('duckdb')} = s.{c.sql('duckdb')}" for c in cols if c.name != spec.merge_key)
            names = ", ".join(c.sql("duckdb") for c in cols)
            con.execute(
                f"MERGE INTO {tgt} AS t USING dw_stage AS s ON t.{key} = s.{key} "
                f"WHEN MATCHED THEN UPDATE SET {assignments} "
                f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({', '.join('s.' + c.sql('duckdb') for c in cols)})"
            )
        con.execute("DROP TABLE dw_stage")
    return LoadResult(
        partition_key=partition_key,
        partition_start=start,
        partition_end=end,
        watermark_column=spec.watermark_column,
        watermark_high_before=hwm,
        watermark_low=low,
        lookback_hours=spec.lookback_hours,
        source_snapshot_ts=snapshot,
        rows_read=rows_read,
        rows_inserted=inserted,
        rows_updated=rows_read - inserted,
    )


@public
class PipelineRepoResource(dg.ConfigurableResource):
    """The pipeline repository (a git working copy) that holds the load's pipeline files.

    Read at run time, so a merged change set takes effect on the next run.
    """

    root: str

    def load_spec(self, relative_path: str) -> IncrementalLoadSpec:
        """Read ``relative_path`` under :attr:`root` as an :class:`IncrementalLoadSpec`."""
        return IncrementalLoadSpec.from_file(Path(self.root) / relative_path)
