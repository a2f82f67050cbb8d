"""The notification tasks for the page, Lightup and the Slack channel, and which tasks a record makes.

:func:`tasks_for` turns one dw_dagster record into its tasks (channel, action, record id, run):
the page (PagerDuty / Opsgenie), Lightup's incident, the Slack channel here; each listed person
(Slack DM, email) in :mod:`~dw_dagster.integrations.notify_people`; Jira and ServiceNow in
:mod:`~dw_dagster.integrations.notify_tickets`. The rules per record are in
:mod:`dw_dagster.integrations.notifications`.
"""

from collections.abc import Callable
from typing import Any

from dw_dagster.core import records
from dw_dagster.core.models import ChangeSet, Diagnosis, Incident, Receipt
from dw_dagster.integrations.notify_core import SLACK_CLOCK_SKEW_S, Outlets, Task, _incident, _Record
from dw_dagster.integrations.outcomes import RepairVerdict, outcome_lines, repair_verdict

#: one task: (channel, action, record id, run)
TaskSpec = tuple[str, str, str, Callable[[Task], None]]


def _vendor(pager: Any) -> str:
    return type(pager).__name__.replace("Resource", "")


def _trigger(pager, inc: Incident, links: list[tuple[str, str]]) -> Callable[[str, bool | None], dict]:
    from dw_dagster.integrations.paging import page_incident

    # Events v2 dedup_key / Opsgenie alias: idempotent, a repeat lands on the same page
    return lambda ref, check_first: {"key": page_incident(pager, inc, links=links)}


def _page(task: Task, o: Outlets, inc: Incident) -> None:
    links = o.links(asset_key=inc.asset_key, incident_id=inc.id)
    if inc.external_url:
        links.append((inc.external_url, "Lightup incident"))
    key = task.step("trigger", _trigger(o.pager, inc, links), last=True).get("key")
    task.finish(True, f"{_vendor(o.pager)} page {key} for incident {inc.id}", incident_id=inc.id)


def _note(pager, incident_id: str, text: str) -> Callable[[str, bool | None], dict]:
    def run(ref: str, check_first: bool | None) -> dict:
        pager.annotate(incident_id, text, ref=ref, check_first=check_first)
        return {"ref": ref}
    return run


def _annotate(task: Task, o: Outlets, inc: Incident, d: Diagnosis) -> None:
    from dw_dagster.integrations.paging import diagnosis_note

    links = o.links(asset_key=inc.asset_key, incident_id=inc.id)
    task.step("trigger", _trigger(o.pager, inc, links))
    text = diagnosis_note(d, links=links)
    task.step("note", _note(o.pager, inc.id, text), last=True)
    task.finish(True, f"{_vendor(o.pager)} page annotated with the cause and blast radius",
                incident_id=inc.id, diagnosis_id=d.id)


def cause_text(d: Diagnosis) -> str:
    """The diagnosis in one sentence with its numbers (``kind (confidence): summary Explains n of m rows``)."""
    p = d.primary
    if p is None:
        return f"no cause found; {d.gap_rows:,} rows unexplained"
    return (f"{p.kind} (confidence {p.confidence:.0%}): {p.summary} Explains {p.explained_rows:,} of "
            f"{d.gap_rows:,} rows; {d.unexplained_rows:,} unexplained.")


def _comment(client, uuid: str, text: str) -> Callable[[str, bool | None], dict]:
    def run(ref: str, check_first: bool | None) -> dict:
        comment = client.add_comment(uuid, text, ref=ref, check_first=True)  # a read of the comments, always
        return {"comment_id": comment.get("id") if isinstance(comment, dict) else None, "ref": ref}
    return run


def _lightup_comment(task: Task, o: Outlets, inc: Incident, d: Diagnosis) -> None:
    br = d.blast_radius
    text = (f"dw_dagster diagnosis {d.id}: {cause_text(d)}\n"
            f"Blast radius: models {', '.join(m.name for m in br.models) or 'none'}; "
            f"exposures {', '.join(e.label or e.name for e in br.exposures) or 'none'}; "
            f"owners {', '.join(br.owners) or 'none'}.\n"
            f"Details: {o.incident(inc.id, inc.asset_key)}")
    task.step("comment", _comment(o.lightup.get_client(), inc.external_id, text), last=True)
    task.finish(True, f"commented the cause on Lightup incident {inc.external_id}",
                incident_id=inc.id, diagnosis_id=d.id)


