"""Propose a change set again, as a new version: after its undo, or after it failed or expired.

An undo hands the incident back (open again, the undo as evidence). What usually comes next is the
original change once more: ``dw-dagster change-sets repropose CS`` (and ``dw-dagster undo`` of an
undo, which does the same) records a new version of ``CS`` with the same window, steps and diff, a
fresh expiry, and the earlier versions (what happened to each) in ``earlier_versions``. Its diff is
marked merged (``diff_merged_in``) when an earlier version of it ran, so the receipt shows the whole
change; the remediation sensor still runs nothing until a listed approver approves the new version.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.models import ChangeSet, utcnow
from dw_dagster.errors import DwDagsterError


class ReproposeError(DwDagsterError, ValueError):
    """The change set cannot be proposed again; the message says why."""


def original_of(instance: dg.DagsterInstance, change_set_id: str) -> ChangeSet:
    """The change set ``change_set_id`` names: itself, or, for an undo, the change set it undid.

    Raises:
        ReproposeError: no such change set.
    """
    cs = records.find_change_set(instance, change_set_id)
    if cs is None:
        raise ReproposeError(f"no change set {change_set_id!r} in this Dagster instance")
    of = cs.undo_plan.of_change_set if cs.undo_plan is not None else None
    if cs.cause_kind == "undo" and not of:
        of = cs.id.split("-undo")[0]
    if of:
        orig = records.find_change_set(instance, of)
        if orig is None:
            raise ReproposeError(f"{cs.id} undid {of!r}, which this Dagster instance does not hold")
        return orig
    return cs


def repropose(instance: dg.DagsterInstance, change_set_id: str, proposer: str = c.PROPOSER) -> ChangeSet:
    """A new version of ``change_set_id`` (or of the change set an undo undid), sealed, not recorded
    (record it with :func:`dw_dagster.proposals.change_sets.propose`).

    Raises:
        ReproposeError: no such change set; its latest version is still live (proposed, approved,
            running or halted: decide on it instead); its incident is closed (reopen it first).
    """
    from dw_dagster.core.ledger import ACTIVE_STATES, OPEN_INCIDENT_STATES, ledger_for
    from dw_dagster.proposals.change_sets import version_notes

    cs = original_of(instance, change_set_id)
    led = ledger_for(instance)
    row = led.change_set_row(cs.id, cs.version)
    if row is not None and row.state in ACTIVE_STATES:
        raise ReproposeError(f"change set {cs.id} version {cs.version[:12]}… is {row.state}; decide on it "
                             f"(`dw-dagster approve {cs.id}`) instead of proposing it again")
    inc = led.incident(cs.incident_id)
    if inc is not None and inc.state not in OPEN_INCIDENT_STATES:
        raise ReproposeError(f"incident {cs.incident_id} is {inc.state}; reopen it first "
                             f"(`dw-dagster incidents reopen {cs.incident_id}`)")
    now = utcnow()
    life = cs.expires_at - cs.created_at if cs.expires_at > cs.created_at else dt.timedelta(hours=24)
    ran = row is not None and row.state in ("applied", "failed", "halted")
    merged = cs.diff_merged_in or (cs.version if ran and cs.diff.strip() else "")
    summary = cs.summary.split(" (re-proposed")[0].split(" (its code change was merged")[0]
    summary += f" (re-proposed by {proposer} after version {cs.version[:12]}… {row.state if row else 'ended'}"
    summary += f"; its code change was merged with version {merged[:12]}…, not again)" if merged else ")"
    content = {**cs.model_dump(exclude={"version"}), "created_at": now, "expires_at": now + life, "proposer": proposer,
               "summary": summary, "diff_merged_in": merged, "earlier_versions": version_notes(led, cs.model_copy(
                   update={"version": ""}))}
    return ChangeSet.seal(**content)


__all__ = ["ReproposeError", "original_of", "repropose"]
