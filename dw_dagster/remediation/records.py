"""Read dw_dagster's records (incidents, change sets, approvals, receipts, loads) back from Dagster.

Everything dw_dagster decides is written as ``dw/`` metadata on asset events; this module is the
one place that reads it back, with ``DagsterInstance.fetch_observations`` /
``fetch_materializations`` (public in Dagster 1.13).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg

from dw_dagster import constants as c
from dw_dagster.models import Approval, ChangeSet, Diagnosis, Incident, Receipt

_PAGE = 500


def _value(mv: Any) -> Any:
    return getattr(mv, "value", mv)


def metadata_json(metadata: dict[str, Any], key: str) -> Any | None:
    """A ``dw/`` JSON metadata entry as Python data (None when absent)."""
    if key not in metadata:
        return None
    v = _value(metadata[key])
    return json.loads(v) if isinstance(v, str) else v


def _paged(fetch, asset_key: dg.AssetKey, newest_first: bool) -> Iterator[dg.EventLogRecord]:
    cursor = None
    while True:
        res = fetch(dg.AssetRecordsFilter(asset_key=asset_key), limit=_PAGE, cursor=cursor, ascending=not newest_first)
        yield from res.records
        if not res.has_more:
            return
        cursor = res.cursor


def iter_observations(instance: dg.DagsterInstance, asset_key: dg.AssetKey, newest_first: bool = True) -> Iterator[dg.EventLogRecord]:
    """Every observation record of ``asset_key``, paged."""
    return _paged(instance.fetch_observations, asset_key, newest_first)


def iter_materializations(instance: dg.DagsterInstance, asset_key: dg.AssetKey, newest_first: bool = True) -> Iterator[dg.EventLogRecord]:
    """Every materialization record of ``asset_key``, paged."""
    return _paged(instance.fetch_materializations, asset_key, newest_first)


def _records(instance: dg.DagsterInstance, key: str, asset_keys: Sequence[dg.AssetKey] | None = None) -> Iterator[tuple[dg.AssetKey, Any, dg.EventLogRecord]]:
    keys = asset_keys if asset_keys is not None else instance.get_asset_keys()
    for ak in keys:
        for rec in iter_observations(instance, ak):
            md = rec.asset_observation.metadata if rec.asset_observation else {}
            data = metadata_json(md, key)
            if data is not None:
                yield ak, data, rec


def incidents(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey] | None = None) -> list[Incident]:
    """All incidents, newest first."""
    return [Incident.model_validate(d) for _, d, _ in _records(instance, c.INCIDENT_KEY, asset_keys)]


def diagnoses(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey] | None = None) -> list[Diagnosis]:
    return [Diagnosis.model_validate(d) for _, d, _ in _records(instance, c.DIAGNOSIS_KEY, asset_keys)]


def change_sets(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey] | None = None) -> list[ChangeSet]:
    """All change set versions, newest first."""
    return [ChangeSet.model_validate(d) for _, d, _ in _records(instance, c.CHANGE_SET_KEY, asset_keys)]


def find_change_set(instance: dg.DagsterInstance, change_set_id: str) -> ChangeSet | None:
    """The latest version of a change set, or None."""
    for cs in change_sets(instance):
        if cs.id == change_set_id:
            return cs
    return None


def approvals(instance: dg.DagsterInstance, change_set_id: str | None = None) -> list[Approval]:
    """Recorded decisions (approvals and rejections), newest first."""
    out = [Approval.model_validate(d) for _, d, _ in _records(instance, c.APPROVAL_KEY)]
    return [a for a in out if change_set_id is None or a.change_set_id == change_set_id]


def refusals(instance: dg.DagsterInstance, change_set_id: str | None = None) -> list[dict[str, Any]]:
    """Refused approval attempts (who, why), newest first."""
    out = [d for _, d, _ in _records(instance, c.APPROVAL_REFUSED_KEY)]
    return [r for r in out if change_set_id is None or r.get("change_set_id") == change_set_id]


def receipts(instance: dg.DagsterInstance, asset_key: dg.AssetKey | None = None) -> list[Receipt]:
    """Receipts, newest first (of one asset, or of every asset)."""
    keys = [asset_key] if asset_key is not None else None
    return [Receipt.model_validate(d) for _, d, _ in _records(instance, c.RECEIPT_KEY, keys)]


def latest_loads(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> dict[str, dict[str, Any]]:
    """Per partition key, the ``dw/loads`` entry of that partition's latest materialization."""
    out: dict[str, dict[str, Any]] = {}
    for rec in iter_materializations(instance, asset_key):
        pk = rec.partition_key
        if pk is None or pk in out:
            continue
        loads = metadata_json(rec.asset_materialization.metadata, "dw/loads") or {}
        if pk in loads:
            out[pk] = {**loads[pk], "run_id": rec.run_id, "timestamp": rec.timestamp}
    return out
