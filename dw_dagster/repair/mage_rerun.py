"""The verify stage's wait for the Mage reruns a change set asks of the engineer.

A change set may name Mage pipelines to rerun after its data steps (manual steps of kind
``mage_rerun``, :mod:`dw_dagster.changes.manual_steps`). dw_dagster starts nothing in Mage: the
engineer reruns them (in Mage's UI or with ``mage-agent run_pipeline``). The check built by
:func:`build_mage_rerun_check` runs in the verify stage and, for each of those pipelines, waits
(bounded by ``timeout_s``, shared by all of them) for a run created after the change set's last
data step to finish (:func:`~dw_dagster.integrations.mage_runs.wait_for_run_after`). It passes only
when every such run completed; its metadata (pipeline, run id, status, reason) lands in the receipt.

- a failed or cancelled rerun fails it with the run's reason (its failed blocks' errors, else the
  last error of its logs);
- no rerun within the timeout, or one still running at the timeout, fails it saying so and how to
  rerun;
- Mage unreachable fails it with Mage's error (the rerun's outcome cannot be proven).

Under a change set (the run holds the ticket the remediation sensor issued) it follows that change
set's reruns; a change set that asks for none passes. Run by hand it waits for the configured
pipelines' runs after the latest change applied to the asset (else the last 24 h).
"""


import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from dw_dagster.core.models import ChangeSet
from dw_dagster.errors import DwDagsterError
from dw_dagster.integrations.mage import MageClient
from dw_dagster.integrations.mage_runs import wait_for_run_after
from dw_dagster.changes.manual_steps import MAGE_RERUN_CHECK, mage_agent_call, mage_reruns
from dw_dagster.repair.replay_checks import _latest_step_time, change_set_of_run
from dw_dagster.changes.steps import step_results
from dw_dagster.core import keys as c


def last_data_step_end(instance: dg.DagsterInstance, cs: ChangeSet) -> dt.datetime:
    """When the change set's last data step finished (aware UTC); its ``created_at`` when none ran."""
    ends = [dt.datetime.fromisoformat(r["finished_at"]) for r in step_results(instance, cs) if r.get("finished_at")]
    end = max(ends) if ends else cs.created_at
    return end if end.tzinfo else end.replace(tzinfo=dt.timezone.utc)


