"""The columns of a dbt node and which of its parents' columns a node selects, read with sqlglot.

A node's SQL is its ``compiled_code`` when the manifest has it (``dbt compile``, ``dbt build``,
``dbt docs generate``); else its ``raw_code`` with the Jinja dw_dagster can resolve from the
manifest alone put in: ``{{ ref(...) }}`` and ``{{ source(...) }}`` become the relation of the
node they point to (``relation_name``; ``__dbt__cte__<name>`` for an ephemeral model, as dbt
names it), ``{{ this }}`` the node's own relation, ``{{ config(...) }}`` and ``{# comments #}``
go. Anything else (macros, ``{% if %}``, ``var()``, ``is_incremental()``) makes the SQL
unreadable — :attr:`NodeSql.problem` says so, and the caller reports it rather than guessing;
``dbt compile`` on the checkout makes ``compiled_code`` available. Python models, seeds and
snapshots have no SQL to read here.

**Columns of a node** (:class:`ColumnReader`), from three sources, kept apart because they do not
agree on spelling or types:

- ``catalog``: ``catalog.json`` (``dbt docs generate``), the warehouse's own columns, types and
  positions (https://docs.getdbt.com/reference/artifacts/catalog-json);
- ``sql``: the names the SQL projects (sqlglot ``qualify`` with ``expand_stars``, given the
  parents' columns, so ``select *`` over a known parent expands), types where a projection is a
  ``cast``; unknown when a star stays unexpanded;
- ``yaml``: the columns documented in the properties file (``columns:``), with ``data_type``,
  ``constraints``, ``description``, ``meta`` and ``tags``.

Documented attributes (description, meta, tags, constraints, declared type) are attached to the
columns of the other sources by case-insensitive name. Names are compared case-insensitively
(``str.casefold``): the warehouses of dbt's main adapters fold unquoted names, and sqlglot
normalises them per dialect.

**Column use** (:meth:`ColumnReader.usage`): the child's SQL as written is parsed, every table
that is the parent is found, and in each sqlglot scope the columns read from it are collected:
named with its alias, unqualified in a scope where it is the only source (or where the other
sources are known not to have that name: ``unqualified``), and ``*``/``alias.*`` over it
(``star``: every column, including any the parent drops).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import traverse_scope

#: dbt ``adapter_type`` → sqlglot dialect (None: sqlglot's default dialect)
DIALECTS = {"duckdb": "duckdb", "postgres": "postgres", "redshift": "redshift", "snowflake": "snowflake",
            "bigquery": "bigquery", "databricks": "databricks", "spark": "spark", "trino": "trino",
            "athena": "athena", "clickhouse": "clickhouse", "sqlserver": "tsql", "fabric": "tsql",
            "synapse": "tsql", "mysql": "mysql", "oracle": "oracle", "teradata": "teradata", "sqlite": "sqlite",
            "materialize": "materialize", "doris": "doris", "starrocks": "starrocks", "dremio": "dremio"}

_COMMENT = re.compile(r"\{#.*?#\}", re.S)
_CONFIG = re.compile(r"\{\{-?\s*config\s*\((?:[^()]|\([^()]*\))*\)\s*-?\}\}", re.S)
_REF = re.compile(r"\{\{-?\s*ref\s*\(([^(){}]*)\)\s*-?\}\}", re.S)
_SOURCE = re.compile(r"\{\{-?\s*source\s*\(([^(){}]*)\)\s*-?\}\}", re.S)
_THIS = re.compile(r"\{\{-?\s*this\s*-?\}\}")
_STR = re.compile(r"""(?:(\w+)\s*=\s*)?(?:'([^']*)'|"([^"]*)"|(\d+(?:\.\d+)?))""")
_PLACEHOLDER = "__dw_rel_{}"


def dialect_for(manifest: Mapping[str, Any]) -> str | None:
    """The sqlglot dialect of the manifest's adapter (``metadata.adapter_type``), or None."""
    return DIALECTS.get(str((manifest.get("metadata") or {}).get("adapter_type") or "").lower())


def fold(name: str) -> str:
    """The key a column name is compared by."""
    return str(name).casefold()


@dataclass(frozen=True)
class Column:
    """One column of a node. ``position`` is 1-based (None: unknown); ``type_from`` is
    ``catalog``, ``declared`` (the properties file's ``data_type``) or ``cast`` (the SQL casts it)."""

    name: str
    data_type: str | None = None
    type_from: str | None = None
    position: int | None = None
    description: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    documented: bool = False


