"""A known Snowflake workload and the ``SNOWFLAKE.ACCOUNT_USAGE`` rows it would leave behind.

fakesnow has no account usage views; tests, ``dw-dagster demo cost`` and the
``cost_attribution_1m_queries`` benchmark seed stand-in tables with the same names and columns
(a subset of the real views') from a workload generated here, deterministically:

- three warehouses: ``TRANSFORM_WH`` (LARGE; the nightly dbt build, models and tests, one model
  spanning an hour boundary and spilling to remote storage), ``LOAD_WH`` (SMALL, AUTO_SUSPEND
  1800 s: dw_dagster's loads every three hours, tagged by its database resource — so long idle
  tails and idle hours), ``BI_WH`` (X-Small, untagged dashboard queries in business hours, some
  queued for overload);
- cloud-services-only metadata queries (no warehouse); cloud services above the daily 10 %
  allowance on some days (billed) and under it on others (not billed);
- metering computed from the workload: a warehouse runs from a query's execution start until
  AUTO_SUSPEND seconds after the last one ends; each hour's credits are the running seconds at
  the size's rate; days sum their hours;
- ``QUERY_ATTRIBUTION_HISTORY`` leaves out queries of 100 ms or less, as Snowflake's does.

Nothing here computes an attribution: tests compute the expected one on their own.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: credits per hour by warehouse size (Snowflake standard warehouses)
RATES = {"X-Small": 1, "Small": 2, "Medium": 4, "Large": 8, "X-Large": 16, "2X-Large": 32, "3X-Large": 64,
         "4X-Large": 128}

QUERY_HISTORY = {
    "QUERY_ID": "VARCHAR", "QUERY_TEXT": "VARCHAR", "QUERY_TAG": "VARCHAR", "WAREHOUSE_NAME": "VARCHAR",
    "WAREHOUSE_SIZE": "VARCHAR", "EXECUTION_STATUS": "VARCHAR", "START_TIME": "TIMESTAMP", "END_TIME": "TIMESTAMP",
    "TOTAL_ELAPSED_TIME": "BIGINT", "COMPILATION_TIME": "BIGINT", "QUEUED_PROVISIONING_TIME": "BIGINT",
    "QUEUED_REPAIR_TIME": "BIGINT", "QUEUED_OVERLOAD_TIME": "BIGINT", "EXECUTION_TIME": "BIGINT",
    "CREDITS_USED_CLOUD_SERVICES": "DECIMAL(38,9)", "BYTES_SPILLED_TO_REMOTE_STORAGE": "BIGINT",
}
WAREHOUSE_METERING_HISTORY = {
    "START_TIME": "TIMESTAMP", "END_TIME": "TIMESTAMP", "WAREHOUSE_ID": "BIGINT", "WAREHOUSE_NAME": "VARCHAR",
    "CREDITS_USED": "DECIMAL(38,9)", "CREDITS_USED_COMPUTE": "DECIMAL(38,9)", "CREDITS_USED_CLOUD_SERVICES": "DECIMAL(38,9)",
}
METERING_DAILY_HISTORY = {
    "SERVICE_TYPE": "VARCHAR", "USAGE_DATE": "DATE", "CREDITS_USED_COMPUTE": "DECIMAL(38,9)",
    "CREDITS_USED_CLOUD_SERVICES": "DECIMAL(38,9)", "CREDITS_USED": "DECIMAL(38,9)",
    "CREDITS_ADJUSTMENT_CLOUD_SERVICES": "DECIMAL(38,9)", "CREDITS_BILLED": "DECIMAL(38,9)",
}
QUERY_ATTRIBUTION_HISTORY = {
    "QUERY_ID": "VARCHAR", "WAREHOUSE_NAME": "VARCHAR", "QUERY_TAG": "VARCHAR", "START_TIME": "TIMESTAMP",
    "END_TIME": "TIMESTAMP", "CREDITS_ATTRIBUTED_COMPUTE": "DECIMAL(38,9)", "CREDITS_USED_QUERY_ACCELERATION": "DECIMAL(38,9)",
}
#: the stand-in the fakesnow warehouse emulation reads SHOW WAREHOUSES from and ALTER WAREHOUSE writes
WAREHOUSES = {
    "NAME": "VARCHAR", "STATE": "VARCHAR", "TYPE": "VARCHAR", "SIZE": "VARCHAR", "MIN_CLUSTER_COUNT": "INTEGER",
    "MAX_CLUSTER_COUNT": "INTEGER", "AUTO_SUSPEND": "INTEGER", "AUTO_RESUME": "VARCHAR", "SCALING_POLICY": "VARCHAR",
}
TABLES = {"QUERY_HISTORY": QUERY_HISTORY, "WAREHOUSE_METERING_HISTORY": WAREHOUSE_METERING_HISTORY,
          "METERING_DAILY_HISTORY": METERING_DAILY_HISTORY, "QUERY_ATTRIBUTION_HISTORY": QUERY_ATTRIBUTION_HISTORY}

MODELS = ["stg_orders", "stg_customers", "stg_payments", "orders", "customers", "fct_revenue_daily"]
TESTS = [("not_null_orders_order_id", "orders"), ("unique_orders_order_id", "orders"),
         ("not_null_customers_customer_id", "customers"), ("accepted_values_orders_status", "orders")]
PROJECT = "shop"
LOAD_ASSET = "raw/pos/sales_line"


@dataclass(frozen=True)
class Warehouse:
    name: str
    size: str
    auto_suspend: int
    max_cluster_count: int = 1
    min_cluster_count: int = 1
    scaling_policy: str = "STANDARD"

    @property
    def rate(self) -> float:
        return float(RATES[self.size])


DEFAULT_WAREHOUSES = (Warehouse("TRANSFORM_WH", "Large", 600), Warehouse("LOAD_WH", "Small", 1800),
                      Warehouse("BI_WH", "X-Small", 60))


@dataclass(slots=True)
class Query:
    """One row of the stand-in ``QUERY_HISTORY`` (times naive UTC, milliseconds)."""

    query_id: str
    text: str
    tag: str
    warehouse: str | None
    size: str | None
    start: dt.datetime
    compilation_ms: int
    queued_provisioning_ms: int
    queued_repair_ms: int
    queued_overload_ms: int
    execution_ms: int
    cs_credits: float
    remote_spill: int = 0
    #: what the workload knows the query is (for tests): ("model", node) ("test", node) ("asset", run, asset, partition) ("bi",) ("meta",)
    truth: tuple = ()

    @property
    def exec_start(self) -> dt.datetime:
        return self.start + dt.timedelta(milliseconds=self.compilation_ms + self.queued_provisioning_ms
                                         + self.queued_repair_ms + self.queued_overload_ms)

    @property
    def end(self) -> dt.datetime:
        return self.exec_start + dt.timedelta(milliseconds=self.execution_ms)

    def row(self) -> tuple:
        total = self.compilation_ms + self.queued_provisioning_ms + self.queued_repair_ms + self.queued_overload_ms + self.execution_ms
        return (self.query_id, self.text, self.tag, self.warehouse, self.size, "SUCCESS", self.start, self.end, total,
                self.compilation_ms, self.queued_provisioning_ms, self.queued_repair_ms, self.queued_overload_ms,
                self.execution_ms, round(self.cs_credits, 9), self.remote_spill)


@dataclass
class Workload:
    """A generated workload: its queries, the metering they leave, and the warehouses' settings."""

    since: dt.date
    days: int
    warehouses: tuple[Warehouse, ...]
    queries: list[Query] = field(default_factory=list)
    hourly: list[tuple] = field(default_factory=list)        # WAREHOUSE_METERING_HISTORY rows
    daily: list[tuple] = field(default_factory=list)         # METERING_DAILY_HISTORY rows
    attribution: list[tuple] = field(default_factory=list)   # QUERY_ATTRIBUTION_HISTORY rows
    extra_cs: dict[dt.date, float] = field(default_factory=dict)
    compute_residual: dict[dt.date, float] = field(default_factory=dict)

    @property
    def until(self) -> dt.date:
        return self.since + dt.timedelta(days=self.days)

    def rows(self, table: str) -> list[tuple]:
        if table == "QUERY_HISTORY":
            return [q.row() for q in self.queries]
        if table == "WAREHOUSE_METERING_HISTORY":
            return self.hourly
        if table == "METERING_DAILY_HISTORY":
            return self.daily
        if table == "QUERY_ATTRIBUTION_HISTORY":
            return self.attribution
        if table == "WAREHOUSES":
            return [(w.name, "SUSPENDED", "STANDARD", w.size, w.min_cluster_count, w.max_cluster_count, w.auto_suspend,
                     "true", w.scaling_policy) for w in self.warehouses]
        raise KeyError(table)


