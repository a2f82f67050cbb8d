"""Applying and verifying a drafted warehouse change through the repair machinery.

- :func:`run_warehouse_setting_step` is the runner of ``warehouse_setting`` steps
  (:func:`dw_dagster.repair.steps.build_step_jobs`): it reads ``SHOW WAREHOUSES``, refuses when the
  warehouse is no longer as drafted (someone changed it: the drafted rollback would be wrong), runs
  the reviewed ``ALTER WAREHOUSE``, and refuses unless ``SHOW WAREHOUSES`` then shows the new values.
  Already applied (a rerun, or set by hand): nothing runs.
- :func:`saving_gate` holds the ``verify`` stage until the measured period after the change is over
  and metered (its last day plus Snowflake's metering latency of 3 hours).
- :func:`build_warehouse_saving_checks`: the ``warehouse_saving`` check of each warehouse: the
  warehouse's metered credits per day over the days after the change against the drafting period;
  a saving change passes when it saved credits, a performance change (more clusters, a larger size)
  when its symptom shrank. The check's numbers (expected and measured saving) land in the receipt.
- :func:`dw_dagster.wiring.warehouse.build_warehouse_change_definitions` wires them: the warehouses as
  assets, their checks, the step, verify and receipt jobs and a remediation sensor that walks only
  warehouse changes.
"""

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.models import ChangeSet, ChangeStep, utcnow
from dw_dagster.cost.models import Period
from dw_dagster.cost.warehouse import Settings, alter_warehouse, measure, show_warehouse, size_index
from dw_dagster.databases import Database
from dw_dagster.changes.steps import StepRefused, step_results
from dw_dagster.repair.steps import build_step_jobs

#: Snowflake's metering views lag up to this long (METERING_DAILY_HISTORY: 180 minutes)
METERING_LATENCY = dt.timedelta(hours=3)


def _same(key: str, a: Any, b: Any) -> bool:
    if key == "WAREHOUSE_SIZE":
        return size_index(a) == size_index(b)
    return str(a).upper() == str(b).upper()


def _values(now: Settings, keys: Sequence[str]) -> dict[str, Any]:
    return {k: now.value(k) for k in keys}


def run_warehouse_setting_step(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db: Database) -> dict:
    """Apply one approved ``warehouse_setting`` step (see the module docstring).

    Returns:
        ``{warehouse, rule, before, after, statements, rollback, already_applied, effective_at, measure,
        verify_not_before}``.

    Raises:
        StepRefused: the warehouse is not as drafted, the statement is not the reviewed one, or SHOW
            WAREHOUSES does not show the new values after it ran.
    """
    spec = step.spec
    name, target, rollback = spec["warehouse"], dict(spec["set"]), dict(spec["rollback"])
    forward = alter_warehouse(name, target)
    if step.sql != [forward]:
        raise StepRefused(f"the step's statement is not the one built from its settings: {step.sql} vs {forward}")
    before = _values(show_warehouse(db, name), list(target))
    already = all(_same(k, before[k], v) for k, v in target.items())
    if not already:
        moved = {k: before[k] for k, v in rollback.items() if not _same(k, before[k], v)}
        if moved:
            raise StepRefused(f"{name} changed since the draft: SHOW WAREHOUSES shows {moved}, the draft's rollback "
                              f"restores {rollback}; draft again", {"now": before, "drafted": rollback})
        db.execute(forward)
        after = _values(show_warehouse(db, name), list(target))
        wrong = {k: after[k] for k, v in target.items() if not _same(k, after[k], v)}
        if wrong:
            raise StepRefused(f"{forward} ran but SHOW WAREHOUSES shows {wrong}", {"after": after, "wanted": target})
    else:
        after = before
    effective = utcnow()
    since = effective.date() + dt.timedelta(days=1)
    until = since + dt.timedelta(days=int(spec.get("measure_days", 7)))
    not_before = dt.datetime.combine(until, dt.time(), dt.timezone.utc) + METERING_LATENCY
    context.log.info(f"{name}: {'already set' if already else 'set'} {target} (was {before}); saving measured over "
                     f"{since}..{until}, from {not_before.isoformat()}")
    return {"warehouse": name, "rule": spec.get("rule"), "before": before, "after": after, "already_applied": already,
            "statements": [] if already else [forward], "rollback": step.rollback_sql,
            "effective_at": effective.isoformat(), "measure": {"since": since.isoformat(), "until": until.isoformat()},
            "verify_not_before": not_before.isoformat()}


def _warehouse_result(instance: dg.DagsterInstance, cs: ChangeSet) -> dict | None:
    return next((r for r in step_results(instance, cs) if r.get("kind") == c.WAREHOUSE_SETTING_STEP
                 and not r.get("refused")), None)


def saving_gate(clock: Callable[[], dt.datetime] = utcnow) -> Callable[[dg.DagsterInstance, ChangeSet], str | None]:
    """A ``stage_gates["verify"]`` gate: a warehouse change's verify waits until its measured period is metered.

    Args:
        clock: what "now" is (aware UTC); a demo passes one that has moved on to after the period.
    """

    def gate(instance: dg.DagsterInstance, cs: ChangeSet) -> str | None:
        res = _warehouse_result(instance, cs) if any(s.kind == c.WAREHOUSE_SETTING_STEP for s in cs.steps) else None
        if res is None or not res.get("verify_not_before"):
            return None
        ready = dt.datetime.fromisoformat(res["verify_not_before"])
        if clock() < ready:
            m = res["measure"]
            return (f"waits until {ready.isoformat()}: the saving is measured over {m['since']}..{m['until']} "
                    "once it is metered")
        return None

    return gate