@dataclass(frozen=True)
class ColumnSet:
    """A node's columns from one source (``catalog``, ``sql``, ``yaml``); ``columns`` keyed by :func:`fold`."""

    source: str
    columns: dict[str, Column]


@dataclass(frozen=True)
class NodeSql:
    """A node's SQL as it can be read: ``sql`` with each parent relation replaced by a placeholder table
    (``relations``: placeholder → parent unique id), ``origin`` ``compiled_code`` or ``raw_code``;
    or ``problem`` (why it cannot be read)."""

    sql: str | None
    origin: str | None
    relations: dict[str, str]
    problem: str | None = None


@dataclass
class Usage:
    """Which columns of one parent a child reads (:meth:`ColumnReader.usage`).

    ``columns``: folded name → how (``selects``, ``unqualified``); ``star``: ``*`` over the parent
    (every column); ``problem``: the child's SQL could not be read (nothing else is known).
    """

    columns: dict[str, str] = field(default_factory=dict)
    star: bool = False
    problem: str | None = None

    def reads(self, key: str) -> str | None:
        """How the child reads column ``key`` (folded): ``selects``, ``unqualified``, ``star``, or None."""
        if key in self.columns:
            return self.columns[key]
        return "star" if self.star else None


def _relation_of(node: Mapping[str, Any]) -> str | None:
    if node.get("resource_type") == "model" and (node.get("config") or {}).get("materialized") == "ephemeral":
        return f"__dbt__cte__{node.get('name')}"
    return node.get("relation_name")


def _has_star(ast: exp.Expression) -> bool:
    for select in ast.find_all(exp.Select):
        for s in select.selects:
            if isinstance(s, exp.Star) or (isinstance(s, exp.Column) and isinstance(s.this, exp.Star)):
                return True
    return False


def _args(text: str) -> tuple[list[str], dict[str, str]]:
    pos, kw = [], {}
    for m in _STR.finditer(text):
        value = next(v for v in m.groups()[1:] if v is not None)
        if m.group(1):
            kw[m.group(1)] = value
        else:
            pos.append(value)
    return pos, kw


