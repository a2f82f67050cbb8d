"""A dashboard refresh that failed or landed after its deadline: the page and the domain's escalation.

After a verified receipt the receipt job refreshes the BI objects of the blast radius
(:func:`dw_dagster.receipts.job.record_bi_refresh`). When one of them failed, or landed after the
exposure's ``needed_by``, the receipt's observation carries a ``dw/bi_escalation`` record (at most
one per receipt: a retried receipt run finds it and writes none). The notification sensor turns it
into two tasks, each done once per receipt by the sensor's exactly-once machinery (the task id is the
receipt's, each step recorded before the next runs, so a tick retried after a failure or a lost
cursor never pages twice):

- **pager** ``bi_escalation``: the incident's page is triggered again (same ``dedup_key``/alias) with
  the late or failed dashboards, then noted with who is escalated to: the domain's ``escalation``
  list, then its ``escalation_approvers`` (the ladder's people);
- **slack** ``bi_escalation``: the domain's channel is told the same, naming those people.
"""

from __future__ import annotations

from dw_dagster.integrations.notify_core import Outlets, Task, _Record


def escalation_people(o: Outlets, domain: str) -> list[str]:
    """Who a late dashboard escalates to: the domain's ``escalation`` list, then its ``escalation_approvers``."""
    d = o.domain(domain) if domain else None
    if d is None:
        return []
    return list(dict.fromkeys([*d.escalation, *d.escalation_approvers]))


def _line(row: dict) -> str:
    late = (f"refresh failed: {row['error']}" if row.get("error")
            else f"refreshed at {row.get('refreshed_at')}, after its deadline {row.get('deadline')}")
    return f"- {row['exposure']} ({row.get('tool')}): {late}"


def escalation_text(data: dict, people: list[str], url: str | None) -> str:
    """The note and message: which dashboards are late or failed, and who is escalated to."""
    rows = [r for r in data.get("rows") or [] if r.get("escalate")]
    return "\n".join([f"dw_dagster: the repair of incident {data.get('incident_id')} is verified (receipt "
                      f"{data['receipt_id']}), but {len(rows)} dashboard(s) did not refresh before they are needed:",
                      *[_line(r) for r in rows],
                      f"Escalated to: {', '.join(people) or 'nobody listed (the domain names no escalation)'}",
                      *([f"Review: {url}"] if url else [])])


def _page(task: Task, o: Outlets, data: dict) -> None:
    from dw_dagster.integrations.notify_tasks import _note, _vendor
    from dw_dagster.integrations.paging import clip

    people = escalation_people(o, data.get("domain") or "")
    url = o.incident(data["incident_id"], data["target_asset"])
    rows = [r for r in data.get("rows") or [] if r.get("escalate")]
    summary = clip(f"[dw_dagster] dashboards late after the repair of incident {data['incident_id']}: "
                   + ", ".join(r["exposure"] for r in rows), 1000)
    details = {"incident_id": data["incident_id"], "receipt_id": data["receipt_id"],
               "change_set_id": data.get("change_set_id"), "dashboards": rows, "escalated_to": people}
    links = o.links(asset_key=data["target_asset"], change_set_id=data.get("change_set_id"), incident_id=data["incident_id"])

    def trigger(ref: str, check_first: bool | None) -> dict:
        return {"key": o.pager.trigger(data["incident_id"], summary, severity="error", details=details, links=links)}
    task.step("trigger", trigger)
    task.step("note", _note(o.pager, data["incident_id"], escalation_text(data, people, url)), last=True)
    task.finish(True, f"{_vendor(o.pager)} paged: {len(rows)} dashboard(s) late after receipt {data['receipt_id']}; "
                f"escalated to {', '.join(people) or 'nobody listed'}", incident_id=data["incident_id"],
                receipt_id=data["receipt_id"], escalated_to=people)


def _slack(task: Task, o: Outlets, data: dict) -> None:
    from dw_dagster.integrations.notify_tasks import message_step
    from dw_dagster.integrations.slack import SlackMessage

    people = escalation_people(o, data.get("domain") or "")
    url = o.incident(data["incident_id"], data["target_asset"])
    text = escalation_text(data, people, url)
    domain = o.domain(data.get("domain") or "") if data.get("domain") else None
    channel = (domain.slack_channel if domain is not None and domain.slack_channel else None) or o.slack_channel
    task.step("message", message_step(o.slack, SlackMessage(text=text), channel, task.record_ts), last=True)
    task.finish(True, f"told Slack: dashboards late after receipt {data['receipt_id']}; escalated to "
                f"{', '.join(people) or 'nobody listed'}", incident_id=data["incident_id"], receipt_id=data["receipt_id"])


def bi_tasks(o: Outlets, rec: _Record) -> list:
    """The tasks of a ``dw/bi_escalation`` record (module docstring)."""
    data = rec.data
    rid = f"bi:{data['receipt_id']}"
    tasks = []
    if o.pager is not None and data.get("incident_id"):
        tasks.append(("pager", "bi_escalation", rid, lambda t, data=data: _page(t, o, data)))
    if o.slack is not None:
        tasks.append(("slack", "bi_escalation", rid, lambda t, data=data: _slack(t, o, data)))
    return tasks


__all__ = ["bi_tasks", "escalation_people", "escalation_text"]
