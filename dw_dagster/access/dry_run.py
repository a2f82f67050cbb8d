"""What a grant opens, beyond the engine: who owns each table, the sensitive columns, what reads them.

:func:`analyse` takes the engine's dry-run (:mod:`dw_dagster.access.engines`) and adds:

- **the domains whose owners must approve**: every domain a reachable table belongs to (newly
  reachable, or through ``SET ROLE`` / ``WITH ADMIN``), and every domain owning tables of a schema
  whose future tables the grant opens. A table belongs to a domain by the domain's ``tables``
  patterns, or by being a Dagster asset the domain owns: an asset whose ``dagster/table_name``
  metadata names the table (dagster-dbt and the warehouse integrations set it), whose key is
  ``[schema, table]``, or a dbt model, seed, snapshot or source that builds or is the table;
- **the sensitive columns** among the reachable ones: the pull-request review's rules
  (:mod:`dw_dagster.lineage.sensitive`, ``review.sensitive`` in the domains file) matched on the
  column's name and its comment in the catalog;
- **the downstream assets and exposures**: everything the lineage graph (Dagster asset graph plus
  dbt manifests, :func:`dw_dagster.lineage.lineage_graph`) has downstream of those tables.

A reachable table no domain owns is named in ``unowned``; a request is refused while there is one
(nobody could approve it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dw_dagster.access.models import AccessDryRun, DomainApproval, EngineDryRun, SensitiveColumn
from dw_dagster.core.domains import Domains
from dw_dagster.core.models import utcnow
from dw_dagster.lineage import asset_vertices, blast_radius
from dw_dagster.lineage.sensitive import match_column, rules_from

TABLE_NAME_KEY = "dagster/table_name"
_BUILT = ("model", "seed", "snapshot", "source")


def table_key(name: str) -> str:
    """The last two parts of a table name, unquoted and case-folded: how names are compared here."""
    import sqlglot
    from sqlglot import exp

    try:
        t = exp.to_table(name)
        parts = [p.name for p in (t.args.get("catalog"), t.args.get("db"), t.this) if p is not None]
    except sqlglot.errors.ParseError:
        parts = [p.strip('"`') for p in name.split(".")]
    return ".".join(parts[-2:]).casefold()


def table_index(asset_graph: Any = None, lineage: Any = None) -> dict[str, list[tuple[tuple[str, ...] | None, list[str]]]]:
    """``table key -> [(asset key, lineage vertices)]`` from an asset graph and a lineage graph."""
    out: dict[str, list[tuple[tuple[str, ...] | None, list[str]]]] = {}

    def add(table: str, key: tuple[str, ...] | None, vertices: list[str]) -> None:
        entry = out.setdefault(table_key(table), [])
        if not any(k == key and v == vertices for k, v in entry):
            entry.append((key, vertices))

    if asset_graph is not None:
        for node in asset_graph.asset_nodes:
            key = tuple(node.key.path)
            md = node.metadata or {}
            value = getattr(md.get(TABLE_NAME_KEY), "value", md.get(TABLE_NAME_KEY))
            vertices = asset_vertices(lineage, key) if lineage is not None else []
            if isinstance(value, str) and value:
                add(value, key, vertices)
            if len(key) >= 2:
                add(".".join(key[-2:]), key, vertices)
    if lineage is not None:
        for uid, attrs in lineage.nodes(data=True):
            data = attrs.get("data") or {}
            if attrs.get("resource_type") not in _BUILT or not data.get("schema"):
                continue
            name = data.get("alias") or data.get("identifier") or data.get("name")
            if name:
                key = attrs.get("asset_key")
                add(f"{data['schema']}.{name}", tuple(key) if key else None, [uid])
    return out


def _strip(name: str) -> str:
    return ".".join(p.strip('"') for p in name.split("."))


def analyse(run: EngineDryRun, *, domains: Domains, requester: str, grantee: str, asset_graph: Any = None,
            lineage: Any = None) -> AccessDryRun:
    """The engine's dry-run with owners, sensitive columns and downstream readers (module docstring).

    Args:
        run: the engine's dry-run.
        domains: the domains as they are now (tables, approvers, sensitive rules).
        requester: who asks (canonical email); not an eligible approver.
        grantee: whom it is for; not an eligible approver either.
        asset_graph: the code locations' asset graph (``Definitions.resolve_asset_graph()``), or None.
        lineage: a lineage graph (:func:`dw_dagster.lineage.lineage_graph`), or None.
    """
    reach = [*run.newly_reachable, *run.also_reachable]
    tables = sorted({x.table for x in reach})
    index = table_index(asset_graph, lineage)
    owners: dict[str, set[str]] = {}
    assets: list[list[str]] = []
    roots: list[str] = []
    for t in tables:
        found = {d.name for d in domains.for_table(_strip(t))}
        for key, vertices in index.get(table_key(t), []):
            roots += vertices
            if key is not None:
                assets.append(list(key))
                try:
                    found.add(domains.for_asset(key, asset_graph).name)
                except KeyError:
                    pass
        owners[t] = found
    for f in run.future_tables:
        probe = f"{f.schema_name or '*'}.__future_table__"
        owners[f"future tables in {f.schema_name or 'every schema'}"] = {
            d.name for d in domains.domains
            if any(_schema_covered(p, f.schema_name) for p in d.tables) or d.owns_table(_strip(probe))}
    sensitive = _sensitive(run, reach, domains)
    per_domain: dict[str, list[str]] = {}
    for t, ds in owners.items():
        for d in ds:
            per_domain.setdefault(d, []).append(t)
    approvals = []
    for name in sorted(per_domain):
        d = domains.get(name)
        owned = sorted(per_domain[name])
        n_sensitive = sum(1 for s in sensitive if s.table in owned)
        eligible = [a for a in d.approvers if a not in (requester, grantee)]
        approvals.append(DomainApproval(domain=name, approvers=list(d.approvers), tables=owned, sensitive=n_sensitive,
                                        eligible=eligible))
    downstream, exposures = [], []
    if lineage is not None and roots:
        br = blast_radius(lineage, sorted(set(r for r in roots if r in lineage)))
        downstream = [*br.models, *br.assets]
        exposures = list(br.exposures)
    return AccessDryRun(engine=run, sensitive=sensitive, domains=approvals,
                        unowned=sorted(t for t, ds in owners.items() if not ds),
                        assets=[list(a) for a in sorted({tuple(a) for a in assets})],
                        downstream=downstream, exposures=exposures, computed_at=utcnow())


def _schema_covered(pattern: str, schema: str | None) -> bool:
    import fnmatch

    parts = pattern.casefold().split(".")
    if schema is None:
        return True
    want = _strip(schema).casefold().split(".")[-1]
    return len(parts) >= 2 and fnmatch.fnmatchcase(want, parts[-2])


def _sensitive(run: EngineDryRun, reach: Iterable, domains: Domains) -> list[SensitiveColumn]:
    rules = rules_from(domains)
    comments: Mapping[str, list] = run.columns
    out, seen = [], set()
    for x in reach:
        described = dict((c, d) for c, d in comments.get(x.table, []))
        cols = x.columns or ([c for c, _ in comments.get(x.table, [])] if x.table_level else [])
        for col in cols:
            for m in match_column(col, rules, description=described.get(col, "") or ""):
                key = (x.table, col, m.rule.category)
                if key in seen:
                    continue
                seen.add(key)
                out.append(SensitiveColumn(table=x.table, column=col, category=m.rule.category, rule=m.rule.name,
                                           source=m.rule.source))
    return out


__all__ = ["TABLE_NAME_KEY", "analyse", "table_index", "table_key"]
