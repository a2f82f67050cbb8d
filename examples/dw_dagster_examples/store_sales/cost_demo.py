"""``dw-dagster demo cost``: what the store-sales runs cost on the embedded DuckDB warehouse, what a month
costs on Snowflake (fakesnow, seeded), and one warehouse change approved, applied and verified.

The store-sales part is this example's own: a nightly load over the month and the dbt build run
through Dagster (at a small scale) and are reported in seconds. The rest is the demo harness's (:mod:`dw_dagster_dev.cost_demo`).
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from dw_dagster_examples.store_sales import generator as gen
from dw_dagster_examples.store_sales import home as h
from dw_dagster.databases import DuckDBDatabase
from dw_dagster_examples.store_sales.definitions import DAILY, build_definitions
from dw_dagster_dev.cost_demo import CostDemoResult, run_cost_demo
from dw_dagster_dev.demo import RANGE_END_TAG, RANGE_START_TAG, DemoSpec, Timeline, claim_demo_dir, run_job

DEFAULT_SCALE = gen.MIN_SCALE


def run(*, home: Path, instance: dg.DagsterInstance, scale: float = DEFAULT_SCALE, log: Timeline | None = None,
        result: CostDemoResult | None = None) -> CostDemoResult:
    log = log or Timeline()
    res = result if result is not None else CostDemoResult(scale=scale)
    res.scale = scale
    claim_demo_dir(home)
    sales_home = h.ensure_home(home / "store_sales")

    def embedded() -> None:
        """One nightly load over the month and one dbt build, through Dagster."""
        src = DuckDBDatabase(h.source_path(sales_home))
        n = gen.post_lines(src, scale, gen.BEFORE_RECOVERY)
        defs = build_definitions(sales_home)
        keys = DAILY.get_partition_keys()
        log.detail(f"posted {n:,} POS lines; load of {keys[0]}..{keys[-2]} and dbt build of the store-sales models")
        run_job(defs.resolve_job_def("store_sales_daily_load"), instance, "load",
                tags={RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-2]})
        run_job(defs.resolve_job_def("store_sales_models"), instance, "dbt build")

    return run_cost_demo(home=home, instance=instance, log=log, result=res, embedded=embedded)


#: what ``dw-dagster demo cost`` runs (:class:`~dw_dagster_dev.demo.DemoSpec`)
DEMO = DemoSpec(
    name="cost", run=run, new_result=lambda scale: CostDemoResult(scale=scale), home_attr="cost_home",
    home_folder="cost", instance_folder="dagster_home", log_name="demo_cost.log", home_env=h.HOME_ENV,
    location_module="dw_dagster_examples.store_sales.definitions", asset="warehouse/LOAD_WH",
    events="dw/change_set, dw/approval, dw/receipt, dw/cost_report", default_scale=DEFAULT_SCALE,
    min_scale=gen.MIN_SCALE, max_scale=0.05)

__all__ = ["DEFAULT_SCALE", "DEMO", "run"]
