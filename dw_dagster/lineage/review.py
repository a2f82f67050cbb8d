"""Review a pull request's dbt project: what changed, what it reaches, which new columns look sensitive.

:func:`review_manifests` compares the ``manifest.json`` of the base branch (BASE) with the pull
request's (HEAD), both from ``dbt parse`` (or any command that writes ``target/``):

- **nodes** added, modified, removed; the modified set is dbt's own ``state:modified``
  (:mod:`dw_dagster.lineage.state`), each node with its reasons, and ``state_modified`` /
  ``state_modified_plus`` are exactly what ``dbt ls -s state:modified`` / ``-s state:modified+``
  ``--state BASE`` print on HEAD (default resource types, eager indirect test selection);
- **columns** of every modified model, seed, snapshot and source (and of any node whose
  ``catalog.json`` columns differ, when both sides have one): added, removed, renamed (paired by a
  ``meta.renamed_from`` hint, a description that says so or is the same, or the same type and
  position), type changed, nullability changed; each removal, rename, base-type change or
  relaxed nullability is *breaking* when a direct child reads the old column — column use read
  from the child's SQL with sqlglot (:mod:`dw_dagster.lineage.columns`; a child whose SQL cannot
  be read is listed as such), from data tests on the column and from semantic models — or when
  the model's enforced contract promised it;
- the **blast radius** of the modified nodes (:func:`~dw_dagster.lineage.dbt_manifest.blast_radius`
  on HEAD: models, tests, exposures with owners, Dagster asset keys);
- **sensitive-looking new columns** (:mod:`dw_dagster.lineage.sensitive`; rules from the
  domains file's ``review.sensitive``);
- the **domains** (domains file) whose assets or exposures are reached, with their approvers,
  escalation and Slack channel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from dw_dagster.core.domains import Domains, DomainsSource, resolve_domains
from dw_dagster.lineage.columns import Column, ColumnReader, ColumnSet, Usage, fold
from dw_dagster.lineage.dbt_manifest import blast_radius, dbt_ls, load_manifest, manifest_graph, node_owners
from dw_dagster.lineage.review_models import (
    ColumnChange,
    ColumnUse,
    DomainNotice,
    NodeChange,
    NodeColumns,
    Reason,
    Review,
    SensitiveColumn,
    Unreadable,
)
from dw_dagster.lineage.sensitive import match_column, rules_from
from dw_dagster.lineage.state import base_node, contract_changes, select_state_modified, state_modified
from dw_dagster.dagster_private import public

COLUMN_TYPES = frozenset({"model", "seed", "snapshot", "source"})
_RENAME_META_KEYS = ("renamed_from", "previous_name", "former_name")
_RENAMED_FROM = re.compile(r"renamed\s+from\s+[`'\"]?([^\s`'\",;)]+)", re.I)
_ORDER = {"added": 0, "modified": 1, "removed": 2}


def load_target(source: Mapping[str, Any] | str | Path, catalog: Mapping[str, Any] | str | Path | None = None,
                ) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """One side of a review: (manifest, catalog or None, label).

    Args:
        source: a dbt ``target/`` folder (or a project folder holding ``target/manifest.json``), a
            ``manifest.json`` path, or a manifest dict.
        catalog: a ``catalog.json`` dict or path; None: ``catalog.json`` beside the manifest when
            there is one (never for a dict).

    Raises:
        FileNotFoundError: no ``manifest.json`` there (or no catalog at an explicit path).
        ValueError: a file is not JSON, or the manifest has neither ``nodes`` nor ``sources``.
    """
    if isinstance(source, Mapping):
        manifest, label, beside = dict(source), "<dict>", None
    else:
        p = Path(source)
        path = p / "manifest.json" if p.is_dir() else p
        if p.is_dir() and not path.is_file() and (p / "target" / "manifest.json").is_file():
            path = p / "target" / "manifest.json"  # a dbt project folder: its target/
        if not path.is_file():
            raise FileNotFoundError(f"no dbt manifest at {path} (give a target/ folder or a manifest.json)")
        manifest, label, beside = load_manifest(path), str(path), path.parent / "catalog.json"
    if not isinstance(manifest, dict) or not any(k in manifest for k in ("nodes", "sources")):
        raise ValueError(f"{label} is not a dbt manifest (no nodes or sources)")
    cat: dict[str, Any] | None = None
    if isinstance(catalog, Mapping):
        cat = dict(catalog)
    elif catalog is not None or (beside is not None and beside.is_file()):
        cpath = Path(catalog) if catalog is not None else beside
        try:
            cat = json.loads(cpath.read_text())  # type: ignore[union-attr]
        except json.JSONDecodeError as e:
            raise ValueError(f"{cpath}: not a JSON catalog: {e}") from e
    return manifest, cat, label


def _key(g: nx.DiGraph, uid: str) -> list[str] | None:
    key = g.nodes[uid].get("asset_key") if uid in g else None
    return [str(k) for k in key] if key is not None else None


def _node_change(g: nx.DiGraph, uid: str, change: str, in_sm: bool, reasons: list[Reason],
                 dependents: list[str] = ()) -> NodeChange:
    attrs = g.nodes[uid]
    reaches = 0 if change == "removed" else len([u for u in dbt_ls(g, [uid]) if u != uid])
    return NodeChange(unique_id=uid, name=str(attrs.get("name") or uid), resource_type=attrs["resource_type"], change=change,
                      in_state_modified=in_sm, reasons=reasons, asset_key=_key(g, uid), owners=node_owners(g, uid),
                      reaches=reaches, dependents_in_base=sorted(dependents))


# -- column use --------------------------------------------------------------------------------


class _Uses:
    """Which columns of a parent each of its direct HEAD children reads, memoised per (child, parent)."""

    def __init__(self, g: nx.DiGraph, reader: ColumnReader) -> None:
        self.g, self.reader = g, reader
        self._memo: dict[tuple[str, str], Usage] = {}

    def of(self, parent: str, key: str, known: set[str]) -> tuple[list[ColumnUse], list[Unreadable]]:
        uses, unreadable = [], []
        for child in sorted(self.g.successors(parent)):
            rt = self.g.nodes[child]["resource_type"]
            usage = self._usage(child, parent, rt, known)
            if usage is None:
                continue
            if usage.problem:
                unreadable.append(Unreadable(unique_id=child, reason=usage.problem))
                continue
            how = usage.reads(key)
            if how:
                uses.append(ColumnUse(unique_id=child, resource_type=rt, how=how))
        return uses, unreadable

    def _usage(self, child: str, parent: str, rt: str, known: set[str]) -> Usage | None:
        if (child, parent) in self._memo:
            return self._memo[(child, parent)]
        data = self.g.nodes[child].get("data") or {}
        if rt == "test" and data.get("test_metadata") is not None:
            u = _generic_test_usage(data, parent)
        elif rt == "semantic_model":
            u = _semantic_usage(data)
        elif rt in ("model", "snapshot", "analysis", "test"):
            u = self.reader.usage(child, parent, known)
        else:
            u = None  # exposures, metrics, unit tests: no column-level reading to go by
        self._memo[(child, parent)] = u  # type: ignore[assignment]
        return u


def _generic_test_usage(test: Mapping[str, Any], parent: str) -> Usage:
    kwargs = (test.get("test_metadata") or {}).get("kwargs") or {}
    u = Usage()
    col = test.get("column_name") or kwargs.get("column_name")
    if test.get("attached_node") == parent and col:
        u.columns.setdefault(fold(col), "test")
        if not str(col).isidentifier():  # an expression (lower(email)) or a quoted name: its column references too
            for name in _expression_columns(str(col)):
                u.columns.setdefault(fold(name), "test")
    if test.get("attached_node") != parent and kwargs.get("field"):
        u.columns.setdefault(fold(kwargs["field"]), "relationships_test")
    for name in kwargs.get("combination_of_columns") or ():
        if test.get("attached_node") == parent:
            u.columns.setdefault(fold(name), "test")
    return u


def _expression_columns(expr: str) -> list[str]:
    """Column names an SQL expression reads; the expression itself when sqlglot cannot parse it."""
    import sqlglot
    from sqlglot import exp

    try:
        return [c.name for c in sqlglot.parse_one(expr).find_all(exp.Column)]
    except Exception:  # noqa: BLE001 - sqlglot raises several error types
        return [expr]


def _semantic_usage(sm: Mapping[str, Any]) -> Usage:
    u = Usage()
    for part in ("entities", "dimensions", "measures"):
        for item in sm.get(part) or ():
            expr = item.get("expr")
            for name in _expression_columns(str(expr)) if expr else [item.get("name") or ""]:
                u.columns.setdefault(fold(name), "semantic_model")
    return u


# -- column changes ----------------------------------------------------------------------------


def _pick(rb: ColumnReader, rh: ColumnReader, uid: str) -> tuple[ColumnSet | None, ColumnSet | None, str, str | None]:
    """The first column source both sides have (catalog, sql, yaml), and a note when a side's SQL could not be used."""
    for source in ("catalog", "sql", "yaml"):
        b, h = rb.columns(uid, source), rh.columns(uid, source)
        if b is not None and h is not None:
            sql_bearing = (rh.node(uid) or {}).get("resource_type") not in ("seed", "source")
            note = f"compared the documented columns only ({'; '.join(_sql_notes(rb, rh, uid))})" if (
                source == "yaml" and sql_bearing) else None
            return b, h, source, note
    return None, None, "none", f"columns not compared ({'; '.join(_sql_notes(rb, rh, uid))})"


