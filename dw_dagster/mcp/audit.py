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

from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.ledger import asset_str
from dw_dagster.core.models import Incident
from dw_dagster.mcp.models import decision_briefs, receipt_check
from dw_dagster.mcp.state import DwState, closest, fail, shown
from dw_dagster.mcp.untrusted import LEDGER_NOTE, NOTIFICATION, RECORD, TYPED, UPSTREAM, Untrusted, untrusted


class AuditEvent(BaseModel):
    """One thing that happened, with who did it: dw_dagster's words in ``actor`` and ``summary``; text from
    outside (a typed name, a comment, a reason, a summary built from warehouse data, a channel's answer)
    only in ``untrusted``."""

    at: dt.datetime
    kind: str = Field(description="incident_opened, diagnosed, proposed, notified, approval_refused, approved, rejected, "
                      "decision_withdrawn, stage_issued, stage_started, stage_succeeded/failed/abandoned, receipt, or "
                      "audit:<kind> (incident closed, hold lifted ...)")
    actor: str = Field(description="who, in dw_dagster's words: a verified approver's email, dw-dagster, a sensor, a run, "
                       "a channel; 'a Dagster user (not verified)' when the name was only typed (untrusted.actor has it)")
    subject: str = Field(description="the change set, incident, stage or receipt it is about")
    summary: str = Field(description="what happened, in dw_dagster's words")
    untrusted: dict[str, Untrusted] = Field(default_factory=dict, description="text from outside dw_dagster that goes "
                                            "with the event, each marked as untrusted data")
    run_id: str | None = None
    verified: bool | None = Field(default=None, description="decisions: signature verifies now; receipts: chain and "
                                  "signature verify now; None when not checked or not applicable")


UNVERIFIED_ACTOR = "a Dagster user (not verified)"


