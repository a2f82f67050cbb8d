"""Notifications to people: each approver asked by Slack DM, email, and every ladder step told to the right people.

For a **change set** (a request for a decision): every approver listed for the domain *now* gets
the request as a Slack direct message with the signed Approve / Reject buttons
(:mod:`~dw_dagster.integrations.slack_direct`: ``users.lookupByEmail`` → ``conversations.open`` →
``chat.postMessage``), one task per person (channel ``slack_dm:<email>``), and one email to all
of them. For a **ladder step** (``dw/escalation``): each person the step is for gets a DM (the
request again, with the buttons, for a reminder or an escalation; a plain notice for a denial or
a failed repair), the domain's channel gets the step, and one email goes to them (the people
copied in Cc). For a **receipt** on the incident's asset: one email to the approvers with the
outcome, the failing checks and the links.

An approver Slack cannot find (``users_not_found``, a deactivated member) is not skipped in
silence: the task ends not ok, naming the person, and the miss is recorded once in the ledger's
audit (``approver_unreachable``) and as a ``dw/unreachable`` observation on the asset, which the
review page shows beside the change set.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import ChangeSet, Receipt
from dw_dagster.integrations.notify_core import SLACK_CLOCK_SKEW_S, Outlets, Task, _incident, _Record


def _approvers(o: Outlets, cs: ChangeSet) -> list[str]:
    """The domain's approvers as listed now (the change set's copy when the domain is unknown)."""
    domain = o.domain(cs.domain)
    return list(domain.approvers) if domain is not None else list(cs.approvers)


def record_unreachable(instance: dg.DagsterInstance, *, email: str, channel: str, reason: str, change_set_id: str,
                       version: str, asset_key: list[str]) -> None:
    """Name an approver a channel cannot reach: a ledger audit entry and a ``dw/unreachable`` observation."""
    body = {"email": email, "channel": channel, "reason": reason, "change_set_id": change_set_id, "version": version}
    ledger_for(instance).audit("approver_unreachable", change_set_id, "dw-dagster", body)
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(asset_key), description=describe(f"{email} cannot be reached in {channel}: {reason}",
                                                               change_set_id=change_set_id),
        metadata={c.UNREACHABLE_KEY: dg.MetadataValue.json(body), c.CHANGE_SET_ID_KEY: change_set_id}))


def unreachable(instance: dg.DagsterInstance, change_set_id: str) -> list[dict[str, Any]]:
    """The people a channel could not reach for a change set (from the ledger), oldest first."""
    return [e["body"] for e in reversed(ledger_for(instance).audit_entries("approver_unreachable", change_set_id))]


def _dm(task: Task, o: Outlets, email: str, message, *, change_set_id: str, version: str, asset_key: list[str],
        what: str) -> None:
    """Look the person up, open the DM, post ``message`` once (each step recorded as it is done)."""
    from dw_dagster.integrations.slack_direct import lookup_user, open_direct, post_direct

    def lookup(ref: str, check_first: bool | None) -> dict:
        user = lookup_user(o.slack, email)
        return {"user_id": user["id"]} if user else {"unreachable": "no Slack member has this email (users_not_found)"}

    found = task.step("lookup", lookup)
    if found.get("unreachable"):
        def note(ref: str, check_first: bool | None) -> dict:
            record_unreachable(o.instance, email=email, channel="slack", reason=found["unreachable"],
                               change_set_id=change_set_id, version=version, asset_key=asset_key)
            return {}
        task.step("record_unreachable", note, last=True)
        task.finish(False, f"{email} cannot be reached in Slack: {found['unreachable']}; named in the ledger",
                    change_set_id=change_set_id, person=email, unreachable=True)
        return
    opened = task.step("open", lambda ref, check_first: {"channel": open_direct(o.slack, found["user_id"])})

    def post(ref: str, check_first: bool | None) -> dict:
        resp = post_direct(o.slack, opened["channel"], message, ref=ref, check_first=check_first,
                           oldest=task.record_ts - SLACK_CLOCK_SKEW_S)
        return {"ts": resp.get("ts"), "channel": resp.get("channel"), "deduplicated": bool(resp.get("deduplicated"))}
    task.step("message", post, last=True)
    task.finish(True, f"{what} sent to {email} by Slack DM", change_set_id=change_set_id, person=email,
                slack_user=found["user_id"])


def _email(task: Task, o: Outlets, mail, *, what: str, **extra: Any) -> None:
    def send(ref: str, check_first: bool | None) -> dict:
        return o.email.send(mail, message_id=f"<{ref.replace(':', '.')}@dw-dagster>")
    sent = task.step("send", send, last=True)
    task.finish(True, f"{what} emailed to {', '.join(mail.to)}" + (f" (cc {', '.join(mail.cc)})" if mail.cc else ""),
                message_id=sent.get("message_id"), **extra)


def _change_set_tasks(o: Outlets, rec: _Record) -> list:
    from dw_dagster.integrations.mail import request_email
    from dw_dagster.integrations.notify_tasks import request_message

    cs = ChangeSet.model_validate(rec.data)
    rid = f"change_set:{cs.id}:{cs.version}"
    people = _approvers(o, cs)
    tasks = []
    if o.slack is not None:
        for email in people:
            tasks.append((f"slack_dm:{email}", "approval_request", rid, lambda t, email=email: _dm(
                t, o, email, request_message(o, cs, t.ak), change_set_id=cs.id, version=cs.version,
                asset_key=cs.target_asset, what="approval request")))
    if o.email is not None and people:
        tasks.append(("email", "approval_request", rid, lambda t: _email(
            t, o, request_email(cs, to=people, review_url=o.change_set(cs.id, cs.target_asset),
                                asset_url=o.asset(cs.target_asset), sender=o.email.sender),
            what=f"approval request for {cs.id}", change_set_id=cs.id)))
    return tasks


def _ladder_tasks(o: Outlets, rec: _Record) -> list:
    from dw_dagster.core.records import load_change_set
    from dw_dagster.integrations.mail import ladder_email
    from dw_dagster.integrations.notify_tasks import message_step, request_message
    from dw_dagster.integrations.slack import SlackMessage

    data = rec.data
    rid = f"escalation:{data['kind']}:{data['change_set_id']}:{data['version']}:{data['step']}"
    action = f"ladder_{data['step']}"
    link = o.change_set(data["change_set_id"], data["target_asset"])
    cs = load_change_set(o.instance, data["change_set_id"], data["version"])
    asks = data["step"] in ("remind", "escalate") and cs is not None and (
        data["kind"] == "request" or "halted" in data.get("text", ""))
    tasks = []
    if o.slack is not None:
        def message(t: Task) -> Any:
            if asks:
                return request_message(o, cs, t.ak, header=data["text"])
            return SlackMessage(text=f"{data['text']} {link}", blocks=[{"type": "section", "text": {
                "type": "mrkdwn", "text": f"*{data['text']}*\n<{link}|Open change set {data['change_set_id']}>"}}])
        for email in data.get("to") or []:
            tasks.append((f"slack_dm:{email}", action, rid, lambda t, email=email: _dm(
                t, o, email, message(t), change_set_id=data["change_set_id"], version=data["version"],
                asset_key=data["target_asset"], what=f"ladder step {data['step']}")))
        channel = data.get("slack_channel") or o.slack_channel
        if channel or o.slack.default_channel:
            def post(t: Task) -> None:
                resp = t.step("message", message_step(o.slack, message(t), channel, t.record_ts), last=True)
                t.finish(True, f"ladder step {data['step']} of {data['change_set_id']} posted in the channel",
                         change_set_id=data["change_set_id"], ts=str(resp.get("ts")))
            tasks.append(("slack", action, rid, post))
    if o.email is not None and (data.get("to") or data.get("cc")):
        tasks.append(("email", action, rid, lambda t: _email(
            t, o, ladder_email(data, cs, review_url=link, asset_url=o.asset(data["target_asset"]), sender=o.email.sender),
            what=f"ladder step {data['step']} of {data['change_set_id']}", change_set_id=data["change_set_id"])))
    return tasks


def _receipt_tasks(o: Outlets, rec: _Record) -> list:
    from dw_dagster.core.records import load_change_set
    from dw_dagster.integrations.mail import receipt_email
    from dw_dagster.integrations.notify_tasks import next_steps, verdict_for

    if o.email is None:
        return []
    r = Receipt.model_validate(rec.data)
    inc = _incident(o.instance, rec.asset_key, r.incident_id)
    if inc is None:
        return []
    try:
        cs = load_change_set(o.instance, r.change_set_id, r.change_set_version)
    except Exception:  # noqa: BLE001 - a tampered record: the receipt's own approver is told
        cs = None
    people = _approvers(o, cs) if cs is not None else [r.approver]
    v = verdict_for(o, r)
    mail = receipt_email(v, inc.id, to=people, review_url=o.incident(inc.id, inc.asset_key),
                         asset_url=o.asset(inc.asset_key), sender=o.email.sender,
                         next_steps=[] if v.resolves else next_steps(v))
    return [("email", "receipt", f"receipt:{r.id}", lambda t: _email(t, o, mail, what=f"receipt {r.id} ({v.headline})",
                                                                     incident_id=inc.id, verdict=v.kind))]


def people_tasks(o: Outlets, rec: _Record) -> list:
    """The Slack DM and email tasks of one record (see the module docstring)."""
    if rec.kind == "change_set":
        return _change_set_tasks(o, rec)
    if rec.kind == "escalation":
        return _ladder_tasks(o, rec)
    if rec.kind == "receipt":
        return _receipt_tasks(o, rec)
    return []


__all__ = ["people_tasks", "record_unreachable", "unreachable"]
