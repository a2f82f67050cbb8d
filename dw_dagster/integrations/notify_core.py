"""The machinery under the notification sensor: records to tell, tasks and their steps, exactly once.

A *task* is one (record, channel, action): a page trigger for an incident, a Slack DM of a change
set to one approver, an email of a ladder step to one person, a Jira comment of a diagnosis. It
has one or more *steps*, one side effect each, every one recorded on the asset the moment it
succeeds (``dw/notification_step``; the last inside the task's ``dw/notification``), so a task
retried on a later tick skips what its records show done. Each step that posts something
non-idempotent carries the marker :func:`step_ref` (``dw:<task id>:<step>``) the vendor clients
look up before they ever post again (:func:`dw_dagster.core.http.post_once`).

:class:`Outlets` holds what the tasks talk to (the vendor resources, the links, the domains) for
one tick of :func:`~dw_dagster.integrations.notifications.build_notification_sensor`.
"""

import datetime as dt
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import Domain, Domains
from dw_dagster.core.links import asset_page, change_set_page, incident_page
from dw_dagster.core.models import Incident

NOTIFICATION_KEY = c.NOTIFICATION_KEY
NOTIFICATION_STEP_KEY = c.NOTIFICATION_STEP_KEY
#: How much earlier than its record a Slack message's ``ts`` may be (clock skew), seconds: the
#: bound of the ``conversations.history`` read that looks for an earlier attempt.
SLACK_CLOCK_SKEW_S = 300.0
_KINDS = {c.INCIDENT_KEY: "incident", c.DIAGNOSIS_KEY: "diagnosis", c.CHANGE_SET_KEY: "change_set", c.RECEIPT_KEY: "receipt",
          c.ESCALATION_KEY: "escalation", c.BI_ESCALATION_KEY: "bi_escalation"}


def asset_url(dagster_url: str, asset_key: Sequence[str]) -> str:
    """The asset's page in the Dagster UI (``<dagster_url>/assets/<path>``), where receipts show."""
    return asset_page(dagster_url, asset_key)


DEFAULT_SENSOR_NAME = c.NOTIFICATION_SENSOR


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


class Task:
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

    #: the review site every record's description links to (set by the sensor; None: ``$DW_REVIEW_URL``)
    review_url: str | None = None

    def _write(self, key: str, description: str, payload: dict) -> None:
        from dw_dagster.core.links import with_link

        cs, inc = payload.get("change_set_id"), payload.get("incident_id")
        url = ((change_set_page(cs, self.review_url) if cs else None)
               or (incident_page(inc, self.review_url) if inc else None))
        self.instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=self.ak, description=with_link(description, url), metadata={key: dg.MetadataValue.json(payload)}))


@dataclass
class Outlets:
    """What one tick's tasks talk to, and the links every message carries.

    Attributes:
        instance: the Dagster instance.
        dagster_url: the Dagster UI (asset pages, the Launchpad).
        review_url: the review site (``dw-dagster approvals serve``), for the change set's and the
            incident's own pages; None when there is none (links then go to the asset page).
        location: the code location of the approval job.
        lightup, pager, slack, email: the resources, or None.
        tickets: ticket systems (Jira, ServiceNow resources), each told in its own channel.
        slack_channel: the channel for requests when the domain names none.
        domains: the domains as they are now (approvers, escalation approvers, channels), or None.
        mask: applied to sample values before they leave the warehouse.
    """

    instance: dg.DagsterInstance
    dagster_url: str
    review_url: str | None = None
    location: str = "dw_dagster"
    lightup: Any = None
    pager: Any = None
    slack: Any = None
    email: Any = None
    tickets: list[Any] = field(default_factory=list)
    slack_channel: str | None = None
    domains: Domains | None = None
    lightup_close: bool = True
    recheck_timeout_s: float = 300.0
    mask: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def asset(self, key: Sequence[str]) -> str:
        return asset_url(self.dagster_url, key)

    def change_set(self, cs_id: str, asset_key: Sequence[str]) -> str:
        """The change set's own page on the review site, else the asset's page."""
        return change_set_page(cs_id, self.review_url) if self.review_url else self.asset(asset_key)

    def incident(self, incident_id: str, asset_key: Sequence[str]) -> str:
        """The incident's own page on the review site, else the asset's page."""
        return incident_page(incident_id, self.review_url) if self.review_url else self.asset(asset_key)

    def links(self, *, asset_key: Sequence[str], change_set_id: str | None = None,
              incident_id: str | None = None) -> list[tuple[str, str]]:
        """``(href, text)`` pairs: the record's page on the review site (when there is one), then the asset."""
        out = []
        if self.review_url and change_set_id:
            out.append((change_set_page(change_set_id, self.review_url), f"change set {change_set_id}"))
        if self.review_url and incident_id:
            out.append((incident_page(incident_id, self.review_url), f"incident {incident_id}"))
        out.append((self.asset(asset_key), "asset in Dagster"))
        return out

    def domain(self, name: str) -> Domain | None:
        if self.domains is None:
            return None
        try:
            return self.domains.get(name)
        except KeyError:
            return None


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



_Task = Task  # the name the task functions used before the split