def _marks(**values: tuple[object, str]) -> dict[str, Untrusted]:
    """``name=(value, origin)`` → the non-empty ones, marked."""
    return {k: u for k, (v, origin) in values.items() if (u := untrusted(v, origin)) is not None}


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
            what = untrusted(inc.summary, UPSTREAM if inc.source == "lightup" else RECORD)
        except ValueError:
            what = None
        ev.append(AuditEvent(at=_ts(row.opened_at), kind="incident_opened", actor=row.source, subject=iid,
                             summary=f"incident opened by the {row.source} detector" if what is not None
                             else "incident opened; its record does not parse (quarantined)",
                             untrusted={"incident_summary": what} if what is not None else {}))
    for d in records.diagnoses(inst, keys):
        if d.incident_id in incident_ids:
            p = d.primary
            ev.append(AuditEvent(at=d.created_at, kind="diagnosed", actor="dw-dagster", subject=d.incident_id,
                                 summary=f"diagnosis {d.id}: " + (f"{p.kind} ({p.confidence:.0%}, explains {p.explained_rows} "
                                                                  f"of {d.gap_rows} rows)" if p else "no cause found")))
    for r in sorted(rows, key=lambda r: r.recorded_at):
        cs = records.parse_change_set(r.body)
        ours = cs.proposer == c.PROPOSER
        ev.append(AuditEvent(at=_ts(r.recorded_at), kind="proposed", actor=cs.proposer if ours else UNVERIFIED_ACTOR,
                             subject=f"{cs.id} v{cs.version[:12]}",
                             summary=f"proposed; waiting for {', '.join(cs.approvers)} until {cs.expires_at.isoformat()} "
                                     f"(now {r.state})",
                             untrusted=_marks(change_set_summary=(cs.summary, RECORD),
                                              actor=(None if ours else cs.proposer, TYPED))))
        for name, s_ in sorted(led.stages(r.change_set_id, r.version).items(), key=lambda x: x[1].issued_at):
            ev.append(AuditEvent(at=_ts(s_.issued_at), kind="stage_issued", actor=c.REMEDIATION_SENSOR,
                                 subject=f"{cs.id} {name}", summary=f"ticket issued for {s_.job_name or name}"))
            if s_.started_at:
                ev.append(AuditEvent(at=_ts(s_.started_at), kind="stage_started", actor=f"run {s_.run_id}",
                                     subject=f"{cs.id} {name}", summary=f"run {s_.run_id} took the ticket", run_id=s_.run_id))
            if s_.finished_at:
                reason = (s_.result or {}).get("reason")
                ev.append(AuditEvent(at=_ts(s_.finished_at), kind=f"stage_{s_.state}", actor=f"run {s_.run_id}",
                                     subject=f"{cs.id} {name}", run_id=s_.run_id, summary=f"{name} {s_.state}",
                                     untrusted=_marks(reason=(reason, LEDGER_NOTE))))
    for cid in cs_ids:
        for d in decision_briefs(state, cid):
            verified = d.method in ("oidc", "slack", "autonomy")
            ev.append(AuditEvent(at=d.decided_at, kind="approved" if d.decision == "approve" else "rejected",
                                 actor=d.approver if verified else UNVERIFIED_ACTOR,
                                 subject=f"{cid} v{d.change_set_version[:12]}", run_id=d.run_id, verified=d.signature_valid,
                                 summary=f"{d.decision} ({d.method})" + ("" if d.active else " (withdrawn since)"),
                                 untrusted={**({"actor": d.approver_typed} if d.approver_typed else {}),
                                            **({"comment": d.comment} if d.comment else {}),
                                            **_marks(withdrawn_reason=(d.withdrawn_reason, LEDGER_NOTE))}))
        for entry in led.audit_entries(subject=cid):
            ev.append(_audit_event(entry, cid))
    for iid in incident_ids:
        for entry in led.audit_entries(subject=iid):
            ev.append(_audit_event(entry, iid))
    for r in records.refusals(inst, None, keys):
        if r.get("change_set_id") in cs_ids:
            ev.append(AuditEvent(at=_iso(r.get("at")) or dt.datetime.now(dt.timezone.utc), kind="approval_refused",
                                 actor=UNVERIFIED_ACTOR, subject=str(r.get("change_set_id")), run_id=r.get("run_id"),
                                 summary=f"{'reject' if r.get('decision') == 'reject' else 'approve'} refused",
                                 untrusted=_marks(actor=(r.get("approver"), TYPED),
                                                  reason=(r.get("reason"), "dw_dagster's refusal, quoting what was typed"))))
    from dw_dagster.integrations.notifications import notifications

    for n in notifications(inst, keys):
        if n.get("change_set_id") in cs_ids or n.get("incident_id") in incident_ids:
            ev.append(AuditEvent(at=_iso(n.get("at")) or dt.datetime.now(dt.timezone.utc), kind="notified",
                                 actor=f"channel {n.get('channel')}", subject=str(n.get("record") or n.get("task")),
                                 summary=f"notification {'sent' if n.get('ok') else 'FAILED'}",
                                 untrusted=_marks(action=(n.get("action"), NOTIFICATION), detail=(n.get("detail"), NOTIFICATION))))
    touched = list(dict.fromkeys([*keys, *(dg.AssetKey(list(a)) for r in rows
                                           for a in records.parse_change_set(r.body).rebuild_assets)]))
    receipts = [x for k in touched for x in records.receipts(inst, k) if x.change_set_id in cs_ids]
    checked, problems, text = receipt_check(state, touched) if receipts else (False, {}, "no receipts")
    for x in receipts:
        ev.append(AuditEvent(at=x.created_at, kind="receipt", actor=c.RECEIPT_JOB, subject=f"{x.id} on {'/'.join(x.asset_key)}",
                             run_id=x.run_ids.get("receipt"),
                             verified=(x.id not in problems) if checked else None,
                             summary=f"{'applied' if x.outcome == 'applied' else 'not applied'}; "
                             f"{'verified' if x.verified else 'NOT verified'} when written"
                             + (f"; problems now: {'; '.join(problems[x.id])}" if x.id in problems else ""),
                             untrusted=_marks(outcome=(x.outcome, LEDGER_NOTE),
                                              approved_by=(x.approver_identity or x.approver, "the receipt's record"))))
    ev.sort(key=lambda e: e.at)
    return AuditTrail(scope=scope, change_set_ids=cs_ids, incident_ids=incident_ids, events=ev,
                      counts=dict(Counter(e.kind for e in ev)), receipts_check=text)


def _audit_event(entry: dict, subject: str) -> AuditEvent:
    """An audit entry (incident closed, hold lifted ...): ``by`` and the reason were typed, or are dw-dagster's."""
    by, body = entry["by"], entry["body"]
    identity = body.get("identity") if isinstance(body, dict) else None
    ours = by == "dw-dagster" or (isinstance(identity, dict) and identity.get("method") in ("oidc", "slack"))
    reason = body.get("reason") if isinstance(body, dict) else None
    return AuditEvent(at=_ts(entry["at"]), kind=f"audit:{entry['kind']}", actor=by if ours else UNVERIFIED_ACTOR,
                      subject=subject, summary=entry["kind"].replace("_", " "),
                      untrusted=_marks(actor=(None if ours else by, TYPED),
                                       reason=(str(reason)[:500] if reason else None, TYPED if not ours else LEDGER_NOTE)))


__all__ = ["AuditEvent", "AuditTrail", "get_audit_trail"]
