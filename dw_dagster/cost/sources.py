"""Where a cost report comes from: a warehouse URL (Snowflake, BigQuery) or the Dagster instance's timings.

:class:`CostResource` is the Dagster resource the daily cost observation job, the receipt job and
the warehouse-change jobs read their source from; :func:`cost_report` makes one report. Without a
warehouse URL the source is :class:`~dw_dagster.cost.timings.DagsterTimingCost` (the embedded
DuckDB default: step and dbt node seconds).
"""

from __future__ import annotations

from dw_dagster.dagster_private import beta, public
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from dw_dagster.cost.bigquery import DEFAULT_PRICE_PER_TIB, BigQueryCost
from dw_dagster.cost.mapping import invocation_runs, node_assets
from dw_dagster.cost.models import CostError, CostReport, Period
from dw_dagster.cost.snowflake import SnowflakeCost
from dw_dagster.cost.timings import DagsterTimingCost, runs_in

#: the environment variable ``dw-dagster cost`` reads the warehouse URL from when ``--url`` is not given
COST_URL_ENV = "DW_COST_URL"


def manifest_node_assets(paths: Sequence[str | Path]) -> dict[str, str]:
    """dbt node id → Dagster asset key ``a/b`` from dbt ``manifest.json`` files.

    Raises:
        CostError: a file that is missing or not JSON.
    """
    out: dict[str, str] = {}
    for p in paths:
        try:
            out.update(node_assets(json.loads(Path(p).read_text())))
        except (OSError, ValueError) as e:
            raise CostError(f"{p}: not a readable dbt manifest ({type(e).__name__}: {e})") from None
    return out


def make_source(url: str | None, *, instance: Any = None, period: Period | None = None,
                manifests: Sequence[str | Path] = (), run_results: Sequence[str | Path] = (),
                account_usage: str = "SNOWFLAKE.ACCOUNT_USAGE", query_attribution: bool = True,
                region: str = "us", project: str | None = None, jobs_view: str | None = None,
                price_per_tib: float = DEFAULT_PRICE_PER_TIB, database: Any = None) -> Any:
    """A cost source for ``url`` (``snowflake://...`` or ``bigquery://...``), or the Dagster timings when None.

    dbt node ids map to assets through ``manifests``; dbt invocations to Dagster runs through the
    ``invocation_id`` dagster-dbt records on the runs of ``period`` in ``instance`` (when given).

    Raises:
        CostError: an engine without a cost source, or no instance for the timings.
    """
    assets = manifest_node_assets(manifests)
    if url is None and database is None:
        if instance is None:
            raise CostError("no warehouse URL (--url or $DW_COST_URL) and no Dagster instance to read step timings from "
                            "(--dagster-home or $DAGSTER_HOME)")
        return DagsterTimingCost(instance, run_results=list(run_results), node_assets=assets)
    if database is None:
        from dw_dagster.databases import database_from_url

        database = database_from_url(url)
    runs = invocation_runs(instance, runs_in(instance, period)) if instance is not None and period is not None else {}
    if database.dialect == "snowflake":
        return SnowflakeCost(database, account_usage=account_usage, query_attribution=query_attribution,
                             node_assets=assets, invocation_runs=runs)
    if database.dialect == "bigquery":
        return BigQueryCost(database, region=region, project=project, jobs_view=jobs_view, price_per_tib=price_per_tib,
                            node_assets=assets, invocation_runs=runs)
    raise CostError(f"{database.name}: no billing to read on {database.dialect}; leave --url out to report the "
                    "Dagster step and dbt node seconds instead")


def cost_report(source: Any, period: Period) -> CostReport:
    """One report of ``source`` over ``period`` (one pushed-down statement)."""
    return source.report(period)


@public
@beta
class CostResource(dg.ConfigurableResource):
    """Where cost comes from, as a Dagster resource (the cost observation job, receipts, warehouse changes).

    Examples:
        .. code-block:: python

            cost = CostResource(url=dg.EnvVar("DW_COST_URL"), manifests=["target/manifest.json"])
    """

    url: str | None = Field(default=None, description="snowflake://... or bigquery://...; none: Dagster step and "
                            "dbt node seconds (DuckDB and engines without billing)")
    account_usage: str = Field(default="SNOWFLAKE.ACCOUNT_USAGE", description="Snowflake: where the usage views are")
    query_attribution: bool = Field(default=True, description="Snowflake: read QUERY_ATTRIBUTION_HISTORY beside")
    region: str = Field(default="us", description="BigQuery: the jobs view's region")
    project: str | None = Field(default=None, description="BigQuery: the project whose jobs are read")
    jobs_view: str | None = Field(default=None, description="BigQuery: another table with the JOBS view's columns")
    price_per_tib: float = Field(default=DEFAULT_PRICE_PER_TIB, description="BigQuery: on-demand USD per TiB billed")
    manifests: list[str] = Field(default_factory=list, description="dbt manifest.json files (node → asset)")
    run_results: list[str] = Field(default_factory=list, description="dbt run_results.json files of runs outside Dagster")

    def source(self, instance: Any, period: Period | None = None, database: Any = None) -> Any:
        return make_source(self.url, instance=instance, period=period, manifests=self.manifests,
                           run_results=self.run_results, account_usage=self.account_usage,
                           query_attribution=self.query_attribution, region=self.region, project=self.project,
                           jobs_view=self.jobs_view, price_per_tib=self.price_per_tib, database=database)

    def report(self, instance: Any, period: Period) -> CostReport:
        return self.source(instance, period).report(period)

    def get_database(self) -> Any:
        """The warehouse database of ``url`` (what a warehouse change's step runs on).

        Raises:
            CostError: no URL is configured.
        """
        if not self.url:
            raise CostError("this CostResource has no warehouse URL")
        from dw_dagster.databases import database_from_url

        return database_from_url(self.url)


def url_from_env() -> str | None:
    return os.environ.get(COST_URL_ENV) or None


__all__ = ["COST_URL_ENV", "CostResource", "cost_report", "make_source", "manifest_node_assets", "url_from_env"]
