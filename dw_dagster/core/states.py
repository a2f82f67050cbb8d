"""What happened, in plain words: a failed stage's error, and an incident's state.

A repair stage whose run failed leaves its error in the run's ``STEP_FAILURE`` / ``RUN_FAILURE``
events. :func:`run_error` reads it from the instance (the exception class and message the op raised,
past Dagster's own wrappers, with the errors that caused it), so the receipt can say *why*
(``failed at snapshot: ValueError: Invalid isoformat string ...``) and link the run.

:func:`incident_words` is the state every view shows (``dw-dagster incidents``, the MCP tools, the
review page): ``repair failed at snapshot: ValueError: ...``, ``undone, open again``, ``fixed
(verified)``; a repair that failed never reads "fixed".
"""

from __future__ import annotations

from typing import Any

import dagster as dg

#: the incident status of a repair that failed at a stage (``repair failed at <stage>: ...``)
REPAIR_FAILED = "repair failed"
#: the incident status after a verified undo: the incident is open again
UNDONE_OPEN = "undone, open again"
#: Dagster's own wrappers around the error an op raised
_WRAPPERS = ("DagsterExecutionStepExecutionError", "DagsterUserCodeExecutionError", "DagsterExecutionInterruptedError")
_MAX_MESSAGE = 500


def _text(error: Any) -> str:
    """The message of a serialized error without its ``module.Class: `` prefix."""
    msg = (getattr(error, "message", "") or "").strip()
    cls = getattr(error, "cls_name", "") or ""
    head, sep, rest = msg.partition(": ")
    if sep and (head == cls or head.endswith("." + cls)):
        msg = rest
    return " ".join(msg.split())[:_MAX_MESSAGE]


def _chain(error: Any) -> list:
    out = []
    while error is not None and len(out) < 20:
        out.append(error)
        error = getattr(error, "cause", None) or getattr(error, "context", None)
    return out


def error_info(error: Any) -> dict[str, Any]:
    """``{error_class, message, causes: [{error_class, message}]}`` of a serialized error, past Dagster's wrappers."""
    chain = [e for e in _chain(error) if (getattr(e, "cls_name", "") or "") not in _WRAPPERS] or _chain(error)
    head, *rest = chain
    return {"error_class": head.cls_name or "Error", "message": _text(head),
            "causes": [{"error_class": e.cls_name or "Error", "message": _text(e)} for e in rest]}


def run_error(instance: dg.DagsterInstance, run_id: str | None) -> dict[str, Any] | None:
    """The error a failed run ended with (its first ``STEP_FAILURE``, else its ``RUN_FAILURE``):
    :func:`error_info` plus ``run_id``, ``step`` and ``run_url`` (the run's page in the Dagster UI, :func:`run_url`); None when the run recorded no error."""
    if not run_id:
        return None
    found: dict[str, Any] | None = None
    for rec in instance.get_records_for_run(run_id, of_type={dg.DagsterEventType.STEP_FAILURE,
                                                             dg.DagsterEventType.RUN_FAILURE}, limit=50).records:
        ev = rec.event_log_entry.dagster_event
        error = getattr(getattr(ev, "event_specific_data", None), "error", None)
        if error is None:
            if found is None and ev.event_type == dg.DagsterEventType.RUN_FAILURE:
                found = {"error_class": "RunFailure", "message": " ".join((ev.message or "").split())[:_MAX_MESSAGE],
                         "causes": []}
            continue
        info = error_info(error)
        if ev.event_type == dg.DagsterEventType.STEP_FAILURE:
            found = {**info, "step": ev.step_key}
            break
        found = found if found and found.get("error_class") != "RunFailure" else info
    if found is None:
        return None
    return {**found, "run_id": run_id, "run_url": run_url(run_id)}


def run_url(run_id: str) -> str:
    """The run's page in the Dagster UI: ``$DAGSTER_UI_URL/runs/<id>`` (default ``http://localhost:3000``)."""
    import os

    return f"{(os.environ.get('DAGSTER_UI_URL') or 'http://localhost:3000').rstrip('/')}/runs/{run_id}"


def error_words(failure: dict[str, Any]) -> str:
    """``ValueError: Invalid isoformat string '…' (caused by …)`` from :func:`run_error`'s dict."""
    text = f"{failure.get('error_class', 'Error')}: {failure.get('message', '')}".rstrip(": ")
    causes = failure.get("causes") or []
    if causes:
        text += " (caused by " + "; ".join(f"{e['error_class']}: {e['message']}" for e in causes) + ")"
    return text


def incident_words(state: str | None, receipt: Any = None, fallback: str = "open") -> str:
    """The incident's status in plain words, from its ledger ``state`` and its newest receipt (a
    :class:`~dw_dagster.core.models.Receipt` or None):

    - after a verified undo (a receipt of an ``undo`` change set): ``undone, open again``;
    - a repair that failed at a stage: ``repair failed at <stage>: <Class>: <message>``;
    - a repair that halted: ``repair halted after ...``;
    - otherwise ``fixed (verified)`` / ``fixed (not verified)``, or ``fallback`` without a receipt.
    """
    if receipt is None:
        return fallback
    if receipt.cause_kind == "undo":
        if receipt.verified:
            return UNDONE_OPEN if state != "closed" else "undone (closed)"
        return "undo " + _failure_text(receipt)
    if receipt.outcome.startswith("failed at") or receipt.outcome.startswith("halted"):
        return "repair " + _failure_text(receipt)
    return "fixed (verified)" if receipt.verified else "fixed (not verified)"


def _failure_text(receipt: Any) -> str:
    failure = (receipt.evidence_summary or {}).get("failure")
    if failure:
        return f"failed at {failure.get('stage', 'a stage')}: {error_words(failure)}"
    if receipt.outcome == "applied":
        return "applied, not verified"
    return receipt.outcome.split("; ran:")[0]


__all__ = ["REPAIR_FAILED", "UNDONE_OPEN", "error_info", "error_words", "incident_words", "run_error", "run_url"]
