"""Tell people and tools what dw_dagster found and did: Lightup comments, the page, Slack.

:func:`build_notification_sensor` follows dw_dagster's records in the event log (by storage id,
with the never-lose/never-repeat cursor of :mod:`dw_dagster.core.cursors`) and, once per record and
channel:

- **incident** → the page is triggered (PagerDuty Events v2 / Opsgenie; ``dedup_key``/alias from
  the incident id, so Lightup's own PagerDuty integration and dw_dagster land on one page);
- **diagnosis** → a comment on the Lightup incident with the cause and evidence counts, and a note on
  the page with the cause and the blast radius;
- **change set** → a Slack message to the domain's approvers: summary, blast radius, expiry, the
  Launchpad link and the ``dw-dagster approve`` command;
- **receipt** (on the incident's asset), by its real outcome
  (:func:`~dw_dagster.integrations.outcomes.repair_verdict`):

  - *applied and verified*: Lightup re-collects both sides of the compare metric (``POST
    .../sources/{uuid}/trigger``) and the gap is re-read from the datapoints; the result and the
    receipt link are commented on the incident, which is closed (status 5) when the gap is 0; the
    page gets the receipt link and is resolved; Slack is told "resolved".
  - *anything else* (applied but not verified, failed at a stage, halted, undone): nothing is
    resolved or closed. The page is re-triggered (the same ``dedup_key``/alias: the open page gets
    another alert, a resolved one opens again) with the outcome and the failing checks, their SQL
    and values in its details, then noted with the same and what happens next; Lightup's incident
    gets that as a comment and stays open; Slack is told what happened, never "resolved".

Each (record, channel, action) is a *task* with one or more *steps*, one side effect each
(receipt → Lightup: ``recheck``, ``comment``, ``close``; page: ``trigger`` then ``note``;
PagerDuty resolve: ``note`` then ``resolve``; a repair that did not verify → page: ``trigger`` then
``note``; Slack: ``message``). A task's outcome is an
``AssetObservation`` with ``dw/notification`` metadata on the asset (channel, action, ok, detail),
which is what the demo and the receipts read back; one channel's failure is retried on the next
tick without repeating the channels that succeeded.

**Exactly once.** Every step is recorded on the asset the moment it succeeds, before the next
step of the task runs: written straight to the instance (not returned with the tick, which a
timed-out or crashed evaluation would lose) as a ``dw/notification_step`` observation, the last
step inside the task's ``dw/notification``. A task retried on a later tick skips the steps its
records show done, so a failure of a later step (Lightup's close) never repeats an earlier one
(the comment). Each step that posts something non-idempotent carries a stable idempotency marker
:func:`step_ref` (``dw:<task id>:<step>``, the task id a hash of the record id, channel and
action): in the text of PagerDuty and Opsgenie notes and Lightup comments, in the metadata of
Slack messages. The vendor clients never re-send such a POST blindly; after a timeout or a 5xx,
and on every retry of the task, they look the marker up first (:func:`dw_dagster.core.http.post_once`)
so a request the vendor applied while its answer was lost is not applied twice. PagerDuty Events
v2 (``dedup_key``) and Opsgenie create/close by ``alias`` are idempotent by design.
"""

import datetime as dt
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.cursors import UpdatedTsCursor
from dw_dagster.core.models import ChangeSet, Diagnosis, Incident, Receipt
from dw_dagster.integrations.outcomes import RepairVerdict, outcome_lines, repair_verdict

NOTIFICATION_KEY = c.NOTIFICATION_KEY
NOTIFICATION_STEP_KEY = c.NOTIFICATION_STEP_KEY
#: How much earlier than its record a Slack message's ``ts`` may be (clock skew), seconds: the
#: bound of the ``conversations.history`` read that looks for an earlier attempt.
SLACK_CLOCK_SKEW_S = 300.0
_KINDS = {c.INCIDENT_KEY: "incident", c.DIAGNOSIS_KEY: "diagnosis", c.CHANGE_SET_KEY: "change_set", c.RECEIPT_KEY: "receipt"}


def asset_url(dagster_url: str, asset_key: Sequence[str]) -> str:
    """The asset's page in the Dagster UI (``<dagster_url>/assets/<path>``), where receipts show."""
    return f"{dagster_url.rstrip('/')}/assets/{'/'.join(asset_key)}"


