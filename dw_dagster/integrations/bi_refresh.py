"""After a verified receipt: refresh the BI objects of the blast radius and say whether each beat its deadline.

:func:`refresh_dashboards` takes the exposures of a repair's blast radius with a ``meta.dw.bi``
reference (``{tool: tableau, workbook: <name>}``), refreshes each through its tool's REST API
(:class:`~dw_dagster.integrations.tableau.TableauClient`: extract refresh, job polled to its end)
and returns one entry per exposure: ``{"exposure", "refreshed_at", "before_deadline", "deadline"}``
— the ``bi_refreshed`` list the receipt and the demo show — plus the ones to escalate: a refresh
that failed, or that landed after the exposure's ``needed_by`` deadline. A receipt that is not
verified refreshes nothing: a dashboard must not be refreshed onto data the repair did not prove.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pydantic import BaseModel, Field

from dw_dagster.core.models import ExposureRef, Receipt
from dw_dagster.integrations.tableau import TableauClient, TableauRefreshFailed
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


def refresh_dashboards(receipt: Receipt, exposures: Sequence[ExposureRef], *, tableau: TableauClient | None,
                       repair_started: dt.datetime, poll_s: float = 5.0, timeout_s: float = 1800.0) -> list[BiRefresh]:
    """Refresh each exposure's BI object after ``receipt`` (module docstring).

    Args:
        receipt: the repair's receipt; nothing is refreshed unless it is verified.
        exposures: the blast radius's exposures (``BlastRadius.exposures``).
        tableau: a signed-in client, or None (Tableau objects are then reported as not refreshed).
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
        item = BiRefresh(exposure=e.name, tool=str(bi.get("tool", "")), deadline=deadline)
        try:
            if item.tool != "tableau" or not bi.get("workbook"):
                raise ValueError(f"no refresh for a {item.tool or 'BI'} object without a Tableau workbook")
            if tableau is None:
                raise ValueError("no Tableau client configured")
            wid = tableau.workbook_id(str(bi["workbook"]))
            done = tableau.wait(wid, tableau.refresh(wid), poll_s=poll_s, timeout_s=timeout_s)
            item.refreshed_at = done.completed_at
            item.before_deadline = None if deadline is None else done.completed_at <= deadline
        except (TableauRefreshFailed, ValueError, RuntimeError) as err:
            item.error = f"{type(err).__name__}: {err}"[:500]
            item.before_deadline = False if deadline is not None else None
        out.append(item)
    far = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    return sorted(out, key=lambda r: (r.deadline or far, r.exposure))


__all__ = ["BiRefresh", "refresh_dashboards"]
