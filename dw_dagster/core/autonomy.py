"""Earned autonomy's record: per domain and change class, what the ledger and the receipts say.

:func:`autonomy_records` counts, per (domain, change class), the change sets applied, those whose
receipt verified, those undone (an applied undo change set names them), those failed, the latest
failure with its note, and the clean streak (verified repairs in a row, none undone, since the last
failure). The review page shows it (:mod:`dw_dagster.approval.autonomy_view`) and
:func:`dw_dagster.receipts.autonomy.propose_autonomy_change` turns it into a change to the domains file.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
from pydantic import BaseModel

from dw_dagster.core import records
from dw_dagster.core.domains import UNDO
from dw_dagster.core.ledger import APPLIED, FAILED, ledger_for
from dw_dagster.core.models import TamperedRecord


class ClassRecord(BaseModel):
    """A domain's record for one change class."""

    domain: str
    change_class: str
    applied: int = 0
    verified: int = 0
    undone: int = 0
    failed: int = 0
    clean_streak: int = 0
    last_failure: str | None = None
    last_failure_at: dt.datetime | None = None


def autonomy_records(instance: dg.DagsterInstance) -> list[ClassRecord]:
    """Every (domain, change class) record, sorted by domain and class (module docstring)."""
    led = ledger_for(instance)
    parsed = []
    for row in reversed(led.change_set_rows(latest_only=False)):  # oldest first
        try:
            parsed.append((row, records.parse_change_set(row.body)))
        except TamperedRecord:
            continue
    undone = {cs.undo_plan.of_change_set for row, cs in parsed
              if row.state == APPLIED and cs.undo_plan is not None and cs.undo_plan.of_change_set}
    verified = {r.change_set_id for r in records.receipts(instance) if r.verified}
    out: dict[tuple[str, str], ClassRecord] = {}
    for row, cs in parsed:
        if UNDO in cs.change_classes or row.state not in (APPLIED, FAILED):
            continue
        for klass in cs.change_classes:
            rec = out.setdefault((cs.domain, klass), ClassRecord(domain=cs.domain, change_class=klass))
            if row.state == FAILED:
                rec.failed += 1
                rec.clean_streak = 0
                rec.last_failure = (row.note or "failed")[:300]
                rec.last_failure_at = dt.datetime.fromtimestamp(row.updated_at, dt.timezone.utc)
                continue
            rec.applied += 1
            if cs.id in undone:
                rec.undone += 1
                rec.clean_streak = 0
            elif cs.id in verified:
                rec.verified += 1
                rec.clean_streak += 1
            else:
                rec.clean_streak = 0
    return [out[k] for k in sorted(out)]


__all__ = ["ClassRecord", "autonomy_records"]