DEFAULT_SENSOR_NAME = "dw_notification_sensor"


def task_id_for(record_id: str, channel: str, action: str, sensor: str = DEFAULT_SENSOR_NAME) -> str:
    """The stable id of one notification task: 16 hex of SHA-256 over (record id, channel, action).

    Args:
        record_id: the record's kind and id, e.g. ``diagnosis:dg-1`` (a change set adds its version).
        channel: ``pager``, ``lightup`` or ``slack``.
        action: what the task does, e.g. ``annotate``.
        sensor: the notification sensor's name; a second sensor in the same instance (say, one for
            PagerDuty and one for Opsgenie) keeps tasks of its own.
    """
    parts = (record_id, channel, action) if sensor == DEFAULT_SENSOR_NAME else (record_id, channel, action, sensor)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def step_ref(task_id: str, step: str) -> str:
    """The idempotency marker of one step: ``dw:<task id>:<step>`` (at most 40 characters or so)."""
    return f"dw:{task_id}:{step}"


@dataclass(frozen=True)
class _Record:
    storage_id: int
    timestamp: float
    asset_key: dg.AssetKey
    kind: str
    data: dict


def _scan(instance: dg.DagsterInstance, after: int | None) -> tuple[list[_Record], dict[str, list[dict]]]:
    """Records after ``after`` (oldest first) and the notification entries there, by task id.

    A task's entries are written after its record, so reading from the watermark finds them all.
    """
    out: list[_Record] = []
    ledger: dict[str, list[dict]] = {}
    for ak in instance.get_asset_keys():
        cursor = None
        while True:
            res = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=ak, after_storage_id=after),
                                              limit=500, cursor=cursor, ascending=True)
            for rec in res.records:
                md = rec.asset_observation.metadata if rec.asset_observation else {}
                for key, kind in _KINDS.items():
                    data = records.metadata_json(md, key)
                    if data is not None:
                        out.append(_Record(rec.storage_id, float(rec.timestamp), ak, kind, data))
                for key in (NOTIFICATION_KEY, NOTIFICATION_STEP_KEY):
                    entry = records.metadata_json(md, key)
                    if isinstance(entry, dict) and isinstance(entry.get("task"), str):
                        ledger.setdefault(entry["task"], []).append({**entry, "_key": key})
            if not res.has_more:
                break
            cursor = res.cursor
    return sorted(out, key=lambda r: r.storage_id), ledger


def _new_records(instance: dg.DagsterInstance, after: int | None) -> list[tuple[int, dg.AssetKey, str, dict]]:
    return [(r.storage_id, r.asset_key, r.kind, r.data) for r in _scan(instance, after)[0]]


def _incident(instance: dg.DagsterInstance, asset_key: dg.AssetKey, incident_id: str) -> Incident | None:
    """The incident from the records, else from its ``dw/incident`` observation on the asset."""
    found = next((i for i in records.incidents(instance, [asset_key]) if i.id == incident_id), None)
    if found is not None:
        return found
    for rec in records.iter_observations(instance, asset_key):
        data = records.metadata_json(rec.asset_observation.metadata if rec.asset_observation else {}, c.INCIDENT_KEY)
        if isinstance(data, dict) and data.get("id") == incident_id:
            return Incident.model_validate(data)
    return None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