def dbt_comment(node_id: str, rng: random.Random) -> str:
    """dbt's default query comment JSON; the key order varies (get-select/dbt-snowflake-monitoring#147)."""
    items = [("app", "dbt"), ("dbt_version", "1.11.2"), ("profile_name", PROJECT), ("target_name", "prod"),
             ("node_id", node_id)]
    if rng.random() < 0.3:
        items = [items[-1], *items[:-1]]
    return "/* " + json.dumps(dict(items)) + " */"


def dagster_tag(run_id: str, asset: str, partition: str) -> str:
    return json.dumps({"app": "dw_dagster", "dagster_run_id": run_id, "asset_key": asset, "partition": partition})


def _run_id(rng: random.Random) -> str:
    return "%08x-%04x-%04x-%04x-%012x" % (rng.getrandbits(32), rng.getrandbits(16), rng.getrandbits(16),
                                         rng.getrandbits(16), rng.getrandbits(48))


def generate(since: dt.date = dt.date(2026, 10, 1), days: int = 30, *, bi_per_hour: int = 12, seed: int = 29,
             warehouses: Sequence[Warehouse] = DEFAULT_WAREHOUSES, loads_per_day: int = 8) -> Workload:
    """The workload over ``days`` from ``since`` (see the module docstring).

    Args:
        bi_per_hour: dashboard queries per business hour on ``BI_WH`` (the volume knob: about
            ``days * (8 * bi_per_hour + 40)`` queries in all).
        seed: the random seed (the same arguments give the same rows).
        loads_per_day: dw_dagster load runs per day on ``LOAD_WH`` (every 24 / n hours).
    """
    rng = random.Random(seed)
    wl = Workload(since=since, days=days, warehouses=tuple(warehouses))
    wh = {w.name: w for w in warehouses}
    n = 0

    def qid() -> str:
        nonlocal n
        n += 1
        return f"01b{n:013x}-0000-{seed:04x}"

    for d in range(days):
        day = since + dt.timedelta(days=d)
        base = dt.datetime.combine(day, dt.time())
        # the nightly dbt build on TRANSFORM_WH: models, one spanning 02:59 -> 03:1x, then tests
        inv = _run_id(rng)
        t = base + dt.timedelta(hours=2, minutes=40)
        for i, model in enumerate(MODELS):
            node = f"model.{PROJECT}.{model}"
            long = model == "fct_revenue_daily"
            exec_ms = rng.randint(900_000, 1_500_000) if long else rng.randint(20_000, 240_000)
            tag = json.dumps({"dbt_snowflake_query_tags_version": "2.5.0", "invocation_id": inv, "node_id": node}) \
                if i % 2 else ""
            q = Query(qid(), f"create or replace transient table analytics.{model} as (select 1)\n{dbt_comment(node, rng)}",
                      tag, "TRANSFORM_WH", wh["TRANSFORM_WH"].size, t, rng.randint(50, 900), 0, 0, 0, exec_ms,
                      rng.uniform(0.0005, 0.003), remote_spill=(3 * 2**30 if long else 0), truth=("model", node))
            wl.queries.append(q)
            t = q.end + dt.timedelta(milliseconds=rng.randint(200, 2000))
        for test, model in TESTS:
            node = f"test.{PROJECT}.{test}.{rng.getrandbits(20):05x}"
            exec_ms = rng.choice([40, 80, 95, rng.randint(150, 4000)])  # some at or under 100 ms
            q = Query(qid(), f"select count(*) from analytics.{model} where 1 = 0\n{dbt_comment(node, rng)}", "",
                      "TRANSFORM_WH", wh["TRANSFORM_WH"].size, t, rng.randint(20, 200), 0, 0, 0, exec_ms,
                      rng.uniform(0.0002, 0.001), truth=("test", node))
            wl.queries.append(q)
            t = q.end + dt.timedelta(milliseconds=rng.randint(100, 800))
        # dw_dagster's loads on LOAD_WH, tagged by its database resource (tag + comment, or comment only)
        for k in range(loads_per_day):
            run = _run_id(rng)
            start = base + dt.timedelta(hours=k * 24 // loads_per_day, minutes=45)
            for j in range(3):
                tag = dagster_tag(run, LOAD_ASSET, day.isoformat())
                text = f"merge into raw.pos.sales_line using (select 1) s on false\n/* {tag} */"
                q = Query(qid(), text, tag if (k + j) % 3 else "", "LOAD_WH", wh["LOAD_WH"].size, start,
                          rng.randint(30, 400), rng.choice([0, 0, 1500]), 0, 0, rng.randint(2_000, 40_000),
                          rng.uniform(0.0002, 0.002), truth=("asset", run, LOAD_ASSET, day.isoformat()))
                wl.queries.append(q)
                start = q.end + dt.timedelta(milliseconds=rng.randint(100, 1000))
        # dashboards on BI_WH, untagged; queued for overload at the 10:00 peak
        for hour in range(9, 17):
            for _ in range(bi_per_hour):
                start = base + dt.timedelta(hours=hour, seconds=rng.uniform(0, 3599))
                overload = rng.randint(2_000, 30_000) if hour == 10 and rng.random() < 0.6 else 0
                wl.queries.append(Query(qid(), "select region, sum(net_sales) from marts.sales group by 1", "", "BI_WH",
                                        wh["BI_WH"].size, start, rng.randint(10, 300), 0, 0, overload,
                                        rng.randint(50, 8_000), rng.uniform(0.00001, 0.0002), truth=("bi",)))
        # metadata queries: cloud services only, no warehouse; heavy on every third day
        heavy = d % 3 == 0
        for _ in range(20):
            start = base + dt.timedelta(hours=rng.uniform(0, 23.9))
            wl.queries.append(Query(qid(), "show tables in schema analytics", "", None, None, start, rng.randint(5, 50),
                                    0, 0, 0, rng.randint(5, 200), rng.uniform(0.05, 0.12) if heavy else rng.uniform(0.001, 0.004),
                                    truth=("meta",)))
        wl.extra_cs[day] = 0.3 if heavy else 0.01  # cloud services no query in the history explains
    _meter(wl)
    return wl


def _intervals(qs: Iterable[Query], auto_suspend: int) -> list[tuple[dt.datetime, dt.datetime]]:
    """When a warehouse runs: from each execution start until AUTO_SUSPEND after the last end."""
    spans = sorted((q.exec_start, q.end + dt.timedelta(seconds=auto_suspend)) for q in qs)
    out: list[list[dt.datetime]] = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _meter(wl: Workload) -> None:
    start, end = dt.datetime.combine(wl.since, dt.time()), dt.datetime.combine(wl.until, dt.time())
    compute_by_day: dict[dt.date, float] = {}
    for wid, w in enumerate(wl.warehouses, start=1):
        mine = [q for q in wl.queries if q.warehouse == w.name]
        seconds: dict[dt.datetime, float] = {}
        for s, e in _intervals(mine, w.auto_suspend):
            h = s.replace(minute=0, second=0, microsecond=0)
            while h < e:
                nxt = h + dt.timedelta(hours=1)
                seconds[h] = seconds.get(h, 0.0) + (min(e, nxt) - max(s, h)).total_seconds()
                h = nxt
        cs_by_hour: dict[dt.datetime, float] = {}
        for q in mine:
            hh = q.start.replace(minute=0, second=0, microsecond=0)
            cs_by_hour[hh] = cs_by_hour.get(hh, 0.0) + q.cs_credits
        for h in sorted(seconds):
            if not start <= h < end:
                continue
            credits = round(w.rate * seconds[h] / 3600.0, 9)
            cs = round(cs_by_hour.get(h, 0.0), 9)
            wl.hourly.append((h, h + dt.timedelta(hours=1), wid, w.name, round(credits + cs, 9), credits, cs))
            compute_by_day[h.date()] = compute_by_day.get(h.date(), 0.0) + credits
    cs_by_day: dict[dt.date, float] = {}
    for q in wl.queries:
        cs_by_day[q.start.date()] = cs_by_day.get(q.start.date(), 0.0) + round(q.cs_credits, 9)
    for d in range(wl.days):
        day = wl.since + dt.timedelta(days=d)
        compute = round(compute_by_day.get(day, 0.0) + wl.compute_residual.get(day, 0.0), 9)
        cs = round(cs_by_day.get(day, 0.0) + wl.extra_cs.get(day, 0.0), 9)
        adj = -round(min(cs, 0.1 * compute), 9)
        wl.daily.append(("WAREHOUSE_METERING", day, compute, cs, round(compute + cs, 9), adj, round(compute + cs + adj, 9)))
    rates = {w.name: w.rate for w in wl.warehouses}
    for q in wl.queries:
        if q.warehouse and q.execution_ms > 100 and start <= q.start < end:
            wl.attribution.append((q.query_id, q.warehouse, q.tag, q.start, q.end,
                                   round(rates[q.warehouse] * q.execution_ms / 3_600_000.0, 9), 0.0))


def create_tables(db: Any, schema: str, workload: Workload, *, batch: int = 400,
                  tables: Sequence[str] = ("QUERY_HISTORY", "WAREHOUSE_METERING_HISTORY", "METERING_DAILY_HISTORY",
                                           "QUERY_ATTRIBUTION_HISTORY", "WAREHOUSES")) -> None:
    """Create the stand-in tables in ``schema`` (``SNOWFLAKE.ACCOUNT_USAGE``) on ``db`` and insert the
    workload (statements built with sqlglot, ``batch`` rows each; existing tables are replaced)."""
    from sqlglot import exp

    from dw_dagster.databases import sql

    for name in tables:
        columns = WAREHOUSES if name == "WAREHOUSES" else TABLES[name]
        full = f"{schema}.{name}"
        db.execute(exp.Drop(tables=[sql.table(full)], kind="TABLE", exists=True).sql(dialect=db.dialect))
        types = {c: exp.DataType.build(t, dialect="duckdb") for c, t in columns.items()}
        create = exp.Create(kind="TABLE", this=exp.Schema(this=sql.table(full), expressions=[
            exp.ColumnDef(this=sql.identifier(c), kind=t.copy()) for c, t in types.items()]))
        db.execute(create.sql(dialect=db.dialect))
        rows = workload.rows(name)
        for i in range(0, len(rows), batch):
            values = exp.values([exp.tuple_(*(_literal(v, types[c]) for v, c in zip(r, columns, strict=True)))
                                 for r in rows[i:i + batch]])
            db.execute(exp.insert(values, sql.table(full), columns=[sql.identifier(c) for c in columns]).sql(dialect=db.dialect))


def _literal(value: object, sqltype: Any) -> Any:
    """A plain literal (timestamps and dates as text, which every engine converts on insert): the
    emulators' per-node rewriting makes a CAST per value slow."""
    from sqlglot import exp

    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (dt.datetime, dt.date)):
        return exp.Literal.string(value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat())
    if isinstance(value, float):
        return exp.Literal.number(repr(value))
    if isinstance(value, int):
        return exp.Literal.number(str(value))
    return exp.Literal.string(str(value))