class ColumnReader:
    """Columns and column use of the nodes of one manifest (and its catalog), memoised per node.

    Args:
        manifest: a ``manifest.json`` dict.
        catalog: the matching ``catalog.json`` dict, or None.
    """

    def __init__(self, manifest: Mapping[str, Any], catalog: Mapping[str, Any] | None = None) -> None:
        self.manifest = manifest
        self.catalog = catalog
        self.dialect = dialect_for(manifest)
        self._nodes: dict[str, Mapping[str, Any]] = {}
        for section in ("nodes", "sources"):
            self._nodes.update(manifest.get(section) or {})
        self._sql: dict[str, NodeSql] = {}
        self._ast: dict[str, tuple[exp.Expression | None, str | None]] = {}
        self._raw: dict[str, tuple[exp.Expression | None, str | None]] = {}
        self._sql_cols: dict[str, ColumnSet | None] = {}
        self._busy: set[str] = set()

    def node(self, uid: str) -> Mapping[str, Any] | None:
        return self._nodes.get(uid)

    # -- SQL ---------------------------------------------------------------------------------

    def node_sql(self, uid: str) -> NodeSql:
        """The node's SQL with parent relations as placeholders (see the module docstring)."""
        if uid not in self._sql:
            self._sql[uid] = self._read_sql(uid)
        return self._sql[uid]

    def _read_sql(self, uid: str) -> NodeSql:
        node = self._nodes.get(uid)
        if node is None:
            return NodeSql(None, None, {}, "not a model, snapshot, seed, test or source of this manifest")
        rt = node.get("resource_type")
        if rt in ("seed", "source"):
            return NodeSql(None, None, {}, f"a {rt} has no SQL")
        if rt == "snapshot":
            return NodeSql(None, None, {}, "a snapshot's columns are its query's plus dbt's; not read from SQL")
        if (node.get("language") or "sql") != "sql":
            return NodeSql(None, None, {}, f"a {node.get('language')} model")
        deps = [d for d in (node.get("depends_on") or {}).get("nodes") or () if d in self._nodes]
        relations: dict[str, str] = {}
        compiled = node.get("compiled_code")
        if compiled:
            sql, origin = compiled, "compiled_code"
            for i, d in enumerate(deps):
                relations[_PLACEHOLDER.format(i)] = d
            return NodeSql(sql, origin, relations)
        raw = node.get("raw_code")
        if not raw:
            return NodeSql(None, None, {}, "no raw_code in the manifest")
        text = _CONFIG.sub("", _COMMENT.sub("", raw))
        problems: list[str] = []
        placeholder = {d: _PLACEHOLDER.format(i) for i, d in enumerate(deps)}

        def ref(m: re.Match) -> str:
            pos, kw = _args(m.group(1))
            if not pos:
                problems.append(f"ref({m.group(1).strip()})")
                return m.group(0)
            name, pkg = pos[-1], (pos[0] if len(pos) > 1 else None)
            version = kw.get("v") or kw.get("version")
            cands = [d for d in deps if (self._nodes[d].get("name") == name and d.split(".", 1)[0] != "source"
                                         and (pkg is None or self._nodes[d].get("package_name") == pkg))]
            if version is not None:
                cands = [d for d in cands if str(self._nodes[d].get("version")) == str(version)]
            elif len(cands) > 1:
                latest = [d for d in cands if str(self._nodes[d].get("version")) == str(self._nodes[d].get("latest_version"))]
                cands = latest or cands
            if len(cands) != 1:
                problems.append(f"ref({m.group(1).strip()})")
                return m.group(0)
            relations[placeholder[cands[0]]] = cands[0]
            return placeholder[cands[0]]

        def source(m: re.Match) -> str:
            pos, _ = _args(m.group(1))
            cands = [d for d in deps if len(pos) == 2 and self._nodes[d].get("resource_type") == "source"
                     and self._nodes[d].get("source_name") == pos[0] and self._nodes[d].get("name") == pos[1]]
            if len(cands) != 1:
                problems.append(f"source({m.group(1).strip()})")
                return m.group(0)
            relations[placeholder[cands[0]]] = cands[0]
            return placeholder[cands[0]]

        text = _SOURCE.sub(source, _REF.sub(ref, text))
        this = node.get("relation_name") or ""
        text = _THIS.sub(lambda _: this, text)
        if problems:
            return NodeSql(None, None, {}, f"cannot resolve {', '.join(problems[:3])} from the manifest")
        if "{{" in text or "{%" in text:
            snippet = re.search(r"\{[{%].{0,40}", text, re.S).group(0).replace("\n", " ")  # type: ignore[union-attr]
            return NodeSql(None, None, {}, f"Jinja beyond ref/source/config ({snippet!r}…); compile the project "
                           "(dbt compile) so the manifest carries compiled_code")
        return NodeSql(text, "raw_code", relations)

    def _parse(self, uid: str) -> tuple[exp.Expression | None, str | None]:
        """The node's SQL parsed (placeholders in), not yet qualified; or (None, why not)."""
        ns = self.node_sql(uid)
        if ns.sql is None:
            return None, ns.problem
        try:
            ast = sqlglot.parse_one(ns.sql, read=self.dialect)
        except Exception as e:  # noqa: BLE001 - sqlglot raises several error types; all mean "cannot read"
            return None, f"sqlglot cannot parse the {ns.origin}: {str(e).splitlines()[0][:160]}"
        if not isinstance(ast, exp.Query):
            return None, f"the {ns.origin} is not a query ({type(ast).__name__})"
        if ns.origin == "compiled_code":
            self._placehold_compiled(ast, ns.relations)
        return ast, None

    def parsed(self, uid: str) -> tuple[exp.Expression | None, str | None]:
        """The node's SQL parsed and qualified, stars over parents with known columns expanded; or (None, why not).

        A query with a star needs its parents' columns first; they are worked out from the top
        down with an explicit stack (a chain of ``select *`` models can be thousands deep).
        """
        if uid in self._ast:
            return self._ast[uid]
        raw = self._raw
        stack: list[tuple[str, bool]] = [(uid, False)]
        pending = {uid}
        while stack:
            u, ready = stack.pop()
            if u in self._ast:
                continue
            if u not in raw:
                raw[u] = self._parse(u)
            ast, problem = raw[u]
            if ready or ast is None or not _has_star(ast):
                self._ast[u] = (None, problem) if ast is None else (self._qualify(u, ast), None)
                continue
            stack.append((u, True))
            for parent in self.node_sql(u).relations.values():
                if parent not in self._ast and parent not in pending:
                    pending.add(parent)
                    stack.append((parent, False))
        return self._ast[uid]

    def _qualify(self, uid: str, ast: exp.Expression) -> exp.Expression:
        schema = {}
        if _has_star(ast):
            for ph, parent in self.node_sql(uid).relations.items():
                cols = self.best(parent)
                if cols is not None and cols.columns:
                    schema[ph] = {c.name: "UNKNOWN" for c in cols.columns.values()}
        try:
            return qualify(ast.copy(), schema=schema, dialect=self.dialect, validate_qualify_columns=False,
                           expand_stars=True, quote_identifiers=False, identify=False)
        except Exception:  # noqa: BLE001 - keep the unqualified tree: usage still reads it
            return ast

    def _placehold_compiled(self, ast: exp.Expression, relations: Mapping[str, str]) -> None:
        """In compiled SQL, rename each table that is a parent's relation to its placeholder (alias kept)."""
        keys: dict[tuple[str, ...], str] = {}
        for ph, parent in relations.items():
            rel = _relation_of(self._nodes[parent])
            if not rel:
                continue
            try:
                t = exp.to_table(rel, dialect=self.dialect)
            except Exception:  # noqa: BLE001 - a relation name sqlglot cannot read: that parent stays unknown
                continue
            keys[tuple(fold(p.name) for p in t.parts)] = ph
        for table in list(ast.find_all(exp.Table)):
            parts = tuple(fold(p.name) for p in table.parts)
            if not parts:
                continue
            ph = next((v for k, v in keys.items() if len(parts) <= len(k) and k[-len(parts):] == parts), None)
            if ph is None:
                continue
            alias = table.alias or table.name
            table.replace(exp.Table(this=exp.to_identifier(ph), alias=exp.TableAlias(this=exp.to_identifier(alias))))

    # -- columns -----------------------------------------------------------------------------

    def yaml_columns(self, uid: str) -> ColumnSet | None:
        """The documented columns (``columns:`` in the properties file), or None when none are documented."""
        node = self._nodes.get(uid) or {}
        cols = node.get("columns") or {}
        if not cols:
            return None
        out = {}
        for i, (key, c) in enumerate(cols.items(), 1):
            c = c or {}
            name = str(c.get("name") or key)
            meta = dict((c.get("config") or {}).get("meta") or {}) | dict(c.get("meta") or {})
            tags = tuple(dict.fromkeys([*(c.get("tags") or ()), *((c.get("config") or {}).get("tags") or ())]))
            out[fold(name)] = Column(
                name=name, data_type=c.get("data_type"), type_from="declared" if c.get("data_type") else None,
                position=i, description=c.get("description") or "", meta=meta, tags=tags,
                constraints=tuple(sorted(str((k or {}).get("type")) for k in c.get("constraints") or ())), documented=True)
        return ColumnSet("yaml", out)

    def catalog_columns(self, uid: str) -> ColumnSet | None:
        """The warehouse's columns from ``catalog.json`` (``nodes`` or ``sources``), or None."""
        if not self.catalog:
            return None
        entry = (self.catalog.get("nodes") or {}).get(uid) or (self.catalog.get("sources") or {}).get(uid)
        if not entry or not entry.get("columns"):
            return None
        cols = sorted((entry.get("columns") or {}).values(), key=lambda c: (c.get("index") is None, c.get("index") or 0))
        return ColumnSet("catalog", {fold(c["name"]): Column(name=str(c["name"]), data_type=c.get("type"),
                                                             type_from="catalog" if c.get("type") else None,
                                                             position=c.get("index"), description=c.get("comment") or "")
                                     for c in cols if c.get("name") is not None})

    def sql_columns(self, uid: str) -> ColumnSet | None:
        """The names the node's SQL projects (stars over known parents expanded), or None when unknown."""
        if uid in self._sql_cols:
            return self._sql_cols[uid]
        if uid in self._busy:
            return None
        self._busy.add(uid)
        try:
            ast, _ = self.parsed(uid)
            raw = self._raw.get(uid, (None, None))[0]
            if raw is not None and not _has_star(raw):
                ast = raw  # the names as written (qualify normalises the case of quoted names for some dialects)
            out = None
            if ast is not None and isinstance(ast, exp.Query):
                selects = ast.selects
                if selects and not any(isinstance(s, exp.Star) or (isinstance(s, exp.Column) and isinstance(s.this, exp.Star))
                                       for s in selects):
                    cols: dict[str, Column] = {}
                    for i, s in enumerate(selects, 1):
                        name = s.alias_or_name
                        if not name:
                            continue
                        inner = s.this if isinstance(s, exp.Alias) else s
                        dtype = inner.to.sql(self.dialect) if isinstance(inner, exp.Cast) else None
                        cols.setdefault(fold(name), Column(name=name, data_type=dtype, type_from="cast" if dtype else None,
                                                           position=i))
                    out = ColumnSet("sql", cols)
            self._sql_cols[uid] = out
            return out
        finally:
            self._busy.discard(uid)

    def best(self, uid: str) -> ColumnSet | None:
        """Catalog, else SQL, else documented columns (what a child's star expands to)."""
        return self.catalog_columns(uid) or self.sql_columns(uid) or self.yaml_columns(uid)

    def columns(self, uid: str, source: str) -> ColumnSet | None:
        """The node's columns from ``source`` (``catalog``, ``sql``, ``yaml``), documented attributes attached."""
        base = {"catalog": self.catalog_columns, "sql": self.sql_columns, "yaml": self.yaml_columns}[source](uid)
        if base is None or source == "yaml":
            return base
        docs = self.yaml_columns(uid)
        if docs is None:
            return base
        merged = {}
        for key, c in base.columns.items():
            d = docs.columns.get(key)
            if d is None:
                merged[key] = c
                continue
            dtype, tfrom = (c.data_type, c.type_from) if c.type_from == "catalog" or not d.data_type else (d.data_type, "declared")
            merged[key] = Column(name=c.name, data_type=dtype, type_from=tfrom, position=c.position,
                                 description=d.description or c.description, meta=d.meta, tags=d.tags,
                                 constraints=d.constraints, documented=True)
        return ColumnSet(base.source, merged)

    # -- use -----------------------------------------------------------------------------------

    def usage(self, child: str, parent: str, parent_columns: set[str] = frozenset()) -> Usage:
        """Which columns of ``parent`` the node ``child`` reads (see the module docstring).

        Args:
            child: unique id of the reading node (a model, snapshot or singular test with SQL).
            parent: unique id of one of its parents.
            parent_columns: folded names the parent has (or had): an unqualified name is
                attributed to it in a scope with several sources when no other source is known to
                have that name.
        """
        ast, problem = self.parsed(child)
        raw = self._raw.get(child, (None, None))[0]
        if ast is None or raw is None:
            return Usage(problem=problem)
        relations = self.node_sql(child).relations
        phs = {ph for ph, p in relations.items() if p == parent}
        if not phs:
            return Usage(problem=f"{parent} is not found among the tables the SQL reads")
        out = Usage()
        try:  # the query as written: a star stays a star, a name is only what the SQL names
            scopes = list(traverse_scope(raw))
        except Exception as e:  # noqa: BLE001 - sqlglot raises several error types
            return Usage(problem=f"sqlglot cannot walk the query's scopes: {str(e).splitlines()[0][:160]}")
        for scope in scopes:
            mine = {a for a, t in scope.sources.items() if isinstance(t, exp.Table) and t.name in phs}
            if not mine:
                continue
            select = scope.expression
            if isinstance(select, exp.Select) and any(
                    isinstance(s, exp.Star) or (isinstance(s, exp.Column) and isinstance(s.this, exp.Star)
                                                and (not s.table or s.table in mine)) for s in select.selects):
                out.star = True
            others = [s for a, s in scope.sources.items() if a not in mine]
            for col in scope.columns:
                key = fold(col.name)
                if not key or isinstance(col.this, exp.Star):
                    continue
                if col.table:
                    if col.table in mine:
                        out.columns.setdefault(key, "selects")
                    continue
                if not others:
                    out.columns.setdefault(key, "selects")
                elif key in parent_columns and not any(self._source_has(o, key, relations) for o in others):
                    out.columns.setdefault(key, "unqualified")
        return out

    def _source_has(self, source: Any, key: str, relations: Mapping[str, str]) -> bool:
        """Whether another source of the scope is known to have column ``key`` (unknown: no)."""
        if isinstance(source, exp.Table):
            other = relations.get(source.name)
            cols = self.best(other) if other else None
            return cols is not None and key in cols.columns
        try:
            return key in {fold(n) for n in source.expression.named_selects}
        except Exception:  # noqa: BLE001
            return True


__all__ = ["Column", "ColumnReader", "ColumnSet", "NodeSql", "Usage", "dialect_for", "fold"]