class _Task:
    """One (record, channel, action) and its steps, each recorded on the asset as soon as it is done.

    ``steps`` holds what earlier attempts recorded (step → data); :meth:`step` skips those. A step
    runs as ``run(ref, check_first)``: ``ref`` its idempotency marker, ``check_first`` True when an
    earlier attempt of the task exists (look the marker up before posting), else None (the vendor
    client's default).
    """

    def __init__(self, instance: dg.DagsterInstance, ak: dg.AssetKey, channel: str, action: str, record_id: str,
                 record_ts: float, entries: list[dict], sensor: str = DEFAULT_SENSOR_NAME) -> None:
        self.instance, self.ak, self.channel, self.action = instance, ak, channel, action
        self.record_id, self.record_ts = record_id, record_ts
        self.id = task_id_for(record_id, channel, action, sensor)
        self.attempted = bool(entries)
        self.complete = False
        self.steps: dict[str, dict] = {}
        self._last: str | None = None
        for e in entries:
            if isinstance(e.get("steps"), dict):
                self.steps.update({str(k): v if isinstance(v, dict) else {} for k, v in e["steps"].items()})
            if e.get("_key") == NOTIFICATION_STEP_KEY and isinstance(e.get("step"), str):
                self.steps[e["step"]] = e.get("data") if isinstance(e.get("data"), dict) else {}
            if e.get("_key") == NOTIFICATION_KEY and e.get("complete") is True:
                self.complete = True

    def step(self, name: str, run: Callable[[str, bool | None], dict | None], *, last: bool = False) -> dict:
        """Run one step unless it is recorded done; record it at once (the last one in :meth:`finish`)."""
        if name in self.steps:
            return self.steps[name]
        ref = step_ref(self.id, name)
        data = dict(run(ref, True if self.attempted else None) or {})
        self.steps[name] = data
        if last:
            self._last = name
        else:
            self._write(NOTIFICATION_STEP_KEY, f"{self.channel} {self.action}: {name} done ({ref})",
                        {"channel": self.channel, "action": self.action, "task": self.id, "record": self.record_id,
                         "step": name, "ref": ref, "data": data, "at": _now()})
        return data

    def finish(self, ok: bool, detail: str, **extra: Any) -> None:
        """Record the task's outcome (``dw/notification``), which also records its last step."""
        self._write(NOTIFICATION_KEY, f"{self.channel} {self.action}: {detail}",
                    {"channel": self.channel, "action": self.action, "ok": ok, "detail": detail[:2000], **extra,
                     "task": self.id, "record": self.record_id, "steps": self.steps, "complete": True, "at": _now()})
        self._last = None

    def fail(self, kind: str, error: Exception) -> None:
        """Record a failure (``dw/notification``, ``ok`` false, action = the record kind), with the steps done."""
        detail = f"{type(error).__name__}: {error}"
        self._write(NOTIFICATION_KEY, f"{self.channel} {kind}: {detail}",
                    {"channel": self.channel, "action": kind, "ok": False, "detail": detail[:2000], "task": self.id,
                     "record": self.record_id, "steps": self.steps, "complete": False, "at": _now()})

    def _write(self, key: str, description: str, payload: dict) -> None:
        self.instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=self.ak, description=description[:1000], metadata={key: dg.MetadataValue.json(payload)}))


