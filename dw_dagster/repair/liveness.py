"""Liveness: an approved repair survives a crash or a short storage outage, and a failed one says what is stale.

The remediation sensor reads, for a stage whose bound run ended without the stage's own code
recording success, what happened to that run (from the run's own events):

- **it never executed a step** (no ``STEP_START``): the run worker or the daemon was killed before
  the first step, the run's start timed out (Dagster's run monitoring failed it), or it was cancelled
  while queued. Nothing ran, so the stage gets a fresh ticket and is dispatched again under the
  same approval (:data:`NO_STEP_ATTEMPTS` runs at most; then the stage fails, naming each run);
- **it failed on the infrastructure** (:func:`infrastructure_failure`): every step failure's error, or
  the run's own failure when no step failed (a worker that died mid-step, a framework error), is a
  connection error: the Dagster storage or the ledger unreachable, a warehouse connection dropped.
  A stage that may run again safely (:func:`~dw_dagster.core.ledger_finish.may_run_again`: the window,
  the rebuild, verify, receipt, snapshot, restore; never a migration or replay step) is dispatched
  again after a backoff (:data:`BACKOFF_SECONDS`), up to :data:`MAX_ATTEMPTS` runs;
- anything else (a step that failed in the user's code, a refusal, a run terminated from the UI, a
  deleted run) ends the repair as before: a receipt says what happened.

When a repair does end half-way, :func:`stale_assets` says which assets it left stale and
:func:`finish_or_undo` proposes the two ways out: a listed approver approves the same version again
to finish it (the stages that succeeded stay done; :mod:`dw_dagster.core.ledger_finish`), or
``dw-dagster undo`` puts the window back.

Dagster's run monitoring (``run_monitoring: {enabled: true}`` in ``dagster.yaml``) is what fails a
run whose start timed out; the code server fails a run whose worker process died.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dagster as dg

from dw_dagster.core.ledger_finish import may_run_again

#: runs a stage may have that never executed a step, before the stage fails
NO_STEP_ATTEMPTS = 3
#: runs a restartable stage may have that failed on the infrastructure, before the stage fails
MAX_ATTEMPTS = 3
#: seconds to wait before the 2nd, 3rd ... run of a stage that failed on the infrastructure
BACKOFF_SECONDS = (20.0, 90.0, 300.0)
#: error class names that say a connection failed, not that the work was wrong
TRANSIENT_ERRORS = frozenset({
    "OperationalError", "InterfaceError", "DisconnectionError", "ConnectionError", "ConnectionRefusedError",
    "ConnectionResetError", "ConnectionAbortedError", "BrokenPipeError", "TimeoutError", "ConnectTimeout",
    "ReadTimeout", "ConnectError", "RemoteDisconnected", "DagsterUserCodeUnreachableError",
})
_REFUSED = frozenset({"RunRefused", "DagsterInvariantViolationError", "DagsterTypeCheckDidNotPass"})


def executed_a_step(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Whether the run started any step (one indexed read of its ``STEP_START`` events)."""
    return bool(instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_START, limit=1).records)


def _chain(error) -> list:
    out, seen = [], 0
    while error is not None and seen < 20:
        out.append(error)
        nxt = getattr(error, "cause", None) or getattr(error, "context", None)
        error, seen = nxt, seen + 1
    return out


def _names(error) -> set[str]:
    return {getattr(e, "cls_name", None) or "" for e in _chain(error)}


def infrastructure_failure(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """What broke, when a failed run failed on the infrastructure (module docstring); None when it did not."""
    steps, engine = [], []
    for rec in instance.get_records_for_run(run_id, of_type={dg.DagsterEventType.STEP_FAILURE,
                                                             dg.DagsterEventType.ENGINE_EVENT,
                                                             dg.DagsterEventType.RUN_FAILURE}, limit=500).records:
        ev = rec.event_log_entry.dagster_event
        data = getattr(ev, "event_specific_data", None)
        error = getattr(data, "error", None)
        if ev.event_type == dg.DagsterEventType.STEP_FAILURE:
            steps.append(error)
        elif error is not None:
            engine.append(error)
    if steps:
        if all(e is not None and _names(e) & TRANSIENT_ERRORS for e in steps):
            first = next(n for n in _names(steps[0]) if n in TRANSIENT_ERRORS)
            return f"{len(steps)} step(s) failed on {first} (a connection, not the work)"
        return None
    if any(_names(e) & _REFUSED for e in engine):
        return None
    hit = next((n for e in engine for n in _names(e) if n in TRANSIENT_ERRORS), None)
    return (f"the run failed on {hit} before any step failed" if hit
            else "the run failed without a step failing (its worker process died or lost its storage)")


def backoff_seconds(attempts: int) -> float:
    """Seconds to wait before the next run of a stage that has had ``attempts`` runs."""
    return BACKOFF_SECONDS[min(max(attempts, 1), len(BACKOFF_SECONDS)) - 1]


def may_retry(stage: str, attempts: int) -> bool:
    """Whether a stage whose run failed on the infrastructure is dispatched again."""
    return may_run_again(stage) and attempts < MAX_ATTEMPTS


def stale_assets(target: Sequence[str], rebuild: Sequence[Sequence[str]], stages: Mapping[str, object]) -> list[str]:
    """The assets a repair that ended part-way leaves stale (``a/b`` strings): the repaired asset when
    some of its window or steps ran and some did not, and every asset to rebuild when the repaired
    asset changed but the rebuild did not succeed. ``stages``: name → row with ``state``."""
    state = {n: getattr(r, "state", r) for n, r in stages.items()}
    changing = [n for n in state if n.startswith("window-") or n == "restore" or _is_step(n)]
    changed = [n for n in changing if state[n] == "succeeded"]
    if not changed:
        return []
    out = []
    if len(changed) < len(changing) or any(state.get(n) != "succeeded" for n in changing):
        out.append("/".join(target))
    if state.get("rebuild") != "succeeded":
        out += ["/".join(k) for k in rebuild]
    return out


def _is_step(stage: str) -> bool:
    kind, _, n = stage.rpartition("-")
    return bool(kind) and n.isdigit() and not stage.startswith(("window-", "receipt"))


def finish_or_undo(change_set_id: str, stale: Sequence[str], failed_stage: str | None) -> str:
    """The sentence a failed repair ends with: what is stale, and how to finish or undo it."""
    if not stale:
        return ("no data changed; a new proposal is needed to try again, or a listed approver approves this version "
                f"again to retry it (`dw-dagster approve {change_set_id} --login`)")
    finish = (f"to finish, a listed approver approves the same version again (`dw-dagster approve {change_set_id} "
              "--login` or the review page): the stages that succeeded stay done and "
              f"{failed_stage or 'the failed stage'} and the rest run; ") if failed_stage is None or may_run_again(failed_stage) \
        else f"stage {failed_stage} cannot run again safely, so it cannot be finished; "
    return f"left stale: {', '.join(stale)}; {finish}to undo: `dw-dagster undo {change_set_id}`"


__all__ = ["BACKOFF_SECONDS", "MAX_ATTEMPTS", "NO_STEP_ATTEMPTS", "TRANSIENT_ERRORS", "backoff_seconds",
           "executed_a_step", "finish_or_undo", "infrastructure_failure", "may_retry", "stale_assets"]
