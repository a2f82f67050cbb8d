"""A code location for the ladder's daemon test: the approval job, the ladder sensor on a clock the test
controls (a file holding an ISO time), and the notification sensor telling Slack (DMs and the domain's
channel), PagerDuty and email — all on loopback fakes named by environment variables."""

import datetime as dt
import os
from pathlib import Path

import dagster as dg

from dw_dagster.approval.job import build_approval_job
from dw_dagster.integrations.mail import EmailResource
from dw_dagster.integrations.notifications import build_notification_sensor
from dw_dagster.integrations.pagerduty import PagerDutyResource
from dw_dagster.integrations.slack import SlackResource
from dw_dagster.approval.autonomy import build_expiry_sensor
from dw_dagster_dev.fakes.paging_server import (DEFAULT_PAGERDUTY_TOKEN, DEFAULT_PAGERDUTY_USERS, DEFAULT_ROUTING_KEY,
                                                    DEFAULT_SLACK_TOKEN)


def test_clock() -> dt.datetime:
    """The time the test wrote to ``$DW_TEST_LADDER_CLOCK`` (the real time when the file is absent)."""
    path = Path(os.environ["DW_TEST_LADDER_CLOCK"])
    return dt.datetime.fromisoformat(path.read_text().strip()) if path.exists() else dt.datetime.now(dt.timezone.utc)


@dg.definitions
def defs() -> dg.Definitions:
    domains, paging = os.environ["DW_TEST_LADDER_DOMAINS"], os.environ["DW_TEST_PAGING_URL"]
    running = dg.DefaultSensorStatus.RUNNING
    return dg.Definitions(
        assets=[dg.AssetSpec(dg.AssetKey(["store_sales_line"]))],
        jobs=[build_approval_job(domains)],
        sensors=[
            build_expiry_sensor(domains=domains, clock=test_clock, minimum_interval_seconds=1, default_status=running),
            build_notification_sensor(pager_resource_key="pager", slack_resource_key="slack", email_resource_key="email",
                                      domains=domains, review_url="https://review.grocer.example", start_from="beginning",
                                      minimum_interval_seconds=1, default_status=running)],
        resources={
            "slack": SlackResource(bot_token=DEFAULT_SLACK_TOKEN, base_url=f"{paging}/api", default_channel="C0DWAPPROV"),
            "pager": PagerDutyResource(routing_key=DEFAULT_ROUTING_KEY, api_token=DEFAULT_PAGERDUTY_TOKEN,
                                       from_email=DEFAULT_PAGERDUTY_USERS[0], events_base_url=paging, rest_base_url=paging,
                                       incident_lookup_s=5),
            "email": EmailResource(host="127.0.0.1", port=int(os.environ["DW_TEST_SMTP_PORT"]),
                                   sender="dw-dagster@grocer.example", starttls=False)})
