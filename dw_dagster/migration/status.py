"""The migration's state as people and tools read it: ``dw-dagster migration status``, the MCP tool
``get_migration_status`` and ``explain_table`` all read the same thing, from the instance alone.

Per wave: the newest materialization of its asset (``migration/<migration>/<wave>``: the pairs and
their states, the numbers) and the gate's ledger entry (round, pending request, sign-off with who
and how they were verified, reopening), which is authoritative for the sign-off: a materialization
reported from outside a run cannot sign a wave off.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from dw_dagster.core import keys as k
from dw_dagster.core import records
from dw_dagster.migration.state import gate_record


def wave_keys(instance: dg.DagsterInstance, migration: str | None = None) -> list[dg.AssetKey]:
    """Every wave asset the instance has (``migration/<migration>/<wave>``), sorted."""
    prefix = [k.MIGRATION_ASSET_PREFIX] + ([migration] if migration else [])
    keys = instance.get_asset_keys(prefix=prefix)
    return sorted((key for key in keys if len(key.path) == 3), key=lambda x: x.path)


def wave_status(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, Any]:
    """One wave's status (module docstring); ``state: never evaluated`` before its first materialization."""
    _, migration, wave = key.path
    ev = instance.get_latest_materialization_event(key)
    data = (records.metadata_json(ev.asset_materialization.metadata, k.MIGRATION_WAVE_KEY) or {}) if ev else {}
    gate = gate_record(instance, migration, wave)
    signed = gate.get("signed_off")
    last = signed or (gate.get("history") or [None])[-1]
    state = data.get("state") or "never evaluated"
    if signed is not None:
        state = "signed_off"
    elif gate.get("reopened"):
        state = "reopened"
    elif state == "signed_off":  # only the gate's ledger entry signs a wave off, never a reported materialization
        state = "holding"
    return {
        "migration": migration, "wave": wave, "asset": key.to_user_string(), "state": state,
        "domain": data.get("domain"), "pairs_holding": data.get("pairs_holding"), "pairs_total": data.get("pairs_total"),
        "consecutive_required": data.get("consecutive_required"),
        "evaluated_at": (dg.TimestampMetadataValue(ev.timestamp).value if ev else None),
        "evidence_hash": (signed or {}).get("evidence_hash") or data.get("evidence_hash"),
        "signed_off_by": ({"email": last.get("by"), "method": last.get("method"), "at": last.get("at"),
                           "current": signed is not None} if last else None),
        "requested": gate.get("requested"), "reopened": gate.get("reopened"), "round": gate.get("round", 0),
        "pairs": [{"pair": p["pair"], "target": p["target"], "state": p["state"], "streak": p["streak"],
                   "failing": p.get("failing", []), "rows_compared": p.get("rows_compared"), "gap_pct": p.get("gap_pct")}
                  for p in data.get("pairs", [])],
    }


def migration_status(instance: dg.DagsterInstance, migration: str | None = None) -> list[dict[str, Any]]:
    """Every wave's status, in key order."""
    return [wave_status(instance, key) for key in wave_keys(instance, migration)]


def table_wave(instance: dg.DagsterInstance, asset: dg.AssetKey) -> dict[str, Any] | None:
    """The wave whose pairs land in ``asset``, and the pair's state there: ``{migration, wave, wave_state, pair,
    state}``; None when no wave names it."""
    name = asset.to_user_string()
    for w in migration_status(instance):
        for p in w["pairs"]:
            if p["target"] == name:
                return {"migration": w["migration"], "wave": w["wave"], "wave_state": w["state"], "pair": p["pair"],
                        "state": p["state"], "signed_off_by": w["signed_off_by"]}
    return None


def status_lines(waves: list[dict[str, Any]]) -> list[str]:
    """The status as text, one block per wave."""
    if not waves:
        return ["no migration waves in this instance (run a wave job: dw_migration__<migration>__<wave>)"]
    out = []
    for w in waves:
        by = w["signed_off_by"]
        signed = f"; signed off by {by['email']} ({by['method']})" if by and by.get("current") else ""
        out.append(f"{w['asset']}: {w['state']} — {w['pairs_holding']}/{w['pairs_total']} pairs holding{signed}")
        if w["reopened"]:
            out.append(f"  reopened: {w['reopened'].get('cause')}")
        if w["requested"]:
            out.append(f"  sign-off requested: {w['requested']['change_set_id']} (evidence {w['requested']['evidence_hash'][:12]}…)")
        out += [f"  {p['pair']}: {p['state']}" for p in w["pairs"]]
    return out


__all__ = ["migration_status", "status_lines", "table_wave", "wave_keys", "wave_status"]