def measured_saving(source: Any, spec: dict, result: dict) -> dict[str, Any]:
    """The warehouse's credits per day after the change against the drafting period (one symptom statement,
    one completeness count); ``ready`` is false while a day of the period is not metered yet."""
    m = result["measure"]
    period = Period(since=dt.date.fromisoformat(m["since"]), until=dt.date.fromisoformat(m["until"]))
    symptoms, text = measure(source, period)
    after = next((s for s in symptoms if s.warehouse.upper() == spec["warehouse"].upper()), None)
    days = _metered_days(source, period)
    credits = after.credits if after else 0.0
    base = spec["baseline"]
    per_day_after = credits / period.days
    saving = (float(base["credits_per_day"]) - per_day_after) * period.days
    base_days = (dt.date.fromisoformat(base["until"]) - dt.date.fromisoformat(base["since"])).days
    expected = float(spec["saving_expected"]) / base_days * period.days
    return {"ready": days >= period.days, "metered_days": days, "period": period, "after": after,
            "credits_after": credits, "credits_per_day_before": float(base["credits_per_day"]),
            "credits_per_day_after": per_day_after, "saving_measured": saving, "saving_expected": expected, "sql": text}


def _metered_days(source: Any, period: Period) -> int:
    from dw_dagster.cost import sqlbuild as sb

    text = sb.build("SELECT COUNT(DISTINCT usage_date) FROM :mdh WHERE usage_date >= :s AND usage_date < :u", "snowflake",
                    mdh=source.view("METERING_DAILY_HISTORY"), s=period.since, u=period.until).sql(dialect=source.db.dialect)
    return int(source.db.fetch_all(text)[0][0] or 0)


def _verdict(spec: dict, before: dict, got: dict) -> tuple[bool, str]:
    rule = spec.get("rule")
    if rule in ("queued", "spilling"):
        after = got["after"]
        key = "queued_queries" if rule == "queued" else "spilling_queries"
        b = before.get(key, 0) / max(before.get("queries", 1), 1)
        a = (getattr(after, key) / max(after.queries, 1)) if after else 0.0
        return a < b, f"{key.replace('_', ' ')} per query {b:.3f} before, {a:.3f} after"
    return got["saving_measured"] > 0, (f"saved {got['saving_measured']:.4g} credits" if got["saving_measured"] > 0
                                        else f"not saved: {-got['saving_measured']:.4g} credits more")


def build_warehouse_saving_checks(warehouses: Sequence[str], *, resource_key: str = "dw_cost") -> list[dg.AssetChecksDefinition]:
    """The ``warehouse_saving`` check on each warehouse's asset (``warehouse/<NAME>``), run by the verify stage."""
    return [_saving_check(w, resource_key) for w in warehouses]


def _saving_check(warehouse: str, resource_key: str) -> dg.AssetChecksDefinition:
    from dw_dagster.repair.replay_checks import change_set_of_run

    @dg.asset_check(asset=dg.AssetKey([c.WAREHOUSE_ASSET_PREFIX, warehouse]), name=c.WAREHOUSE_SAVING_CHECK,
                    required_resource_keys={resource_key}, blocking=False,
                    description=f"Whether the approved setting change on {warehouse} did what it was drafted for, "
                                "measured over the metered days after it.")
    def saving(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        cs = change_set_of_run(context)
        step = next((s for s in (cs.steps if cs else []) if s.kind == c.WAREHOUSE_SETTING_STEP
                     and s.spec.get("warehouse", "").upper() == warehouse.upper()), None)
        if step is None:
            return dg.AssetCheckResult(passed=True, description=f"no approved change of {warehouse} under way: nothing to measure")
        result = _warehouse_result(context.instance, cs)
        if result is None:
            return dg.AssetCheckResult(passed=False, description=f"the change of {warehouse} has no applied step to measure")
        cost = getattr(context.resources, resource_key)
        got = measured_saving(cost.source(context.instance), step.spec, result)
        md = {c.SAVING_EXPECTED_KEY: float(got["saving_expected"]), c.SAVING_MEASURED_KEY: float(got["saving_measured"]),
              c.SAVING_BEFORE_KEY: got["credits_per_day_before"], c.SAVING_AFTER_KEY: got["credits_per_day_after"],
              c.SAVING_SINCE_KEY: got["period"].since.isoformat(), c.SAVING_UNTIL_KEY: got["period"].until.isoformat(),
              c.SAVING_DAYS_KEY: got["metered_days"], c.SAVING_RULE_KEY: str(step.spec.get("rule")),
              c.SAVING_EVIDENCE_KEY: dg.MetadataValue.md(f"```sql\n{got['sql']}\n```")}
        if not got["ready"]:
            return dg.AssetCheckResult(passed=False, metadata=md, description=(
                f"{warehouse}: only {got['metered_days']} of {got['period'].days} days after the change are metered; "
                "the saving cannot be measured yet"))
        ok, words = _verdict(step.spec, step.spec.get("symptoms", {}), got)
        return dg.AssetCheckResult(passed=ok, metadata=md, description=(
            f"{warehouse}: {got['credits_per_day_before']:.4g} credits/day before, {got['credits_per_day_after']:.4g} after "
            f"over {got['period'].since}..{got['period'].until}: {words} (expected {got['saving_expected']:.4g})"))

    return saving


def is_warehouse_change(cs: ChangeSet) -> bool:
    """A change set made of ``warehouse_setting`` steps only."""
    return bool(cs.steps) and all(s.kind == c.WAREHOUSE_SETTING_STEP for s in cs.steps)


__all__ = ["METERING_LATENCY", "build_warehouse_saving_checks", "is_warehouse_change",
           "measured_saving", "run_warehouse_setting_step", "saving_gate"]
