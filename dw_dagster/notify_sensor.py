"""Tell people and tools what dw_dagster found and did: Lightup comments, the page, Slack.

:func:`build_notification_sensor` follows dw_dagster's records in the event log (by storage id,
with the never-lose/never-repeat cursor of :mod:`dw_dagster.cursors`) and, once per record and
channel:

- **incident** → the page is triggered (PagerDuty Events v2 / Opsgenie; ``dedup_key``/alias from
  the incident id, so Lightup's own PagerDuty integration and dw_dagster land on one page);
- **diagnosis** → a comment on the Lightup incident with the cause and evidence counts, and a note on
  the page with the cause and the blast radius;
- **change set** → a Slack message to the domain's approvers: summary, blast radius, expiry, the
  Launchpad link and the ``dw-dagster approve`` command;
- **receipt** (on the incident's asset) → Lightup re-collects both sides of the compare metric
  (``POST .../sources/{uuid}/trigger``) and the gap is re-read from the datapoints; the result and
  the receipt link are commented on the incident, which is closed (status 5) when the gap is 0; the
  page gets the receipt link and is resolved; Slack is told.

Each side effect is recorded as an ``AssetObservation`` with ``dw/notification`` metadata on the
asset (channel, action, outcome), which is what the demo and the receipts read back. One
channel's failure is retried on the next tick without repeating the channels that succeeded.
"""

import datetime as dt
from collections.abc import Sequence
from typing import Any

import dagster as dg

from dw_dagster import constants as c
from dw_dagster.cursors import UpdatedTsCursor
from dw_dagster.models import ChangeSet, Diagnosis, Incident, Receipt
from dw_dagster.remediation import records

NOTIFICATION_KEY = "dw/notification"
_KINDS = {c.INCIDENT_KEY: "incident", c.DIAGNOSIS_KEY: "diagnosis", c.CHANGE_SET_KEY: "change_set", c.RECEIPT_KEY: "receipt"}


def asset_url(dagster_url: str, asset_key: Sequence[str]) -> str:
    """The asset's page in the Dagster UI (``<dagster_url>/assets/<path>``), where receipts show."""
    return f"{dagster_url.rstrip('/')}/assets/{'/'.join(asset_key)}"


def _new_records(instance: dg.DagsterInstance, after: int | None) -> list[tuple[int, dg.AssetKey, str, dict]]:
    out = []
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
                        out.append((rec.storage_id, ak, kind, data))
            if not res.has_more:
                break
            cursor = res.cursor
    return sorted(out, key=lambda r: r[0])


