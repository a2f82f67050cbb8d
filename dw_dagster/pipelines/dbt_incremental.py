"""dbt incremental models as incremental loads: the filter read from the model, each run's watermark recorded.

A dbt model materialized ``incremental`` whose ``is_incremental()`` block compares a column with
the largest value already in the model, e.g.::

    {% if is_incremental() %}
    where updated_at > (select max(updated_at) from {{ this }})
    {% endif %}

is a load by high-watermark, with the failure :mod:`dw_dagster.diagnosis.causes.watermark`
explains: a source row that arrives after the run that should have read it, stamped at or below
the high-watermark of every later run, is never read (`dbt incremental models`_).

:func:`read_incremental_filter` reads the comparison from the model's SQL as written (the block is
rendered with ``is_incremental()`` true, ``{{ this }}`` a placeholder and ``var()`` its default,
then parsed with sqlglot): the compared column, ``>`` or ``>=``, the column whose ``max()`` is
read from ``{{ this }}``, a lookback subtracted from it (``- interval '72 hours'``), and the
bounded-rebuild clause dw_dagster's fix adds (rows of ``[dw_window_start, dw_window_end)`` on a
column, when those dbt vars are set).

What each run read cannot be recovered afterwards from the model's table (the high-watermark moves
with every run), so it is recorded when the run starts: :func:`dbt_incremental_build` wraps
``dbt.cli(["build"], context=context)`` in a ``@dbt_assets`` function; before dbt starts it reads,
for each watched incremental model the run builds, ``max(<max column>)`` from the model's table
and ``max(<arrival column>)`` from the table the model selects from, and puts them on the model's
materialization as ``dw/incremental_run`` (:class:`DbtIncrementalRun`). The values are read
before dbt starts because an embedded warehouse (DuckDB) admits no reader while dbt writes.

.. _dbt incremental models: https://docs.getdbt.com/docs/build/incremental-models
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field
from sqlglot import exp

from dw_dagster.errors import DwDagsterError
from dw_dagster.databases import Database, sql
from dw_dagster.core import keys as c
from dw_dagster.dagster_private import public

INCREMENTAL_RUN_KEY = c.INCREMENTAL_RUN_KEY
WINDOW_START_VAR = "dw_window_start"
WINDOW_END_VAR = "dw_window_end"
THIS = "__dw_this__"
_WINDOW_SENTINEL = ("1901-02-03 04:05:06", "1902-03-04 05:06:07")

_TAG = re.compile(r"\{%-?\s*(if|endif)\b(.*?)-?%\}", re.S)
_IS_INCREMENTAL = re.compile(r"^\s*is_incremental\s*\(\s*\)\s*$")
_UNITS = {"hour": 1.0, "hours": 1.0, "day": 24.0, "days": 24.0, "minute": 1 / 60, "minutes": 1 / 60}


class DbtIncrementalError(DwDagsterError, ValueError):
    """The model is not an incremental load dw_dagster can read (the message says what it found)."""


@dataclass(frozen=True)
class IncrementalBlock:
    """The ``{% if is_incremental() %} ... {% endif %}`` block of a model's SQL text.

    Attributes:
        start, end: where the inside of the block starts and ends in the text (character offsets).
        text: the inside, as written (Jinja included).
    """

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class IncrementalFilter:
    """The high-watermark comparison of an incremental model.

    Attributes:
        watermark_column: the column compared with the high-watermark.
        operator: ``">"`` or ``">="``.
        max_column: the column whose ``max()`` is read from ``{{ this }}`` (usually the same).
        lookback_hours: hours subtracted from that max (0 when none).
        window_column: the column of dw_dagster's bounded-rebuild clause, None when the model has none.
        block: the ``is_incremental()`` block it was read from.
    """

    watermark_column: str
    operator: str
    max_column: str
    lookback_hours: float
    window_column: str | None
    block: IncrementalBlock


def find_incremental_block(text: str) -> IncrementalBlock:
    """The one ``{% if is_incremental() %}`` block of a model's SQL text (nested ``if`` blocks allowed).

    Raises:
        DbtIncrementalError: no such block, more than one, or an ``if`` without its ``endif``.
    """
    blocks, stack = [], []
    for m in _TAG.finditer(text):
        if m.group(1) == "if":
            stack.append((m, bool(_IS_INCREMENTAL.match(m.group(2)))))
        elif stack:
            opened, incremental = stack.pop()
            if incremental:
                blocks.append(IncrementalBlock(opened.end(), m.start(), text[opened.end():m.start()]))
    if stack:
        raise DbtIncrementalError("an {% if %} has no {% endif %}")
    if len(blocks) != 1:
        raise DbtIncrementalError(f"the model has {len(blocks)} {{% if is_incremental() %}} blocks; dw_dagster reads exactly one")
    return blocks[0]


def render_block(block: str, window: tuple[str, str] | None) -> str:
    """The block as dbt would compile it on an incremental run, with ``{{ this }}`` a placeholder."""
    import jinja2

    def var(name: str, default: Any = None) -> Any:
        if window is not None and name in (WINDOW_START_VAR, WINDOW_END_VAR):
            return window[0] if name == WINDOW_START_VAR else window[1]
        return default

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    try:
        return env.from_string(block).render(this=THIS, var=var, is_incremental=lambda: True)
    except jinja2.TemplateError as e:
        raise DbtIncrementalError(f"the is_incremental() block uses Jinja dw_dagster cannot evaluate ({e}); "
                                  "write the filter with {{ this }} and var() only") from e


def parse_block(rendered: str, dialect: str) -> exp.Expression:
    """The condition of a rendered block (``where ...`` or ``and ...``) as a sqlglot expression."""
    import sqlglot

    body = rendered.strip()
    lead = body.split(None, 1)[0].lower() if body else ""
    if lead not in ("where", "and"):
        raise DbtIncrementalError(f"the is_incremental() block starts with {lead or 'nothing'!r}; dw_dagster reads a "
                                  "block that is a `where ...` clause or an `and ...` condition")
    query = f"SELECT 1 FROM {THIS}_src " + (body if lead == "where" else f"WHERE TRUE {body}")
    try:
        where = sqlglot.parse_one(query, dialect=dialect).args.get("where")
    except sqlglot.errors.ParseError as e:
        raise DbtIncrementalError(f"the is_incremental() block does not parse as {dialect} SQL: {e}") from e
    if where is None:
        raise DbtIncrementalError("the is_incremental() block holds no condition")
    return where.this


def _hours(interval: exp.Interval) -> float:
    """An interval literal in hours (``'72 hours'``, ``'3' DAY``...)."""
    value = interval.this.name if interval.this is not None else ""
    unit = interval.args.get("unit")
    text = f"{value} {unit.name if unit is not None else ''}".strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    if not m or m.group(2) not in _UNITS:
        raise DbtIncrementalError(f"the lookback interval {interval.sql()!r} is not in minutes, hours or days")
    return float(m.group(1)) * _UNITS[m.group(2)]


def watermark_comparisons(condition: exp.Expression) -> list[tuple[exp.Expression, str, str, float]]:
    """``(node, column, max column, lookback hours)`` of each ``column > (select max(x) [- interval] from this)``."""
    found = []
    for node in condition.find_all(exp.GT, exp.GTE):
        left, right = node.this, node.expression
        if not isinstance(left, exp.Column) or not isinstance(right, exp.Subquery):
            continue
        select = right.this
        tables = [t.name for t in select.find_all(exp.Table)] if isinstance(select, exp.Select) else []
        if tables != [THIS] or len(select.expressions) != 1:
            continue
        value = select.expressions[0].unalias()
        maxes = list(value.find_all(exp.Max))
        if len(maxes) != 1 or not isinstance(maxes[0].this, exp.Column):
            continue
        lookback = 0.0
        if isinstance(value, exp.Sub) and isinstance(value.expression, exp.Interval):
            lookback = _hours(value.expression)
        elif not isinstance(value, (exp.Max, exp.Coalesce)):
            raise DbtIncrementalError(f"the high-watermark {value.sql()!r} is not max(column) [- interval ...]")
        found.append((node, left.name, maxes[0].this.name, lookback))
    return found


def _window_column(block: str, dialect: str) -> str | None:
    """The column of the bounded-rebuild clause (compared with the dw_window_* vars), if the block has one."""
    if WINDOW_START_VAR not in block:
        return None
    condition = parse_block(render_block(block, _WINDOW_SENTINEL), dialect)
    cols = {n.this.name for n in condition.find_all(exp.GTE)
            if isinstance(n.this, exp.Column) and _WINDOW_SENTINEL[0] in n.expression.sql()}
    if len(cols) != 1:
        raise DbtIncrementalError(f"the {WINDOW_START_VAR} clause compares {sorted(cols) or 'no column'}; expected one column")
    return cols.pop()


def read_incremental_filter(text: str, dialect: str) -> IncrementalFilter:
    """Read the high-watermark filter of an incremental model from its SQL text.

    Args:
        text: the model's ``.sql`` file as written (``raw_code`` in the manifest).
        dialect: the warehouse's sqlglot dialect (``duckdb``, ``snowflake``, ``postgres``, ``bigquery``...).

    Returns:
        An :class:`IncrementalFilter`.

    Raises:
        DbtIncrementalError: not exactly one ``is_incremental()`` block, Jinja other than
            ``{{ this }}`` and ``var()`` in it, or not exactly one comparison of a column with
            ``(select max(column) [- interval ...] from {{ this }})``.
    """
    block = find_incremental_block(text)
    found = watermark_comparisons(parse_block(render_block(block.text, None), dialect))
    if len(found) != 1:
        raise DbtIncrementalError(f"the is_incremental() block has {len(found)} comparisons of a column with "
                                  "(select max(column) from {{ this }}); dw_dagster reads exactly one")
    node, column, max_column, lookback = found[0]
    return IncrementalFilter(watermark_column=column, operator=">=" if isinstance(node, exp.GTE) else ">",
                             max_column=max_column, lookback_hours=lookback,
                             window_column=_window_column(block.text, dialect), block=block)


@dataclass(frozen=True)
class DbtIncrementalModel:
    """An incremental model as the manifest describes it.

    Attributes:
        unique_id, name: the dbt node.
        relation: ``[database.]schema.alias`` of its table.
        file: its SQL file, relative to the dbt project.
        unique_key: the ``unique_key`` config (a column name, a list, or None).
        incremental_strategy: the ``incremental_strategy`` config (None: the adapter's default).
        upstream: ``[database.]schema.identifier`` of each source or model it selects from.
    """

    unique_id: str
    name: str
    relation: str
    file: str
    unique_key: str | list[str] | None
    incremental_strategy: str | None
    upstream: tuple[str, ...]


def _relation(node: Mapping[str, Any]) -> str:
    parts = [node.get("database"), node.get("schema"), node.get("alias") or node.get("identifier") or node.get("name")]
    return ".".join(p for p in parts if p)


def incremental_model(manifest: Mapping[str, Any], name: str) -> DbtIncrementalModel:
    """The model ``name`` of a dbt manifest, which must be materialized ``incremental``.

    Raises:
        DbtIncrementalError: no model of that name, or not incremental.
    """
    nodes = [n for n in manifest.get("nodes", {}).values() if n.get("resource_type") == "model" and n.get("name") == name]
    if len(nodes) != 1:
        raise DbtIncrementalError(f"the dbt manifest has {len(nodes)} models named {name!r}")
    node = nodes[0]
    cfg = node.get("config", {})
    if cfg.get("materialized") != "incremental":
        raise DbtIncrementalError(f"model {name} is materialized {cfg.get('materialized')!r}, not 'incremental'")
    everything = {**manifest.get("nodes", {}), **manifest.get("sources", {})}
    upstream = tuple(_relation(everything[u]) for u in node.get("depends_on", {}).get("nodes", []) if u in everything
                     and everything[u].get("resource_type") in ("source", "model", "seed", "snapshot"))
    return DbtIncrementalModel(unique_id=node["unique_id"], name=name, relation=_relation(node),
                               file=node["original_file_path"], unique_key=cfg.get("unique_key"),
                               incremental_strategy=cfg.get("incremental_strategy"), upstream=upstream)


class DbtIncrementalRun(BaseModel):
    """What one dbt run of an incremental model read, recorded before dbt started (``dw/incremental_run``).

    Times are naive UTC. ``watermark_low`` is what the run read strictly above (``>``; at or above
    for ``>=``): the model's ``max(max_column)`` before the run less the lookback; None when the
    run read every row (the model's table did not exist, or ``--full-refresh``).
    """

    model: str
    unique_id: str
    relation: str = Field(description="the model's table, [database.]schema.alias")
    watermark_column: str
    operator: str
    max_column: str
    lookback_hours: float = 0
    watermark_high_before: dt.datetime | None = Field(description="max(max_column) in the model's table before the run")
    watermark_low: dt.datetime | None
    source_table: str = Field(description="the table the model selects from, [database.]schema.identifier")
    arrival_column: str
    source_snapshot_ts: dt.datetime | None = Field(description="max(arrival_column) in the source before the run")
    window_start: dt.datetime | None = Field(None, description="a bounded rebuild's window start (dw_window_start)")
    window_end: dt.datetime | None = None
    recorded_at: dt.datetime


def _naive(v: Any) -> Any:
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return dt.datetime.combine(v, dt.time())
    return v


def _max(db: Database, table: str, column: str) -> Any:
    q = exp.select(exp.Max(this=sql.column(column))).from_(sql.table(table))
    return _naive(db.fetch_all(q.sql(dialect=db.dialect))[0][0])


def _exists(db: Database, table: str) -> bool:
    from dw_dagster.databases.catalog import CatalogError, read_table_schema

    try:
        read_table_schema(db, table)
    except CatalogError:
        return False
    return True


def record_run(db: Database, model: DbtIncrementalModel, filt: IncrementalFilter, *, arrival_column: str,
               source_table: str | None = None, full_refresh: bool = False,
               window: tuple[dt.datetime, dt.datetime] | None = None) -> DbtIncrementalRun:
    """Read what a run of ``model`` is about to read: its high-watermark and the source's newest arrival.

    Call it before dbt starts (an embedded warehouse admits no reader while dbt writes).

    Args:
        db: the warehouse holding the model's table and its source (what dbt reads).
        model: from :func:`incremental_model`.
        filt: from :func:`read_incremental_filter` on the model's SQL as it will run.
        arrival_column: the source column telling when a row reached it.
        source_table: the table the model selects from; default its one upstream relation.
        full_refresh: the run rebuilds the table (reads every row).
        window: a bounded rebuild's ``[start, end)`` (the dw_window_* vars it passes).

    Raises:
        DbtIncrementalError: the model selects from several tables and ``source_table`` is not given.
        dw_dagster.databases.DatabaseError: a query failed.
    """
    if source_table is None:
        if len(model.upstream) != 1:
            raise DbtIncrementalError(f"model {model.name} selects from {list(model.upstream) or 'nothing'}; "
                                      "name the table its watermark follows (source_table)")
        source_table = model.upstream[0]
    high = None if full_refresh or not _exists(db, model.relation) else _max(db, model.relation, filt.max_column)
    low = high - dt.timedelta(hours=filt.lookback_hours) if high is not None else None
    return DbtIncrementalRun(
        model=model.name, unique_id=model.unique_id, relation=model.relation, watermark_column=filt.watermark_column,
        operator=filt.operator, max_column=filt.max_column, lookback_hours=filt.lookback_hours,
        watermark_high_before=high, watermark_low=low, source_table=source_table, arrival_column=arrival_column,
        source_snapshot_ts=_max(db, source_table, arrival_column), window_start=window[0] if window else None,
        window_end=window[1] if window else None,
        recorded_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))


def with_run_record(event: Any, run: DbtIncrementalRun) -> Any:
    """``event`` (an ``Output`` or ``AssetMaterialization`` of the model) with ``dw/incremental_run`` added."""
    extra = {INCREMENTAL_RUN_KEY: dg.MetadataValue.json(run.model_dump(mode="json"))}
    return event.with_metadata({**(event.metadata or {}), **extra})


@public
def dbt_incremental_build(
    context: dg.AssetExecutionContext,
    dbt: Any,
    *,
    database: Database,
    arrival_columns: Mapping[str, str],
    args: Sequence[str] = ("build",),
    source_tables: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """``dbt.cli(args, context=context).stream()`` that records what each incremental model's run read.

    Use it in a ``@dbt_assets`` function in place of the plain stream::

        @dbt_assets(manifest=project.manifest_path, project=project)
        def shop_dbt(context: dg.AssetExecutionContext, dbt: DbtCliResource, warehouse: DatabaseResource):
            yield from dbt_incremental_build(context, dbt, database=warehouse.get_database(),
                                             arrival_columns={"fct_sales": "posted_ts"})

    Before dbt starts, for each model of ``arrival_columns`` this run materializes, it reads the
    model's filter from its SQL file as it is now (:func:`read_incremental_filter`), the model's
    ``max()`` of the watermark and the source's ``max(arrival)``; each such model's output then
    carries ``dw/incremental_run`` (:class:`DbtIncrementalRun`). Other events pass unchanged.

    Args:
        context: the ``@dbt_assets`` function's context.
        dbt: its ``DbtCliResource``.
        database: the warehouse dbt builds in (where the model and its source are read).
        arrival_columns: model name → the column of its source telling when a row arrived.
        args: the dbt command (``--full-refresh`` is seen: that run reads every row).
        source_tables: model name → the table its watermark follows, for models selecting from
            more than one (default: the model's one upstream source or model).

    Yields:
        The events of ``dbt.cli(args, context=context).stream()``.

    Raises:
        DbtIncrementalError: a named model is not in the manifest, not incremental, or its filter
            cannot be read (raised before dbt starts).
    """
    from pathlib import Path

    from dagster_dbt.asset_utils import get_manifest_and_translator_from_dbt_assets

    manifest, translator, project = get_manifest_and_translator_from_dbt_assets([context.assets_def])
    project_dir = Path(project.project_dir if project is not None else dbt.project_dir)
    selected = context.selected_asset_keys
    runs: dict[dg.AssetKey, DbtIncrementalRun] = {}
    for name, arrival in arrival_columns.items():
        model = incremental_model(manifest, name)
        key = translator.get_asset_spec(manifest, model.unique_id, project).key
        if key not in selected:
            continue
        filt = read_incremental_filter((project_dir / model.file).read_text(), database.dialect)
        runs[key] = record_run(database, model, filt, arrival_column=arrival,
                               source_table=(source_tables or {}).get(name), full_refresh="--full-refresh" in args)
    for event in dbt.cli(list(args), context=context).stream():
        key = None
        if isinstance(event, dg.Output):
            key = context.assets_def.keys_by_output_name.get(event.output_name)
        elif isinstance(event, dg.AssetMaterialization):
            key = event.asset_key
        yield with_run_record(event, runs[key]) if key in runs else event


__all__ = [
    "INCREMENTAL_RUN_KEY", "DbtIncrementalError", "DbtIncrementalModel", "DbtIncrementalRun", "IncrementalBlock",
    "IncrementalFilter", "WINDOW_END_VAR", "WINDOW_START_VAR", "dbt_incremental_build", "find_incremental_block",
    "incremental_model", "read_incremental_filter", "record_run", "with_run_record",
]