def _why_not(reader: ColumnReader, uid: str) -> str:
    _, problem = reader.parsed(uid)
    return problem or "its SQL projects a column list dw_dagster cannot expand (a star over a parent of unknown columns)"


def _sql_notes(rb: ColumnReader, rh: ColumnReader, uid: str) -> list[str]:
    found: dict[str, list[str]] = {}
    for side, r in (("base", rb), ("head", rh)):
        if r.sql_columns(uid) is not None:
            continue
        rt = (r.node(uid) or {}).get("resource_type")
        if rt in ("seed", "source"):
            why = f"a {rt}: no catalog.json entry" + ("" if r.yaml_columns(uid) else " and no documented columns")
        else:
            why = _why_not(r, uid)
        found.setdefault(why, []).append(side)
    return [f"{' and '.join(sides)}: {why}" for why, sides in found.items()]


def _renames(removed: dict[str, Column], added: dict[str, Column]) -> list[tuple[str, str, str]]:
    """(old key, new key, evidence) pairs, the strongest hint first; each column paired at most once."""
    pairs: list[tuple[str, str, str]] = []
    free_r, free_a = dict(removed), dict(added)

    def take(r: str, a: str, why: str) -> None:
        pairs.append((r, a, why))
        free_r.pop(r)
        free_a.pop(a)

    for a, col in list(free_a.items()):
        hint = next((col.meta.get(k) for k in _RENAME_META_KEYS if col.meta.get(k)), None)
        if hint is not None and fold(str(hint)) in free_r:
            take(fold(str(hint)), a, f"meta.{next(k for k in _RENAME_META_KEYS if col.meta.get(k))}")
    for a, col in list(free_a.items()):
        m = _RENAMED_FROM.search(col.description or "")
        if m and fold(m.group(1)) in free_r:
            take(fold(m.group(1)), a, "description says renamed from")
    for a, col in list(free_a.items()):
        same = [r for r, old in free_r.items() if col.description and old.description == col.description]
        if len(same) == 1:
            take(same[0], a, "same description")
    for a, col in list(free_a.items()):
        same = [r for r, old in free_r.items() if col.data_type and old.data_type and old.type_from == col.type_from
                and fold(old.data_type) == fold(col.data_type) and old.position is not None and old.position == col.position]
        if len(same) == 1:
            take(same[0], a, "same type and position")
    return pairs