def message_step(slack, msg, channel: str | None, record_ts: float) -> Callable[[str, bool | None], dict]:
    """A ``chat.postMessage`` step (at most once per ref) to ``channel``."""
    def run(ref: str, check_first: bool | None) -> dict:
        resp = slack.post_message(msg, channel=channel, ref=ref, check_first=check_first,
                                  oldest=record_ts - SLACK_CLOCK_SKEW_S)
        return {"ts": resp.get("ts"), "channel": resp.get("channel"), "deduplicated": bool(resp.get("deduplicated")),
                "ref": ref}
    return run


def request_message(o: Outlets, cs: ChangeSet, ak, header: str | None = None):
    """The approval request (summary, blast radius, buttons, the review page) as a Slack message."""
    from dw_dagster.integrations.slack import approval_request_message

    diag = next((x for x in records.diagnoses(o.instance, [ak]) if x.id == cs.diagnosis_id), None)
    return approval_request_message(cs, diag.blast_radius if diag else None, dagster_url=o.dagster_url,
                                    location=o.location, review_url=o.change_set(cs.id, cs.target_asset)
                                    if o.review_url else None, header=header)


def _ask_approval(task: Task, o: Outlets, cs: ChangeSet) -> None:
    domain = o.domain(cs.domain)
    channel = (domain.slack_channel if domain is not None and domain.slack_channel else None) or o.slack_channel
    msg = request_message(o, cs, task.ak)
    resp = task.step("message", message_step(o.slack, msg, channel, task.record_ts), last=True)
    task.finish(True, f"asked {', '.join(cs.approvers)} to approve change set {cs.id} in the channel",
                change_set_id=cs.id, ts=str(resp.get("ts")), channel_id=str(resp.get("channel")))


def _lightup_verify(task: Task, o: Outlets, inc: Incident, r: Receipt) -> None:
    client = o.lightup.get_client()

    def recheck(ref: str, check_first: bool | None) -> dict:
        raw = client.get_incident(inc.external_id)
        ctx = client.compare_context(raw)
        gaps = client.recheck(ctx, raw.get("slice") or {}, raw["start_ts"], raw["end_ts"], user_defined_id=r.id,
                              timeout_s=o.recheck_timeout_s)
        summary = "; ".join(f"{g.aggregation}: source {g.source_value:,.2f}, target {g.target_value:,.2f}, "
                            f"gap {g.gap:,.2f}" for g in gaps)
        return {"zero": all(g.gap == 0 for g in gaps), "summary": summary,
                "gaps": [{"aggregation": g.aggregation, "source": g.source_value, "target": g.target_value,
                          "gap": g.gap} for g in gaps]}

    data = task.step("recheck", recheck)
    zero, summary = bool(data.get("zero")), str(data.get("summary", ""))
    closing = zero and o.lightup_close
    text = (f"dw_dagster repaired and verified this (change set {r.change_set_id}, approved by {r.approver}, "
            f"partitions {', '.join(r.partitions)}; receipt {r.id}: {r.outcome}). Lightup re-collected both tables: "
            f"{summary}. {'Compare gap is 0.' if zero else 'The compare gap is NOT 0.'} "
            f"Receipt: {o.incident(inc.id, inc.asset_key)}")
    task.step("comment", _comment(client, inc.external_id, text), last=not closing)
    if closing:
        def close_incident(ref: str, check_first: bool | None) -> dict:
            client.set_incident_status(inc.external_id, 5)  # PATCH status: idempotent
            return {"status": 5}
        task.step("close", close_incident, last=True)
    task.finish(zero, f"Lightup re-collection: {summary}", incident_id=inc.id, gap_zero=zero, closed=closing)


def _resolve(task: Task, o: Outlets, inc: Incident, receipts: list[Receipt]) -> None:
    from dw_dagster.integrations.paging import resolution_note

    pager = o.pager
    url = o.incident(inc.id, inc.asset_key)
    text = resolution_note(url, receipts, extra=f"Asset in Dagster: {o.asset(inc.asset_key)}" if o.review_url else None)
    if hasattr(pager, "resolution_steps"):
        steps = pager.resolution_steps(inc.id, receipt_url=url, note=text)
    else:  # another Pager: one step
        steps = [("resolve", lambda ref, check_first: pager.resolve(inc.id, receipt_url=url, note=text) or {})]
    for i, (name, run) in enumerate(steps):
        task.step(name, run, last=i == len(steps) - 1)
    task.finish(True, f"{_vendor(pager)} page resolved with the receipt link {url}", incident_id=inc.id)


