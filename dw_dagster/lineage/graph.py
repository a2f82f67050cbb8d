"""One networkx graph of the Dagster asset graph and the dbt manifests behind it.

:func:`lineage_graph` starts from the dbt graph of every manifest (:func:`~dw_dagster.lineage.
dbt_manifest.add_manifests`: models, seeds, snapshots, sources, tests, unit tests, exposures,
metrics, semantic models, saved queries) and lays the Dagster asset graph over it:

- a Dagster asset that *is* a dbt node is the same vertex. The link is the asset's
  ``dagster_dbt/unique_id`` metadata (set by ``@dbt_assets``), else the asset key dagster-dbt's
  translator gives the dbt node (``DagsterDbtTranslator.get_asset_key``: ``meta.dagster.asset_key``
  or the default key, the same key ``get_asset_key_for_model`` returns). A dbt *source* whose key
  is a Dagster asset (``meta.dagster.asset_key: [store_sales_line]``) becomes that asset, so a
  non-dbt asset upstream reaches the dbt models through the source;
- any other Dagster asset is a vertex ``asset:<key path joined by '/'>`` with resource type
  ``asset``; its dependencies become edges, so Dagster assets downstream of dbt models are in the
  blast radius too;
- Dagster asset checks that are not dbt tests are leaf vertices ``check:<asset>:<name>`` (resource
  type ``asset_check``) hanging off their asset and its ``additional_deps``.

Dagster attributes on a vertex: ``asset_key`` (tuple), ``owners`` (list of str), ``kinds`` (list),
``group`` (str), ``dagster`` (True), ``description``. Edges between two dbt vertices come from the
manifest only (dagster-dbt re-routes deps around ephemeral models; dbt's own edges keep depths
right).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from dw_dagster.lineage.dbt_manifest import add_manifests, index_graph, load_manifest
from dw_dagster.dagster_private import public

DBT_UNIQUE_ID_KEY = "dagster_dbt/unique_id"
DBT_MANIFEST_KEY = "dagster_dbt/manifest"
DBT_TRANSLATOR_KEY = "dagster_dbt/dagster_dbt_translator"


def asset_vertex(key: Iterable[str]) -> str:
    """The vertex id of a Dagster-only asset: ``asset:`` + the key path joined by ``/``."""
    return "asset:" + "/".join(key)


def _asset_graph(defs: Any):
    if defs is None:
        return None
    if hasattr(defs, "asset_nodes"):
        return defs
    if hasattr(defs, "resolve_asset_graph"):
        return defs.resolve_asset_graph()
    raise TypeError(f"expected dagster.Definitions or an AssetGraph, got {type(defs).__name__}")


def _manifest_of(value: Any) -> Mapping[str, Any] | None:
    value = getattr(value, "value", value)  # MetadataValue wrappers
    m = getattr(value, "manifest", value)  # dagster-dbt's DbtManifestWrapper
    return m if isinstance(m, Mapping) and "nodes" in m else None


@public
def lineage_graph(defs: Any = None, manifests: Iterable[Mapping[str, Any] | str | Path] = (),
                  translator: Any = None) -> nx.DiGraph:
    """Build the combined Dagster + dbt lineage graph.

    Args:
        defs: a ``dagster.Definitions`` (its ``resolve_asset_graph()`` is used, so its resources
            must resolve) or an ``AssetGraph``; ``None`` for dbt only.
        manifests: dbt manifests (dicts, or paths to ``manifest.json``) in addition to those found
            on ``@dbt_assets`` definitions in ``defs`` (``dagster_dbt/manifest`` metadata).
        translator: a ``DagsterDbtTranslator`` for the dbt nodes of ``manifests`` that no
            ``@dbt_assets`` in ``defs`` covers (default: dagster-dbt's default translator; for
            nodes of an ``@dbt_assets``, the translator it was built with is used).

    Returns:
        A ``networkx.DiGraph`` parent → child. ``g.graph["asset_index"]`` maps an asset key
        (tuple) to the vertices that are that asset. Use it with
        :func:`~dw_dagster.lineage.dbt_manifest.select_nodes` and
        :func:`~dw_dagster.lineage.dbt_manifest.blast_radius`.

    Raises:
        FileNotFoundError / ValueError: a manifest path is missing or not JSON.
        TypeError: ``defs`` is neither.
    """
    ag = _asset_graph(defs)
    found: list[tuple[Mapping[str, Any], Any]] = []  # (manifest, translator)
    seen: set[int] = set()

    def take(m: Mapping[str, Any] | None, tr: Any) -> None:
        if m is not None and id(m) not in seen:
            seen.add(id(m))
            found.append((m, tr))

    if ag is not None:
        for node in ag.asset_nodes:
            meta = node.metadata or {}
            if DBT_MANIFEST_KEY in meta:
                tr = meta.get(DBT_TRANSLATOR_KEY)
                take(_manifest_of(meta[DBT_MANIFEST_KEY]), getattr(tr, "value", tr))
    for m in manifests:
        take(load_manifest(m) if isinstance(m, (str, Path)) else m, translator)

    g = add_manifests(nx.DiGraph(), [m for m, _ in found])
    index: dict[tuple[str, ...], list[str]] = {}
    # dbt node → Dagster asset key, as dagster-dbt's translator names it
    tr_default = None
    for m, tr in found:
        if tr is None:
            if tr_default is None:
                from dagster_dbt import DagsterDbtTranslator

                tr_default = DagsterDbtTranslator()
            tr = tr_default
        for section in ("nodes", "sources"):
            for uid, props in (m.get(section) or {}).items():
                if uid not in g or g.nodes[uid]["asset_key"] is None:
                    continue  # disabled, or not an asset (tests, ephemeral models)
                try:
                    key = tuple(tr.get_asset_key(props).path)
                except Exception:  # a custom translator that cannot name this node: keep the default key
                    key = g.nodes[uid]["asset_key"]
                g.nodes[uid]["asset_key"] = key
                if uid not in index.setdefault(key, []):
                    index[key].append(uid)
    g.graph["asset_index"] = index
    if ag is None:
        index_graph(g)
        return g

    dbt_vertices = set(g.nodes)
    for node in ag.asset_nodes:
        key = tuple(node.key.path)
        meta = node.metadata or {}
        uid = meta.get(DBT_UNIQUE_ID_KEY)
        uid = getattr(uid, "value", uid)
        if isinstance(uid, str) and uid in g:
            targets = [uid]
            old = g.nodes[uid]["asset_key"]
            if old is not None and old != key and uid in index.get(old, ()):
                index[old].remove(uid)  # the asset's own key wins over the translator's guess
            if uid not in index.setdefault(key, []):
                index[key].append(uid)
        elif key in index:
            targets = index[key]
        else:
            v = asset_vertex(key)
            g.add_node(v, resource_type="asset", name="/".join(key), data=None, dbt=False)
            index[key] = targets = [v]
        for v in targets:
            attrs = g.nodes[v]
            attrs.update(asset_key=key, dagster=True, owners=list(node.owners or ()), kinds=sorted(node.kinds or ()),
                         group=node.group_name, description=node.description)
    for node in ag.asset_nodes:
        children = index[tuple(node.key.path)]
        for pkey in node.parent_keys:
            for p in index.get(tuple(pkey.path), ()):
                for c in children:
                    if p != c and not (p in dbt_vertices and c in dbt_vertices):
                        g.add_edge(p, c)
    for ck in ag.asset_check_keys:
        spec = ag.get_check_spec(ck)
        uid = (spec.metadata or {}).get(DBT_UNIQUE_ID_KEY)
        uid = getattr(uid, "value", uid)
        if isinstance(uid, str) and uid in g:
            g.nodes[uid]["check_key"] = [*ck.asset_key.path, ck.name]
            continue
        v = f"check:{'/'.join(ck.asset_key.path)}:{ck.name}"
        parents = [ck.asset_key, *(d.asset_key for d in (spec.additional_deps or ()))]
        g.add_node(v, resource_type="asset_check", name=ck.name, data=None, dbt=False, check_key=[*ck.asset_key.path, ck.name],
                   description=spec.description)
        for pk in parents:
            for p in index.get(tuple(pk.path), ()):
                g.add_edge(p, v)
    index_graph(g)
    return g


def asset_vertices(g: nx.DiGraph, key: Iterable[str]) -> list[str]:
    """The vertices that are the Dagster asset ``key`` (a dbt node, a source, or ``asset:...``)."""
    return list(g.graph.get("asset_index", {}).get(tuple(key), ()))


__all__ = ["asset_vertex", "asset_vertices", "lineage_graph"]
