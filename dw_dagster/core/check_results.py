"""Which asset check evaluations count as results: only those a run wrote.

Dagster also stores evaluations reported without a run: GraphQL ``reportAssetCheckEvaluations``
(and ``instance.report_runless_asset_event``) lets anyone who can reach the API write one, with any
``passed`` and any metadata. Such an evaluation is a claim, not a result: no check ran. The
incident sensor never takes one as evidence; neither does anything that reads "the latest result"
of a check (the quality score, the assistant's answers, the volume window a diagnosis reads). They
read :func:`latest_run_evaluation`, which walks the check's execution history (newest first, by
its indexed storage id) past the runless records and the planned-but-not-evaluated ones, and
returns the runless ones it passed so a caller can list them as what they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg

#: execution records read per page, and at most in all, while looking for one a run wrote
PAGE, MOST = 20, 200


@dataclass(frozen=True)
class CheckHistory:
    """``latest``: the newest evaluation a run wrote (its execution record), or None; ``reported``: the
    evaluations reported without a run that are newer than it, newest first."""

    latest: object | None
    reported: list = field(default_factory=list)


def evaluated(rec) -> bool:
    """Whether an execution record holds an evaluation (not only the plan of a run still going)."""
    data = getattr(getattr(getattr(rec, "event", None), "dagster_event", None), "event_specific_data", None)
    return hasattr(data, "passed")


def latest_run_evaluation(instance: dg.DagsterInstance, key: dg.AssetCheckKey) -> CheckHistory:
    """The check's newest evaluation written by a run, and the runless ones reported after it (module docstring)."""
    storage = instance.event_log_storage
    reported, cursor, read = [], None, 0
    while read < MOST:
        page = storage.get_asset_check_execution_history(key, limit=PAGE, cursor=cursor)
        for rec in page:
            if not evaluated(rec):
                continue
            if rec.run_id:
                return CheckHistory(rec, reported)
            reported.append(rec)
        read += len(page)
        if len(page) < PAGE:
            break
        cursor = page[-1].id
    return CheckHistory(None, reported)


__all__ = ["CheckHistory", "evaluated", "latest_run_evaluation"]
