"""The demos' ``--undo`` tail: after a verified repair, undo it and hand the incident back.

The owner proposes the undo of the repair (``dw-dagster undo CS``), approves it after logging in at
the identity provider, and the remediation sensor restores the window; the undo's receipt is
verified against the snapshot the repair kept (rows and checksum per partition), the incident is
open again, and the undo of the undo proposes the original change set again as a new version
(what ``dw-dagster change-sets repropose CS`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from dw_dagster.core import records
from dw_dagster_dev.demo import DemoError, Timeline, demo_login, run_repair_stages
from dw_dagster.testing.local_daemon import LocalSensorDaemon


def undo_and_repropose(instance: dg.DagsterInstance, daemon: LocalSensorDaemon, change_set_id: str, *, owner: str,
                       domains_file: Path, log: Timeline) -> dict[str, Any]:
    """Undo a verified repair through its own approval and propose the original again.

    Returns:
        ``{"undo": {"change_set_id", "verified", "receipt_id", "outcome", "taken_back_rows", "partitions"},
        "incident_state_after_undo": <ledger state>, "reproposed": "<id> v<version>"}``.

    Raises:
        DemoError: the undo was refused, a stage failed, or the incident did not open again.
    """
    from dw_dagster.approval.job import approve_in_process
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.proposals.change_sets import propose
    from dw_dagster.repair.undo import UndoError, propose_undo

    cs = records.find_change_set(instance, change_set_id)
    try:
        undo, _ = propose(instance, propose_undo(instance, change_set_id))
    except UndoError as e:
        raise DemoError(f"undo: {e}") from e
    log("undo", f"{owner} proposed {undo.id}: {undo.summary}")
    token = demo_login(domains_file, undo.id, owner, instance)
    ok, msg = approve_in_process(instance, undo.id, domains=domains_file, id_token=token, comment="put the window back")
    if not ok:
        raise DemoError(f"undo: the owner's approval of {undo.id} was refused: {msg}")
    log("undo", f"{undo.id} approved by {owner} (logged in)")
    run_ids: dict[str, str] = {}
    run_repair_stages(daemon, instance, run_ids, log, ticks=6, describe=lambda stage, run: "")
    receipt = next((r for r in records.receipts(instance) if r.change_set_id == undo.id and r.asset_key == cs.target_asset),
                   None)
    if receipt is None:
        raise DemoError(f"undo: no receipt for {undo.id}")
    promise = receipt.evidence_summary.get("undo") or {}
    taken = (promise.get("taken_back") or {}).get("rows", 0)
    log("receipt", f"undo receipt {receipt.id}: {'verified' if receipt.verified else 'NOT verified'} against the snapshot "
        f"({len(promise.get('partitions') or {})} partition range(s), {promise.get('restored_rows')} rows as kept; "
        f"{taken} rows taken back)")
    row = ledger_for(instance).incident(cs.incident_id)
    log("undo", f"incident {cs.incident_id}: {row.state if row else 'unknown'} ({row.note if row else ''})")
    try:
        again, _ = propose(instance, propose_undo(instance, undo.id))  # the undo of the undo: the original again
    except UndoError as e:
        raise DemoError(f"repropose: {e}") from e
    log("propose", f"the undo of {undo.id} proposes {again.id} again as version {again.version[:16]}: {again.summary}")
    return {"undo": {"change_set_id": undo.id, "verified": receipt.verified, "receipt_id": receipt.id,
                     "outcome": receipt.outcome, "taken_back_rows": taken,
                     "partitions": sorted((promise.get("partitions") or {}))},
            "incident_state_after_undo": row.state if row else None, "reproposed": f"{again.id} v{again.version}"}


__all__ = ["undo_and_repropose"]
