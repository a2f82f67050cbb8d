"""A networkx graph of a dbt manifest, and the blast radius of a broken node.

Built from each node's ``depends_on.nodes`` (so a missing or partial ``child_map`` does not lose
edges) over every section that holds graph members: ``nodes`` (models, seeds, snapshots, tests,
analyses), ``sources``, ``exposures``, ``metrics``, ``semantic_models``, ``saved_queries``.
Children that live outside ``nodes`` (exposures) are found by their own section
(``shared/cases/PUBLIC_CASES.md`` C15). Tests are leaves: a test that hangs off several models is
reported as an affected check, never used as a path into unrelated models.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from dw_dagster.models import BlastRadius, ExposureRef, ImpactedNode

SECTIONS = ("nodes", "sources", "exposures", "metrics", "semantic_models", "saved_queries", "unit_tests")


class UnknownNodeError(KeyError):
    """The selected node is not in the manifest (the message lists close matches)."""


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read ``manifest.json``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not JSON.
    """
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON manifest: {e}") from e


def manifest_graph(manifest: Mapping[str, Any]) -> nx.DiGraph:
    """Directed graph parent → child over every manifest section; node attributes are the manifest entries."""
    g = nx.DiGraph()
    for section in SECTIONS:
        for uid, node in (manifest.get(section) or {}).items():
            g.add_node(uid, **{"resource_type": node.get("resource_type") or uid.split(".", 1)[0], "data": node})
    for section in SECTIONS:
        for uid, node in (manifest.get(section) or {}).items():
            for parent in (node.get("depends_on") or {}).get("nodes") or []:
                if parent in g:
                    g.add_edge(parent, uid)
    for parent, children in (manifest.get("child_map") or {}).items():
        for child in children or []:
            if parent in g and child in g:
                g.add_edge(parent, child)
    return g


def resolve_node(g: nx.DiGraph, selector: str) -> str:
    """A unique id, or a model/source/seed name (``sales_line``, ``pos.sales_line``) → its unique id.

    Raises:
        UnknownNodeError: nothing matches, or a bare name matches several nodes.
    """
    if selector in g:
        return selector
    matches = []
    for uid, attrs in g.nodes(data=True):
        node = attrs["data"]
        names = {node.get("name")}
        if attrs["resource_type"] == "source":
            names.add(f"{node.get('source_name')}.{node.get('name')}")
        if selector in names and attrs["resource_type"] != "test":
            matches.append(uid)
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UnknownNodeError(f"{selector!r} is ambiguous: {sorted(matches)}")
    close = sorted(u for u in g.nodes if selector.lower() in u.lower())[:5]
    raise UnknownNodeError(f"no dbt node {selector!r} in the manifest" + (f"; did you mean {close}?" if close else ""))


def source_for_asset_key(g: nx.DiGraph, asset_key: Iterable[str]) -> str | None:
    """The dbt source whose ``meta.dagster.asset_key`` (or default key ``[source, table]``) is ``asset_key``."""
    want = list(asset_key)
    for uid, attrs in g.nodes(data=True):
        if attrs["resource_type"] != "source":
            continue
        node = attrs["data"]
        meta = (node.get("meta") or {}).get("dagster") or (node.get("config", {}).get("meta") or {}).get("dagster") or {}
        key = meta.get("asset_key") or [node.get("source_name"), node.get("name")]
        if list(key) == want:
            return uid
    return None


def _owner(node: Mapping[str, Any]) -> tuple[str | None, str | None]:
    owner = node.get("owner") or {}
    return owner.get("name"), owner.get("email")


def blast_radius(g: nx.DiGraph, roots: Iterable[str], asset_keys: Mapping[str, list[str]] | None = None) -> BlastRadius:
    """Everything downstream of ``roots``: models (and seeds/snapshots), tests, exposures, owners.

    Depth is the shortest number of edges from any root. Tests are collected but never expanded.

    Args:
        g: a graph from :func:`manifest_graph`.
        roots: unique ids of the broken nodes.
        asset_keys: optional unique id → Dagster asset key path, to name the Dagster assets hit.
    """
    roots = list(roots)
    depth: dict[str, int] = {r: 0 for r in roots}
    frontier = list(roots)
    while frontier:
        nxt = []
        for u in frontier:
            for v in g.successors(u):
                if v in depth:
                    continue
                depth[v] = depth[u] + 1
                if g.nodes[v]["resource_type"] != "test":
                    nxt.append(v)
        frontier = nxt
    models, tests, exposures, other, owners = [], [], [], [], set()
    for uid, d in sorted(depth.items(), key=lambda x: (x[1], x[0])):
        if uid in roots:
            continue
        attrs = g.nodes[uid]
        node, rt = attrs["data"], attrs["resource_type"]
        item = ImpactedNode(unique_id=uid, name=node.get("name", uid), resource_type=rt, depth=d,
                            asset_key=(asset_keys or {}).get(uid))
        if rt == "exposure":
            oname, oemail = _owner(node)
            exposures.append(ExposureRef(unique_id=uid, name=node.get("name", uid), label=node.get("label"),
                                         type=node.get("type"), url=node.get("url"), owner_name=oname,
                                         owner_email=oemail, depth=d))
            if oemail or oname:
                owners.add(oemail or oname)
        elif rt == "test":
            tests.append(item)
        elif rt in ("model", "seed", "snapshot"):
            models.append(item)
            meta_owner = ((node.get("config") or {}).get("meta") or {}).get("owner") or (node.get("meta") or {}).get("owner")
            if meta_owner:
                owners.add(meta_owner)
        else:
            other.append(item)
    return BlastRadius(
        root=roots[0] if len(roots) == 1 else ",".join(roots),
        models=models, tests=tests, exposures=exposures, other=other, owners=sorted(owners),
        dagster_assets=[m.asset_key for m in models if m.asset_key],
    )