def next_steps(v: RepairVerdict) -> list[str]:
    """What a person can do after an outcome that resolves nothing."""
    cs = v.receipt.change_set_id
    if v.kind == "undo":
        return ["the fix was taken back and the incident is open again", "re-propose the change once its cause is fixed"]
    steps = [f"a listed approver may undo it (`dw-dagster undo {cs}`) or approve a new version"]
    if v.kind == "halted":
        steps.insert(0, "the remaining stages did not run; a listed approver may approve to continue")
    return steps + ["unanswered, it is reminded and escalated as the domain's ladder says"]


def _retrigger(task: Task, o: Outlets, inc: Incident, v: RepairVerdict) -> None:
    """A repair that did not prove itself: the page is re-triggered (or kept) with what failed, then noted."""
    from dw_dagster.integrations.paging import clip

    url = o.incident(inc.id, inc.asset_key)
    summary = clip(f"[dw_dagster] {'/'.join(inc.asset_key)}: {v.headline} for incident {inc.id}: {v.receipt.outcome}", 1000)
    details = {"incident_id": inc.id, "change_set_id": v.receipt.change_set_id, "receipt_id": v.receipt.id,
               "outcome": v.receipt.outcome, "verified": v.receipt.verified, "verdict": v.kind,
               "failing_checks": [{"check": f.check, "asset": f.asset, "sql": f.sql, "values": f.values} for f in v.checks],
               "review_page": url}
    links = o.links(asset_key=inc.asset_key, change_set_id=v.receipt.change_set_id, incident_id=inc.id)

    def trigger(ref: str, check_first: bool | None) -> dict:
        return {"key": o.pager.trigger(inc.id, summary, severity="error", details=details, links=links)}
    task.step("trigger", trigger)
    text = "\n".join(outcome_lines(v, inc.id, next_steps=next_steps(v)) + [f"Receipt: {url}"])
    task.step("note", _note(o.pager, inc.id, text), last=True)
    task.finish(True, f"{_vendor(o.pager)} page kept open: {v.headline} ({clip(v.receipt.outcome, 200)})",
                incident_id=inc.id, verdict=v.kind, verified=v.receipt.verified)


def _lightup_outcome(task: Task, o: Outlets, inc: Incident, v: RepairVerdict) -> None:
    """A repair that did not prove itself: Lightup's incident gets the outcome as a comment and stays open."""
    text = "\n".join(outcome_lines(v, inc.id, next_steps=["this Lightup incident stays open"])
                     + [f"Receipt: {o.incident(inc.id, inc.asset_key)}"])
    task.step("comment", _comment(o.lightup.get_client(), inc.external_id, text), last=True)
    task.finish(True, f"commented on Lightup incident {inc.external_id}: {v.headline}; left open",
                incident_id=inc.id, verdict=v.kind, closed=False)


def _tell_outcome(task: Task, o: Outlets, inc: Incident, v: RepairVerdict) -> None:
    from dw_dagster.integrations.slack import outcome_message, resolved_message

    url = o.incident(inc.id, inc.asset_key)
    msg = (resolved_message(inc.id, list(v.receipts), url) if v.resolves
           else outcome_message(v, inc.id, url, next_steps=next_steps(v)))
    domain = o.domain(_domain_of(o, v.receipt))
    channel = (domain.slack_channel if domain is not None and domain.slack_channel else None) or o.slack_channel
    task.step("message", message_step(o.slack, msg, channel, task.record_ts), last=True)
    task.finish(True, f"told Slack incident {inc.id}: {v.headline}", incident_id=inc.id, verdict=v.kind)


def _domain_of(o: Outlets, r: Receipt) -> str:
    from dw_dagster.core.records import load_change_set

    try:
        cs = load_change_set(o.instance, r.change_set_id, r.change_set_version)
    except Exception:  # noqa: BLE001 - a tampered or missing record: the default channel
        return ""
    return cs.domain if cs is not None else ""


def verdict_for(o: Outlets, r: Receipt) -> RepairVerdict:
    receipts = [x for x in records.receipts(o.instance) if x.change_set_id == r.change_set_id]
    return repair_verdict(r, receipts, mask=o.mask)


