"""Lineage: the dbt manifest as a graph, and the blast radius of a broken node."""

from dw_dagster.lineage.dbt_manifest import blast_radius, load_manifest, manifest_graph, resolve_node, source_for_asset_key

__all__ = ["blast_radius", "load_manifest", "manifest_graph", "resolve_node", "source_for_asset_key"]