def _base_type(t: str) -> str:
    return t.partition("(")[0].strip().casefold()


def _column_changes(uid: str, g: nx.DiGraph, rb: ColumnReader, rh: ColumnReader, uses: _Uses,
                    old_node: Mapping[str, Any], new_node: Mapping[str, Any]) -> NodeColumns:
    attrs = g.nodes[uid]
    common = dict(unique_id=uid, name=str(attrs.get("name")), resource_type=attrs["resource_type"])
    contract_breaking: list[str] = []
    enforced = bool((old_node.get("contract") or {}).get("enforced"))
    if attrs["resource_type"] == "model" and old_node.get("resource_type") == "model":
        _, contract_breaking = contract_changes(new_node, old_node)
    b, h, source, note = _pick(rb, rh, uid)
    if b is None or h is None:
        return NodeColumns(**common, columns_from="none", note=note, contract_breaking=contract_breaking)
    known = set(b.columns) | set(h.columns)
    removed = {k: c for k, c in b.columns.items() if k not in h.columns}
    added = {k: c for k, c in h.columns.items() if k not in b.columns}
    renames = _renames(removed, added)
    changes: list[ColumnChange] = []

    def reading(old_key: str, what: str, breaks_contract: bool) -> dict[str, Any]:
        used, unreadable = uses.of(uid, old_key, known)
        why = []
        if used:
            why.append(f"read by {len(used)} downstream node(s)")
        if breaks_contract and enforced:
            why.append("the enforced contract promised it")
        if not why:
            why.append(f"{len(unreadable)} downstream node(s) could not be read" if unreadable else "nothing downstream reads it")
        return dict(breaking=bool(used) or (breaks_contract and enforced), why=f"{what}: {'; '.join(why)}",
                    selected_by=used, unreadable=unreadable)

    paired_r, paired_a = {r for r, _, _ in renames}, {a for _, a, _ in renames}
    for r, a, why in renames:
        changes.append(ColumnChange(column=h.columns[a].name, change="renamed", before=b.columns[r].name, evidence=why,
                                    **reading(r, f"renamed from {b.columns[r].name}", True)))
    for k, c in removed.items():
        if k not in paired_r:
            changes.append(ColumnChange(column=c.name, change="removed", **reading(k, "removed", True)))
    for k, c in added.items():
        if k not in paired_a:
            changes.append(ColumnChange(column=c.name, change="added", breaking=False, why="new column"))
    for k, new in h.columns.items():
        old = b.columns.get(k)
        if old is None:
            continue
        if old.data_type and new.data_type and old.type_from == new.type_from and fold(old.data_type) != fold(new.data_type):
            base_changed = _base_type(old.data_type) != _base_type(new.data_type)
            kw = reading(k, f"type {old.data_type} → {new.data_type}", True) if base_changed else dict(
                breaking=False, why="size, precision or scale only (not breaking, as dbt's contract check)")
            changes.append(ColumnChange(column=new.name, change="type_changed", before=old.data_type, after=new.data_type, **kw))
        was, now = "not_null" in old.constraints, "not_null" in new.constraints
        if was != now:
            kw = reading(k, "was not null, now nullable", False) if was else dict(breaking=False, why="now not null")
            changes.append(ColumnChange(column=new.name, change="nullability_changed", before="not null" if was else "nullable",
                                        after="not null" if now else "nullable", **kw))
    order = {"removed": 0, "renamed": 1, "type_changed": 2, "nullability_changed": 3, "added": 4}
    changes.sort(key=lambda c: (order[c.change], fold(c.column)))
    return NodeColumns(**common, columns_from=source, note=note, changes=changes, contract_breaking=contract_breaking)


