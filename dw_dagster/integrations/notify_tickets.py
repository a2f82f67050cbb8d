"""Notification tasks for ticket systems (Jira Cloud, ServiceNow): one ticket per incident, its story as comments.

Per record, for each configured :class:`~dw_dagster.integrations.tickets.TicketSystem` (channel =
its ``kind``):

- every task first makes sure of *the* ticket (step ``ticket``): when the incident came from
  Lightup and the Lightup monitor's alert channels include this system (Lightup's API:
  incident → monitor → ``alertConfig.channels`` → integration ``type``), it is the ticket Lightup
  opened, found in the ticket system by the Lightup incident's uuid, never a second one (not there
  yet: the task is tried again next tick); otherwise dw_dagster's own, opened once
  (``dw-incident-<id>`` label in Jira, ``correlation_id`` in ServiceNow);
- **diagnosis** → a comment with the cause in one sentence, its numbers and the blast radius;
- **change set** → a comment: who is asked to approve what, the review page;
- **ladder step** → a comment: the reminder, the escalation (who may now decide) or the denial;
- **receipt** on the incident's asset → the outcome as a comment; only a *verified* repair then
  closes the ticket (Jira: a transition to a done status; ServiceNow: Resolved with close code and
  notes). A failed, halted, unverified or undone repair leaves it open, with the failing check,
  its SQL and values in the comment.
"""

from __future__ import annotations

from typing import Any

from dw_dagster.core.models import ChangeSet, Diagnosis, Incident, Receipt
from dw_dagster.errors import DwDagsterError
from dw_dagster.integrations.notify_core import Outlets, Task, _incident, _Record
from dw_dagster.integrations.tickets import Ticket


class TicketNotReady(DwDagsterError, RuntimeError):
    """Lightup routes the incident to this ticket system but its ticket cannot be found yet (tried next tick)."""


def _ticket(o: Outlets, system: Any, inc: Incident, *, check_first: bool) -> Ticket:
    if inc.source == "lightup" and inc.external_id and o.lightup is not None:
        channels = [i for i in o.lightup.get_client().alerting_integrations(inc.external_id)
                    if str(i.get("type", "")).lower() == system.kind]
        if channels:
            found = system.find_alerting_ticket(inc.external_id, channels[0].get("config") or {})
            if found is None:
                raise TicketNotReady(f"Lightup routes incident {inc.external_id} to {system.kind} "
                                     f"({channels[0].get('name', 'its channel')}) but that ticket is not there yet; "
                                     "dw_dagster opens no second one and looks again next tick")
            return found
    summary = f"[dw_dagster] {'/'.join(inc.asset_key)}: {inc.summary}"
    description = "\n".join([f"dw_dagster incident {inc.id} on {'/'.join(inc.asset_key)}: {inc.summary}",
                             f"Detected {inc.detected_at:%Y-%m-%d %H:%M UTC} by {inc.source}"
                             + (f" ({inc.check_name})" if inc.check_name else "") + f"; gap {inc.gap_rows:,} rows.",
                             f"Incident page: {o.incident(inc.id, inc.asset_key)}",
                             f"Asset in Dagster: {o.asset(inc.asset_key)}"])
    return system.open_ticket(inc.id, summary, description, check_first=check_first)


def _ensure(task: Task, o: Outlets, system: Any, inc: Incident, last: bool = False) -> Ticket:
    data = task.step("ticket", lambda ref, check_first: _ticket(o, system, inc, check_first=True).as_dict(), last=last)
    return Ticket(**data)


def _comment_step(task: Task, system: Any, ticket: Ticket, text: str, *, last: bool) -> dict:
    return task.step("comment", lambda ref, check_first: system.comment(ticket, text, ref=ref, check_first=check_first),
                     last=last)


def _open(task: Task, o: Outlets, system: Any, inc: Incident) -> None:
    t = _ensure(task, o, system, inc, last=True)
    task.finish(True, f"{system.kind} {t.key} ({'opened by Lightup' if t.opened_by == 'lightup' else 'dw_dagster'}) "
                f"for incident {inc.id}", incident_id=inc.id, ticket=t.key, opened_by=t.opened_by)


def _diagnosed(task: Task, o: Outlets, system: Any, inc: Incident, d: Diagnosis) -> None:
    from dw_dagster.integrations.notify_tasks import cause_text
    from dw_dagster.integrations.paging import blast_radius_lines

    t = _ensure(task, o, system, inc)
    text = "\n".join([f"dw_dagster diagnosis {d.id}: {cause_text(d)}", "Blast radius:",
                      *blast_radius_lines(d), f"Incident page: {o.incident(inc.id, inc.asset_key)}"])
    _comment_step(task, system, t, text, last=True)
    task.finish(True, f"{system.kind} {t.key}: commented the cause", incident_id=inc.id, ticket=t.key)


