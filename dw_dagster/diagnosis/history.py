"""Incident history: past incidents, their diagnoses, change sets, decisions and receipts.

Everything comes back from the Dagster event log through :mod:`dw_dagster.core.records`
(the ``dw/incident``, ``dw/diagnosis``, ``dw/change_set``, ``dw/approval`` and ``dw/receipt``
observations), joined on incident id and change set id. A diagnosis uses it to say "the same
cause on this asset on DATE, fixed by change set X" when a cause repeats
(:func:`attach_history`); ``dw-dagster incidents`` prints it.
"""

import datetime as dt
from collections.abc import Sequence
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.core.models import CauseFinding, PartitionNote
from dw_dagster.core import records
from dw_dagster.core.states import incident_words
from dw_dagster.dagster_private import public

_PAST = {"approve": "approved", "reject": "rejected"}


class IncidentHistoryEntry(BaseModel):
    """One incident and what became of it. Times are UTC; ``gap_rows`` is source − target."""

    incident_id: str
    asset_key: list[str]
    detected_at: dt.datetime
    source: str
    summary: str
    gap_rows: int
    gap_pct: float
    diagnosis_id: str | None = None
    cause_kind: str | None = None
    cause_summary: str | None = None
    confidence: float | None = None
    explained_rows: int | None = None
    unexplained_rows: int | None = None
    change_set_id: str | None = None
    change_set_version: str | None = None
    change_set_summary: str | None = None
    window: list[str] = Field(default_factory=list)
    not_run: list[PartitionNote] = Field(default_factory=list, description="partitions the cause reached that the "
                                         "change set did not run: outside the asset's partitions or deferred, with their rows")
    decision: str | None = Field(default=None, description="approved, rejected, or None while pending")
    approver: str | None = None
    receipt_id: str | None = None
    verified: bool | None = None
    fixed_at: dt.datetime | None = None
    status: str = Field(description="open, diagnosed, proposed, approved, rejected, fixed (verified), fixed (not verified), "
                        "repair failed at <stage>: <error>, undone, open again")
    state: str | None = Field(default=None, description="the incident's state in the ledger: open, diagnosing, diagnosed, "
                              "diagnosis_failed, rediagnose, unrepaired, closed, quarantined")
    linked_to: str | None = Field(default=None, description="the open incident this one is linked to, if any")


@public
def incident_history(instance: dg.DagsterInstance, asset_key: dg.AssetKey | None = None) -> list[IncidentHistoryEntry]:
    """Every incident (of one asset, or of every asset) with its outcome, newest first.

    Per incident: the newest diagnosis and its primary cause; the change set that got a receipt,
    else the newest one proposed for it; the newest decision on that change set; the receipt on
    the incident's asset for that change set (``verified`` from the receipt).
    """
    keys = [asset_key] if asset_key is not None else None
    incidents, seen = [], set()
    for inc in records.incidents(instance, keys):
        if inc.id not in seen:
            seen.add(inc.id)
            incidents.append(inc)
    diag_by_inc: dict[str, Any] = {}
    for d in records.diagnoses(instance, keys):
        diag_by_inc.setdefault(d.incident_id, d)
    cs_by_inc: dict[str, list] = {}
    for cs in records.change_sets(instance, keys):
        cs_by_inc.setdefault(cs.incident_id, []).append(cs)
    receipts = records.receipts(instance, asset_key)
    decisions: dict[str, Any] = {}
    if any(cs_by_inc.values()):
        for a in records.approvals(instance):
            decisions.setdefault(a.change_set_id, a)
    from dw_dagster.core.ledger import ledger_for

    rows = {r.incident_id: r for r in ledger_for(instance).incidents()}
    out = []
    for inc in incidents:
        d = diag_by_inc.get(inc.id)
        row = rows.get(inc.id)
        p = d.primary if d else None
        mine = [r for r in receipts if r.incident_id == inc.id and r.asset_key == inc.asset_key]
        cands = [x for x in cs_by_inc.get(inc.id, []) if x.cause_kind != "undo"]
        cs = next((c for c in cands if any(r.change_set_id == c.id for r in mine)), cands[0] if cands else None)
        rec = next((r for r in mine if r.cause_kind != "undo" and (cs is None or r.change_set_id == cs.id)), None)
        dec = decisions.get(cs.id) if cs else None
        undo = max((r for r in mine if r.cause_kind == "undo"), key=lambda r: r.created_at, default=None)
        if undo is not None and (rec is None or undo.created_at >= rec.created_at):
            status = incident_words(row.state if row else None, undo)
        elif rec is not None:
            status = incident_words(row.state if row else None, rec)
        elif dec is not None:
            status = _PAST.get(dec.decision, dec.decision)
        elif cs is not None:
            status = "proposed"
        elif d is not None:
            status = "diagnosed"
        else:
            status = "open"
        out.append(IncidentHistoryEntry(
            incident_id=inc.id, asset_key=inc.asset_key, detected_at=inc.detected_at, source=inc.source, summary=inc.summary,
            gap_rows=inc.gap_rows, gap_pct=inc.gap_pct, diagnosis_id=d.id if d else None,
            cause_kind=p.kind if p and p.explained_rows > 0 else ("unexplained" if d else None),
            cause_summary=p.summary if p and p.explained_rows > 0 else None,
            confidence=p.confidence if p and p.explained_rows > 0 else None,
            explained_rows=p.explained_rows if p else None, unexplained_rows=d.unexplained_rows if d else None,
            change_set_id=cs.id if cs else None, change_set_version=cs.version if cs else None,
            change_set_summary=cs.summary if cs else None, window=list(cs.window) if cs else [],
            not_run=cs.not_run() if cs else [],
            decision=_PAST.get(dec.decision, dec.decision) if dec else None, approver=dec.approver if dec else None,
            receipt_id=rec.id if rec else None, verified=rec.verified if rec else None,
            fixed_at=rec.created_at if rec else None, status=status, state=row.state if row else None,
            linked_to=row.linked_to if row else None))
    return sorted(out, key=lambda e: e.detected_at, reverse=True)