def _column_candidates(g: nx.DiGraph, base: Mapping[str, Any], modified: Mapping[str, Any], rb: ColumnReader,
                       rh: ColumnReader) -> list[str]:
    """Nodes whose columns are compared: modified models, seeds, snapshots and sources; sources whose documented
    columns differ (dbt does not count those as modified); any node whose catalog columns differ."""
    out = []
    for u, attrs in g.nodes(data=True):
        old = base_node(base, u) if attrs.get("dbt") and attrs["resource_type"] in COLUMN_TYPES else None
        if old is None:
            continue
        if (u in modified or (attrs["resource_type"] == "source"
                              and (attrs["data"].get("columns") or {}) != (old.get("columns") or {}))
                or (rb.catalog and rh.catalog and _catalog_differs(rb, rh, u))):
            out.append(u)
    return out


def _catalog_differs(rb: ColumnReader, rh: ColumnReader, uid: str) -> bool:
    b, h = rb.catalog_columns(uid), rh.catalog_columns(uid)
    return b is not None and h is not None and (
        {k: (c.data_type, c.position) for k, c in b.columns.items()} != {k: (c.data_type, c.position) for k, c in h.columns.items()})


# -- domains -----------------------------------------------------------------------------------


def _domain_notices(domains: Domains | None, head: Mapping[str, Any], keys: list[list[str]], exposures: list[str],
                    notes: list[str]) -> list[DomainNotice]:
    if domains is None:
        return []
    owned: dict[str, tuple[list[list[str]], list[str]]] = {}
    todo = [k for k in keys]
    for k in list(todo):
        d = next((d for d in domains.domains if d.owns(k)), None)
        if d is not None:
            owned.setdefault(d.name, ([], []))[0].append(k)
            todo.remove(k)
    if todo and any(d.select for d in domains.domains):
        for d in domains.domains:
            for sel in d.select:
                try:
                    hit = _resolve_selection(head, sel)
                except Exception as e:  # noqa: BLE001 - a selection that needs the code location's own assets
                    notes.append(f"domain {d.name}: cannot resolve select {sel!r} on the dbt assets: {e}")
                    continue
                for k in [k for k in todo if tuple(k) in hit]:
                    owned.setdefault(d.name, ([], []))[0].append(k)
                    todo.remove(k)
    for name in exposures:
        d = next((d for d in domains.domains if name in d.exposures), None)
        if d is not None:
            owned.setdefault(d.name, ([], []))[1].append(name)
    out = []
    for d in domains.domains:
        if d.name in owned:
            ks, es = owned[d.name]
            out.append(DomainNotice(domain=d.name, approvers=d.approvers, escalation=d.escalation,
                                    slack_channel=d.slack_channel, assets=sorted(ks), exposures=sorted(es)))
    return out