def _incident(instance: dg.DagsterInstance, asset_key: dg.AssetKey, incident_id: str) -> Incident | None:
    return next((i for i in records.incidents(instance, [asset_key]) if i.id == incident_id), None)


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
    name: str = "dw_notification_sensor",
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor that carries dw_dagster's records to Lightup, the pager and Slack (module docstring).

    Args:
        dagster_url: base URL of the Dagster UI, for receipt and Launchpad links.
        location_name: the code location holding the approval job (for the Launchpad link).
        lightup_resource_key: key of a :class:`~dw_dagster.lightup.LightupResource`, or None.
        pager_resource_key: key of a :class:`~dw_dagster.paging.PagerDutyResource` or
            :class:`~dw_dagster.paging.OpsgenieResource`, or None.
        slack_resource_key: key of a :class:`~dw_dagster.slack.SlackResource`, or None.
        slack_channel: channel for approval requests (default: the resource's channel).
        lightup_close_when_verified: set the Lightup incident to CLOSED (5) when the re-read gap is 0.
        recheck_timeout_s: seconds to wait for Lightup's triggered collection.
        start_from: with no cursor (a new sensor, or an unreadable cursor), ``"latest"`` starts after
            the records already in the instance (nothing old is re-sent to people);
            ``"beginning"`` tells about every record in the instance.

    Returns:
        A ``SensorDefinition`` (STOPPED by default) whose cursor is the event-log storage id
        watermark plus the (record, channel) pairs already done.
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
        done, failed, events, problems = [], [], [], []

        def note(ak: dg.AssetKey, channel: str, action: str, ok: bool, detail: str, **extra: Any) -> None:
            events.append(dg.AssetObservation(
                asset_key=ak, description=f"{channel} {action}: {detail}"[:1000],
                metadata={NOTIFICATION_KEY: dg.MetadataValue.json(
                    {"channel": channel, "action": action, "ok": ok, "detail": detail[:2000], **extra,
                     "at": dt.datetime.now(dt.timezone.utc).isoformat()})}))

        for storage_id, ak, kind, data in _new_records(instance, after):
            tasks: list[tuple[str, Any]] = []
            if kind == "incident":
                inc = Incident.model_validate(data)
                if pager is not None:
                    tasks.append(("pager", lambda inc=inc: _page(pager, inc, dagster_url, note, ak)))
            elif kind == "diagnosis":
                d = Diagnosis.model_validate(data)
                inc = _incident(instance, ak, d.incident_id)
                if lightup is not None and inc is not None and inc.source == "lightup" and inc.external_id:
                    tasks.append(("lightup", lambda d=d, inc=inc: _lightup_comment(lightup, inc, d, dagster_url, note, ak)))
                if pager is not None and inc is not None:
                    tasks.append(("pager", lambda d=d, inc=inc: _annotate(pager, inc, d, dagster_url, note, ak)))
            elif kind == "change_set":
                cs = ChangeSet.model_validate(data)
                if slack is not None:
                    tasks.append(("slack", lambda cs=cs: _ask_approval(instance, slack, cs, slack_channel, dagster_url,
                                                                      location_name, note, ak)))
            elif kind == "receipt":
                r = Receipt.model_validate(data)
                inc = _incident(instance, ak, r.incident_id)
                if inc is None:  # receipts on downstream assets: the incident's own asset speaks for them
                    continue
                receipts = [x for x in records.receipts(instance) if x.change_set_id == r.change_set_id]
                if lightup is not None and inc.source == "lightup" and inc.external_id:
                    tasks.append(("lightup", lambda r=r, inc=inc: _lightup_verify(
                        lightup, inc, r, dagster_url, note, ak, lightup_close_when_verified, recheck_timeout_s)))
                if pager is not None:
                    tasks.append(("pager", lambda inc=inc, receipts=receipts: _resolve(pager, inc, receipts, dagster_url, note, ak)))
                if slack is not None:
                    tasks.append(("slack", lambda inc=inc, receipts=receipts: _tell_resolved(slack, inc, receipts, dagster_url, slack_channel, note, ak)))
            for channel, run in tasks:
                task_id = f"{storage_id}:{channel}"
                if cursor.is_handled(task_id, float(storage_id)):
                    continue
                try:
                    run()
                    done.append((task_id, float(storage_id)))
                except Exception as e:  # noqa: BLE001 - retried next tick; other channels go on
                    failed.append((task_id, float(storage_id)))
                    problems.append(f"{kind} {storage_id} → {channel}: {type(e).__name__}: {e}")
                    context.log.error(f"notification {kind} {storage_id} → {channel} failed (retried next tick): {e}")
                    note(ak, channel, kind, False, f"{type(e).__name__}: {e}")
            if not tasks:
                done.append((f"{storage_id}:none", float(storage_id)))
        cursor.advance(done, failed)
        if not events:
            return dg.SensorResult(skip_reason="; ".join(problems)[:1000] or "nothing to tell", cursor=cursor.dumps())
        return dg.SensorResult(asset_events=events, cursor=cursor.dumps())

    return _sensor


def _vendor(pager: Any) -> str:
    return type(pager).__name__.replace("Resource", "")


def _page(pager, inc: Incident, dagster_url: str, note, ak) -> None:
    from dw_dagster.paging import page_incident

    links = [(asset_url(dagster_url, inc.asset_key), "asset in Dagster")]
    if inc.external_url:
        links.append((inc.external_url, "Lightup incident"))
    key = page_incident(pager, inc, links=links)
    note(ak, "pager", "trigger", True, f"{_vendor(pager)} page {key} for incident {inc.id}", incident_id=inc.id)


def _annotate(pager, inc: Incident, d: Diagnosis, dagster_url: str, note, ak) -> None:
    from dw_dagster.paging import diagnosis_note, page_incident

    page_incident(pager, inc, links=[(asset_url(dagster_url, inc.asset_key), "asset in Dagster")])  # idempotent
    text = diagnosis_note(d, links=[(asset_url(dagster_url, inc.asset_key), "diagnosis and change set")])
    pager.annotate(inc.id, text)
    note(ak, "pager", "annotate", True, f"{_vendor(pager)} page annotated with the cause and blast radius",
         incident_id=inc.id, diagnosis_id=d.id)


def _cause_text(d: Diagnosis) -> str:
    p = d.primary
    if p is None:
        return f"no cause found; {d.gap_rows:,} rows unexplained"
    return (f"{p.kind} (confidence {p.confidence:.0%}): {p.summary} Explains {p.explained_rows:,} of "
            f"{d.gap_rows:,} rows; {d.unexplained_rows:,} unexplained.")


def _lightup_comment(lightup, inc: Incident, d: Diagnosis, dagster_url: str, note, ak) -> None:
    br = d.blast_radius
    text = (f"dw_dagster diagnosis {d.id}: {_cause_text(d)}\n"
            f"Blast radius: models {', '.join(m.name for m in br.models) or 'none'}; "
            f"exposures {', '.join(e.label or e.name for e in br.exposures) or 'none'}; "
            f"owners {', '.join(br.owners) or 'none'}.\n"
            f"Details: {asset_url(dagster_url, inc.asset_key)}")
    lightup.get_client().add_comment(inc.external_id, text)
    note(ak, "lightup", "comment", True, f"commented the cause on Lightup incident {inc.external_id}",
         incident_id=inc.id, diagnosis_id=d.id)


def _ask_approval(instance, slack, cs: ChangeSet, channel: str | None, dagster_url: str, location: str, note, ak) -> None:
    from dw_dagster.slack import approval_request_message

    diag = next((x for x in records.diagnoses(instance, [ak]) if x.id == cs.diagnosis_id), None)
    msg = approval_request_message(cs, diag.blast_radius if diag else None, dagster_url=dagster_url, location=location)
    resp = slack.post_message(msg, channel=channel)
    note(ak, "slack", "approval_request", True, f"asked {', '.join(cs.approvers)} to approve change set {cs.id}",
         change_set_id=cs.id, ts=str(resp.get("ts")), channel_id=str(resp.get("channel")))


def _lightup_verify(lightup, inc: Incident, r: Receipt, dagster_url: str, note, ak, close: bool, timeout_s: float) -> None:
    client = lightup.get_client()
    raw = client.get_incident(inc.external_id)
    ctx = client.compare_context(raw)
    gaps = client.recheck(ctx, raw.get("slice") or {}, raw["start_ts"], raw["end_ts"], user_defined_id=r.id,
                          timeout_s=timeout_s)
    zero = all(g.gap == 0 for g in gaps)
    summary = "; ".join(f"{g.aggregation}: source {g.source_value:,.2f}, target {g.target_value:,.2f}, gap {g.gap:,.2f}"
                        for g in gaps)
    client.add_comment(inc.external_id, (
        f"dw_dagster repaired this (change set {r.change_set_id}, approved by {r.approver}, partitions "
        f"{', '.join(r.partitions)}). Lightup re-collected both tables: {summary}. "
        f"{'Compare gap is 0.' if zero else 'The compare gap is NOT 0.'} Receipt: {asset_url(dagster_url, inc.asset_key)}"))
    if zero and close:
        client.set_incident_status(inc.external_id, 5)
    note(ak, "lightup", "verify", zero, f"Lightup re-collection: {summary}", incident_id=inc.id, gap_zero=zero,
         closed=bool(zero and close))


def _resolve(pager, inc: Incident, receipts: list[Receipt], dagster_url: str, note, ak) -> None:
    from dw_dagster.paging import resolution_note

    url = asset_url(dagster_url, inc.asset_key)
    pager.resolve(inc.id, receipt_url=url, note=resolution_note(url, receipts))
    note(ak, "pager", "resolve", True, f"{_vendor(pager)} page resolved with the receipt link {url}", incident_id=inc.id)


def _tell_resolved(slack, inc: Incident, receipts: list[Receipt], dagster_url: str, channel: str | None, note, ak) -> None:
    from dw_dagster.slack import resolved_message

    slack.post_message(resolved_message(inc.id, receipts, asset_url(dagster_url, inc.asset_key)), channel=channel)
    note(ak, "slack", "resolved", True, f"told Slack incident {inc.id} is resolved", incident_id=inc.id)


def notifications(instance: dg.DagsterInstance, asset_keys: Sequence[dg.AssetKey] | None = None) -> list[dict]:
    """Recorded notifications (``dw/notification``), oldest first."""
    keys = asset_keys if asset_keys is not None else instance.get_asset_keys()
    out = []
    for ak in keys:
        for rec in records.iter_observations(instance, ak, newest_first=False):
            md = rec.asset_observation.metadata if rec.asset_observation else {}
            data = records.metadata_json(md, NOTIFICATION_KEY)
            if data is not None:
                out.append({**data, "asset_key": list(ak.path), "storage_id": rec.storage_id})
    return sorted(out, key=lambda d: d["storage_id"])

