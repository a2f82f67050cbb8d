"""Wiring a drafted warehouse change (:mod:`dw_dagster.cost.warehouse`) after its approval: the
warehouses as assets with their saving check, the setting step, verify and receipt jobs and a
remediation sensor that walks warehouse changes only. See docs/guides/cost.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg
from dw_dagster.dagster_private import public


def not_a_warehouse_change(cs) -> bool:
    """The loop's remediation sensor leaves warehouse changes to their own sensor (one walker per change set)."""
    from dw_dagster.cost.warehouse_apply import is_warehouse_change

    return not is_warehouse_change(cs)


@public
def build_warehouse_change_definitions(warehouses: "Sequence[str]", cost: Any, *, resource_key: str = "dw_cost",
                                       domains: Any = None, clock: Any = None,
                                       sensor_name: str | None = None,
                                       executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """Everything a drafted warehouse change needs after approval, as Definitions to merge into a code location.

    Args:
        warehouses: the warehouses (Snowflake names) that may be changed: each becomes an asset
            ``warehouse/<NAME>`` with its ``warehouse_saving`` check.
        cost: the :class:`~dw_dagster.cost.sources.CostResource` on the Snowflake account.
        domains: where approvers are read (default ``$DW_DOMAINS_FILE``).
        clock: "now" (aware UTC) for the saving gate; default the real clock.

    Returns:
        Definitions with the warehouse assets and checks, the ``warehouse_setting`` step job, the verify
        and receipt jobs, and the remediation sensor (it walks warehouse changes only; the loop's own
        sensor should not be given them).
    """
    from dw_dagster.core import keys as c
    from dw_dagster.core.models import utcnow
    from dw_dagster.cost.warehouse_apply import (build_warehouse_saving_checks, is_warehouse_change,
                                                 run_warehouse_setting_step, saving_gate)
    from dw_dagster.receipts.job import build_receipt_job
    from dw_dagster.repair.jobs import build_verify_job
    from dw_dagster.repair.sensor import build_remediation_sensor
    from dw_dagster.repair.steps import build_step_jobs

    clock = clock or utcnow
    sensor_name = sensor_name or c.WAREHOUSE_SENSOR

    specs = [dg.AssetSpec([c.WAREHOUSE_ASSET_PREFIX, w], group_name=c.WAREHOUSE_ASSET_PREFIX, kinds={"snowflake"},
                          description=f"Snowflake warehouse {w}: its settings and what it meters") for w in warehouses]
    checks = build_warehouse_saving_checks(warehouses, resource_key=resource_key)
    verify = build_verify_job(c.WAREHOUSE_VERIFY_JOB, [dg.AssetCheckKey(dg.AssetKey([c.WAREHOUSE_ASSET_PREFIX, w]),
                                                                       c.WAREHOUSE_SAVING_CHECK) for w in warehouses],
                              executor=executor)
    steps = build_step_jobs({c.WAREHOUSE_SETTING_STEP: run_warehouse_setting_step}, resource_keys=(resource_key,),
                            include_migration=False, executor=executor)
    receipt = build_receipt_job(c.WAREHOUSE_RECEIPT_JOB, executor=executor, cost=cost)
    sensor = build_remediation_sensor(verify_job=verify, receipt_job=receipt, step_jobs=steps, domains=domains,
                                      name=sensor_name, stage_gates={"verify": saving_gate(clock)},
                                      accepts=is_warehouse_change)
    return dg.Definitions(assets=specs, asset_checks=checks, jobs=[verify, receipt, *steps.values()], sensors=[sensor],
                          resources={resource_key: cost})


__all__ = ["build_warehouse_change_definitions", "not_a_warehouse_change"]
