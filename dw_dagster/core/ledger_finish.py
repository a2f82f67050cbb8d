"""Finishing a repair that failed half-way, under a new decision (part of :class:`~dw_dagster.core.ledger.Ledger`).

A change set version whose repair failed after a stage had changed data (a window rerun, a
migration) leaves assets stale: the rebuild did not run, or only part of the window did. Its
receipt says so and proposes two ways out: undo (``dw-dagster undo``, a change set of its own) or
finish. Finishing is a new decision by a listed approver on the *same* version (same content, so
the same hash the first approval signed): :meth:`FinishMixin.record_finishing_decision` records it
and, in the same transaction,

- withdraws the decision the failed repair ran under (its slot is the new one's);
- gives each stage that failed or was abandoned, and the receipt stage, a fresh ticket under the
  new decision (the stages that succeeded stay done: nothing is run twice);
- moves the version from ``failed`` back to ``running`` and its incident, if the failure had
  released it (``unrepaired``), back to ``diagnosed``.

The remediation sensor then dispatches the remaining stages in order, and the receipt says what
the whole repair did.
"""

from __future__ import annotations

import json
import secrets
import time

import sqlalchemy as sa

from dw_dagster.core.ledger_incidents import DIAGNOSED, UNREPAIRED
from dw_dagster.core.ledger_tables import (
    ABANDONED,
    FAILED,
    ISSUED,
    RUNNING,
    STAGE_FAILED,
    change_sets_t,
    credentials_t,
    decisions_t,
    incidents_t,
    stages_t,
)


class FinishMixin:
    """:meth:`record_finishing_decision` (``engine`` and ``_tx`` are the ledger's)."""

    def _tx(self):  # pragma: no cover - Ledger's
        raise NotImplementedError

    def record_finishing_decision(self, *, approval_id: str, change_set_id: str, version: str, approver: str,
                                  method: str, decided_at: float, body: str,
                                  credential_id: str | None = None, credential_purpose: str = "") -> list[str]:
        """Record an approval that finishes a failed version (module docstring); returns the stages issued again.

        Raises:
            LedgerError: the version is not failed, no stage of it changed data, a stage that failed is
                not restartable, or the credential was used before; nothing is recorded then.
        """
        from dw_dagster.core.ledger import LedgerError

        now = time.time()
        with self._tx() as conn:
            row = conn.execute(sa.select(change_sets_t.c.state, change_sets_t.c.incident_id).where(
                change_sets_t.c.change_set_id == change_set_id, change_sets_t.c.version == version)).first()
            if row is None or row.state != FAILED:
                raise LedgerError(f"change set {change_set_id} version {version[:12]}… is "
                                  f"{row.state if row else 'not recorded'}; only a failed repair can be finished")
            stages = {r.stage: r for r in conn.execute(sa.select(stages_t).where(
                stages_t.c.change_set_id == change_set_id, stages_t.c.version == version))}
            ended = sorted(n for n, r in stages.items() if r.state in (STAGE_FAILED, ABANDONED) and not n.startswith("receipt"))
            blocked = [n for n in ended if not may_run_again(n)]
            if blocked:
                raise LedgerError(f"stage {', '.join(blocked)} of {change_set_id} cannot run again safely (it may have "
                                  "changed data before it failed); undo it instead (`dw-dagster undo`)")
            if credential_id is not None:
                try:
                    with conn.begin_nested():
                        conn.execute(credentials_t.insert().values(credential_id=credential_id,
                                                                   purpose=credential_purpose[:512], used_at=now))
                except sa.exc.IntegrityError:
                    raise LedgerError("this credential was already used for a decision; each is accepted once") from None
            conn.execute(decisions_t.update().where(
                decisions_t.c.change_set_id == change_set_id, decisions_t.c.version == version,
                decisions_t.c.active.is_(True)).values(
                active=False, withdrawn_reason=f"the repair failed at {', '.join(ended) or 'a stage'}; "
                                               f"{approver} approved finishing it"))
            conn.execute(decisions_t.insert().values(
                approval_id=approval_id, change_set_id=change_set_id, version=version, decision="approve",
                approver=approver, method=method, decided_at=decided_at, active=True, withdrawn_reason=None, body=body))
            again = [n for n, r in stages.items() if n in ended or (n == "receipt" and r.state != ISSUED)]
            for name in again:
                r = stages[name]
                earlier = json.loads(r.result) if r.result else {}
                conn.execute(stages_t.update().where(stages_t.c.ticket == r.ticket).values(
                    ticket=secrets.token_hex(16), approval_id=approval_id, state=ISSUED, run_id=None, started_at=None,
                    finished_at=None, issued_at=now, dispatch=_fresh_dispatch(r.dispatch),
                    result=json.dumps({"finishing": approval_id, "earlier": earlier})))
            conn.execute(change_sets_t.update().where(
                change_sets_t.c.change_set_id == change_set_id, change_sets_t.c.version == version).values(
                state=RUNNING, updated_at=now, note=f"finishing under approval {approval_id} by {approver}"))
            conn.execute(incidents_t.update().where(incidents_t.c.incident_id == row.incident_id,
                                                    incidents_t.c.state == UNREPAIRED).values(
                state=DIAGNOSED, updated_at=now, note=f"change set {change_set_id} is being finished"))
        return sorted(again)


def _fresh_dispatch(text: str | None) -> str | None:
    if not text:
        return None
    d = json.loads(text)
    d["ticks"] = []
    return json.dumps(d, sort_keys=True)


#: stages that may run again after a run of theirs failed part-way: each either changes no data
#: (verify, receipt), writes what it writes idempotently (a window rerun merges on the key; the dbt
#: rebuild rebuilds; a snapshot is ``CREATE OR REPLACE`` before the window runs; a restore deletes and
#: re-inserts in one transaction). A change set's own steps (migrations, replays) are not among them.
RESTARTABLE_STAGES = frozenset({"snapshot", "restore", "rebuild", "verify", "receipt"})


def may_run_again(stage: str) -> bool:
    """Whether ``stage`` may be dispatched again after its run failed part-way (:data:`RESTARTABLE_STAGES`, ``window-<n>``)."""
    return stage in RESTARTABLE_STAGES or stage.startswith("window-")


__all__ = ["FinishMixin", "RESTARTABLE_STAGES", "may_run_again"]
