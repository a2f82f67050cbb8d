"""Which fix a schema change gets: the model's contract when the diagnosed asset is a dbt model with an enforced one.

A dbt model with ``config: {contract: {enforced: true}}`` refuses to build when its upstream
changes a column its contract pins (a ``not_null`` constraint, a ``data_type``): the fix is the
contract, in the model's properties file, merged by the owner
(:func:`~dw_dagster.diagnosis.fixes.propose_contract_fix`), not a migration of the model's table
(which the next build would replace). :func:`contract_fix_args` finds that model in the dbt
manifest — the diagnosed asset itself, by ``dbt_asset_keys`` or else by its name — and where its
properties file is (the node's ``patch_path``), relative to the pipeline repository; the
diagnoser then proposes the contract fix instead of the migration.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def contracted_model(manifest: Mapping[str, Any], target_asset: Sequence[str],
                     dbt_asset_keys: Mapping[str, Sequence[str]] | None = None) -> dict | None:
    """The manifest node of the model that is ``target_asset``, when its contract is enforced; else None."""
    nodes = manifest.get("nodes") or {}
    path = list(target_asset)
    uid = next((u for u, k in (dbt_asset_keys or {}).items() if list(k) == path), None)
    node = nodes.get(uid) if uid else None
    if node is None:
        node = next((n for n in nodes.values() if n.get("resource_type") == "model" and n.get("name") == path[-1]), None)
    if node is None or node.get("resource_type") != "model":
        return None
    enforced = ((node.get("config") or {}).get("contract") or {}).get("enforced") or (node.get("contract") or {}).get("enforced")
    return dict(node) if enforced else None


def contract_fix_args(manifest_path: Path, target_asset: Sequence[str], dbt_asset_keys: Mapping[str, Sequence[str]] | None,
                      pipeline_root: Path, finding: Any, target_table: str) -> dict | None:
    """``propose_contract_fix``'s ``model``, ``schema_file``, ``dbt_project`` and ``upstream_table`` for
    ``target_asset``, or None (no manifest, not a model, no enforced contract, no properties file inside
    the pipeline repository, or no changed table upstream of it in ``finding``)."""
    manifest_path = Path(manifest_path)
    if not manifest_path.exists():
        return None
    node = contracted_model(json.loads(manifest_path.read_text()), target_asset, dbt_asset_keys)
    if node is None or not node.get("patch_path"):
        return None
    project = manifest_path.parent.parent  # <project>/target/manifest.json
    schema = project / str(node["patch_path"]).split("://", 1)[-1]
    root = Path(pipeline_root).resolve()
    try:
        schema_file = schema.resolve().relative_to(root).as_posix()
        dbt_project = project.resolve().relative_to(root).as_posix()
    except ValueError:  # the project is not in the pipeline repository: no diff the owner can merge
        return None
    changed = [e["table"] for e in (getattr(finding, "details", None) or {}).get("changes", [])
               if str(e.get("table", "")).lower() != target_table.lower()]
    if not changed:
        return None
    return {"model": str(node["name"]), "schema_file": schema_file, "dbt_project": dbt_project or ".",
            "upstream_table": changed[0]}


__all__ = ["contract_fix_args", "contracted_model"]