def _asked(task: Task, o: Outlets, system: Any, inc: Incident, cs: ChangeSet) -> None:
    t = _ensure(task, o, system, inc)
    domain = o.domain(cs.domain)
    who = list(domain.approvers) if domain else list(cs.approvers)
    text = "\n".join([f"dw_dagster proposed change set {cs.id} (version {cs.version[:12]}): {cs.summary}",
                      f"Waiting for a decision by {', '.join(who)} until {cs.expires_at:%Y-%m-%d %H:%M UTC}.",
                      f"Window: {', '.join(cs.window) or 'none'}; rows to recover: {cs.expected_recovered_rows:,}.",
                      f"Review and decide: {o.change_set(cs.id, cs.target_asset)}"])
    _comment_step(task, system, t, text, last=True)
    task.finish(True, f"{system.kind} {t.key}: approval request noted", change_set_id=cs.id, ticket=t.key)


def _ladder(task: Task, o: Outlets, system: Any, inc: Incident, data: dict) -> None:
    t = _ensure(task, o, system, inc)
    text = "\n".join([f"dw_dagster escalation ladder ({data['kind']} {data['step']}): {data['text']}",
                      f"To: {', '.join(data['to']) or 'nobody listed'}" + (f"; cc {', '.join(data['cc'])}" if data['cc'] else ""),
                      f"Review: {o.change_set(data['change_set_id'], data['target_asset'])}"])
    _comment_step(task, system, t, text, last=True)
    task.finish(True, f"{system.kind} {t.key}: ladder step {data['step']} noted", change_set_id=data["change_set_id"],
                ticket=t.key)


def _receipt(task: Task, o: Outlets, system: Any, inc: Incident, r: Receipt) -> None:
    from dw_dagster.integrations.notify_tasks import next_steps, verdict_for
    from dw_dagster.integrations.outcomes import outcome_lines

    v = verdict_for(o, r)
    t = _ensure(task, o, system, inc)
    text = "\n".join(outcome_lines(v, inc.id, next_steps=[] if v.resolves else
                                   [f"this {system.kind} ticket stays open", *next_steps(v)])
                     + [f"Incident page: {o.incident(inc.id, inc.asset_key)}", f"Asset in Dagster: {o.asset(inc.asset_key)}"])
    _comment_step(task, system, t, text, last=not v.resolves)
    if v.resolves:
        task.step("close", lambda ref, check_first: system.close(t, f"Repaired and verified by dw_dagster: receipt {r.id}. "
                                                                   f"{o.incident(inc.id, inc.asset_key)}"), last=True)
    task.finish(True, f"{system.kind} {t.key}: {v.headline}" + ("; closed" if v.resolves else "; left open"),
                incident_id=inc.id, ticket=t.key, verdict=v.kind, closed=v.resolves)


def ticket_tasks(o: Outlets, rec: _Record) -> list:
    """The ticket tasks of one record, one per configured ticket system (see the module docstring)."""
    if not o.tickets:
        return []
    kind, data, ak = rec.kind, rec.data, rec.asset_key
    out = []
    for system in o.tickets:
        ch = system.kind
        if kind == "incident":
            inc = Incident.model_validate(data)
            out.append((ch, "open", f"incident:{inc.id}", lambda t, s=system, inc=inc: _open(t, o, s, inc)))
            continue
        incident_id = data.get("incident_id")
        inc = _incident(o.instance, ak, incident_id) if incident_id else None
        if inc is None:
            continue
        if kind == "diagnosis":
            d = Diagnosis.model_validate(data)
            out.append((ch, "comment", f"diagnosis:{d.id}", lambda t, s=system, inc=inc, d=d: _diagnosed(t, o, s, inc, d)))
        elif kind == "change_set":
            cs = ChangeSet.model_validate(data)
            out.append((ch, "approval_request", f"change_set:{cs.id}:{cs.version}",
                        lambda t, s=system, inc=inc, cs=cs: _asked(t, o, s, inc, cs)))
        elif kind == "escalation":
            rid = f"escalation:{data['kind']}:{data['change_set_id']}:{data['version']}:{data['step']}"
            out.append((ch, f"ladder_{data['step']}", rid, lambda t, s=system, inc=inc: _ladder(t, o, s, inc, data)))
        elif kind == "receipt":
            r = Receipt.model_validate(data)
            out.append((ch, "receipt", f"receipt:{r.id}", lambda t, s=system, inc=inc, r=r: _receipt(t, o, s, inc, r)))
    return out


__all__ = ["TicketNotReady", "ticket_tasks"]