_ARROW = {"VARCHAR": "string", "TIMESTAMP": "timestamp", "BIGINT": "int64", "INTEGER": "int32", "DATE": "date32",
          "DECIMAL(38,9)": "decimal"}


def arrow_tables(workload: Workload, tables: Sequence[str] = (*TABLES, "WAREHOUSES")) -> dict[str, Any]:
    """The workload's tables as Arrow tables with the stand-in's types (credits as DECIMAL(38,9))."""
    from decimal import Decimal

    import pyarrow as pa

    kinds = {"string": pa.string(), "timestamp": pa.timestamp("us"), "int64": pa.int64(), "int32": pa.int32(),
             "date32": pa.date32(), "decimal": pa.decimal128(38, 9)}
    out = {}
    for name in tables:
        columns = WAREHOUSES if name == "WAREHOUSES" else TABLES[name]
        rows = workload.rows(name)
        arrays = []
        for i, (col, ty) in enumerate(columns.items()):
            kind = _ARROW[ty]
            values = [r[i] for r in rows]
            if kind == "decimal":
                values = [None if v is None else Decimal(f"{v:.9f}") for v in values]
            arrays.append(pa.array(values, type=kinds[kind]))
        out[name] = pa.table(arrays, names=list(columns))
    return out


def load_parquet(db: Any, schema: str, workload: Workload, folder: Path,
                 tables: Sequence[str] = (*TABLES, "WAREHOUSES"), *, append: bool = False) -> None:
    """Seed the stand-in tables fast: write each as Parquet under ``folder`` and create it with
    ``CREATE OR REPLACE TABLE ... AS SELECT * FROM read_parquet(...)`` (``append``: insert into it).

    Only for DuckDB and fakesnow (which hands DuckDB's ``read_parquet`` through; the session needs a
    current database and schema); the portable way is :func:`create_tables`.
    """
    import pyarrow.parquet as pq
    from sqlglot import exp

    from dw_dagster.databases import sql

    folder.mkdir(parents=True, exist_ok=True)
    for name, table in arrow_tables(workload, tables).items():
        path = folder / f"{name.lower()}{'_more' if append else ''}.parquet"
        pq.write_table(table, path)
        source = exp.select("*").from_(exp.Table(this=exp.Anonymous(this="read_parquet", expressions=[
            exp.Literal.string(str(path.resolve()))])))
        target = sql.table(f"{schema}.{name}")
        stmt = exp.insert(source, target) if append else exp.Create(kind="TABLE", this=target, expression=source, replace=True)
        db.execute(stmt.sql(dialect=db.dialect))


__all__ = ["DEFAULT_WAREHOUSES", "LOAD_ASSET", "MODELS", "PROJECT", "Query", "RATES", "TABLES", "TESTS", "WAREHOUSES",
           "Warehouse", "Workload", "arrow_tables", "create_tables", "dagster_tag", "dbt_comment", "generate", "load_parquet"]
