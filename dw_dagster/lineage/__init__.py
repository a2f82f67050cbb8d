"""Lineage: one graph of the dbt manifest (and the Dagster asset graph), the blast radius of a broken node, and
the review of a pull request's dbt project (what changed, what it reaches, new columns that look sensitive)."""

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
from dw_dagster.lineage.review import review_manifests
from dw_dagster.lineage.review_models import Review

__all__ = [
    "Review",
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
    "review_manifests",
    "select_nodes",
    "source_for_asset_key",
]
