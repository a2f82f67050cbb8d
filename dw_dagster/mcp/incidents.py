"""Incident tools: ``list_incidents``, ``get_incident``, ``get_incident_history``.

The rows are :class:`~dw_dagster.diagnosis.history.IncidentHistoryEntry` from
:func:`~dw_dagster.diagnosis.history.incident_history`, the same objects ``dw-dagster incidents
--json`` prints, so the assistant and the command line give one answer.
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
from collections import Counter
from typing import Annotated

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.core import records
from dw_dagster.core.keys import LIGHTUP_CHECK
from dw_dagster.core.models import Incident, PartitionNote
from dw_dagster.diagnosis.history import IncidentHistoryEntry, incident_history, repeats
from dw_dagster.mcp.models import (
    ChangeSetBrief,
    DecisionBrief,
    ReceiptVerdict,
    change_set_brief,
    decision_briefs,
    receipt_check,
    receipt_verdicts,
)
from dw_dagster.mcp.state import DwState, asset_of, fail, shown
from dw_dagster.mcp.untrusted import LEDGER_NOTE, RECORD, UPSTREAM, Untrusted, untrusted

#: ``status`` values of :class:`IncidentHistoryEntry` and ledger states, both accepted by ``list_incidents``
STATUSES = ("open", "diagnosed", "proposed", "approved", "rejected", "fixed", "fixed (verified)", "fixed (not verified)",
            "repair failed", "undone, open again",
            "diagnosing", "diagnosis_failed", "rediagnose", "closed", "quarantined")

AssetArg = Annotated[str, Field(description="Asset key, slash-separated (store_sales_line, pos_source/sales_line) "
                                "or a JSON list of its parts", max_length=1000)]
IncidentIdArg = Annotated[str, Field(description="Incident id as list_incidents shows it (lu-…, inc-…)", max_length=200)]


def parse_since(text: str) -> dt.datetime:
    """``since`` as an aware UTC datetime: an ISO date or datetime (naive = UTC), or ``Nd`` / ``Nh`` ago.

    Raises:
        ToolError: anything else.
    """
    s = text.strip()
    m = re.fullmatch(r"(\d{1,5})\s*([dh])", s)
    if m:
        n = int(m.group(1))
        return dt.datetime.now(dt.timezone.utc) - (dt.timedelta(days=n) if m.group(2) == "d" else dt.timedelta(hours=n))
    try:
        t = dt.datetime.fromisoformat(s)
    except ValueError:
        raise fail(f"since {shown(text)} is not a date: give 2026-11-26, 2026-11-26T08:00:00Z, 7d or 24h") from None
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)


class IncidentEntry(BaseModel):
    """An incident and what became of it: the fields of ``dw-dagster incidents --json``, with the text that came
    from outside dw_dagster (summaries built from warehouse or alert data, the approver's name) marked."""

    incident_id: str
    asset_key: list[str]
    detected_at: dt.datetime
    source: str
    summary: Untrusted = Field(description="the incident's summary as its detector recorded it")
    gap_rows: int
    gap_pct: float
    diagnosis_id: str | None = None
    cause_kind: str | None = None
    cause_summary: Untrusted | None = None
    confidence: float | None = None
    explained_rows: int | None = None
    unexplained_rows: int | None = None
    change_set_id: str | None = None
    change_set_version: str | None = None
    change_set_summary: Untrusted | None = None
    window: list[str] = Field(default_factory=list)
    not_run: list[PartitionNote] = Field(default_factory=list, description="partitions the cause reached that the change "
                                         "set did not run: outside the asset's partitions or deferred, with their rows")
    decision: str | None = Field(default=None, description="approved, rejected, or None while pending")
    approver: Untrusted | None = Field(default=None, description="who decided, as the decision records it (an email the "
                                       "identity provider vouched for, or one typed in an `identity: unverified` domain)")
    receipt_id: str | None = None
    verified: bool | None = None
    fixed_at: dt.datetime | None = None
    status: str = Field(description="open, diagnosed, proposed, approved, rejected, fixed (verified), fixed (not verified), "
                        "repair failed at <stage>: <error>, undone, open again")
    state: str | None = Field(default=None, description="the incident's state in the ledger")
    linked_to: str | None = Field(default=None, description="the open incident this one is linked to, if any")


def entry_view(e: IncidentHistoryEntry) -> IncidentEntry:
    """:class:`IncidentHistoryEntry` (shared with the CLI) with its outside text marked."""
    d = e.model_dump()
    origin = UPSTREAM if e.source == "lightup" else RECORD
    d.update(summary=Untrusted(untrusted_data=e.summary, origin=origin), cause_summary=untrusted(e.cause_summary, RECORD),
             change_set_summary=untrusted(e.change_set_summary, RECORD),
             approver=untrusted(e.approver, "the decision's record"))
    return IncidentEntry(**d)


class IncidentList(BaseModel):
    """Incidents newest first, each as ``dw-dagster incidents --json`` prints it (outside text marked)."""

    incidents: list[IncidentEntry]
    total: int = Field(description="incidents matching the filters before `limit`")
    asset: str | None = None
    status: str | None = None
    since: dt.datetime | None = None


def list_incidents(state: DwState, asset: str | None, status: str | None, since: str | None, limit: int) -> IncidentList:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    state.require_records()
    key = state.asset(asset) if asset is not None else None
    if status is not None and status not in STATUSES:
        raise fail(f"status {shown(status)} is not one of {', '.join(STATUSES)}")
    after = parse_since(since) if since is not None else None
    entries = incident_history(state.view(), key)
    if status is not None:
        entries = [e for e in entries if e.status == status or e.state == status
                   or (status in ("fixed", "repair failed") and e.status.startswith(status))]
    if after is not None:
        entries = [e for e in entries if e.detected_at >= after]
    return IncidentList(incidents=[entry_view(e) for e in entries[:limit]], total=len(entries),
                        asset=key.to_user_string() if key else None,
                        status=status, since=after)


class IncidentView(BaseModel):
    """The incident's record as detected, with what its detector took from outside (the alert's text and link,
    the slices' values) marked."""

    id: str
    asset_key: list[str]
    source: str
    check_name: str | None = None
    detected_at: dt.datetime
    summary: Untrusted
    slices: Untrusted | None = Field(default=None, description="the gap per slice (slice values come from the data)")
    gap_rows: int = 0
    gap_pct: float = 0.0
    evaluation_id: int | None = Field(default=None, description="storage id of the failing check evaluation")
    external_id: Untrusted | None = Field(default=None, description="the alerting tool's incident id")
    external_url: Untrusted | None = Field(default=None, description="link to the incident in the alerting tool")
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None


def incident_view(inc: Incident) -> IncidentView:
    origin = UPSTREAM if inc.source == "lightup" else RECORD
    return IncidentView(id=inc.id, asset_key=inc.asset_key, source=inc.source, check_name=inc.check_name,
                        detected_at=inc.detected_at, summary=Untrusted(untrusted_data=inc.summary, origin=origin),
                        slices=untrusted([x.model_dump(mode="json") for x in inc.slices] or None, origin),
                        gap_rows=inc.gap_rows, gap_pct=inc.gap_pct, evaluation_id=inc.evaluation_id,
                        external_id=untrusted(inc.external_id, UPSTREAM), external_url=untrusted(inc.external_url, UPSTREAM),
                        window_start=inc.window_start, window_end=inc.window_end)


class IncidentDetail(BaseModel):
    """One incident: what was detected, by which source, its cause, change set, decision and receipts."""

    incident: IncidentView = Field(description="the record as detected: source, gap per slice, window, external id and link")
    detected_by: str = Field(description="the source in words: Lightup compare incident, failed check, volume sensor")
    ledger_state: str = Field(description="open, diagnosing, diagnosed, diagnosis_failed, rediagnose, closed, quarantined")
    ledger_note: Untrusted | None = None
    outcome: IncidentEntry = Field(description="cause, change set, decision and receipt, as `dw-dagster incidents`")
    change_sets: list[ChangeSetBrief] = Field(description="change sets proposed for it, newest first")
    decisions: list[DecisionBrief] = Field(description="decisions on those change sets, newest first")
    refused_approvals: int = Field(description="approval attempts refused on those change sets (get_audit_trail lists them)")
    receipts: list[ReceiptVerdict] = Field(description="receipts written for it, on every touched asset")
    receipts_check: str = Field(description="what verify_receipts said about the instance's chains")


def detected_by(inc: Incident) -> str:
    """The incident's source in words."""
    if inc.source == "lightup":  # its id and link are Lightup's text: in the record's external_id / external_url
        return f"a Lightup incident, reported as the failed check {inc.check_name or LIGHTUP_CHECK}"
    if inc.source == "dw_check":
        return f"the failed asset check {inc.check_name} (evaluation {inc.evaluation_id})"
    if inc.source == "volume_sensor":
        return "the volume sensor (rows per day outside the table's baseline)"
    return "opened by a person"


def get_incident(state: DwState, incident_id: str) -> IncidentDetail:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    row = state.incident_row(incident_id)
    inst, led = state.view(), state.ledger()
    try:
        inc = Incident.model_validate_json(row.body)
    except ValueError as e:
        raise fail(f"incident {row.incident_id}'s record does not parse; it is quarantined: "
                   "`dw-dagster change-sets` lists it") from e
    key = asset_of(row.asset_key)
    entry = next(e for e in incident_history(inst, key) if e.incident_id == row.incident_id)
    sets = [records.parse_change_set(r.body) for r in led.change_set_rows(incident_id=row.incident_id, latest_only=True)]
    decisions = [d for cs in sets for d in decision_briefs(state, cs.id)]
    targets = list(dict.fromkeys(tuple(cs.target_asset) for cs in sets))
    refused = sum(len(records.refusals(inst, cs.id, [dg.AssetKey(list(cs.target_asset))])) for cs in sets)
    touched = list(dict.fromkeys([*targets, *(tuple(a) for cs in sets for a in cs.rebuild_assets)]))
    mine = [r for a in touched for r in records.receipts(inst, dg.AssetKey(list(a))) if r.incident_id == row.incident_id]
    checked, problems, text = (receipt_check(state, [dg.AssetKey(list(a)) for a in touched]) if mine
                               else (False, {}, "no receipts to check"))
    return IncidentDetail(incident=incident_view(inc), detected_by=detected_by(inc), ledger_state=row.state,
                          ledger_note=untrusted(row.note, LEDGER_NOTE), outcome=entry_view(entry), change_sets=[change_set_brief(led, cs) for cs in sets], decisions=decisions,
                          refused_approvals=refused, receipts=receipt_verdicts(mine, checked, problems), receipts_check=text)


class CauseCount(BaseModel):
    cause_kind: str
    incidents: int
    repeat: bool = Field(description="True when the cause happened more than once on this asset")


class HistoryEntry(IncidentEntry):
    """An incident with how long it took from detection to its receipt."""

    hours_to_receipt: float | None = Field(description="detected_at → the receipt's created_at, hours (4 decimals: 0.36 s); None without a receipt")


class IncidentHistory(BaseModel):
    """Past incidents of one asset (or those like one incident), with repeats and time to receipt."""

    asset: str
    similar_to: str | None = Field(default=None, description="the incident or cause kind the list was narrowed to")
    cause_kind: str | None = Field(default=None, description="the cause kind `similar_to` stands for")
    incidents: list[HistoryEntry]
    by_cause: list[CauseCount]
    median_hours_to_receipt: float | None = Field(description="over the incidents with a receipt; None if none")
    fixed_verified: int = Field(description="incidents fixed with a verified receipt")
    open: int = Field(description="incidents neither fixed nor closed")


def get_incident_history(state: DwState, asset: str, similar_to: str | None) -> IncidentHistory:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    state.require_records()
    key: dg.AssetKey = state.asset(asset)
    entries = incident_history(state.view(), key)
    kind = None
    if similar_to is not None:
        s = similar_to.strip()
        ref = next((e for e in entries if e.incident_id == s), None)
        if ref is None and state.ledger().incident(s) is not None:
            raise fail(f"incident {s} is not on {key.to_user_string()}; give an incident of this asset or a cause kind")
        kind = ref.cause_kind if ref is not None else s
        known = sorted({e.cause_kind for e in entries if e.cause_kind})
        if ref is None and kind not in known:
            raise fail(f"similar_to {shown(similar_to)} is neither an incident of {key.to_user_string()} nor a cause seen "
                       f"on it (causes seen: {', '.join(known) or 'none'})")
        if kind is None:
            raise fail(f"incident {s} has no diagnosed cause yet, so nothing is similar to it; diagnose_incident says "
                       "how to start its diagnosis")
        entries = repeats(entries, kind, exclude_incident_id=ref.incident_id if ref else None)
    out = [HistoryEntry(**entry_view(e).model_dump(), hours_to_receipt=round((e.fixed_at - e.detected_at).total_seconds() / 3600, 4)
                        if e.fixed_at else None) for e in entries]
    counts = Counter(e.cause_kind or "(not diagnosed)" for e in out)
    times = [e.hours_to_receipt for e in out if e.hours_to_receipt is not None]
    return IncidentHistory(
        asset=key.to_user_string(), similar_to=similar_to, cause_kind=kind, incidents=out,
        by_cause=[CauseCount(cause_kind=k, incidents=n, repeat=n > 1) for k, n in counts.most_common()],
        median_hours_to_receipt=round(statistics.median(times), 4) if times else None,
        fixed_verified=sum(e.status == "fixed (verified)" for e in out),
        open=sum(not e.status.startswith("fixed") and e.state != "closed" for e in out))


__all__ = ["AssetArg", "IncidentDetail", "IncidentEntry", "IncidentHistory", "IncidentIdArg", "IncidentList", "STATUSES", "get_incident",
           "get_incident_history", "list_incidents", "parse_since"]
