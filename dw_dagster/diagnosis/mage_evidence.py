"""Mage evidence for a diagnosis: the pipeline runs around the incident's table in its window.

An asset may name the Mage pipeline that writes its table and those that read it downstream
(:class:`MageSource`, from ``assets[].mage`` in the configuration). :func:`read_mage_evidence`
reads their runs that overlapped the incident's window (status, start, end, block runs) with
:func:`~dw_dagster.integrations.mage_runs.runs_in_window`, and :func:`apply_mage_evidence` adds
them to a cause's finding:

- one evidence entry per pipeline (its runs with their block runs), and one more per failed or
  cancelled run (its own evidence, with the failing blocks' errors);
- ``details["mage"]``: the runs per pipeline, the incident timeline's Mage lines, and whether the
  writer ran green throughout;
- the summary says "the stream ran green throughout" only when the writer's runs say so (runs in
  the window, none failed or cancelled, and they cover the window or all completed); a failed or
  cancelled run of the writer lowers the confidence in a data-only cause (×
  :data:`PROBLEM_FACTOR`): the pipeline's failure may have lost rows on its own.

Mage unreachable (or refusing) never fails the diagnosis: the evidence says so, and nothing is
claimed about the runs.

Example::

    ev = read_mage_evidence(context.resources.mage.get_client, MageSource(writes="orders_stream",
                            reads=("finance_daily",)), (window_start, window_end))
    finding = apply_mage_evidence(finding, ev)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import httpx

from dw_dagster.core.models import CauseFinding, Evidence
from dw_dagster.errors import DwDagsterError
from dw_dagster.integrations.mage import MageClient
from dw_dagster.integrations.mage_runs import MageTimeline, runs_in_window

#: confidence factor of a data-only cause when the writing pipeline failed or was cancelled in the window
PROBLEM_FACTOR = 0.75
GREEN_SENTENCE = "the stream ran green throughout"


@dataclasses.dataclass(frozen=True)
class MageSource:
    """The Mage pipelines around one asset's table.

    Attributes:
        writes: uuid of the pipeline that writes the table (e.g. the stream), or None.
        reads: uuids of the pipelines that read it downstream (rerun after a fix, in order).
        resource_key: the :class:`~dw_dagster.integrations.mage.MageResource`'s key.
        lookback: how long before the window a run still going in it may have been created.
        rerun_timeout_s: how long the verify stage waits for a rerun (seconds).
        poll_s: seconds between reads while it waits.
    """

    writes: str | None = None
    reads: tuple[str, ...] = ()
    resource_key: str = "mage"
    lookback: dt.timedelta = dt.timedelta(hours=24)
    rerun_timeout_s: float = 1800.0
    poll_s: float = 15.0

    @property
    def pipelines(self) -> list[str]:
        """The writer first, then the readers (each once)."""
        return list(dict.fromkeys([*([self.writes] if self.writes else []), *self.reads]))


@dataclasses.dataclass
class MageEvidence:
    """What Mage said about an incident's window.

    Attributes:
        evidence: entries for the finding (one per pipeline, one per failed or cancelled run, or
            one saying Mage could not be read).
        details: ``details["mage"]`` of the finding: ``url``, ``window`` (ISO UTC), ``pipelines``
            (uuid → :meth:`MageTimeline.to_dict`), ``statuses`` (uuid → run statuses), ``timeline``
            (one line per run, by start), ``writer`` and ``green_throughout`` (True/False, None when
            unknown), ``problems`` (failed or cancelled runs), ``error`` (when Mage could not be read).
        sentence: what the summary adds.
        confidence_factor: 1.0, or :data:`PROBLEM_FACTOR` when the writer failed or was cancelled.
    """

    evidence: list[Evidence]
    details: dict[str, Any]
    sentence: str
    confidence_factor: float = 1.0


def _request(uuid: str, start: dt.datetime, end: dt.datetime) -> str:
    return (f"GET /api/pipeline_runs?pipeline_uuid={uuid}&start_timestamp={int(start.timestamp())}"
            f"&end_timestamp={int(end.timestamp())} (every page; and the runs still initial or running), "
            "then GET /api/block_runs?pipeline_run_id=<id> where Mage lists more block runs than it nests")


def _green(t: MageTimeline) -> bool:
    """Runs in the window, none failed or cancelled, and they cover it (a stream) or all completed (a batch)."""
    return bool(t.runs) and not t.problems and (t.covered or t.ran_green)


def _run_words(t: MageTimeline) -> str:
    return "; ".join(f"run {r.id} {r.status}" for r in t.runs[:5]) + (f"; {len(t.runs) - 5} more" if len(t.runs) > 5 else "")


def read_mage_evidence(client: MageClient | Callable[[], MageClient], source: MageSource,
                       window: tuple[dt.datetime, dt.datetime], *, now: dt.datetime | None = None) -> MageEvidence:
    """Read the runs of ``source``'s pipelines in ``window``; never raises for Mage's sake.

    Args:
        client: the Mage client, or a function returning it (called here, so a missing URL is
            evidence too).
        source: the pipelines.
        window: ``(start, end)`` of the incident (naive = UTC).
        now: the read time (default: the clock).

    Returns:
        A :class:`MageEvidence`; when Mage cannot be read (unreachable, refused, not configured)
        its evidence and ``details["error"]`` say why and ``green_throughout`` is None.
    """
    start, end = (w if w.tzinfo else w.replace(tzinfo=dt.timezone.utc) for w in window)
    iso = [start.isoformat(), end.isoformat()]
    details: dict[str, Any] = {"window": iso, "writer": source.writes, "readers": list(source.reads), "pipelines": {},
                               "statuses": {}, "timeline": [], "green_throughout": None, "problems": []}
    url = "?"
    try:
        c = client() if callable(client) and not isinstance(client, MageClient) else client
        url = c.url
        details["url"] = url
        timelines = {uuid: runs_in_window(c, uuid, start, end, lookback=source.lookback, now=now)
                     for uuid in source.pipelines}
    except (DwDagsterError, httpx.HTTPError, OSError, ValueError) as e:
        why = " ".join(str(e).split())[:400]
        details["error"] = why
        ev = Evidence(description=f"Mage could not be read, so the runs of {', '.join(source.pipelines)} in the window "
                      f"are not known: {why}", database=f"mage {url}",
                      sql=_request(source.pipelines[0], start, end), values={"error": why, "window": iso})
        return MageEvidence([ev], details, f"the Mage runs could not be read ({why[:160]}); whether the stream ran "
                            "green in the window is not known")
    evidence: list[Evidence] = []
    lines: list[tuple[dt.datetime, int, str]] = []
    for uuid, t in timelines.items():
        role = "writes" if uuid == source.writes else "reads"
        details["pipelines"][uuid] = t.to_dict()
        details["statuses"][uuid] = t.statuses
        evidence.append(Evidence(
            description=f"Mage pipeline {uuid} ({role} the table): {len(t.runs)} run(s) in the window with status, start, "
            "end and block runs", database=f"mage {c.url}", sql=_request(uuid, start, end), values=t.to_dict()))
        for r, line in zip(t.runs, t.lines(ui=c)):
            lines.append((r.began_at or t.end, r.id, line))
        for r in t.problems:
            blocks = [{"block": b.block_uuid, "status": b.status, "error": b.error} for b in r.failed_blocks]
            details["problems"].append({"pipeline": uuid, "run_id": r.id, "status": r.status, "blocks": blocks})
            evidence.append(Evidence(
                description=f"Mage run {r.id} of {uuid} {r.status} in the window"
                + (f" (blocks: {', '.join(b['block'] + ' ' + b['status'] for b in blocks)})" if blocks else ""),
                database=f"mage {c.url}", sql=f"GET /api/pipeline_runs/{r.id}",
                values={"run_id": r.id, "status": r.status, "started_at": r.began_at.isoformat() if r.began_at else None,
                        "ended_at": r.ended_at.isoformat() if r.ended_at else None, "blocks": blocks, "url": c.run_url(r)}))
    details["timeline"] = [x[2] for x in sorted(lines, key=lambda x: (x[0], x[1]))]
    parts, factor = [], 1.0
    w = timelines.get(source.writes) if source.writes else None
    if w is not None:
        green = _green(w)
        details["green_throughout"] = green
        if green:
            parts.append(f"{GREEN_SENTENCE} (Mage pipeline {w.pipeline_uuid}: {_run_words(w)}; none failed or cancelled)")
        elif w.problems:
            factor = PROBLEM_FACTOR
            parts.append(f"the stream did NOT run green: Mage pipeline {w.pipeline_uuid} had "
                         + ", ".join(f"run {r.id} {r.status}" for r in w.problems)
                         + " in the window, which may have lost rows on its own (confidence lowered)")
        elif not w.runs:
            parts.append(f"Mage shows no run of {w.pipeline_uuid} in the window")
        else:
            parts.append(f"Mage pipeline {w.pipeline_uuid} ran without a failure but its runs do not cover the whole "
                         f"window ({_run_words(w)})")
    for uuid in source.reads:
        t = timelines[uuid]
        bad = ", ".join(f"run {r.id} {r.status}" for r in t.problems)
        parts.append(f"downstream Mage pipeline {uuid}: " + (_run_words(t) if t.runs else "no run") + " in the window"
                     + (f" ({bad})" if bad else ""))
    return MageEvidence(evidence, details, "; ".join(parts), factor)


def apply_mage_evidence(finding: CauseFinding, mage: MageEvidence) -> CauseFinding:
    """``finding`` with the Mage evidence, ``details["mage"]``, the summary's Mage sentence and the
    confidence times :attr:`MageEvidence.confidence_factor`."""
    summary = finding.summary.rstrip()
    summary += ("" if summary.endswith(".") else ".") + " Mage: " + mage.sentence + "."
    return finding.model_copy(update={
        "summary": summary, "confidence": round(finding.confidence * mage.confidence_factor, 4),
        "details": {**finding.details, "mage": mage.details}, "evidence": [*finding.evidence, *mage.evidence]})


__all__ = ["GREEN_SENTENCE", "PROBLEM_FACTOR", "MageEvidence", "MageSource", "apply_mage_evidence", "read_mage_evidence"]
