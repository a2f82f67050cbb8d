"""Lineage tools: ``blast_radius_analysis`` and ``trace_cross_platform_lineage``.

``blast_radius_analysis`` answers with exactly what ``dw-dagster blast-radius --manifest M --select X
--json`` prints for the same manifest (which equals ``dbt ls --select X+``), built from the same
functions of :mod:`dw_dagster.lineage` (:func:`select_nodes`, :func:`downstream`, :func:`dbt_ls`,
:func:`dbt_selector`, :func:`node_owners`), and adds the exposures' owners and links, the
Dagster assets among them and, for a column change, which of them name the column. The manifest
is the one the workspace's ``@dbt_assets`` carry (or ``--manifest``). A Dagster asset no manifest
knows (an upstream source asset) is looked up in the code location's Dagster + dbt lineage graph
(:func:`dw_dagster.lineage.lineage_graph`) instead, which the answer says.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, Field

from dw_dagster.core.models import ExposureRef
from dw_dagster.lineage import blast_radius, dbt_ls, dbt_selector, downstream, manifest_graph, node_owners, select_nodes
from dw_dagster.lineage.dbt_manifest import UnknownNodeError
from dw_dagster.mcp.state import DwState, closest, fail, shown

ChangeType = Literal["data", "add_column", "drop_column", "rename_column", "retype_column", "nullability"]
COLUMN_CHANGES = ("drop_column", "rename_column", "retype_column", "nullability")

_graphs: dict[int, nx.DiGraph] = {}


def _manifest_graph(m: Any) -> nx.DiGraph:
    g = _graphs.get(id(m))
    if g is None:
        g = _graphs[id(m)] = manifest_graph(m)
        g.graph["_manifest"] = m  # keeps id(m) from being reused while the graph is cached
    return g


class ColumnUse(BaseModel):
    """A listed node that names the changed column, and where."""

    unique_id: str
    depth: int
    how: list[str] = Field(description="documented column, tests this column, named in its SQL (a text match, not "
                           "parsed column lineage)")


class BlastRadiusAnswer(BaseModel):
    """Everything downstream of a node, as `dw-dagster blast-radius --json` (= `dbt ls --select X+`), plus owners
    of exposures, the Dagster assets among them and, for a column change, who names the column."""

    graph: str = Field(description="where the answer comes from: the manifest of a code location, a --manifest "
                       "file, or a location's Dagster + dbt lineage graph")
    selected: list[str] = Field(description="the unique ids the selector resolved to")
    dbt_selector: str = Field(description="the same selection in dbt's syntax")
    nodes: list[str] = Field(description="selected nodes, then downstream models, seeds, snapshots, sources, metrics, ... "
                             "by depth")
    tests: list[str] = Field(description="data tests and unit tests")
    exposures: list[str]
    owners: list[str] = Field(description="owners of all listed nodes, sorted")
    depth: dict[str, int] = Field(description="unique id → edges from the selected node")
    dbt_ls: list[str] = Field(description="nodes + tests + exposures, sorted: what `dbt ls --select X+` prints")
    exposure_details: list[ExposureRef] = Field(description="dashboards/workbooks with type, link and owner")
    dagster_assets: list[list[str]] = Field(description="Dagster asset keys among the listed nodes")
    change_type: ChangeType
    column: str | None = None
    column_impact: list[ColumnUse] | None = Field(default=None, description="for a column change: the listed nodes "
                                                 "that name the column")
    note: str = Field(description="what the change type means for the list")


def _select(state: DwState, selector: str) -> tuple[str, nx.DiGraph, list[str], bool]:
    """``(where, graph, roots, is_manifest)`` for the first manifest (then lineage graph) that resolves ``selector``."""
    errors = []
    for where, m in state.manifests():
        g = _manifest_graph(m)
        try:
            return f"dbt manifest of {where}", g, select_nodes(g, selector), True
        except UnknownNodeError as e:
            errors.append(str(e.args[0]))
    if state.workspace_path:
        for loc in state.workspace().loaded():
            g = loc.lineage()
            try:
                return f"Dagster + dbt lineage graph of location {loc.name}", g, select_nodes(g, selector), False
            except UnknownNodeError as e:
                errors.append(str(e.args[0]))
    names = sorted({str(a.get("name")) for _, m in state.manifests() for a in _manifest_graph(m)._node.values()})
    near = closest(selector.strip().removesuffix("+"), names)
    raise fail(f"no dbt node or asset {shown(selector)} in the manifests or the asset graph"
               + (f"; the closest names are {', '.join(near)}" if near else "")
               + (f" ({errors[0]})" if errors and "invalid" in errors[0] or errors and "graph operators" in errors[0] else "")
               + "; give a model name, a unique id, source:x.y, exposure:x, or an asset key (a/b)")


def _mentions(g: nx.DiGraph, uid: str, column: str) -> list[str]:
    data = g.nodes[uid].get("data") or {}
    how = []
    if any(str(c).lower() == column.lower() for c in (data.get("columns") or {})):
        how.append("documented column")
    kw = (data.get("test_metadata") or {}).get("kwargs") or {}
    if str(data.get("column_name") or kw.get("column_name") or "").lower() == column.lower():
        how.append("tests this column")
    code = data.get("compiled_code") or data.get("raw_code") or data.get("raw_sql") or ""
    if code and re.search(rf"(?<![\w$]){re.escape(column)}(?![\w$])", code, re.IGNORECASE):
        how.append("named in its SQL")
    return how


def blast_radius_analysis(state: DwState, node: str, change_type: ChangeType, column: str | None) -> BlastRadiusAnswer:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    if not node or not node.strip() or len(node) > 1000:
        raise fail("name one node: a model, a unique id, source:x.y, exposure:x or an asset key (a/b)")
    if change_type in COLUMN_CHANGES and not (column or "").strip():
        raise fail(f"change_type {change_type} is about one column: give column")
    where, g, roots, is_manifest = _select(state, node)
    depth = downstream(g, roots)
    listed = sorted(dbt_ls(g, roots), key=lambda u: (depth[u], u))
    kind = {u: g.nodes[u]["resource_type"] for u in listed}
    br = blast_radius(g, roots)
    col = (column or "").strip() or None
    impact = None
    if col is not None and change_type != "data":
        impact = [ColumnUse(unique_id=u, depth=depth[u], how=how) for u in listed if (how := _mentions(g, u, col))]
    note = {
        "data": "rows change (a rerun, backfill or delete): every listed node reads them, directly or through another",
        "add_column": "a new column breaks no reference; models that select * pass it on",
    }.get(change_type, f"every listed node is downstream; column_impact lists those that name {col!r} (documented, "
                       "tested or in their SQL); those are the ones the change can break")
    return BlastRadiusAnswer(
        graph=where + ("" if is_manifest else " (a superset of dbt ls: Dagster assets can link dbt nodes)"),
        selected=roots, dbt_selector=" ".join(f"{dbt_selector(g, r) or r}+" for r in roots),
        nodes=[u for u in listed if kind[u] not in ("test", "unit_test", "exposure")],
        exposures=[u for u in listed if kind[u] == "exposure"], tests=[u for u in listed if kind[u] in ("test", "unit_test")],
        owners=sorted({o for u in listed for o in node_owners(g, u)}), depth={u: depth[u] for u in listed},
        dbt_ls=sorted(listed), exposure_details=br.exposures, dagster_assets=br.dagster_assets, change_type=change_type,
        column=col, column_impact=impact, note=note)


class LineageNode(BaseModel):
    """One vertex on the path: a Dagster asset, a dbt node, a source, a check or an exposure."""

    id: str = Field(description="dbt unique id, asset:<key> for a Dagster-only asset, check:<asset>:<name>")
    name: str
    resource_type: str = Field(description="asset, model, seed, snapshot, source, test, asset_check, exposure, metric, ...")
    platform: str = Field(description="dagster (an asset not in dbt), dbt (a dbt node, also a Dagster asset when "
                          "asset_key is set), dbt test, dagster check, dashboard/notebook/... (an exposure)")
    kinds: list[str] = Field(default_factory=list, description="the Dagster asset's kinds: the systems it lives in")
    asset_key: list[str] | None = None
    direction: Literal["root", "upstream", "downstream"]
    depth: int = Field(description="edges from the root")
    owners: list[str] = Field(default_factory=list)
    url: str | None = None


class LineageTrace(BaseModel):
    """Dagster assets, dbt nodes, sources and exposures on one path, with the platform of each."""

    root: list[str]
    location: str = Field(description="the code location whose graph was walked")
    direction: Literal["upstream", "downstream", "both"]
    max_depth: int
    nodes: list[LineageNode] = Field(description="root first, then by direction and depth")
    edges: list[tuple[str, str]] = Field(description="parent → child, between listed nodes")
    truncated: bool = Field(description="True when nodes lie beyond max_depth")


def _platform(attrs: dict) -> str:
    rt = attrs.get("resource_type")
    if rt == "asset":
        return "dagster"
    if rt == "asset_check":
        return "dagster check"
    if rt in ("test", "unit_test"):
        return "dbt test"
    if rt == "exposure":
        return str((attrs.get("data") or {}).get("type") or "exposure")
    return "dbt"


def _walk(g: nx.DiGraph, roots: list[str], up: bool, max_depth: int) -> tuple[dict[str, int], bool]:
    depth = {r: 0 for r in roots}
    queue, beyond = deque(roots), False
    step = g.predecessors if up else g.successors
    while queue:
        u = queue.popleft()
        if not up and g.nodes[u].get("resource_type") in ("test", "unit_test", "asset_check") and depth[u]:
            continue
        for v in step(u):
            if v in depth:
                continue
            if depth[u] + 1 > max_depth:
                beyond = True
                continue
            depth[v] = depth[u] + 1
            queue.append(v)
    return depth, beyond


def trace_cross_platform_lineage(state: DwState, asset: str, direction: str, max_depth: int) -> LineageTrace:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    if not asset or not asset.strip() or len(asset) > 1000:
        raise fail("name an asset key (a/b) or a dbt node")
    ws = state.workspace()
    found, errors = None, []
    for loc in ws.loaded():
        g = loc.lineage()
        try:
            found = (loc, g, select_nodes(g, asset))
            break
        except UnknownNodeError as e:
            errors.append(e)
    if found is None:
        names = sorted({k.to_user_string() for k in ws.asset_keys()})
        near = closest(asset.strip(), names)
        raise fail(f"no asset or dbt node {shown(asset)} in the workspace's code locations"
                   + (f"; the closest are {', '.join(near)}" if near else "") + " (asset keys are slash-separated)")
    loc, g, roots = found
    sides = {"upstream": [True], "downstream": [False], "both": [True, False]}[direction]
    placed: dict[str, tuple[str, int]] = {r: ("root", 0) for r in roots}
    truncated = False
    for up in sides:
        depth, beyond = _walk(g, roots, up, max_depth)
        truncated |= beyond
        for v, d in depth.items():
            placed.setdefault(v, ("upstream" if up else "downstream", d))
    order = {"root": 0, "upstream": 1, "downstream": 2}
    nodes = []
    for v, (side, d) in sorted(placed.items(), key=lambda x: (order[x[1][0]], x[1][1], x[0])):
        a = g.nodes[v]
        key = a.get("asset_key")
        nodes.append(LineageNode(id=v, name=str(a.get("name")), resource_type=str(a.get("resource_type")),
                                 platform=_platform(a), kinds=list(a.get("kinds") or []),
                                 asset_key=[str(k) for k in key] if key is not None and (a.get("dagster") or a.get(
                                     "resource_type") in ("model", "seed", "snapshot")) else None,
                                 direction=side, depth=d, owners=node_owners(g, v),
                                 url=(a.get("data") or {}).get("url")))
    edges = sorted((u, v) for u, v in g.subgraph(placed).edges())
    return LineageTrace(root=roots, location=loc.name, direction=direction, max_depth=max_depth, nodes=nodes, edges=edges,
                        truncated=truncated)


__all__ = ["BlastRadiusAnswer", "ChangeType", "LineageTrace", "blast_radius_analysis", "trace_cross_platform_lineage"]
