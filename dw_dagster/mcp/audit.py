"""``get_audit_trail``: proposals, approvals, refusals, runs and receipts of a change set (or an asset), in order.

Read from the ledger (change set versions, decisions with their identity, stages with their
runs, audit entries) and from the ``dw/`` observations the asset page shows (incidents,
diagnoses, refused approvals, notifications, receipts); each receipt carries the verdict of
:func:`~dw_dagster.receipts.chain.verify_receipts` and each decision whether its signature verifies.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.core import records
from dw_dagster.core.ledger import asset_str
from dw_dagster.core.models import Incident
from dw_dagster.mcp.models import decision_briefs, receipt_check
from dw_dagster.mcp.state import DwState, closest, fail, shown


class AuditEvent(BaseModel):
    """One thing that happened, with who did it."""

    at: dt.datetime
    kind: str = Field(description="incident_opened, diagnosed, proposed, notified, approval_refused, approved, rejected, "
                      "decision_withdrawn, stage_issued, stage_started, stage_succeeded/failed/abandoned, receipt, or "
                      "audit:<kind> (incident closed, hold lifted ...)")
    actor: str = Field(description="who: an approver's email, dw-dagster, a channel, a run")
    subject: str = Field(description="the change set, incident, stage or receipt it is about")
    summary: str
    run_id: str | None = None
    verified: bool | None = Field(default=None, description="decisions: signature verifies now; receipts: chain and "
                                  "signature verify now; None when not checked or not applicable")


class AuditTrail(BaseModel):
    """Everything recorded about one change set (or every change set and incident of one asset), oldest first."""

    scope: str = Field(description="'change set cs-…' or 'asset a/b'")
    change_set_ids: list[str]
    incident_ids: list[str]
    events: list[AuditEvent]
    counts: dict[str, int] = Field(description="events per kind")
    receipts_check: str = Field(description="what verify_receipts said")


def _ts(t: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc) if t else None


def _iso(s: Any) -> dt.datetime | None:
    try:
        t = dt.datetime.fromisoformat(str(s))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def get_audit_trail(state: DwState, asset: str | None, change_set_id: str | None) -> AuditTrail:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    if (asset is None) == (change_set_id is None):
        raise fail("give either asset or change_set_id")
    led = state.require_records()
    inst = state.view()
    if change_set_id is not None:
        cid = change_set_id.strip()
        rows = led.change_set_rows(latest_only=False) if cid and len(cid) <= 200 else []
        rows = [r for r in rows if r.change_set_id == cid]
        if not rows:
            ids = sorted({r.change_set_id for r in led.change_set_rows(limit=500)})
            raise fail(f"no change set {shown(change_set_id)} in the ledger"
                       + (f"; the closest are {', '.join(closest(cid, ids) or ids[:5])}" if ids else "")
                       + " (get_incident or list_incidents name them)")
        keys = [dg.AssetKey(rows[0].target_asset.split("/"))]
        scope = f"change set {cid}"
        incident_ids = sorted({r.incident_id for r in rows})
    else:
        key = state.asset(asset)
        keys, scope = [key], f"asset {key.to_user_string()}"
        rows = led.change_set_rows(target_asset=asset_str(key), latest_only=False)
        incident_ids = [r.incident_id for r in led.incidents(asset_key=asset_str(key))]
    cs_ids = list(dict.fromkeys(r.change_set_id for r in sorted(rows, key=lambda r: r.recorded_at)))
    ev: list[AuditEvent] = []
    for iid in incident_ids:
        row = led.incident(iid)
        if row is None:
            continue
        try:
            inc = Incident.model_validate_json(row.body)
            what = inc.summary
        except ValueError:
            what = "(record does not parse; quarantined)"
        ev.append(AuditEvent(at=_ts(row.opened_at), kind="incident_opened", actor=row.source, subject=iid, summary=what))
    for d in records.diagnoses(inst, keys):
        if d.incident_id in incident_ids:
            p = d.primary
            ev.append(AuditEvent(at=d.created_at, kind="diagnosed", actor="dw-dagster", subject=d.incident_id,
                                 summary=f"diagnosis {d.id}: " + (f"{p.kind} ({p.confidence:.0%}, explains {p.explained_rows} "
                                                                  f"of {d.gap_rows} rows)" if p else "no cause found")))
    for r in sorted(rows, key=lambda r: r.recorded_at):
        cs = records.parse_change_set(r.body)
        ev.append(AuditEvent(at=_ts(r.recorded_at), kind="proposed", actor=cs.proposer, subject=f"{cs.id} v{cs.version[:12]}",
                             summary=f"{cs.summary}; waiting for {', '.join(cs.approvers)} until {cs.expires_at.isoformat()}"
                             f" (now {r.state})"))
        for name, s in sorted(led.stages(r.change_set_id, r.version).items(), key=lambda x: x[1].issued_at):
            ev.append(AuditEvent(at=_ts(s.issued_at), kind="stage_issued", actor="dw_remediation_sensor",
                                 subject=f"{cs.id} {name}", summary=f"ticket issued for {s.job_name or name}"))
            if s.started_at:
                ev.append(AuditEvent(at=_ts(s.started_at), kind="stage_started", actor=f"run {s.run_id}",
                                     subject=f"{cs.id} {name}", summary=f"run {s.run_id} took the ticket", run_id=s.run_id))
            if s.finished_at:
                ev.append(AuditEvent(at=_ts(s.finished_at), kind=f"stage_{s.state}", actor=f"run {s.run_id}",
                                     subject=f"{cs.id} {name}", run_id=s.run_id,
                                     summary=f"{name} {s.state}" + (f": {s.result.get('reason')}" if s.result and
                                                                   s.result.get("reason") else "")))
    for cid in cs_ids:
        for d in decision_briefs(state, cid):
            ev.append(AuditEvent(at=d.decided_at, kind="approved" if d.decision == "approve" else "rejected",
                                 actor=d.approver, subject=f"{cid} v{d.change_set_version[:12]}", run_id=d.run_id,
                                 verified=d.signature_valid, summary=f"{d.decision} by {d.verified_by}"
                                 + (f": {d.comment}" if d.comment else "")
                                 + ("" if d.active else f" (withdrawn: {d.withdrawn_reason})")))
        for entry in led.audit_entries(subject=cid):
            ev.append(AuditEvent(at=_ts(entry["at"]), kind=f"audit:{entry['kind']}", actor=entry["by"], subject=cid,
                                 summary=str(entry["body"].get("reason") or entry["body"])[:500]))
    for iid in incident_ids:
        for entry in led.audit_entries(subject=iid):
            ev.append(AuditEvent(at=_ts(entry["at"]), kind=f"audit:{entry['kind']}", actor=entry["by"], subject=iid,
                                 summary=str(entry["body"].get("reason") or entry["body"])[:500]))
    for r in records.refusals(inst, None, keys):
        if r.get("change_set_id") in cs_ids:
            ev.append(AuditEvent(at=_iso(r.get("at")) or dt.datetime.now(dt.timezone.utc), kind="approval_refused",
                                 actor=str(r.get("approver")), subject=str(r.get("change_set_id")), run_id=r.get("run_id"),
                                 summary=f"{r.get('decision', 'approve')} refused: {r.get('reason')}"))
    from dw_dagster.integrations.notifications import notifications

    for n in notifications(inst, keys):
        if n.get("change_set_id") in cs_ids or n.get("incident_id") in incident_ids:
            ev.append(AuditEvent(at=_iso(n.get("at")) or dt.datetime.now(dt.timezone.utc), kind="notified",
                                 actor=str(n.get("channel")), subject=str(n.get("record") or n.get("task")),
                                 summary=f"{n.get('action')}: {n.get('detail')}" + ("" if n.get("ok") else " (FAILED)")))
    touched = list(dict.fromkeys([*keys, *(dg.AssetKey(list(a)) for r in rows
                                           for a in records.parse_change_set(r.body).rebuild_assets)]))
    receipts = [x for k in touched for x in records.receipts(inst, k) if x.change_set_id in cs_ids]
    checked, problems, text = receipt_check(state, touched) if receipts else (False, {}, "no receipts")
    for x in receipts:
        ev.append(AuditEvent(at=x.created_at, kind="receipt", actor="dw_receipts", subject=f"{x.id} on {'/'.join(x.asset_key)}",
                             run_id=x.run_ids.get("receipt"),
                             verified=(x.id not in problems) if checked else None,
                             summary=f"{x.outcome}; {'verified' if x.verified else 'NOT verified'} when written; approved "
                             f"by {x.approver_identity or x.approver}"
                             + (f"; problems now: {'; '.join(problems[x.id])}" if x.id in problems else "")))
    ev.sort(key=lambda e: e.at)
    return AuditTrail(scope=scope, change_set_ids=cs_ids, incident_ids=incident_ids, events=ev,
                      counts=dict(Counter(e.kind for e in ev)), receipts_check=text)


__all__ = ["AuditEvent", "AuditTrail", "get_audit_trail"]
