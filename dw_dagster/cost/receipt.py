"""What a repair cost, for its receipt: the runs that held its stages, by their tags.

Always: each stage run's step seconds and the dbt nodes it ran (seconds from dbt's run_results,
as dagster-dbt records them), from the event log of those runs only. With a warehouse cost source
(:class:`~dw_dagster.cost.sources.CostResource` with a URL): the queries the runs issued, found
by the ``dagster_run_id`` their statements carry (:mod:`dw_dagster.databases.tags`), with their
credits or bytes billed. Snowflake's ``ACCOUNT_USAGE`` lags (up to 45 minutes for queries, 3 hours
for metering): queries not in it yet are said to be pending, never counted as free.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from dw_dagster.core import keys as c
from dw_dagster.cost.models import Period


def _period_of(runs: list[Any], instance: Any) -> Period:
    days = []
    for run in runs:
        rec = instance.get_run_record_by_id(run.run_id)
        for t in (getattr(rec, "start_time", None), getattr(rec, "end_time", None), getattr(rec, "create_timestamp", None)):
            if t is None:
                continue
            days.append(t.date() if isinstance(t, dt.datetime) else dt.datetime.fromtimestamp(t, dt.timezone.utc).date())
    today = dt.datetime.now(dt.timezone.utc).date()
    return Period(since=min(days, default=today), until=max(days, default=today) + dt.timedelta(days=1))


def repair_cost(instance: Any, run_ids: Mapping[str, str], cost: Any = None) -> dict[str, Any]:
    """The cost of the runs that held a repair's stages (stage → run id).

    Args:
        cost: a :class:`~dw_dagster.cost.sources.CostResource` whose warehouse the runs' queries ran on;
            None: the runs' seconds only.

    Returns:
        ``{"runs", "seconds", "by_stage": {stage: seconds}, "dbt_nodes": {node: seconds}, "steps", "engine",
        "queries", "amount", "unit", "by_stage_queries", "by_stage_amount", "note"}`` (warehouse fields only
        with a warehouse source). Never raises for the warehouse's sake: a failed read is in ``note``.
    """
    from dw_dagster.cost.timings import read_runs, report_from_timings

    try:
        runs = [r for r in (instance.get_run_by_id(rid) for rid in dict(run_ids).values()) if r is not None]
        period = _period_of(runs, instance)
        t = read_runs(instance, runs)
        timing = report_from_timings(t, period)
    except Exception as e:  # noqa: BLE001 - a receipt is never lost to its cost
        return {"runs": len(run_ids), "note": f"the runs' timings could not be read: {type(e).__name__}: {str(e)[:300]}"}
    stage_of = {rid: stage for stage, rid in run_ids.items()}
    out: dict[str, Any] = {
        "runs": len(runs), "seconds": round(timing.metered, 3), "steps": len(t.steps),
        "by_stage": {stage_of[r]: round(v, 3) for r, v in timing.by_run.items() if r in stage_of},
        "dbt_nodes": {k: round(v, 3) for k, v in timing.by_model.items()},
        "engine": "dagster steps", "unit": "seconds",
    }
    if cost is None or not getattr(cost, "url", None):
        out["note"] = "seconds of the runs' steps and dbt nodes (no warehouse billing configured)"
        return out
    try:
        report = cost.report(instance, period)
    except Exception as e:  # noqa: BLE001 - a receipt is never lost to the warehouse (CostError included)
        out["note"] = f"the warehouse's query history could not be read: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return out
    queries = {stage_of[r]: n for r, n in report.queries_by.get("run", {}).items() if r in stage_of}
    amounts = {stage_of[r]: v for r, v in report.by_run.items() if r in stage_of}
    out.update(engine=report.engine, unit=report.unit, queries=sum(queries.values()), amount=sum(amounts.values()),
               by_stage_queries=queries, by_stage_amount=amounts,
               note=(f"queries found by their dagster_run_id tag in {report.engine}'s history"
                     + ("" if queries else "; none yet: the history may lag (Snowflake ACCOUNT_USAGE up to 45 min, "
                        "metering up to 3 h); `dw-dagster cost --by run` shows them later")))
    if report.unit == "bytes_billed":
        out["usd"] = out["amount"] / 2**40 * report.extra.get("price_per_tib", 0)
    return out


def cost_line(cost: Mapping[str, Any]) -> str:
    """The receipt's markdown line for :func:`repair_cost`'s result."""
    if not cost:
        return ""
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in (cost.get("by_stage") or {}).items())
    nodes = cost.get("dbt_nodes") or {}
    if "seconds" not in cost:
        return f"- **Repair cost**: {cost.get('note', 'not known')}"
    text = (f"- **Repair cost**: {cost.get('runs', 0)} run(s), {cost.get('seconds', 0):.1f} s of steps ({stages or 'none'})"
            + (f"; dbt: {len(nodes)} node(s), {sum(nodes.values()):.1f} s" if nodes else ""))
    if "queries" in cost:
        unit = cost.get("unit")
        amount = cost.get("amount", 0.0)
        shown = f"{amount / 2**30:.3f} GiB billed" if unit == "bytes_billed" else f"{amount:.6f} {unit}"
        text += f"; {cost.get('engine')}: {cost['queries']} tagged quer{'y' if cost['queries'] == 1 else 'ies'}, {shown}"
    return text


def saving_line(outcome: Any) -> str:
    """The receipt's markdown line for a ``warehouse_saving`` check outcome: what was saved, or that it was not."""
    md = outcome.metadata
    measured, expected = float(md.get(c.SAVING_MEASURED_KEY, 0.0)), float(md.get(c.SAVING_EXPECTED_KEY, 0.0))
    period = f"{md.get(c.SAVING_SINCE_KEY)}..{md.get(c.SAVING_UNTIL_KEY)}"
    verdict = ("saved" if measured > 0 else "NOT saved") if md.get(c.SAVING_RULE_KEY) not in ("queued", "spilling") else (
        "symptom shrank" if outcome.passed else "symptom did NOT shrink")
    return (f"- **Saving** ({'/'.join(outcome.asset_key)}, {period}): {verdict}: measured {measured:.6g} credits, "
            f"expected {expected:.6g}")


__all__ = ["cost_line", "repair_cost", "saving_line"]
