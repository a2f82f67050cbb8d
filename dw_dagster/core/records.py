"""Read dw_dagster's records back: from the ledger where it decides, from the event log where it shows.

Change sets, decisions and incidents are read from the ledger (:mod:`dw_dagster.core.ledger`): indexed
lookups whose cost does not grow with the event log, and the only records that can let a repair
run. Diagnoses, receipts, refusals and loads are read from the ``dw/`` metadata of asset events
(``DagsterInstance.fetch_observations`` / ``fetch_materializations``, public in Dagster 1.13),
which is what the asset page shows.

A record that does not parse, or whose content does not hash to its version, is never fatal: it
is skipped with a warning naming it and listed as quarantined (:func:`quarantined`;
``dw-dagster change-sets`` and the ``dw_control`` asset show them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg
from pydantic import ValidationError

from dw_dagster.core import keys as c
from dw_dagster.core.ledger import Ledger, asset_str, ledger_for
from dw_dagster.core.models import Approval, ChangeSet, Diagnosis, Incident, Receipt, TamperedRecord

_PAGE = 500
log = logging.getLogger("dw_dagster")


def _value(mv: Any) -> Any:
    return getattr(mv, "value", mv)


def metadata_json(metadata: dict[str, Any], key: str) -> Any | None:
    """A ``dw/`` JSON metadata entry as Python data (None when absent; a malformed string is None too)."""
    if key not in metadata:
        return None
    v = _value(metadata[key])
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return None
    return v


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


def quarantine(instance: dg.DagsterInstance, ref: str, kind: str, asset_key: Sequence[str] | str, reason: str) -> None:
    """Skip a bad record with a warning naming it, and list it as quarantined (never raises)."""
    log.warning(f"dw_dagster: skipped {kind} record {ref}: {reason}")
    asset = asset_key if isinstance(asset_key, str) else asset_str(asset_key)
    try:
        if ledger_for(instance).quarantine(ref, kind, asset, reason):  # shown once on the dw_control asset
            instance.report_runless_asset_event(dg.AssetObservation(
                asset_key=dg.AssetKey(["dw_control"]), description=f"quarantined {kind} record {ref} on {asset}: {reason}"[:1000],
                metadata={c.QUARANTINED_KEY: dg.MetadataValue.json({"ref": ref, "kind": kind, "asset": asset, "reason": reason})}))
    except Exception:  # noqa: BLE001 - bookkeeping of a bad record must never fail a reader
        log.exception("dw_dagster: could not record the quarantine")


def quarantined(instance: dg.DagsterInstance) -> list[dict]:
    """Records skipped as malformed or tampered: ``{ref, kind, asset_key, reason, first_seen, last_seen}``."""
    return ledger_for(instance).quarantined()


def _records(instance: dg.DagsterInstance, key: str, model, asset_keys: Sequence[dg.AssetKey] | None = None):
    keys = asset_keys if asset_keys is not None else instance.get_asset_keys()
    for ak in keys:
        for rec in iter_observations(instance, ak):
            md = rec.asset_observation.metadata if rec.asset_observation else {}
            if key not in md:
                continue
            data = metadata_json(md, key)
            try:
                yield ak, (model.model_validate(data) if model is not None else data), rec
            except ValidationError as e:
                quarantine(instance, f"event:{rec.storage_id}", key, ak.path,
                           f"{key} on {ak.to_user_string()} does not parse: {e.errors()[0]['msg']}")


def incidents(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey] | None = None) -> list[Incident]:
    """All incidents, newest first (from the ledger)."""
    led = ledger_for(instance)
    rows = ([r for ak in asset_keys for r in led.incidents(asset_key=asset_str(ak))] if asset_keys is not None
            else led.incidents())
    out = []
    for r in sorted(rows, key=lambda r: r.opened_at, reverse=True):
        try:
            out.append(Incident.model_validate_json(r.body))
        except ValidationError as e:
            quarantine(instance, f"incident:{r.incident_id}", "incident", r.asset_key, str(e.errors()[0]["msg"]))
    return out


def diagnoses(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey] | None = None) -> list[Diagnosis]:
    """All diagnoses, newest first (from the event log)."""
    return [d for _, d, _ in _records(instance, c.DIAGNOSIS_KEY, Diagnosis, asset_keys)]


def change_sets(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey] | None = None,
                latest_only: bool = False) -> list[ChangeSet]:
    """Change set versions recorded in the ledger, newest first; tampered ones are quarantined, not returned."""

    led = ledger_for(instance)
    rows = ([r for ak in asset_keys for r in led.change_set_rows(target_asset=asset_str(ak), latest_only=latest_only)]
            if asset_keys is not None else led.change_set_rows(latest_only=latest_only))
    out = []
    for r in sorted(rows, key=lambda r: r.recorded_at, reverse=True):
        try:
            out.append(parse_change_set(r.body))
        except TamperedRecord as e:
            quarantine(instance, f"change_set:{r.change_set_id}:{r.version}", "change_set", r.target_asset, str(e))
    return out


def find_change_set(instance: dg.DagsterInstance, change_set_id: str) -> ChangeSet | None:
    """The latest version of a change set (one indexed ledger lookup), or None (also for a tampered record)."""

    try:
        return load_change_set(instance, change_set_id)
    except TamperedRecord as e:
        quarantine(instance, f"change_set:{change_set_id}", "change_set", "?", str(e))
        return None


def approvals(instance: dg.DagsterInstance, change_set_id: str | None = None, *, active_only: bool = False) -> list[Approval]:
    """Recorded decisions (approvals and rejections, withdrawn ones too unless ``active_only``), newest first."""
    led = ledger_for(instance)
    out = []
    for d in led.decisions(change_set_id):
        if active_only and not d["active"]:
            continue
        try:
            out.append(Approval.model_validate_json(d["body"]))
        except ValidationError as e:
            quarantine(instance, f"decision:{d['approval_id']}", "approval", "?", str(e.errors()[0]["msg"]))
    return sorted(out, key=lambda a: a.decided_at, reverse=True)


def refusals(instance: dg.DagsterInstance, change_set_id: str | None = None,
             asset_keys: Sequence[dg.AssetKey] | None = None) -> list[dict[str, Any]]:
    """Refused approval attempts (who, why), newest first (from the event log; of ``asset_keys`` only, when
    given: a refusal is shown on its change set's target asset)."""
    out = [d for _, d, _ in _records(instance, c.APPROVAL_REFUSED_KEY, None, asset_keys) if isinstance(d, dict)]
    return [r for r in out if change_set_id is None or r.get("change_set_id") == change_set_id]


def receipts(instance: dg.DagsterInstance, asset_key: dg.AssetKey | None = None) -> list[Receipt]:
    """Receipts as the event log shows them, newest first (of one asset, or of every asset)."""
    keys = [asset_key] if asset_key is not None else None
    return [r for _, r, _ in _records(instance, c.RECEIPT_KEY, Receipt, keys)]


def latest_loads(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> dict[str, dict[str, Any]]:
    """Per partition key, the ``dw/loads`` entry of that partition's latest materialization."""
    out: dict[str, dict[str, Any]] = {}
    for rec in iter_materializations(instance, asset_key):
        pk = rec.partition_key
        if pk is None or pk in out:
            continue
        loads = metadata_json(rec.asset_materialization.metadata, c.LOADS_KEY) or {}
        if isinstance(loads, dict) and isinstance(loads.get(pk), dict):
            out[pk] = {**loads[pk], "run_id": rec.run_id, "timestamp": rec.timestamp}
    return out


def parse_change_set(body: str) -> ChangeSet:
    """A ledger body as a :class:`ChangeSet` whose content hashes to its version.

    Raises:
        TamperedRecord: the body does not parse or does not hash to its version.
    """
    try:
        cs = ChangeSet.model_validate_json(body)
    except ValidationError as e:
        raise TamperedRecord(f"a recorded change set does not parse: {e.errors()[0]['msg']}") from e
    cs.verify_version()
    return cs


def load_change_set(instance: dg.DagsterInstance | Ledger, change_set_id: str, version: str | None = None) -> ChangeSet | None:
    """The latest (or the named) version of a change set from the ledger; None when unknown.

    Raises:
        TamperedRecord: the stored record does not hash to its version.
    """
    led = instance if isinstance(instance, Ledger) else ledger_for(instance)
    row = led.change_set_row(change_set_id, version)
    return parse_change_set(row.body) if row is not None else None
