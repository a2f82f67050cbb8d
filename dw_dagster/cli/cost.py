"""``dw-dagster cost``: what a period cost, by dbt model, Dagster asset, run or warehouse, reconciled to the meter."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from dw_dagster.cost.models import DIMENSIONS, CostError, CostReport, Period


def _instance_or_none(dagster_home: str | None):
    import dagster as dg

    home = dagster_home or os.environ.get("DAGSTER_HOME")
    if not home:
        return None
    if not Path(home).is_dir():
        raise click.UsageError(f"DAGSTER_HOME {home} is not a directory holding a Dagster instance")
    os.environ["DAGSTER_HOME"] = str(Path(home).resolve())
    return dg.DagsterInstance.get()


def _fmt(report: CostReport, value: float) -> str:
    if report.unit == "bytes_billed":
        return f"{value / 2**30:,.3f} GiB"
    if report.unit == "seconds":
        return f"{value:,.2f} s"
    return f"{value:,.6f}"


def render_text(report: CostReport, by: str, limit: int = 25) -> str:
    """The report for a person: totals, the reconciliation, and the ``by`` breakdown."""
    unit = {"credits": "credits", "bytes_billed": "bytes billed", "seconds": "seconds"}[report.unit]
    lines = [f"{report.engine} cost {report.period.since}..{report.period.until} (until exclusive), in {unit}",
             f"  metered      {_fmt(report, report.metered)}",
             f"  attributed   {_fmt(report, report.attributed)}",
             f"  idle         {_fmt(report, report.idle)}",
             f"  unattributed {_fmt(report, report.unattributed)}"
             + "".join(f"\n    {k.replace('_', ' ')}: {_fmt(report, v)}" for k, v in report.unattributed_detail.items() if v),
             f"  {'reconciled' if report.reconciled else 'NOT RECONCILED'}: {report.reconciliation}"]
    if "usd" in report.extra:
        lines.append(f"  on-demand cost: ${report.extra['usd']:,.2f} at ${report.extra['price_per_tib']}/TiB")
    qah = report.beside.get("query_attribution_history")
    if qah:
        lines.append(f"  beside: QUERY_ATTRIBUTION_HISTORY says {qah['credits']:,.6f} credits for {qah['queries']} queries; "
                     f"{qah['queries_not_in_view']} queries are not in it")
    rows = report.by(by)
    counts = report.queries_by.get(by, {})
    lines += ["", f"by {by} (top {min(limit, len(rows))} of {len(rows)}):"]
    width = max([len(k) for k in list(rows)[:limit]] + [len(by)])
    for key, value in list(rows.items())[:limit]:
        share = 100.0 * value / report.metered if report.metered else 0.0
        idle = report.idle_by_warehouse.get(key, 0.0) if by == "warehouse" else 0.0
        lines.append(f"  {key:<{width}}  {_fmt(report, value):>18}  {share:5.1f} %  {counts.get(key, 0):>7} queries"
                     + (f"  (idle {_fmt(report, idle)})" if idle else ""))
    if not rows:
        lines.append("  (nothing maps to this dimension in the period)")
    return "\n".join(lines)


@click.command("cost")
@click.option("--by", "by", type=click.Choice(DIMENSIONS), default="model", show_default=True,
              help="The breakdown printed (--json prints all of them).")
@click.option("--since", default=None, help="First UTC day, YYYY-MM-DD (default: 30 days before --until).")
@click.option("--until", default=None, help="The UTC day after the last, YYYY-MM-DD (default: today for a warehouse, "
              "whose meter lags; tomorrow for Dagster's own timings, so today so far counts).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--url", default=None, help="snowflake://... or bigquery://... (default $DW_COST_URL); without one, the "
              "seconds of the Dagster instance's steps and dbt nodes (DuckDB and engines without billing).")
@click.option("--account-usage", default="SNOWFLAKE.ACCOUNT_USAGE", show_default=True,
              help="Snowflake: the schema holding the usage views.")
@click.option("--no-query-attribution", is_flag=True, help="Snowflake: do not read QUERY_ATTRIBUTION_HISTORY.")
@click.option("--region", default="us", show_default=True, help="BigQuery: the region of INFORMATION_SCHEMA.JOBS.")
@click.option("--project", default=None, help="BigQuery: the project whose jobs are read.")
@click.option("--jobs-view", default=None, help="BigQuery: another table with the JOBS view's columns (dataset.table).")
@click.option("--price-per-tib", type=float, default=None, help="BigQuery: on-demand USD per TiB billed (default 6.25).")
@click.option("--manifest", "manifests", multiple=True, type=click.Path(dir_okay=False),
              help="dbt manifest.json (dbt nodes → Dagster assets); repeatable.")
@click.option("--run-results", "run_results", multiple=True, type=click.Path(dir_okay=False),
              help="dbt run_results.json of runs outside Dagster (seconds); repeatable.")
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None,
              help="Dagster instance directory (default $DAGSTER_HOME): runs, step timings, dbt invocations.")
def cost_command(by: str, since: str | None, until: str | None, as_json: bool, url: str | None, account_usage: str,
                 no_query_attribution: bool, region: str, project: str | None, jobs_view: str | None,
                 price_per_tib: float | None, manifests: tuple[str, ...], run_results: tuple[str, ...],
                 dagster_home: str | None) -> None:
    """What a period cost: metered = attributed + idle + unattributed, by dbt model, asset, run or warehouse.

    Snowflake: credits from the account usage views (hourly metering split by each query's execution
    time, idle hours per warehouse, cloud services as billed). BigQuery: bytes billed and slot time
    from INFORMATION_SCHEMA.JOBS. Otherwise the seconds of the Dagster instance's steps and dbt nodes.
    One statement per report, shown as "sql" in --json.
    """
    from dw_dagster.cost.bigquery import DEFAULT_PRICE_PER_TIB
    from dw_dagster.cost.sources import make_source, url_from_env

    try:
        url = url or url_from_env()
        # a warehouse's meter lags: whole days up to yesterday; Dagster's timings: today so far too
        period = Period.parse(since, until, include_today=not url)
        instance = _instance_or_none(dagster_home)
        source = make_source(url, instance=instance, period=period, manifests=manifests,
                             run_results=run_results, account_usage=account_usage,
                             query_attribution=not no_query_attribution, region=region, project=project,
                             jobs_view=jobs_view, price_per_tib=price_per_tib or DEFAULT_PRICE_PER_TIB)
        report = source.report(period)
    except CostError as e:
        raise click.ClickException(str(e)) from e
    except (ValueError, ImportError) as e:  # a malformed URL, a missing extra
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    if as_json:
        click.echo(json.dumps(report.to_json_dict(), indent=2))
    else:
        click.echo(render_text(report, by))
    if not report.reconciled:
        raise SystemExit(2)


__all__ = ["cost_command", "render_text"]