_SELECTION_CACHE: dict[int, tuple[Any, Any]] = {}


def _resolve_selection(head: Mapping[str, Any], selection: str) -> set[tuple[str, ...]]:
    """Asset keys a Dagster selection string picks among the dbt assets dagster-dbt builds from ``head``."""
    import dagster as dg
    from dagster_dbt import dbt_assets

    cached = _SELECTION_CACHE.get(id(head))
    if cached is None or cached[0] is not head:
        @dbt_assets(manifest=dict(head))
        def _dbt(context):  # pragma: no cover - never run: only its specs are read
            yield from ()

        cached = (head, dg.Definitions(assets=[_dbt]).resolve_asset_graph())
        _SELECTION_CACHE.clear()
        _SELECTION_CACHE[id(head)] = cached
    return {tuple(k.path) for k in dg.AssetSelection.from_string(selection).resolve(cached[1])}


# -- the review --------------------------------------------------------------------------------


@public
def review_manifests(base: Mapping[str, Any] | str | Path, head: Mapping[str, Any] | str | Path, *,
                     base_catalog: Mapping[str, Any] | str | Path | None = None,
                     head_catalog: Mapping[str, Any] | str | Path | None = None,
                     domains: DomainsSource = None) -> Review:
    """Review what HEAD changes in the dbt project against BASE (module docstring).

    Args:
        base: the base branch's dbt ``target/`` folder, ``manifest.json`` path or manifest dict
            (what ``--state`` would point at).
        head: the pull request's, the same way.
        base_catalog, head_catalog: ``catalog.json`` (dict or path); by default the one beside
            each manifest, if any. With both, actual column types and positions are compared.
        domains: a :class:`~dw_dagster.core.domains.Domains`, a domains file path, or None for
            ``$DW_DOMAINS_FILE`` (no domains when unset): owners, Slack channels and the
            sensitive-column rules (``review.sensitive``).

    Returns:
        A :class:`~dw_dagster.lineage.review_models.Review`. ``Review.failures(["breaking"])`` /
        ``exit_code`` apply a CI policy.

    Raises:
        FileNotFoundError, ValueError: a manifest or catalog is missing or unreadable
            (:func:`load_target`).
        DomainsFileError: a domains file is configured but invalid.
        ValueError: ``review.sensitive.disable`` names no built-in rule.
    """
    bm, bc, blabel = load_target(base, base_catalog)
    hm, hc, hlabel = load_target(head, head_catalog)
    dom = resolve_domains(domains)
    rules = rules_from(dom)
    notes: list[str] = []
    bmeta, hmeta = bm.get("metadata") or {}, hm.get("metadata") or {}
    if bmeta.get("dbt_schema_version") != hmeta.get("dbt_schema_version"):
        notes.append(f"manifest schemas differ (base {bmeta.get('dbt_schema_version')}, head {hmeta.get('dbt_schema_version')}): "
                     "dbt compares state only across compatible manifests")
    g, gb = manifest_graph(hm), manifest_graph(bm)
    modified = state_modified(bm, hm, g)

    nodes: list[NodeChange] = []
    for uid, attrs in g.nodes(data=True):
        reasons = [Reason(kind=r.kind, detail=r.detail) for r in modified.get(uid, ())]
        if base_node(bm, uid) is None:
            if uid not in modified:
                reasons = [Reason(kind="new", detail="not in the base manifest (dbt's state:modified does not select a new "
                                  f"{attrs['resource_type']})")]
            nodes.append(_node_change(g, uid, "added", uid in modified, reasons))
        elif uid in modified:
            nodes.append(_node_change(g, uid, "modified", True, reasons))
    for uid, attrs in gb.nodes(data=True):
        if uid not in g:
            why = "disabled in head" if uid in (hm.get("disabled") or {}) else "not in the head manifest"
            nodes.append(_node_change(gb, uid, "removed", False, [Reason(kind="removed", detail=why)],
                                      list(gb.successors(uid))))
    nodes.sort(key=lambda n: (_ORDER[n.change], n.unique_id))

    rb, rh = ColumnReader(bm, bc), ColumnReader(hm, hc)
    uses = _Uses(g, rh)
    added_ids = {n.unique_id for n in nodes if n.change == "added"}
    columns = []
    for u in sorted(_column_candidates(g, bm, modified, rb, rh)):
        nc = _column_changes(u, g, rb, rh, uses, base_node(bm, u) or {}, g.nodes[u]["data"])
        if nc.changes or nc.contract_breaking or nc.note:
            columns.append(nc)

    sensitive: list[SensitiveColumn] = []

    def scan(uid: str, cols: list[Column]) -> None:
        for c in cols:
            for m in match_column(c.name, rules, description=c.description, tags=c.tags, meta=c.meta):
                sensitive.append(SensitiveColumn(unique_id=uid, column=c.name, rule=m.rule.name, category=m.rule.category,
                                                 matched_on=m.matched_on, matched_text=m.matched_text, source=m.rule.source))

    for nc in columns:
        new_cols = {fold(c.column) for c in nc.changes if c.change in ("added", "renamed")}
        best = rh.columns(nc.unique_id, nc.columns_from) if nc.columns_from != "none" else None
        if best is not None:
            scan(nc.unique_id, [c for k, c in best.columns.items() if k in new_cols])
    for uid in sorted(added_ids):
        if g.nodes[uid]["resource_type"] in COLUMN_TYPES:
            best = rh.best(uid)
            if best is None:
                notes.append(f"{uid} is new and its columns cannot be read ({_why_not(rh, uid)}): not checked for sensitive columns")
                continue
            scan(uid, [rh.columns(uid, best.source).columns[k] for k in best.columns])  # type: ignore[union-attr]

    br = blast_radius(g, list(modified)) if modified else None
    keys = [n.asset_key for n in nodes if n.asset_key and n.change != "removed"] + (
        [list(k) for k in br.dagster_assets] if br else [])
    keys = [list(k) for k in dict.fromkeys(tuple(k) for k in keys)]
    exposures = sorted({n.name for n in nodes if n.resource_type == "exposure" and n.change != "removed"}
                       | ({e.name for e in br.exposures} if br else set()))
    notices = _domain_notices(dom, hm, keys, exposures, notes)
    owners = set(br.owners if br else ()) | {o for n in nodes for o in n.owners} | {a for d in notices for a in d.approvers}
    unreadable = sorted({u.unique_id for nc in columns for c in nc.changes for u in c.unreadable})
    if unreadable:
        notes.append(f"column use of {len(unreadable)} downstream node(s) could not be read (see each change's 'unreadable')")
    return Review(base=blabel, head=hlabel, adapter=hmeta.get("adapter_type"), catalogs={"base": bc is not None, "head": hc is not None},
                  nodes=nodes, state_modified=select_state_modified(g, modified),
                  state_modified_plus=select_state_modified(g, modified, descendants=True), blast_radius=br, columns=columns,
                  sensitive=sensitive, domains=notices, owners=sorted(owners), notes=notes)


__all__ = ["Review", "load_target", "review_manifests"]
