"""How a query in a warehouse's history is mapped to a dbt node, a Dagster asset, partition and run.

Read from the query itself, in this order:

- **dbt's query comment** in the text, ``/* {"app": "dbt", ..., "node_id": "model.p.orders"} */``
  (dbt's default JSON, prepended or, with ``query-comment: {append: true}``, appended; any key
  order, get-select/dbt-snowflake-monitoring#147); tests are nodes of their own (``test.p....``);
- **the query tag** (Snowflake ``QUERY_TAG`` as JSON) or **job labels** (BigQuery): ``node_id``
  (dbt's ``query-comment: {job-label: true}``; a label value is dbt's sanitised id, matched back
  to the manifest's), ``dbt_invocation_id`` (dbt-bigquery labels every job with it; also
  ``invocation_id``) and dw_dagster's own ``dagster_run_id``, ``asset_key``, ``partition``
  (:mod:`dw_dagster.databases.tags`), also read from dw_dagster's appended comment;
- a dbt node's Dagster asset comes from the manifest (``meta.dagster.asset_key`` or dagster-dbt's
  default key; a test belongs to the asset it tests); a dbt invocation's Dagster run from the
  ``invocation_id`` dagster-dbt records on the run's materializations.

A query that maps to none of these is *unattributed*. The patterns are plain POSIX-style
regular expressions without backslashes, so Snowflake, BigQuery and DuckDB read them alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from dw_dagster.core import keys as c
from dw_dagster.databases.tags import bigquery_label


def comment_pattern(key: str) -> str:
    """A pattern whose group 1 is ``key``'s value inside a ``/* {...} */`` comment."""
    _check_key(key)
    return '/[*][^*]*"' + key + '": *"([^"]*)"'


def json_pattern(key: str) -> str:
    """A pattern whose group 1 is ``key``'s value in a JSON text (a query tag)."""
    _check_key(key)
    return '"' + key + '": *"([^"]*)"'


def _check_key(key: str) -> None:
    if not re.fullmatch(r"[a-z_]+", key):
        raise ValueError(f"not a tag key: {key!r}")


def node_assets(manifest: Mapping[str, Any] | None) -> dict[str, str]:
    """dbt node id → the Dagster asset key (``a/b``) it is, or (a test) the asset it tests."""
    if not manifest:
        return {}
    from dw_dagster.lineage.dbt_manifest import dbt_asset_key

    nodes = dict(manifest.get("nodes") or {})
    out: dict[str, str] = {}
    for uid, node in nodes.items():
        if node.get("resource_type") in ("model", "seed", "snapshot"):
            key = dbt_asset_key(node)
            if key:
                out[uid] = "/".join(key)
    for uid, node in nodes.items():
        if node.get("resource_type") != "test":
            continue
        target = node.get("attached_node") or next(
            (d for d in (node.get("depends_on") or {}).get("nodes", []) if d in out), None)
        if target in out:
            out[uid] = out[target]
    return out


def label_nodes(node_ids: Iterable[str]) -> dict[str, str]:
    """dbt's BigQuery job-label form of each node id (``model_p_orders``) → the node id (first one wins)."""
    out: dict[str, str] = {}
    for uid in node_ids:
        out.setdefault(bigquery_label(uid), uid)
    return out


def invocation_runs(instance: Any, runs: Iterable[Any]) -> dict[str, str]:
    """dbt invocation id → Dagster run id, from the ``invocation_id`` dagster-dbt records on the
    materializations and check evaluations of ``runs`` (only those runs' events are read)."""
    import dagster as dg

    out: dict[str, str] = {}
    kinds = {dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.ASSET_CHECK_EVALUATION}
    for run in runs:
        for entry in instance.all_logs(run.run_id, of_type=kinds):
            md = _event_metadata(entry)
            inv = md.get("invocation_id")
            if inv:
                out[str(getattr(inv, "value", inv))] = run.run_id
                break
    return out


def _event_metadata(entry: Any) -> dict[str, Any]:
    ev = entry.dagster_event
    data = ev.event_specific_data
    if hasattr(data, "materialization"):
        return dict(data.materialization.metadata or {})
    return dict(getattr(data, "metadata", None) or {})


__all__ = ["comment_pattern", "invocation_runs", "json_pattern", "label_nodes", "node_assets"]

# the keys read back, in one place
KEYS = {"node": c.DBT_NODE_ID_KEY, "run": c.QUERY_TAG_RUN_KEY, "asset": c.QUERY_TAG_ASSET_KEY,
        "partition": c.QUERY_TAG_PARTITION_KEY, "invocation": c.DBT_INVOCATION_ID_KEY,
        "invocation_alt": c.DBT_INVOCATION_ID_ALT_KEY}