def repeats(history: Sequence[IncidentHistoryEntry], cause_kind: str, *,
            exclude_incident_id: str | None = None) -> list[IncidentHistoryEntry]:
    """Past incidents whose primary cause was ``cause_kind`` (newest first), without ``exclude_incident_id``."""
    return [e for e in history if e.cause_kind == cause_kind and e.incident_id != exclude_incident_id]


def history_note(entry: IncidentHistoryEntry) -> str:
    """One line: "the same cause (KIND) on ASSET on DATE (incident ID), fixed by change set X (receipt verified)"."""
    when = entry.detected_at.astimezone(dt.timezone.utc).date().isoformat()
    text = f"the same cause ({entry.cause_kind}) on {'/'.join(entry.asset_key)} on {when} (incident {entry.incident_id})"
    if entry.receipt_id:
        text += (f", fixed by change set {entry.change_set_id}"
                 + (f" over {entry.window[0]}..{entry.window[-1]}" if entry.window else "")
                 + f" (receipt {entry.receipt_id}, {'verified' if entry.verified else 'NOT verified'})")
    elif entry.change_set_id:
        text += f", change set {entry.change_set_id} {entry.decision or 'proposed, not decided'}, no receipt"
    else:
        text += ", no change set proposed"
    return text


def attach_history(finding: CauseFinding, instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                   incident_id: str | None = None, limit: int = 5) -> CauseFinding:
    """``finding`` with ``details["history"]`` and ``details["history_note"]`` when its cause happened before on the asset.

    Returns the finding unchanged when the cause is new on this asset (or explains nothing).

    Args:
        finding: the diagnosis's primary finding.
        instance: the Dagster instance.
        asset_key: the incident's asset.
        incident_id: the current incident (left out of the history).
        limit: how many earlier incidents to list.
    """
    if finding.explained_rows <= 0:
        return finding
    past = repeats(incident_history(instance, asset_key), finding.kind, exclude_incident_id=incident_id)
    if not past:
        return finding
    hist = [{"incident_id": e.incident_id, "detected_at": e.detected_at.isoformat(), "gap_rows": e.gap_rows,
             "change_set_id": e.change_set_id, "window": e.window, "status": e.status, "receipt_id": e.receipt_id,
             "verified": e.verified} for e in past[:limit]]
    note = ("seen before: " + history_note(past[0])
            + (f"; {len(past) - 1} earlier incident(s) with the same cause" if len(past) > 1 else ""))
    return finding.model_copy(update={"details": {**finding.details, "history": hist, "history_note": note,
                                                  "repeat_count": len(past)}})
