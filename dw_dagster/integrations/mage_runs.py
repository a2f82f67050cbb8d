"""Mage evidence for the loop: the runs in an incident's window, and the outcome of a rerun.

Two entry points, both read-only and built on :class:`dw_dagster.integrations.mage.MageClient`:

- the diagnosis side: :func:`runs_in_window` → :class:`MageTimeline`, the pipeline's runs that
  overlapped the window with status, start, end and block runs, and whether they ran green;
- the verify side: :func:`wait_for_run_after` → the newest run of a pipeline created after a moment
  (the last data step), waited for until it finishes or a bounded timeout passes.

Example::

    client = context.resources.mage.get_client()
    timeline = runs_in_window(client, "orders_stream", incident.window_start, incident.window_end)
    timeline.ran_green        # every run completed (a batch pipeline's "all green")
    timeline.ran_throughout   # no run failed or was cancelled and the runs cover the whole window
                              # (a healthy stream: one run `running` from before the start to after the end)
    timeline.lines()          # one line per run for the incident's timeline
    rerun = wait_for_run_after(client, "finance_daily", last_step_at, timeout_s=1800, poll_s=15)
    # None: nobody reran it yet; rerun.status "completed" / "failed" / "cancelled", or still "running" at the timeout
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from dw_dagster.integrations.mage import MageClient
from dw_dagster.integrations.mage_models import RUN_PROBLEMS, MageRun, utc_time

#: Mage filters runs by ``created_at`` against epoch seconds read in its server's *local* time
#: (``mage_ai/api/utils.py:get_query_timestamps``); a server off UTC shifts the range by at most 14 h.
SERVER_TZ_SLACK = dt.timedelta(hours=14)


def _fmt(t: dt.datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%SZ") if t is not None else "—"


class MageTimeline(BaseModel):
    """A Mage pipeline's runs that overlapped a window.

    Attributes:
        pipeline_uuid: the Mage pipeline.
        start: window start (UTC).
        end: window end (UTC).
        runs: the runs that overlapped ``[start, end]`` (began at or before ``end`` and ended at or
            after ``start``, or are still in progress), by start time then id, with their block runs.
        read_at: when Mage was read (UTC); runs in progress are as of then.
    """

    model_config = ConfigDict(frozen=True)

    pipeline_uuid: str
    start: dt.datetime
    end: dt.datetime
    runs: tuple[MageRun, ...] = ()
    read_at: dt.datetime

    @property
    def statuses(self) -> list[str]:
        """The runs' statuses in run order (the orders demo's ``mage_runs`` value)."""
        return [r.status for r in self.runs]

    @property
    def problems(self) -> tuple[MageRun, ...]:
        """Runs that failed or were cancelled: evidence of their own, against a data-only cause."""
        return tuple(r for r in self.runs if r.status in RUN_PROBLEMS)

    @property
    def in_progress(self) -> tuple[MageRun, ...]:
        """Runs still ``initial`` or ``running`` when read."""
        return tuple(r for r in self.runs if not r.finished)

    @property
    def ran_green(self) -> bool:
        """True only when there were runs in the window and every one of them completed.

        False with no run (no evidence), with a failed or cancelled run, and with a run still in
        progress (a streaming run is ``running`` for as long as it is healthy: see :attr:`ran_throughout`).
        """
        return bool(self.runs) and all(r.status == "completed" for r in self.runs)

    @property
    def covered(self) -> bool:
        """The runs' spans (start to end, or to :attr:`read_at` while in progress) cover the whole window."""
        reach = self.start
        for run in sorted(self.runs, key=lambda r: (r.began_at or self.end, r.id)):
            began = run.began_at
            if began is None or began > reach:
                return False
            reach = max(reach, run.ended_at or self.read_at)
            if reach >= self.end:
                return True
        return reach >= self.end

    @property
    def ran_throughout(self) -> bool:
        """No run failed or was cancelled, and the runs (completed or in progress) cover the whole window.

        This is what "the stream ran healthy throughout" means for a streaming pipeline, whose run
        stays ``running``; for a batch pipeline run every few hours use :attr:`ran_green`.
        """
        return not self.problems and self.covered

    def lines(self, ui: MageClient | None = None) -> list[str]:
        """One line per run for an incident timeline, e.g.
        ``Mage finance_daily run 12 completed 2026-12-02 04:57:19Z → 04:57:29Z; blocks: load_orders completed``.

        Args:
            ui: a client whose UI base URL is used to add each run's link.
        """
        out = []
        for r in self.runs:
            blocks = ", ".join(f"{b.block_uuid} {b.status}" + (f" ({b.error})" if b.error else "")
                               for b in r.block_runs)
            end = _fmt(r.ended_at) if r.ended_at else f"still {r.status} at {_fmt(self.read_at)}"
            line = f"Mage {r.pipeline_uuid} run {r.id} {r.status} {_fmt(r.began_at)} → {end}"
            line += f"; blocks: {blocks}" if blocks else "; no block runs"
            out.append(line + (f" <{ui.run_url(r)}>" if ui is not None else ""))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready evidence: window, verdicts and each run with its block runs (ISO 8601 UTC times)."""
        iso = lambda t: t.isoformat() if t is not None else None  # noqa: E731
        return {
            "pipeline": self.pipeline_uuid, "start": iso(self.start), "end": iso(self.end), "read_at": iso(self.read_at),
            "ran_green": self.ran_green, "ran_throughout": self.ran_throughout, "statuses": self.statuses,
            "runs": [{"id": r.id, "status": r.status, "trigger": r.pipeline_schedule_name, "started_at": iso(r.began_at),
                      "ended_at": iso(r.ended_at),
                      "block_runs": [{"block": b.block_uuid, "status": b.status, "error": b.error} for b in r.block_runs]}
                     for r in self.runs],
        }


def runs_in_window(client: MageClient, pipeline_uuid: str, start: dt.datetime, end: dt.datetime, *,
                   lookback: dt.timedelta = dt.timedelta(days=1), now: dt.datetime | None = None) -> MageTimeline:
    """The pipeline's runs that overlapped ``[start, end]``, with their block runs.

    Reads (``GET /api/pipeline_runs``, every page) the runs created from ``start - lookback`` to
    ``end`` (widened by :data:`SERVER_TZ_SLACK` for Mage's local-time filter), plus every run still
    ``initial`` or ``running`` created before ``end`` (a stream started long ago), then keeps those
    whose span overlaps the window. Block runs come nested in the list; when Mage reports more
    (``block_runs_count``) they are read with ``GET /api/block_runs``.

    Args:
        client: the Mage client.
        pipeline_uuid: the pipeline that writes or reads the incident's table.
        start: window start (naive = UTC, as ``Incident.window_start``).
        end: window end (naive = UTC).
        lookback: how long before ``start`` a run that was still going in the window may have
            been created, besides those still in progress.
        now: the read time recorded in the timeline (default: the clock now).

    Returns:
        A :class:`MageTimeline`; ``ran_green`` / ``ran_throughout`` say whether the runs were healthy.

    Raises:
        ValueError: ``end`` before ``start``.
        MageApiError: Mage refused or failed (names the pipeline and what to check).
        MageError: more runs than the client reads in one call (10,000).
    """
    start, end = utc_time(start), utc_time(end)
    assert start is not None and end is not None
    if end < start:
        raise ValueError(f"window end {end.isoformat()} is before its start {start.isoformat()}")
    read_at = utc_time(now) or dt.datetime.now(dt.timezone.utc)
    found = {r.id: r for r in client.pipeline_runs(pipeline_uuid, created_after=start - lookback - SERVER_TZ_SLACK,
                                                   created_before=end + SERVER_TZ_SLACK)}
    for r in client.pipeline_runs(pipeline_uuid, status=("initial", "running"), created_before=end + SERVER_TZ_SLACK):
        found.setdefault(r.id, r)
    runs = []
    for r in found.values():
        began, ended = r.began_at, r.ended_at
        if began is None or began > end or (ended is not None and ended < start):
            continue
        if (r.block_runs_count or 0) > len(r.block_runs):
            r = r.model_copy(update={"block_runs": tuple(client.block_runs(r.id))})
        runs.append(r)
    runs.sort(key=lambda r: (r.began_at, r.id))
    return MageTimeline(pipeline_uuid=pipeline_uuid, start=start, end=end, runs=tuple(runs), read_at=read_at)


def wait_for_run_after(client: MageClient, pipeline_uuid: str, after: dt.datetime, timeout_s: float,
                       poll_s: float = 10.0, *, sleep: Callable[[float], None] = time.sleep,
                       monotonic: Callable[[], float] = time.monotonic) -> MageRun | None:
    """Wait, bounded, for the newest run of ``pipeline_uuid`` created after ``after`` to finish.

    Polls the pipeline's newest run (:meth:`MageClient.latest_run`) every ``poll_s`` seconds. A run
    counts when its ``created_at`` is at or after ``after`` (Mage stores ``created_at`` in whole
    seconds, so ``after`` is rounded down to the second). When a newer run appears while waiting
    (the engineer started another), that one is followed. Mage's scheduler picks a run up within
    seconds and a one-block batch run is finished after about 20 s (measured on mage-ai 0.9.80).

    Args:
        client: the Mage client.
        pipeline_uuid: the pipeline the change set asks to rerun.
        after: the moment after which the rerun must have been started (the last data step's end;
            naive = UTC).
        timeout_s: how long to wait at most (seconds, > 0).
        poll_s: seconds between reads (> 0).
        sleep: the sleep function (tests pass a recorder).
        monotonic: the clock for the deadline.

    Returns:
        The run once it finished (``completed``, ``failed`` or ``cancelled``); the run as last
        read, still ``initial`` or ``running``, when the timeout passed first; None when no run
        was created after ``after`` within the timeout.

    Raises:
        ValueError: ``timeout_s`` or ``poll_s`` not a positive finite number.
        MageApiError: Mage refused or failed (after the client's retries).
    """
    if not (timeout_s > 0 and math.isfinite(timeout_s)) or not (poll_s > 0 and math.isfinite(poll_s)):
        raise ValueError(f"timeout_s and poll_s must be positive and finite, got {timeout_s!r} and {poll_s!r}")
    since = utc_time(after)
    assert since is not None
    since = since.replace(microsecond=0)
    deadline = monotonic() + timeout_s
    while True:
        run = client.latest_run(pipeline_uuid)
        if run is not None and (run.created_at is None or run.created_at < since):
            run = None
        if run is not None and run.finished:
            return run
        left = deadline - monotonic()
        if left <= 0:
            return run
        sleep(min(poll_s, left))


__all__ = ["SERVER_TZ_SLACK", "MageTimeline", "runs_in_window", "wait_for_run_after"]
