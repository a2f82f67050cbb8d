"""Tell people and tools what dw_dagster found and did: the page, Lightup, Slack, Jira, ServiceNow, email.

:func:`build_notification_sensor` follows dw_dagster's records in the event log (by storage id,
with the never-lose/never-repeat cursor of :mod:`dw_dagster.core.cursors`) and, once per record and
channel:

- **incident** → the page is triggered (PagerDuty Events v2 / Opsgenie; ``dedup_key``/alias from
  the incident id, so Lightup's own PagerDuty integration and dw_dagster land on one page);
- **diagnosis** → a comment on the Lightup incident with the cause and evidence counts, and a note on
  the page with the cause and the blast radius;
- **change set** → every approver listed for the domain now is asked directly: a Slack DM with the
  signed Approve / Reject buttons (one task per person; one Slack cannot find is named in the ledger
  and on the review page, :mod:`~dw_dagster.integrations.notify_people`) and an email; the domain's
  channel (else the sensor's) gets the request too, with summary, blast radius, expiry, the review
  page, the Launchpad link and the ``dw-dagster approve`` command;
- **ladder step** (``dw/escalation``, :mod:`dw_dagster.approval.ladder`) → a reminder, an escalation
  (the escalation approvers asked, with the buttons) or a denial, to the right people by every
  channel they have: Slack DM, the domain's channel, a note on the page, email, the ticket;
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

  The approvers get the receipt by email either way.
- **Jira / ServiceNow** (:mod:`~dw_dagster.integrations.notify_tickets`): one ticket per incident —
  the one Lightup opened when its alert channel is that system, else dw_dagster's own — with the
  cause, the request, the ladder steps and the outcome as comments; closed only on a verified receipt.

Every message links to the change set's or incident's own page on the review site
(``review_url``, default ``$DW_REVIEW_URL``) and to the asset's page in the Dagster UI.

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

from collections.abc import Sequence

import dagster as dg

from dw_dagster.core.cursors import UpdatedTsCursor
from dw_dagster.core.domains import DomainsFileError, DomainsSource, resolve_domains
from dw_dagster.core.links import review_base
from dw_dagster.integrations.notify_core import (  # noqa: F401 - the names tests and callers import from here
    DEFAULT_SENSOR_NAME,
    NOTIFICATION_KEY,
    NOTIFICATION_STEP_KEY,
    SLACK_CLOCK_SKEW_S,
    Outlets,
    Task,
    _new_records,
    _scan,
    asset_url,
    notifications,
    step_ref,
    task_id_for,
)
from dw_dagster.dagster_private import public


@public
def build_notification_sensor(
    *,
    dagster_url: str = "http://localhost:3000",
    location_name: str = "dw_dagster",
    lightup_resource_key: str | None = None,
    pager_resource_key: str | None = None,
    slack_resource_key: str | None = None,
    slack_channel: str | None = None,
    email_resource_key: str | None = None,
    ticket_resource_keys: Sequence[str] = (),
    review_url: str | None = None,
    domains: DomainsSource = None,
    lightup_close_when_verified: bool = True,
    recheck_timeout_s: float = 300.0,
    start_from: str = "latest",
    name: str = DEFAULT_SENSOR_NAME,
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor that carries dw_dagster's records to the page, Lightup, Slack, tickets and email (module docstring).

    Args:
        dagster_url: base URL of the Dagster UI, for asset pages and the Launchpad link.
        location_name: the code location holding the approval job (for the Launchpad link).
        lightup_resource_key: key of a :class:`~dw_dagster.integrations.lightup.LightupResource`, or None.
        pager_resource_key: key of a :class:`~dw_dagster.integrations.pagerduty.PagerDutyResource` or
            :class:`~dw_dagster.integrations.opsgenie.OpsgenieResource`, or None.
        slack_resource_key: key of a :class:`~dw_dagster.integrations.slack.SlackResource`, or None
            (DMs need the ``users:read.email``, ``im:write`` and ``im:history`` scopes too).
        slack_channel: channel for requests of domains that name no ``slack_channel`` (default: the
            resource's). Give a channel ID (``C...``): looking for an earlier attempt's message needs it.
        email_resource_key: key of an :class:`~dw_dagster.integrations.mail.EmailResource`, or None.
        ticket_resource_keys: keys of :class:`~dw_dagster.integrations.jira.JiraResource` /
            :class:`~dw_dagster.integrations.servicenow.ServiceNowResource` resources.
        review_url: the review site's public URL (``dw-dagster approvals serve``); default ``$DW_REVIEW_URL``.
        domains: the domains (approvers now, channels, sensitive-column rules); default ``$DW_DOMAINS_FILE``.
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
    keys = {k for k in (lightup_resource_key, pager_resource_key, slack_resource_key, email_resource_key,
                        *ticket_resource_keys) if k}
    if start_from not in ("latest", "beginning"):
        raise ValueError(f"start_from must be 'latest' or 'beginning', got {start_from!r}")

    def outlets(context: dg.SensorEvaluationContext) -> Outlets:
        from dw_dagster.lineage.sensitive import masker

        res = context.resources
        try:
            doms = resolve_domains(domains)
        except DomainsFileError as e:  # told without the domain's channel and people; named in the log
            context.log.error(f"cannot read the domains file: {e}")
            doms = None
        return Outlets(
            instance=context.instance, dagster_url=dagster_url, review_url=review_base(review_url),
            location=location_name,
            lightup=getattr(res, lightup_resource_key) if lightup_resource_key else None,
            pager=getattr(res, pager_resource_key) if pager_resource_key else None,
            slack=getattr(res, slack_resource_key) if slack_resource_key else None,
            email=getattr(res, email_resource_key) if email_resource_key else None,
            tickets=[getattr(res, k) for k in ticket_resource_keys], slack_channel=slack_channel, domains=doms,
            lightup_close=lightup_close_when_verified, recheck_timeout_s=recheck_timeout_s, mask=masker(doms))

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               required_resource_keys=keys,
               description="Pages, comments on Lightup and tickets, asks approvers directly (Slack DM, email) and "
               "tells the outcome of every repair as it really is, once per dw_dagster record.")
    def _sensor(context: dg.SensorEvaluationContext):
        from dw_dagster.integrations.notify_tasks import tasks_for

        instance = context.instance
        cursor = UpdatedTsCursor.loads(context.cursor, warn=context.log.warning)
        if cursor.updated_ts is None and start_from == "latest":
            existing = _new_records(instance, None)
            last = max((r[0] for r in existing), default=0)
            cursor.advance([(f"{last + 1}:start", float(last + 1))], [])  # the next read starts after `last`
            return dg.SensorResult(skip_reason=f"starting after the {len(existing)} record(s) already in the instance "
                                               f"(storage id {last}); only new ones are told", cursor=cursor.dumps())
        o = outlets(context)
        # re-read inclusively from the watermark (a failed record sits at it); done tasks are skipped
        after = int(cursor.updated_ts) - 1 if cursor.updated_ts is not None else None
        done, failed, told, problems = [], [], [], []
        scanned, ledger = _scan(instance, after)
        for rec in scanned:
            try:
                tasks = tasks_for(o, rec)
            except Exception as e:  # noqa: BLE001 - this record is retried next tick; the others go on
                failed.append((f"{rec.storage_id}:tasks", float(rec.storage_id)))
                problems.append(f"{rec.kind} {rec.storage_id}: {type(e).__name__}: {e}")
                context.log.error(f"notification tasks of {rec.kind} {rec.storage_id} failed (retried next tick): {e}")
                continue
            for channel, action, record_id, run in tasks:
                cursor_id = f"{rec.storage_id}:{channel}"
                if cursor.is_handled(cursor_id, float(rec.storage_id)):
                    continue
                tid = task_id_for(record_id, channel, action, name)
                task = Task(instance, rec.asset_key, channel, action, record_id, rec.timestamp, ledger.get(tid, []), name)
                task.review_url = o.review_url
                if task.complete:  # done on a tick whose cursor was lost (timed out, crashed)
                    done.append((cursor_id, float(rec.storage_id)))
                    continue
                try:
                    run(task)
                    done.append((cursor_id, float(rec.storage_id)))
                    told.append(f"{channel} {action}")
                except Exception as e:  # noqa: BLE001 - retried next tick; other channels go on
                    failed.append((cursor_id, float(rec.storage_id)))
                    problems.append(f"{rec.kind} {rec.storage_id} → {channel}: {type(e).__name__}: {e}")
                    context.log.error(f"notification {rec.kind} {rec.storage_id} → {channel} failed (retried next tick): {e}")
                    try:
                        task.fail(rec.kind, e)
                    except Exception as record_error:  # noqa: BLE001 - the cursor still retries it
                        context.log.error(f"could not record that failure: {record_error}")
            if not tasks:
                done.append((f"{rec.storage_id}:none", float(rec.storage_id)))
        cursor.advance(done, failed)
        reason = "; ".join(([f"told: {', '.join(told)}"] if told else []) + problems) or "nothing to tell"
        return dg.SensorResult(skip_reason=reason[:1000], cursor=cursor.dumps())

    return _sensor


__all__ = ["NOTIFICATION_KEY", "NOTIFICATION_STEP_KEY", "build_notification_sensor", "notifications", "step_ref",
           "task_id_for"]
