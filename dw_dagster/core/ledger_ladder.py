"""The ledger's escalation ladders: each step of a request's (or a failed repair's) ladder, once.

Part of :class:`dw_dagster.core.ledger.Ledger`. A ladder step (``remind``, ``escalate``, ``deny``)
is one row keyed by ``(subject, step)``: the subject is ``request:<change set>:<version>`` for a
change set waiting for a decision, ``repair:<change set>:<version>`` for a repair that ended
without a verified receipt. The insert is the transition: a second process (or a tick whose result
was lost) that tries the same step finds the row and does nothing, so every step is told exactly
once. ``shown`` says the step's ``dw/escalation`` observation was written; a row not shown yet is
shown again by the next tick (the notification tasks are keyed by the step, so showing twice tells
no one twice).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from dw_dagster.core.ledger_tables import LadderRow, _row, ladder_t

#: ladder steps, in order
REMIND, ESCALATE, DENY = "remind", "escalate", "deny"
LADDER_STEPS = (REMIND, ESCALATE, DENY)
#: subject kinds
REQUEST, REPAIR = "request", "repair"


def ladder_subject(kind: str, change_set_id: str, version: str) -> str:
    """``request:<change set>:<version>`` or ``repair:<change set>:<version>``."""
    return f"{kind}:{change_set_id}:{version}"


class LadderMixin:
    """The ladder methods of :class:`~dw_dagster.core.ledger.Ledger` (``engine`` and ``_tx`` are its)."""

    engine: sa.engine.Engine

    def record_ladder_step(self, *, kind: str, change_set_id: str, version: str, incident_id: str, step: str,
                           body: dict[str, Any], at: float | None = None) -> bool:
        """Record one step of a ladder; True when this call recorded it (False: it was already)."""
        subject = ladder_subject(kind, change_set_id, version)
        try:
            with self._tx() as conn:  # type: ignore[attr-defined]
                conn.execute(ladder_t.insert().values(
                    subject=subject, step=step, kind=kind, change_set_id=change_set_id, version=version,
                    incident_id=incident_id, at=at if at is not None else time.time(), shown=False,
                    body=json.dumps(body, default=str)))
        except sa.exc.IntegrityError:
            return False
        return True

    def mark_ladder_shown(self, subject: str, step: str) -> None:
        with self._tx() as conn:  # type: ignore[attr-defined]
            conn.execute(ladder_t.update().where(ladder_t.c.subject == subject, ladder_t.c.step == step).values(shown=True))

    def ladder_steps(self, *, subject: str | None = None, change_set_id: str | None = None,
                     incident_id: str | None = None, shown: bool | None = None) -> list[LadderRow]:
        """Recorded steps, oldest first, filtered on indexed columns."""
        q = sa.select(ladder_t).order_by(ladder_t.c.at, ladder_t.c.step)
        if subject is not None:
            q = q.where(ladder_t.c.subject == subject)
        if change_set_id is not None:
            q = q.where(ladder_t.c.change_set_id == change_set_id)
        if incident_id is not None:
            q = q.where(ladder_t.c.incident_id == incident_id)
        if shown is not None:
            q = q.where(ladder_t.c.shown.is_(shown))
        with self.engine.connect() as conn:
            return [_row(LadderRow, r) for r in conn.execute(q)]

    def ladder_done(self, subjects: Iterable[str]) -> dict[str, set[str]]:
        """subject → the steps recorded for it (one query per 500 subjects)."""
        subjects = sorted(set(subjects))
        out: dict[str, set[str]] = {s: set() for s in subjects}
        with self.engine.connect() as conn:
            for i in range(0, len(subjects), 500):
                q = sa.select(ladder_t.c.subject, ladder_t.c.step).where(ladder_t.c.subject.in_(subjects[i:i + 500]))
                for subject, step in conn.execute(q):
                    out[subject].add(step)
        return out


__all__ = ["DENY", "ESCALATE", "LADDER_STEPS", "LadderMixin", "REMIND", "REPAIR", "REQUEST", "ladder_subject"]