def tasks_for(o: Outlets, rec: _Record) -> list[TaskSpec]:
    """Every task one record makes, for the outlets configured (see the sensor's module docstring)."""
    from dw_dagster.integrations.notify_people import people_tasks
    from dw_dagster.integrations.notify_tickets import ticket_tasks

    kind, data, ak = rec.kind, rec.data, rec.asset_key
    tasks: list[TaskSpec] = []
    if kind == "incident":
        inc = Incident.model_validate(data)
        if o.pager is not None:
            tasks.append(("pager", "trigger", f"incident:{inc.id}", lambda t, inc=inc: _page(t, o, inc)))
    elif kind == "diagnosis":
        d = Diagnosis.model_validate(data)
        inc = _incident(o.instance, ak, d.incident_id)
        if o.lightup is not None and inc is not None and inc.source == "lightup" and inc.external_id:
            tasks.append(("lightup", "comment", f"diagnosis:{d.id}", lambda t, d=d, inc=inc: _lightup_comment(t, o, inc, d)))
        if o.pager is not None and inc is not None:
            tasks.append(("pager", "annotate", f"diagnosis:{d.id}", lambda t, d=d, inc=inc: _annotate(t, o, inc, d)))
    elif kind == "change_set":
        cs = ChangeSet.model_validate(data)
        if o.slack is not None:
            tasks.append(("slack", "approval_request", f"change_set:{cs.id}:{cs.version}",
                          lambda t, cs=cs: _ask_approval(t, o, cs)))
    elif kind == "receipt":
        r = Receipt.model_validate(data)
        inc = _incident(o.instance, ak, r.incident_id)
        if inc is None:  # receipts on downstream assets: the incident's own asset speaks for them
            return []
        v = verdict_for(o, r)
        rid = f"receipt:{r.id}"
        # only a verified repair resolves anything; every other outcome keeps (or re-triggers) the page
        if o.lightup is not None and inc.source == "lightup" and inc.external_id:
            tasks.append(("lightup", "verify", rid, lambda t, r=r, inc=inc: _lightup_verify(t, o, inc, r)) if v.resolves
                         else ("lightup", "outcome", rid, lambda t, v=v, inc=inc: _lightup_outcome(t, o, inc, v)))
        if o.pager is not None:
            tasks.append(("pager", "resolve", rid, lambda t, inc=inc, v=v: _resolve(t, o, inc, list(v.receipts)))
                         if v.resolves else ("pager", "retrigger", rid, lambda t, inc=inc, v=v: _retrigger(t, o, inc, v)))
        if o.slack is not None:
            tasks.append(("slack", "resolved" if v.resolves else "not_resolved", rid,
                          lambda t, inc=inc, v=v: _tell_outcome(t, o, inc, v)))
    elif kind == "escalation" and o.pager is not None and data.get("incident_id"):
        tasks.append(("pager", f"ladder_{data['step']}", _ladder_record_id(data),
                      lambda t, data=data: _ladder_note(t, o, data)))
    elif kind == "bi_escalation":  # a dashboard late or not refreshed after a verified repair
        from dw_dagster.integrations.notify_bi import bi_tasks

        tasks += bi_tasks(o, rec)
    return tasks + people_tasks(o, rec) + ticket_tasks(o, rec)


def _ladder_record_id(data: dict) -> str:
    return f"escalation:{data['kind']}:{data['change_set_id']}:{data['version']}:{data['step']}"


def _ladder_note(task: Task, o: Outlets, data: dict) -> None:
    """A ladder step as a note on the incident's page (the page itself is not re-triggered by a reminder)."""
    url = o.change_set(data["change_set_id"], data["target_asset"])
    text = f"dw_dagster escalation ladder: {data['text']}\nTo: {', '.join(data['to']) or 'nobody listed'}\nReview: {url}"
    key = f"{data['kind']} {data['step']}"
    try:
        task.step("note", _note(o.pager, data["incident_id"], text), last=True)
    except Exception as e:  # noqa: BLE001 - no page for this incident (paged elsewhere): say so, do not retry forever
        from dw_dagster.core.http import HttpApiError

        if isinstance(e, HttpApiError) and e.status in (200, 404) and not e.maybe_applied:
            task.finish(False, f"no page to note the ladder step on ({e})", change_set_id=data["change_set_id"])
            return
        raise
    task.finish(True, f"{_vendor(o.pager)} page noted: {key} of change set {data['change_set_id']}",
                change_set_id=data["change_set_id"], step=data["step"])


__all__ = ["TaskSpec", "cause_text", "message_step", "next_steps", "request_message", "tasks_for", "verdict_for"]
