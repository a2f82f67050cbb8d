"""Lineage: one graph of the dbt manifest (and the Dagster asset graph), and the blast radius of a broken node."""

from dw_dagster.lineage.dbt_manifest import (
    UnknownNodeError,
    blast_radius,
    dbt_ls,
    dbt_selector,
    downstream,
    load_manifest,
    manifest_graph,
    node_owners,
    resolve_node,
    select_nodes,
    source_for_asset_key,
)
from dw_dagster.lineage.graph import asset_vertex, asset_vertices, lineage_graph

__all__ = [
    "UnknownNodeError",
    "asset_vertex",
    "asset_vertices",
    "blast_radius",
    "dbt_ls",
    "dbt_selector",
    "downstream",
    "lineage_graph",
    "load_manifest",
    "manifest_graph",
    "node_owners",
    "resolve_node",
    "select_nodes",
    "source_for_asset_key",
]
