"""After a verified receipt: refresh the BI objects of the blast radius and say whether each beat its deadline.

:func:`refresh_dashboards` takes the exposures of a repair's blast radius with a ``meta.dw.bi``
reference and refreshes each through its tool's REST API:

- ``{tool: tableau, workbook: <name>}``: :class:`~dw_dagster.integrations.tableau.TableauClient`
  (the workbook's extract refresh, its job polled to the end; the job's ``completedAt``);
- ``{tool: lightdash, dashboard: <uuid, slug or name>}``:
  :class:`~dw_dagster.integrations.lightdash.LightdashClient` (the dashboard's results cache
  invalidated, every chart tile's query run again; when the last one was ready).

It returns one entry per exposure: ``{"exposure", "refreshed_at", "before_deadline", "deadline"}``
— the ``bi_refreshed`` list the receipt's observation and the demos show — plus the ones to
escalate: a refresh that failed, or that landed after the exposure's ``needed_by`` deadline. A
receipt that is not verified refreshes nothing: a dashboard must not be refreshed onto data the
repair did not prove. :class:`BiClients` holds one client per tool for one refresh round.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from dw_dagster.core.models import ExposureRef, Receipt
from dw_dagster.lineage.deadlines import parse_needed_by


class BiRefresh(BaseModel):
    """One exposure's refresh after a repair."""

    exposure: str
    tool: str
    refreshed_at: dt.datetime | None = None
    deadline: dt.datetime | None = None
    before_deadline: bool | None = Field(default=None, description="None without a needed_by")
    error: str | None = None

    @property
    def escalate(self) -> bool:
        """A failed refresh, or one that landed after the deadline."""
        return self.error is not None or self.before_deadline is False


@dataclass
class BiClients:
    """The BI clients of one refresh round (a context manager: each client is entered and closed).

    ``tableau``: a :class:`~dw_dagster.integrations.tableau.TableauClient` (signed in on enter);
    ``lightdash``: a :class:`~dw_dagster.integrations.lightdash.LightdashClient`. Either may be None.
    """

    tableau: Any = None
    lightdash: Any = None

    @classmethod
    def of(cls, client: Any) -> "BiClients":
        """``client`` as a :class:`BiClients` (a Tableau or Lightdash client alone, or one already)."""
        from dw_dagster.integrations.lightdash import LightdashClient

        if client is None or isinstance(client, BiClients):
            return client or cls()
        return cls(lightdash=client) if isinstance(client, LightdashClient) else cls(tableau=client)

    def __enter__(self) -> "BiClients":
        entered = []
        try:
            for name in ("tableau", "lightdash"):
                c = getattr(self, name)
                if c is not None:
                    setattr(self, name, c.__enter__())
                    entered.append(getattr(self, name))
        except BaseException:
            for c in entered:
                c.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for c in (self.tableau, self.lightdash):
            if c is not None:
                c.__exit__(*exc)


def _refresh_one(item: BiRefresh, bi: dict, tableau: Any, lightdash: Any, poll_s: float, timeout_s: float) -> dt.datetime:
    if item.tool == "tableau":
        if not bi.get("workbook"):
            raise ValueError("a Tableau reference needs workbook: <name>")
        if tableau is None:
            raise ValueError("no Tableau client configured")
        wid = tableau.workbook_id(str(bi["workbook"]))
        return tableau.wait(wid, tableau.refresh(wid), poll_s=poll_s, timeout_s=timeout_s).completed_at
    if item.tool == "lightdash":
        if not bi.get("dashboard"):
            raise ValueError("a Lightdash reference needs dashboard: <uuid, slug or name>")
        if lightdash is None:
            raise ValueError("no Lightdash client configured")
        return lightdash.refresh(str(bi["dashboard"]), poll_s=poll_s, timeout_s=timeout_s).refreshed_at
    raise ValueError(f"no refresh for a {item.tool or 'BI'} object (tools: tableau, lightdash)")


def refresh_dashboards(receipt: Receipt, exposures: Sequence[ExposureRef], *, tableau: Any = None, lightdash: Any = None,
                       repair_started: dt.datetime, poll_s: float = 5.0, timeout_s: float = 1800.0) -> list[BiRefresh]:
    """Refresh each exposure's BI object after ``receipt`` (module docstring).

    Args:
        receipt: the repair's receipt; nothing is refreshed unless it is verified.
        exposures: the blast radius's exposures (``BlastRadius.exposures``).
        tableau: a signed-in Tableau client, or None (Tableau objects are then reported as not refreshed).
        lightdash: a Lightdash client, or None (likewise).
        repair_started: the deadline each refresh is judged against is the first at or after it.

    Returns:
        One :class:`BiRefresh` per exposure with a ``bi`` reference, soonest deadline first.
    """
    if not receipt.verified:
        return []
    out = []
    for e in exposures:
        bi = e.bi or {}
        if not bi:
            continue
        deadline = parse_needed_by(e.needed_by, after=repair_started) if e.needed_by else None
        item = BiRefresh(exposure=e.name, tool=str(bi.get("tool", "")).lower(), deadline=deadline)
        try:
            item.refreshed_at = _refresh_one(item, bi, tableau, lightdash, poll_s, timeout_s)
            item.before_deadline = None if deadline is None else item.refreshed_at <= deadline
        except (ValueError, RuntimeError) as err:  # the clients' errors (HttpApiError, ...RefreshFailed) included
            item.error = f"{type(err).__name__}: {err}"[:500]
            item.before_deadline = False if deadline is not None else None
        out.append(item)
    far = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    return sorted(out, key=lambda r: (r.deadline or far, r.exposure))


__all__ = ["BiClients", "BiRefresh", "refresh_dashboards"]
