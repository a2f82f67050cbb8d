"""Dashboards and their deadlines: ``meta.dw.needed_by`` on a dbt exposure, and the blast radius ranked by it.

An exposure says when its dashboard is needed and which BI object it is::

    exposures:
      - name: store_pnl
        meta:
          dw:
            needed_by: "08:00 America/Chicago"      # daily at a local time, or
            # needed_by: "0 8 * * 1-5 America/Chicago"  # a cron with its zone (UTC when none)
            bi: {tool: tableau, workbook: store-pnl}  # or {tool: lightdash, dashboard: <uuid>}

:func:`parse_needed_by` gives the next deadline after a time (Dagster's own cron iterator, so it
keeps the zone's DST); :func:`rank_by_deadline` orders the exposures a blast radius reaches by the
deadline at risk and compares each with the repair's expected end: "the Store P&L is needed at
08:00 CST; the repair's expected end is 06:50 CST (70 min to spare)".
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from dw_dagster.core.models import ExposureRef
from dw_dagster.errors import DwDagsterError

_DAILY = re.compile(r"^(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)(?:\s+(?P<zone>\S+))?$")


class NeededByError(DwDagsterError, ValueError):
    """``meta.dw.needed_by`` is neither ``HH:MM [Zone]`` nor a cron with an optional zone."""


def _zone(name: str | None, spec: str) -> str:
    zone = name or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise NeededByError(f"needed_by {spec!r}: {zone!r} is not a time zone (e.g. America/Chicago)") from e
    return zone


def _cron_and_zone(spec: str) -> tuple[str, str]:
    """``(cron, zone)`` of a ``needed_by`` value (a daily ``HH:MM`` becomes ``M H * * *``)."""
    text = " ".join(str(spec).split())
    m = _DAILY.match(text)
    if m:
        return f"{int(m['m'])} {int(m['h'])} * * *", _zone(m["zone"], spec)
    parts = text.split(" ")
    if len(parts) == 6:
        return " ".join(parts[:5]), _zone(parts[5], spec)
    if len(parts) == 5:
        return text, "UTC"
    raise NeededByError(f"needed_by {spec!r} is neither 'HH:MM Zone' (e.g. '08:00 America/Chicago') nor a cron "
                        "with an optional zone (e.g. '0 8 * * 1-5 America/Chicago')")


def parse_needed_by(spec: str, *, after: dt.datetime) -> dt.datetime:
    """The first deadline of ``spec`` at or after ``after`` (aware), in the spec's zone.

    Raises:
        NeededByError: the spec does not parse (a bad time, cron or zone).
    """
    from dw_dagster.dagster_private import cron_string_iterator, is_valid_cron_string

    cron, zone = _cron_and_zone(spec)
    if not is_valid_cron_string(cron):
        raise NeededByError(f"needed_by {spec!r}: {cron!r} is not a valid cron")
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    return next(cron_string_iterator(after.timestamp(), cron, zone))


def exposure_dw_meta(node: Mapping[str, Any]) -> tuple[str | None, dict | None]:
    """``(needed_by, bi)`` from an exposure's manifest node (``meta.dw``, or ``config.meta.dw``)."""
    for meta in ((node.get("config") or {}).get("meta") or {}, node.get("meta") or {}):
        dw = meta.get("dw") if isinstance(meta, Mapping) else None
        if isinstance(dw, Mapping) and (dw.get("needed_by") or dw.get("bi")):
            bi = dw.get("bi")
            return (str(dw["needed_by"]) if dw.get("needed_by") else None), (dict(bi) if isinstance(bi, Mapping) else None)
    return None, None


class DeadlineAtRisk(BaseModel):
    """One exposure of a blast radius with a deadline, against the repair's expected end."""

    exposure: str
    label: str
    needed_by: str = Field(description="the exposure's meta.dw.needed_by as written")
    deadline: dt.datetime = Field(description="the next deadline at or after now, in the exposure's zone")
    expected_end: dt.datetime
    minutes_to_spare: float = Field(description="deadline − expected end, in minutes (negative: late)")
    at_risk: bool = Field(description="the repair's expected end is after the deadline")
    bi: dict | None = None
    owner_email: str | None = None

    def words(self) -> str:
        """``the Store P&L is needed at 08:00 CST; the repair's expected end is 06:50 CST (70 min to spare)``."""
        end = self.expected_end.astimezone(self.deadline.tzinfo)
        spare = (f"{self.minutes_to_spare:.0f} min to spare" if not self.at_risk
                 else f"{-self.minutes_to_spare:.0f} min LATE")
        return (f"the {self.label} is needed at {self.deadline:%H:%M %Z}; the repair's expected end is "
                f"{end:%H:%M %Z} ({spare})")


def rank_by_deadline(exposures: Sequence[ExposureRef], *, expected_end: dt.datetime,
                     now: dt.datetime | None = None) -> list[DeadlineAtRisk]:
    """The exposures with a ``needed_by``, soonest deadline first (those at risk first among equals).

    Args:
        exposures: a blast radius's exposures (``BlastRadius.exposures``).
        expected_end: when the repair is expected to end (aware).
        now: the deadlines are the next ones at or after it (default the clock).

    Raises:
        NeededByError: an exposure's ``needed_by`` does not parse (named in the message).
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    out = []
    for e in exposures:
        if not e.needed_by:
            continue
        try:
            deadline = parse_needed_by(e.needed_by, after=now)
        except NeededByError as err:
            raise NeededByError(f"exposure {e.name}: {err}") from err
        spare = (deadline - expected_end).total_seconds() / 60
        out.append(DeadlineAtRisk(exposure=e.name, label=e.label or e.name, needed_by=e.needed_by, deadline=deadline,
                                  expected_end=expected_end, minutes_to_spare=round(spare, 1), at_risk=spare < 0,
                                  bi=e.bi, owner_email=e.owner_email))
    return sorted(out, key=lambda r: (r.deadline, not r.at_risk, r.exposure))


__all__ = ["DeadlineAtRisk", "NeededByError", "exposure_dw_meta", "parse_needed_by", "rank_by_deadline"]
