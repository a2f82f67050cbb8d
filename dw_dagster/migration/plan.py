"""``dw-dagster migration plan``: waves proposed from what can be read, printed as the YAML to paste.

Inputs: the source catalog (tables, their keys, row counts and sizes, each engine's own way:
PostgreSQL ``pg_total_relation_size``, DuckDB ``duckdb_tables()``, Informix ``systables``), the dbt
manifest (which models read which source tables) and the Dagster asset graph (which assets read
which tables, by their ``dagster/table_name``), and a size budget per wave. Rules, in order:

1. tables read together by one model or asset go together (one *group*);
2. a table goes no later than the wave of the models that read it: a group whose output another
   planned table is built from comes first (groups are placed in dependency order);
3. a wave holds at most ``budget_bytes`` (and ``max_pairs`` pairs) unless one group alone is larger,
   which then gets a wave of its own.

Each placement carries its reason, printed as a comment beside the pair. A plan is a proposal:
nothing runs from it and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

from dw_dagster.databases import Database, DatabaseError, sql


@dataclass
class TableInfo:
    """One source table as the catalog tells it."""

    name: str
    rows: int
    bytes: int
    key: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)


@dataclass
class PlannedWave:
    name: str
    tables: list[TableInfo] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tables)


def _size_sql(db: Database, table: str) -> str | None:
    t = sql.table(table)
    if db.dialect == "postgres":
        return f"SELECT pg_total_relation_size(to_regclass({sql.literal(t.sql(dialect='postgres')).sql('postgres')}))"
    if db.dialect == "duckdb":
        schema = t.args.get("db")
        cond = f"table_name = {sql.literal(t.name).sql('duckdb')}" + (
            f" AND schema_name = {sql.literal(schema.name).sql('duckdb')}" if schema is not None else "")
        return f"SELECT estimated_size * GREATEST(column_count, 1) * 8 FROM duckdb_tables() WHERE {cond}"
    if db.dialect.startswith("informix"):
        return (exp.select(exp.Mul(this=exp.column("npused"), expression=exp.column("pagesize"))).from_("systables")
                .where(exp.column("tabname").eq(sql.literal(t.name))).sql(dialect=db.dialect))
    return None


def _key_sql(db: Database, table: str) -> str | None:
    t = sql.table(table)
    schema = t.args.get("db")
    if db.dialect == "duckdb":
        cond = f"table_name = {sql.literal(t.name).sql('duckdb')}" + (
            f" AND schema_name = {sql.literal(schema.name).sql('duckdb')}" if schema is not None else "")
        return f"SELECT constraint_column_names FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY' AND {cond}"
    if db.dialect == "postgres":
        return ("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = "
                f"ANY(i.indkey) WHERE i.indisprimary AND i.indrelid = to_regclass({sql.literal(t.sql(dialect='postgres')).sql('postgres')}) "
                "ORDER BY array_position(i.indkey, a.attnum)")
    return None


def read_table_info(db: Database, table: str) -> TableInfo:
    """Rows (``COUNT(*)``, pushed down), size (the engine's own figure, else 64 bytes a row) and primary key.

    Raises:
        DatabaseError: the table cannot be read.
    """
    from dw_dagster.databases.catalog import table_columns

    cols = [n for n, _ in table_columns(db, table)]
    rows = int(db.fetch_all(exp.select(exp.Count(this=exp.Star())).from_(sql.table(table)).sql(dialect=db.dialect))[0][0])
    size = None
    q = _size_sql(db, table)
    if q:
        try:
            found = db.fetch_all(q)
            size = int(found[0][0]) if found and found[0][0] is not None else None
        except DatabaseError:
            size = None
    key: list[str] = []
    q = _key_sql(db, table)
    if q:
        try:
            found = db.fetch_all(q)
            key = list(found[0][0]) if db.dialect == "duckdb" and found else [str(r[0]) for r in found]
        except DatabaseError:
            key = []
    return TableInfo(table, rows, size if size is not None else rows * 64, key, cols)


def manifest_reads(manifest: Mapping[str, Any], tables: Sequence[str]) -> tuple[list[tuple[str, set[str]]], dict[str, set[str]]]:
    """From a dbt manifest: (model → the planned tables it reads, table → planned tables it is built from).

    A source or model matches a planned table by its ``schema.name`` (case-insensitive).
    """
    wanted = {t.lower(): t for t in tables}

    def rel(node: Mapping[str, Any]) -> str | None:
        name = f"{node.get('schema')}.{node.get('identifier') or node.get('alias') or node.get('name')}".lower()
        return wanted.get(name)

    by_id = {**manifest.get("sources", {}), **manifest.get("nodes", {})}
    groups, upstream = [], {}
    for uid, node in manifest.get("nodes", {}).items():
        if node.get("resource_type") != "model":
            continue
        reads = {rel(by_id[d]) for d in node.get("depends_on", {}).get("nodes", []) if d in by_id} - {None}
        if reads:
            groups.append((node.get("name", uid), reads))
        out = rel(node)
        if out is not None and reads:
            upstream[out] = reads - {out}
    return groups, upstream


def plan_waves(tables: Sequence[TableInfo], groups: Sequence[tuple[str, set[str]]], upstream: Mapping[str, set[str]],
               *, budget_bytes: int, max_pairs: int = 25) -> list[PlannedWave]:
    """Place the tables in waves by the rules of the module docstring."""
    info = {t.name: t for t in tables}
    parent = {t: t for t in info}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    why_group: dict[str, str] = {}
    for model, reads in groups:
        reads = sorted(r for r in reads if r in info)
        for r in reads[1:]:
            parent[find(r)] = find(reads[0])
        if len(reads) > 1:
            for r in reads:
                why_group[r] = f"read together with {', '.join(x for x in reads if x != r)} by {model}"
    members: dict[str, list[str]] = {}
    for t in info:
        members.setdefault(find(t), []).append(t)
    deps = {root: {find(u) for m in ms for u in upstream.get(m, set()) if u in info} - {root} for root, ms in members.items()}
    placed: dict[str, int] = {}
    waves: list[PlannedWave] = []
    order = sorted(members, key=lambda r: (-sum(info[m].bytes for m in members[r]), r))
    while len(placed) < len(members):
        ready = [r for r in order if r not in placed and deps[r] <= set(placed)]
        if not ready:  # a cycle: place the rest together
            ready = [r for r in order if r not in placed]
        for root in ready:
            size = sum(info[m].bytes for m in members[root])
            floor = max((placed[d] for d in deps[root]), default=0)
            target = next((i for i, w in enumerate(waves) if i >= floor and w.bytes + size <= budget_bytes
                           and len(w.tables) + len(members[root]) <= max_pairs), None)
            if target is None:
                waves.append(PlannedWave(f"wave{len(waves) + 1}"))
                target = len(waves) - 1
            w = waves[target]
            for m in sorted(members[root]):
                w.tables.append(info[m])
                reasons = [why_group.get(m, "no model reads it with another table")]
                if deps[root]:
                    reasons.append(f"after {', '.join(sorted(members[d][0] for d in deps[root]))} (built from it)")
                reasons.append(f"{info[m].rows:,} rows, {_mb(info[m].bytes)}; " + (
                    f"larger than the {_mb(budget_bytes)} budget alone: a wave of its own" if size > budget_bytes else
                    f"wave {target + 1} holds {_mb(w.bytes)} of the {_mb(budget_bytes)} budget"))
                w.reasons[m] = "; ".join(reasons)
            placed[root] = target
    return waves


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def plan_yaml(waves: Sequence[PlannedWave], *, migration: str, source_database: str, target_database: str,
              domain: str, asset_prefix: str = "", target_schema: str | None = None) -> str:
    """The plan as the ``migration:`` YAML to paste, each pair's reason as a comment."""
    lines = ["# proposed by dw-dagster migration plan: review the keys, slices and sums, then paste under the",
             "# Component's attributes (or your DataOpsConfig). Nothing runs from a plan.", "migration:",
             f"  name: {migration}", "  gate: {require: [schema, counts, key_diff], consecutive: 3}", "  waves:"]
    for w in waves:
        lines += [f"    - name: {w.name}            # {len(w.tables)} table(s), {_mb(w.bytes)}", f"      domain: {domain}",
                  "      pairs:"]
        for t in w.tables:
            short = t.name.split(".")[-1]
            target = f"{target_schema}.{short}" if target_schema else t.name
            key = ", ".join(t.key) if t.key else "TODO"
            lines += [f"        # {w.reasons[t.name]}",
                      f"        - source: {{database: {source_database}, table: {t.name}}}",
                      f"          target: {{asset: {asset_prefix}{short}, database: {target_database}, table: {target}}}",
                      f"          key: [{key}]" + ("" if t.key else "   # no primary key in the catalog: name the key")]
    return "\n".join(lines) + "\n"


def source_tables(db: Database, schema: str) -> list[str]:
    """The tables of ``schema`` in the source (``schema.table``), sorted."""
    if db.dialect.startswith("informix"):
        q = (exp.select("tabname").from_("systables").where(exp.and_(exp.column("tabid") >= 100, exp.func(
            "TRIM", exp.column("owner")).eq(sql.literal(schema)), exp.column("tabtype").eq(sql.literal("T"))))
             .sql(dialect=db.dialect))
    else:
        q = sqlglot.transpile(f"SELECT table_name FROM information_schema.tables WHERE table_schema = "
                              f"{sql.literal(schema).sql('duckdb')} AND table_type = 'BASE TABLE'", read="duckdb",
                              write=db.dialect)[0]
    return sorted(f"{schema}.{str(r[0]).strip()}" for r in db.fetch_all(q))


__all__ = ["PlannedWave", "TableInfo", "manifest_reads", "plan_waves", "plan_yaml", "read_table_info", "source_tables"]