def _fmt(t: dt.datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%SZ") if t else "—"


def wait_for_reruns(client: MageClient, pipelines: Sequence[str], after: dt.datetime, timeout_s: float, poll_s: float,
                    *, sleep: Callable[[float], None] = time.sleep,
                    monotonic: Callable[[], float] = time.monotonic) -> list[dict[str, Any]]:
    """Wait for a run of each pipeline created after ``after``; one outcome per pipeline.

    Args:
        client: the Mage client.
        pipelines: the Mage pipelines' uuids, in order.
        after: the last data step's end (naive = UTC).
        timeout_s: the wait for all of them together (seconds).
        poll_s: seconds between reads.
        sleep: the sleep function; monotonic: the deadline's clock (tests pass fakes).

    Returns:
        ``[{pipeline, passed, run_id, status, started_at, ended_at, url, reason}]``: ``run_id`` /
        ``status`` are None when no run came; ``reason`` says why it did not pass (or what passed).
        Never raises for Mage's sake: an unreachable Mage is a failed outcome with its error.
    """
    deadline = monotonic() + timeout_s
    out = []
    for pipeline in pipelines:
        o: dict[str, Any] = {"pipeline": pipeline, "passed": False, "run_id": None, "status": None,
                             "started_at": None, "ended_at": None, "url": None}
        try:
            run = wait_for_run_after(client, pipeline, after, max(deadline - monotonic(), 0.001), poll_s,
                                     sleep=sleep, monotonic=monotonic)
        except DwDagsterError as e:
            o["reason"] = f"Mage could not be read: {' '.join(str(e).split())[:300]}"
            out.append(o)
            continue
        if run is None:
            o["reason"] = (f"no run of {pipeline} was started after the last data step ({_fmt(after)}) within "
                           f"{timeout_s:g} s: rerun it in Mage ({mage_agent_call(pipeline)})")
            out.append(o)
            continue
        o.update(run_id=run.id, status=run.status, url=client.run_url(run),
                 started_at=run.began_at.isoformat() if run.began_at else None,
                 ended_at=run.ended_at.isoformat() if run.ended_at else None)
        if run.status == "completed":
            o.update(passed=True, reason=f"run {run.id} completed {_fmt(run.began_at)} → {_fmt(run.ended_at)}")
        elif not run.finished:
            o["reason"] = f"run {run.id} still {run.status} after {timeout_s:g} s (the wait's bound)"
        else:
            why = "; ".join(f"block {b.block_uuid} {b.status}" + (f": {b.error}" if b.error else "")
                            for b in run.failed_blocks)
            if not any(b.error for b in run.failed_blocks):
                try:
                    last = client.run_logs(run).last_error
                except DwDagsterError:
                    last = None
                why = "; ".join(x for x in (why, f"log: {last}" if last else "") if x)
            o["reason"] = f"run {run.id} {run.status}" + (f" ({why})" if why else "")
        out.append(o)
    return out


def build_mage_rerun_check(*, asset: dg.AssetKey | str, pipelines: Sequence[str], resource_key: str = "mage",
                           timeout_s: float = 1800.0, poll_s: float = 15.0,
                           name: str = MAGE_RERUN_CHECK) -> dg.AssetChecksDefinition:
    """The check that waits for the Mage reruns of a change set (module docstring).

    Args:
        asset: the repaired asset (the check is on it).
        pipelines: the Mage pipelines that read it downstream (waited for when run by hand).
        resource_key: the :class:`~dw_dagster.integrations.mage.MageResource`'s key.
        timeout_s: the bound of the wait (seconds, all pipelines together).
        poll_s: seconds between reads.
        name: the check's name.

    Returns:
        The asset check. Metadata: ``dw/mage_pipeline``, ``dw/mage_run_id``, ``dw/mage_status``
        (of the first rerun that did not pass, else of the last), ``dw/mage_after_utc`` and
        ``dw/mage_reruns_json`` (every outcome of :func:`wait_for_reruns`).
    """
    key = asset if isinstance(asset, dg.AssetKey) else dg.AssetKey.from_user_string(asset)
    configured = list(pipelines)

    @dg.asset_check(asset=key, name=name, required_resource_keys={resource_key}, blocking=False,
                    metadata={c.CHECK_KIND_KEY: "mage_rerun"},
                    description=f"The Mage reruns of {', '.join(configured) or 'the change set'} started after the last "
                    f"data step completed (waits at most {timeout_s:g} s).")
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        cs = change_set_of_run(context)
        if cs is not None:
            wanted = [s.target for s in mage_reruns(cs) if not s.check or s.check == [*key.path, name]]
            if not wanted:
                return dg.AssetCheckResult(passed=True, description=f"change set {cs.id} asks for no Mage rerun",
                                           metadata={c.MAGE_RERUNS_JSON_KEY: dg.MetadataValue.json([])})
            after, how = last_data_step_end(context.instance, cs), f"the end of change set {cs.id}'s last data step"
        else:
            wanted = configured
            since = _latest_step_time(context.instance, key)
            after, how = ((since, f"the latest change applied to {key.to_user_string()}") if since else
                          (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=24), "24 h ago (no change applied yet)"))
        try:
            client = getattr(context.resources, resource_key).get_client()
        except DwDagsterError as e:
            outcomes = [{"pipeline": p, "passed": False, "run_id": None, "status": None,
                         "reason": f"Mage is not configured: {e}"} for p in wanted]
        else:
            context.log.info(f"waiting up to {timeout_s:g} s for Mage runs of {', '.join(wanted)} started after "
                             f"{_fmt(after)} ({how})")
            outcomes = wait_for_reruns(client, wanted, after, timeout_s, poll_s)
        shown = next((o for o in outcomes if not o["passed"]), outcomes[-1])
        md: dict[str, Any] = {c.MAGE_PIPELINE_KEY: shown["pipeline"], c.MAGE_STATUS_KEY: shown["status"] or "no run",
                              c.MAGE_AFTER_UTC_KEY: after.isoformat(),
                              c.MAGE_RERUNS_JSON_KEY: dg.MetadataValue.json(outcomes)}
        if shown["run_id"] is not None:
            md[c.MAGE_RUN_ID_KEY] = shown["run_id"]
        if shown.get("url"):
            md[c.MAGE_RUN_URL_KEY] = dg.MetadataValue.url(shown["url"])
        passed = all(o["passed"] for o in outcomes)
        text = "; ".join(f"Mage {o['pipeline']}: {o['reason']}" for o in outcomes)
        return dg.AssetCheckResult(passed=passed, metadata=md,
                                   description=(text if passed else "Mage rerun not proven: " + text)[:2000])

    return _check


__all__ = ["build_mage_rerun_check", "last_data_step_end", "wait_for_reruns"]
