"""Where people read a record: the review page of a change set or an incident, and the Dagster asset page.

Every notification (PagerDuty, Opsgenie, Slack, Jira, ServiceNow, email, Lightup comments) and every
``dw/`` observation's description points at one record: the change set's or the incident's own page
on the review site (``dw-dagster approvals serve``), whose public URL is ``$DW_REVIEW_URL`` (or
given to the notification sensor), and the asset's page in the Dagster UI.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import quote

REVIEW_URL_ENV = "DW_REVIEW_URL"


def review_base(explicit: str | None = None) -> str | None:
    """The review site's public URL: ``explicit``, else ``$DW_REVIEW_URL``; None when neither is set."""
    url = (explicit or os.environ.get(REVIEW_URL_ENV) or "").strip()
    return url.rstrip("/") or None


def change_set_page(change_set_id: str, base: str | None = None) -> str | None:
    """``<review site>/change-sets/<id>`` (every version and decision, the ladder, the receipts)."""
    root = review_base(base)
    return f"{root}/change-sets/{quote(change_set_id, safe='')}" if root else None


def incident_page(incident_id: str, base: str | None = None) -> str | None:
    """``<review site>/incidents/<id>``: the incident's timeline from detection to receipt."""
    root = review_base(base)
    return f"{root}/incidents/{quote(incident_id, safe='')}" if root else None


def asset_page(dagster_url: str, asset_key: Sequence[str]) -> str:
    """The asset's page in the Dagster UI (``<dagster_url>/assets/<path>``), where receipts show."""
    return f"{dagster_url.rstrip('/')}/assets/{'/'.join(quote(p, safe='') for p in asset_key)}"


def with_link(description: str, url: str | None, limit: int = 1000) -> str:
    """``description`` ending in `` — <url>`` (the link kept whole when the text is cut to ``limit``)."""
    if not url:
        return description[:limit]
    tail = f" — {url}"
    room = max(0, limit - len(tail))
    text = description if len(description) <= room else description[: max(0, room - 1)] + "…"
    return text + tail


def describe(description: str, *, incident_id: str | None = None, change_set_id: str | None = None,
             limit: int = 1000) -> str:
    """An observation's description ending in the link to its record's page on the review site (the change
    set's when it has one, else the incident's); unchanged (cut to ``limit``) when no review site is set."""
    url = (change_set_page(change_set_id) if change_set_id else None) or (incident_page(incident_id) if incident_id else None)
    return with_link(description, url, limit)


__all__ = ["REVIEW_URL_ENV", "describe", "asset_page", "change_set_page", "incident_page", "review_base", "with_link"]