def build_notification_sensor(
    *,
    dagster_url: str = "http://localhost:3000",
    location_name: str = "dw_dagster",
    lightup_resource_key: str | None = None,
    pager_resource_key: str | None = None,
    slack_resource_key: str | None = None,
    slack_channel: str | None = None,
    lightup_close_when_verified: bool = True,
    recheck_timeout_s: float = 300.0,
    start_from: str = "latest",
    name: str = DEFAULT_SENSOR_NAME,
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor that carries dw_dagster's records to Lightup, the pager and Slack (module docstring).

    Args:
        dagster_url: base URL of the Dagster UI, for receipt and Launchpad links.
        location_name: the code location holding the approval job (for the Launchpad link).
        lightup_resource_key: key of a :class:`~dw_dagster.integrations.lightup.LightupResource`, or None.
        pager_resource_key: key of a :class:`~dw_dagster.integrations.pagerduty.PagerDutyResource` or
            :class:`~dw_dagster.integrations.opsgenie.OpsgenieResource`, or None.
        slack_resource_key: key of a :class:`~dw_dagster.integrations.slack.SlackResource`, or None.
        slack_channel: channel for approval requests (default: the resource's channel). Give a
            channel ID (``C...``): looking for an earlier attempt's message needs it.
        lightup_close_when_verified: set the Lightup incident to CLOSED (5) when the re-read gap is 0.
        recheck_timeout_s: seconds to wait for Lightup's triggered collection.
        start_from: with no cursor (a new sensor, or an unreadable cursor), ``"latest"`` starts after
            the records already in the instance (nothing old is re-sent to people);
            ``"beginning"`` tells about every record in the instance.

    Returns:
        A ``SensorDefinition`` (STOPPED by default) whose cursor is the event-log storage id
        watermark plus the (record, channel) pairs already done. Its ticks return no asset events:
        each step and outcome is written to the instance as it happens; the tick's skip reason
        says what was told and what failed.
    """
    keys = {k for k in (lightup_resource_key, pager_resource_key, slack_resource_key) if k}
    if start_from not in ("latest", "beginning"):
        raise ValueError(f"start_from must be 'latest' or 'beginning', got {start_from!r}")

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               required_resource_keys=keys,
               description="Comments on Lightup incidents, annotates and resolves the page, and asks approvers "
               "in Slack, once per dw_dagster record.")
    def _sensor(context: dg.SensorEvaluationContext):
        instance = context.instance
        cursor = UpdatedTsCursor.loads(context.cursor, warn=context.log.warning)
        if cursor.updated_ts is None and start_from == "latest":
            existing = _new_records(instance, None)
            last = max((r[0] for r in existing), default=0)
            cursor.advance([(f"{last + 1}:start", float(last + 1))], [])  # the next read starts after `last`
            return dg.SensorResult(skip_reason=f"starting after the {len(existing)} record(s) already in the instance "
                                               f"(storage id {last}); only new ones are told", cursor=cursor.dumps())
        lightup = getattr(context.resources, lightup_resource_key) if lightup_resource_key else None
        pager = getattr(context.resources, pager_resource_key) if pager_resource_key else None
        slack = getattr(context.resources, slack_resource_key) if slack_resource_key else None
        # re-read inclusively from the watermark (a failed record sits at it); done tasks are skipped
        after = int(cursor.updated_ts) - 1 if cursor.updated_ts is not None else None
        done, failed, told, problems = [], [], [], []
        scanned, ledger = _scan(instance, after)

        for rec in scanned:
            storage_id, ak, kind, data = rec.storage_id, rec.asset_key, rec.kind, rec.data
            tasks: list[tuple[str, str, str, Callable[[_Task], None]]] = []  # channel, action, record id, run
            if kind == "incident":
                inc = Incident.model_validate(data)
                if pager is not None:
                    tasks.append(("pager", "trigger", f"incident:{inc.id}",
                                  lambda t, inc=inc: _page(t, pager, inc, dagster_url)))
            elif kind == "diagnosis":
                d = Diagnosis.model_validate(data)
                inc = _incident(instance, ak, d.incident_id)
                if lightup is not None and inc is not None and inc.source == "lightup" and inc.external_id:
                    tasks.append(("lightup", "comment", f"diagnosis:{d.id}",
                                  lambda t, d=d, inc=inc: _lightup_comment(t, lightup, inc, d, dagster_url)))
                if pager is not None and inc is not None:
                    tasks.append(("pager", "annotate", f"diagnosis:{d.id}",
                                  lambda t, d=d, inc=inc: _annotate(t, pager, inc, d, dagster_url)))
            elif kind == "change_set":
                cs = ChangeSet.model_validate(data)
                if slack is not None:
                    tasks.append(("slack", "approval_request", f"change_set:{cs.id}:{cs.version}",
                                  lambda t, cs=cs: _ask_approval(t, instance, slack, cs, slack_channel, dagster_url,
                                                                 location_name)))
            elif kind == "receipt":
                r = Receipt.model_validate(data)
                inc = _incident(instance, ak, r.incident_id)
                if inc is None:  # receipts on downstream assets: the incident's own asset speaks for them
                    continue
                receipts = [x for x in records.receipts(instance) if x.change_set_id == r.change_set_id]
                v = repair_verdict(r, receipts)
                # only a verified repair resolves anything; every other outcome keeps (or re-triggers) the page
                if lightup is not None and inc.source == "lightup" and inc.external_id:
                    tasks.append(("lightup", "verify", f"receipt:{r.id}", lambda t, r=r, inc=inc: _lightup_verify(
                        t, lightup, inc, r, dagster_url, lightup_close_when_verified, recheck_timeout_s))
                        if v.resolves else ("lightup", "outcome", f"receipt:{r.id}",
                                            lambda t, v=v, inc=inc: _lightup_outcome(t, lightup, inc, v, dagster_url)))
                if pager is not None:
                    tasks.append(("pager", "resolve", f"receipt:{r.id}",
                                  lambda t, inc=inc, v=v: _resolve(t, pager, inc, list(v.receipts), dagster_url))
                                 if v.resolves else ("pager", "retrigger", f"receipt:{r.id}",
                                                     lambda t, inc=inc, v=v: _retrigger(t, pager, inc, v, dagster_url)))
                if slack is not None:
                    tasks.append(("slack", "resolved" if v.resolves else "not_resolved", f"receipt:{r.id}",
                                  lambda t, inc=inc, v=v: _tell_outcome(t, slack, inc, v, dagster_url, slack_channel)))
            for channel, action, record_id, run in tasks:
                cursor_id = f"{storage_id}:{channel}"
                if cursor.is_handled(cursor_id, float(storage_id)):
                    continue
                tid = task_id_for(record_id, channel, action, name)
                task = _Task(instance, ak, channel, action, record_id, rec.timestamp, ledger.get(tid, []), name)
                if task.complete:  # done on a tick whose cursor was lost (timed out, crashed)
                    done.append((cursor_id, float(storage_id)))
                    continue
                try:
                    run(task)
                    done.append((cursor_id, float(storage_id)))
                    told.append(f"{channel} {action}")
                except Exception as e:  # noqa: BLE001 - retried next tick; other channels go on
                    failed.append((cursor_id, float(storage_id)))
                    problems.append(f"{kind} {storage_id} → {channel}: {type(e).__name__}: {e}")
                    context.log.error(f"notification {kind} {storage_id} → {channel} failed (retried next tick): {e}")
                    try:
                        task.fail(kind, e)
                    except Exception as record_error:  # noqa: BLE001 - the cursor still retries it
                        context.log.error(f"could not record that failure: {record_error}")
            if not tasks:
                done.append((f"{storage_id}:none", float(storage_id)))
        cursor.advance(done, failed)
        reason = "; ".join(([f"told: {', '.join(told)}"] if told else []) + problems) or "nothing to tell"
        return dg.SensorResult(skip_reason=reason[:1000], cursor=cursor.dumps())

    return _sensor


def _vendor(pager: Any) -> str:
    return type(pager).__name__.replace("Resource", "")


def _trigger(pager, inc: Incident, links: list[tuple[str, str]]) -> Callable[[str, bool | None], dict]:
    from dw_dagster.integrations.paging import page_incident

    # Events v2 dedup_key / Opsgenie alias: idempotent, a repeat lands on the same page
    return lambda ref, check_first: {"key": page_incident(pager, inc, links=links)}


def _page(task: _Task, pager, inc: Incident, dagster_url: str) -> None:
    links = [(asset_url(dagster_url, inc.asset_key), "asset in Dagster")]
    if inc.external_url:
        links.append((inc.external_url, "Lightup incident"))
    key = task.step("trigger", _trigger(pager, inc, links), last=True).get("key")
    task.finish(True, f"{_vendor(pager)} page {key} for incident {inc.id}", incident_id=inc.id)


def _annotate(task: _Task, pager, inc: Incident, d: Diagnosis, dagster_url: str) -> None:
    from dw_dagster.integrations.paging import diagnosis_note

    task.step("trigger", _trigger(pager, inc, [(asset_url(dagster_url, inc.asset_key), "asset in Dagster")]))
    text = diagnosis_note(d, links=[(asset_url(dagster_url, inc.asset_key), "diagnosis and change set")])

    def note(ref: str, check_first: bool | None) -> dict:
        pager.annotate(inc.id, text, ref=ref, check_first=check_first)
        return {"ref": ref}
    task.step("note", note, last=True)
    task.finish(True, f"{_vendor(pager)} page annotated with the cause and blast radius",
                incident_id=inc.id, diagnosis_id=d.id)


def _cause_text(d: Diagnosis) -> str:
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


def _lightup_comment(task: _Task, lightup, inc: Incident, d: Diagnosis, dagster_url: str) -> None:
    br = d.blast_radius
    text = (f"dw_dagster diagnosis {d.id}: {_cause_text(d)}\n"
            f"Blast radius: models {', '.join(m.name for m in br.models) or 'none'}; "
            f"exposures {', '.join(e.label or e.name for e in br.exposures) or 'none'}; "
            f"owners {', '.join(br.owners) or 'none'}.\n"
            f"Details: {asset_url(dagster_url, inc.asset_key)}")
    task.step("comment", _comment(lightup.get_client(), inc.external_id, text), last=True)
    task.finish(True, f"commented the cause on Lightup incident {inc.external_id}",
                incident_id=inc.id, diagnosis_id=d.id)


def _message(slack, msg, channel: str | None, record_ts: float) -> Callable[[str, bool | None], dict]:
    def run(ref: str, check_first: bool | None) -> dict:
        resp = slack.post_message(msg, channel=channel, ref=ref, check_first=check_first,
                                  oldest=record_ts - SLACK_CLOCK_SKEW_S)
        return {"ts": resp.get("ts"), "channel": resp.get("channel"), "deduplicated": bool(resp.get("deduplicated")),
                "ref": ref}
    return run


def _ask_approval(task: _Task, instance, slack, cs: ChangeSet, channel: str | None, dagster_url: str,
                  location: str) -> None:
    from dw_dagster.integrations.slack import approval_request_message

    diag = next((x for x in records.diagnoses(instance, [task.ak]) if x.id == cs.diagnosis_id), None)
    msg = approval_request_message(cs, diag.blast_radius if diag else None, dagster_url=dagster_url, location=location)
    resp = task.step("message", _message(slack, msg, channel, task.record_ts), last=True)
    task.finish(True, f"asked {', '.join(cs.approvers)} to approve change set {cs.id}",
                change_set_id=cs.id, ts=str(resp.get("ts")), channel_id=str(resp.get("channel")))


def _lightup_verify(task: _Task, lightup, inc: Incident, r: Receipt, dagster_url: str, close: bool,
                    timeout_s: float) -> None:
    client = lightup.get_client()

    def recheck(ref: str, check_first: bool | None) -> dict:
        raw = client.get_incident(inc.external_id)
        ctx = client.compare_context(raw)
        gaps = client.recheck(ctx, raw.get("slice") or {}, raw["start_ts"], raw["end_ts"], user_defined_id=r.id,
                              timeout_s=timeout_s)
        summary = "; ".join(f"{g.aggregation}: source {g.source_value:,.2f}, target {g.target_value:,.2f}, "
                            f"gap {g.gap:,.2f}" for g in gaps)
        return {"zero": all(g.gap == 0 for g in gaps), "summary": summary,
                "gaps": [{"aggregation": g.aggregation, "source": g.source_value, "target": g.target_value,
                          "gap": g.gap} for g in gaps]}

    data = task.step("recheck", recheck)
    zero, summary = bool(data.get("zero")), str(data.get("summary", ""))
    closing = zero and close
    text = (f"dw_dagster repaired this (change set {r.change_set_id}, approved by {r.approver}, partitions "
            f"{', '.join(r.partitions)}). Lightup re-collected both tables: {summary}. "
            f"{'Compare gap is 0.' if zero else 'The compare gap is NOT 0.'} Receipt: {asset_url(dagster_url, inc.asset_key)}")
    task.step("comment", _comment(client, inc.external_id, text), last=not closing)
    if closing:
        def close_incident(ref: str, check_first: bool | None) -> dict:
            client.set_incident_status(inc.external_id, 5)  # PATCH status: idempotent
            return {"status": 5}
        task.step("close", close_incident, last=True)
    task.finish(zero, f"Lightup re-collection: {summary}", incident_id=inc.id, gap_zero=zero, closed=closing)


def _resolve(task: _Task, pager, inc: Incident, receipts: list[Receipt], dagster_url: str) -> None:
    from dw_dagster.integrations.paging import resolution_note

    url = asset_url(dagster_url, inc.asset_key)
    text = resolution_note(url, receipts)
    if hasattr(pager, "resolution_steps"):
        steps = pager.resolution_steps(inc.id, receipt_url=url, note=text)
    else:  # another Pager: one step
        steps = [("resolve", lambda ref, check_first: pager.resolve(inc.id, receipt_url=url, note=text) or {})]
    for i, (name, run) in enumerate(steps):
        task.step(name, run, last=i == len(steps) - 1)
    task.finish(True, f"{_vendor(pager)} page resolved with the receipt link {url}", incident_id=inc.id)


def _next_steps(v: RepairVerdict) -> list[str]:
    """What a person can do after an outcome that resolves nothing."""
    cs = v.receipt.change_set_id
    if v.kind == "undo":
        return ["the fix was taken back and the incident is open again", "re-propose the change once its cause is fixed"]
    steps = [f"a listed approver may undo it (`dw-dagster undo {cs}`) or approve a new version"]
    if v.kind == "halted":
        steps.insert(0, "the remaining stages did not run; a listed approver may approve to continue")
    return steps + ["unanswered, it is reminded and escalated as the domain's ladder says"]


def _retrigger(task: _Task, pager, inc: Incident, v: RepairVerdict, dagster_url: str) -> None:
    """A repair that did not prove itself: the page is re-triggered (or kept) with what failed, then noted."""
    from dw_dagster.integrations.paging import clip

    url = asset_url(dagster_url, inc.asset_key)
    summary = clip(f"[dw_dagster] {'/'.join(inc.asset_key)}: {v.headline} for incident {inc.id}: {v.receipt.outcome}", 1000)
    details = {"incident_id": inc.id, "change_set_id": v.receipt.change_set_id, "receipt_id": v.receipt.id,
               "outcome": v.receipt.outcome, "verified": v.receipt.verified, "verdict": v.kind,
               "failing_checks": [{"check": f.check, "asset": f.asset, "sql": f.sql, "values": f.values} for f in v.checks]}
    links = [(url, "receipt in Dagster")]

    def trigger(ref: str, check_first: bool | None) -> dict:
        return {"key": pager.trigger(inc.id, summary, severity="error", details=details, links=links)}
    task.step("trigger", trigger)
    text = "\n".join(outcome_lines(v, inc.id, next_steps=_next_steps(v)) + [f"Receipt: {url}"])

    def note(ref: str, check_first: bool | None) -> dict:
        pager.annotate(inc.id, text, ref=ref, check_first=check_first)
        return {"ref": ref}
    task.step("note", note, last=True)
    task.finish(True, f"{_vendor(pager)} page kept open: {v.headline} ({clip(v.receipt.outcome, 200)})",
                incident_id=inc.id, verdict=v.kind, verified=v.receipt.verified)


def _lightup_outcome(task: _Task, lightup, inc: Incident, v: RepairVerdict, dagster_url: str) -> None:
    """A repair that did not prove itself: Lightup's incident gets the outcome as a comment and stays open."""
    text = "\n".join(outcome_lines(v, inc.id, next_steps=["this Lightup incident stays open"])
                     + [f"Receipt: {asset_url(dagster_url, inc.asset_key)}"])
    task.step("comment", _comment(lightup.get_client(), inc.external_id, text), last=True)
    task.finish(True, f"commented on Lightup incident {inc.external_id}: {v.headline}; left open",
                incident_id=inc.id, verdict=v.kind, closed=False)


def _tell_outcome(task: _Task, slack, inc: Incident, v: RepairVerdict, dagster_url: str, channel: str | None) -> None:
    from dw_dagster.integrations.slack import outcome_message, resolved_message

    url = asset_url(dagster_url, inc.asset_key)
    msg = (resolved_message(inc.id, list(v.receipts), url) if v.resolves
           else outcome_message(v, inc.id, url, next_steps=_next_steps(v)))
    task.step("message", _message(slack, msg, channel, task.record_ts), last=True)
    task.finish(True, f"told Slack incident {inc.id}: {v.headline}", incident_id=inc.id, verdict=v.kind)


def notifications(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey] | None = None,
                  *, key: str = NOTIFICATION_KEY) -> list[dict]:
    """Recorded notifications (``dw/notification``, one per task outcome), oldest first.

    Args:
        instance: the Dagster instance.
        asset_keys: only these assets (default: all).
        key: :data:`NOTIFICATION_STEP_KEY` for the intermediate steps instead.
    """
    keys = asset_keys if asset_keys is not None else instance.get_asset_keys()
    out = []
    for ak in keys:
        for rec in records.iter_observations(instance, ak, newest_first=False):
            md = rec.asset_observation.metadata if rec.asset_observation else {}
            data = records.metadata_json(md, key)
            if data is not None:
                out.append({**data, "asset_key": list(ak.path), "storage_id": rec.storage_id})
    return sorted(out, key=lambda d: d["storage_id"])

