"""The access example's code location: access requests on one PostgreSQL database.

Reads ``$DW_ACCESS_DEMO_URL`` (the PostgreSQL server, default the loopback one) and
``$DW_ACCESS_HOME/domains.yaml`` (written by ``dw-dagster demo access``). Reminders go to Slack
when ``SLACK_BOT_TOKEN`` is set (``SLACK_API_URL`` and ``SLACK_CHANNEL`` for where).
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from dw_dagster import DatabaseResource, SlackResource, build_access_definitions
from dw_dagster.access import SlackNotifier

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
HOME_ENV = "DW_ACCESS_HOME"
URL_ENV = "DW_ACCESS_DEMO_URL"


def home_dir() -> Path:
    return Path(os.environ.get(HOME_ENV) or ".dw_demo/access").resolve()


def build_definitions(url: str | None = None, home: Path | None = None, *, interval_s: int = 30) -> dg.Definitions:
    """The location: ``warehouse`` (PostgreSQL), the access sensor, grant and revoke jobs, approvals."""
    home = home or home_dir()
    notifiers = []
    if os.environ.get("SLACK_BOT_TOKEN"):
        slack = SlackResource(bot_token=os.environ["SLACK_BOT_TOKEN"],
                              base_url=os.environ.get("SLACK_API_URL", "https://slack.com/api"),
                              default_channel=os.environ.get("SLACK_CHANNEL"))
        notifiers.append(SlackNotifier(slack))
    return build_access_definitions(databases={"warehouse": DatabaseResource(url=url or os.environ.get(URL_ENV) or DEFAULT_URL)},
                                    domains=str(home / "domains.yaml"), notifiers=notifiers,
                                    minimum_interval_seconds=interval_s)


defs = build_definitions()
