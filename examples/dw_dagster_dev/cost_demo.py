"""``dw-dagster demo cost``: one cost report per engine, and one warehouse change approved, applied and verified.

1. **Embedded default (DuckDB).** The example's own runs (its loads and dbt build, through Dagster)
   are reported in seconds: Dagster step timings and dbt's node timings.
2. **Snowflake (fakesnow).** A month of a known workload is seeded into stand-in
   ``SNOWFLAKE.ACCOUNT_USAGE`` views (:mod:`dw_dagster_dev.cost_workload`) and reported in credits,
   reconciled to metering.
3. **A warehouse change.** Changes are drafted from the month's symptoms for the warehouses' owner
   (the domains file lists the warehouses); the idle one on ``LOAD_WH`` (AUTO_SUSPEND 1800 s → 60 s)
   is proposed, refused for the proposer, approved by the owner logged in at the stand-in identity
   provider, applied by the remediation sensor (``ALTER WAREHOUSE`` on fakesnow's emulation),
   held until the week after it is metered, and verified by the ``warehouse_saving`` check over
   that week's metering.

fakesnow meters nothing: "a week later" is simulated. The demo's clock moves to the end of the
measured week and the workload of that week, run with the new setting, is seeded (its metering
computed from it as for the month), so the saving measured is the setting's effect on the same
workload. It says so in its timeline.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from dw_dagster.core import records
from dw_dagster.core.keys import WAREHOUSE_SAVING_CHECK, WAREHOUSE_SENSOR
from dw_dagster.core.models import utcnow
from dw_dagster_dev import cost_workload as cw
from dw_dagster_dev.demo import DemoError, Timeline, clip, demo_login
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_dev.services import OidcProvider, _start

OWNER = "priya.raman@grocer.example"
NOT_LISTED = "sam.lee@grocer.example"
ACCOUNT_USAGE = "SNOWFLAKE.ACCOUNT_USAGE"
EMULATOR_SCHEMA = "SNOWFLAKE.DW_FAKESNOW"
SENSOR = WAREHOUSE_SENSOR


@dataclass
class CostDemoResult:
    reports: list[dict] = field(default_factory=list)
    drafted: list[dict] = field(default_factory=list)
    warehouse_change: dict = field(default_factory=dict)
    refused: list[dict] = field(default_factory=list)
    receipt: dict = field(default_factory=dict)
    days: int = 30
    scale: float = 0.0
    seconds: float = 0.0
    dagster_home: str = ""
    cost_home: str = ""
    ok: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


@contextlib.contextmanager
def fakesnow_service(folder: Path) -> Iterator[str]:
    """fakesnow with the warehouse emulation as a child process; yields a ``snowflake://`` URL of database SNOWFLAKE."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        proc, port = _start(["dw_dagster_dev.fakes.fakesnow_server", "--port", "0"], folder / "fakesnow.log", 60.0)
    except ImportError as e:  # pragma: no cover - the test extra holds fakesnow
        raise DemoError(f"setup: fakesnow is not installed ({e}); pip install 'dw-dagster[test]'") from e
    try:
        base = f"snowflake://fake:snow@fakesnow/{{db}}?host=127.0.0.1&port={int(port)}&protocol=http&login_timeout=20&network_timeout=20"
        from dw_dagster.databases import database_from_url

        database_from_url(base.format(db="")).execute("CREATE DATABASE IF NOT EXISTS SNOWFLAKE")
        yield base.format(db="SNOWFLAKE")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def write_domains(path: Path, issuer: str) -> Path:
    path.write_text(
        "# Who owns the Snowflake warehouses and approves their setting changes (dw_dagster domains file).\n"
        "domains:\n  - name: data_platform\n    warehouses: [TRANSFORM_WH, LOAD_WH, BI_WH]\n"
        f"    approvers: [{OWNER}]\n    autonomy: L2\n    approval_expiry_hours: 24\n"
        f"identity:\n  oidc:\n    issuer: {issuer}\n    audience: dw-dagster\n")
    return path


def schema_url(url: str, schema: str) -> str:
    """``url`` (database SNOWFLAKE) with ``schema`` as the session's schema."""
    base, _, query = url.partition("?")
    return f"{base}/{schema}?{query}"


def seed(url: str, workload: cw.Workload, folder: Path, *, append: bool = False) -> None:
    """The workload's account usage rows (and, unless appending, the warehouses' settings for the
    emulation), loaded through fakesnow from Parquet files (:func:`~dw_dagster_dev.cost_workload.load_parquet`)."""
    from dw_dagster.databases import database_from_url

    for schema, tables in ((ACCOUNT_USAGE, tuple(cw.TABLES)), (EMULATOR_SCHEMA, ("WAREHOUSES",))):
        if append and schema == EMULATOR_SCHEMA:
            continue
        database_from_url(url).execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        db = database_from_url(schema_url(url, schema.split(".")[1]))
        cw.load_parquet(db, schema, workload, folder, tables, append=append)


def run_cost_demo(*, home: Path, instance: dg.DagsterInstance, log: Timeline, result: CostDemoResult, days: int = 30,
                  embedded: Callable[[], Any] | None = None) -> CostDemoResult:
    """Run the three parts (module docstring); raise :class:`DemoError` naming the stage that went wrong.

    Args:
        home: the demo's folder (services' logs, the domains file).
        embedded: runs the example's own jobs on ``instance`` (the embedded DuckDB part); None skips it.
    """
    from dw_dagster.cost.models import Period
    from dw_dagster.cost.timings import DagsterTimingCost

    result.days, result.cost_home = days, str(home)
    today = utcnow().date()
    if embedded is not None:
        log("duckdb", "the example's loads and dbt build, through Dagster ...")
        embedded()
        report = DagsterTimingCost(instance).report(Period(since=today, until=today + dt.timedelta(days=1)))
        _log_report(log, report, "asset")
        result.reports.append(report.to_json_dict())
    with OidcProvider(home / "services", [OWNER, NOT_LISTED]) as idp, fakesnow_service(home / "services") as url:
        log("setup", f"fakesnow with warehouse emulation; stand-in identity provider {idp.url}")
        return _snowflake(home, instance, log, result, days, today, url, write_domains(home / "domains.yaml", idp.url))


def _log_report(log: Timeline, report: Any, by: str) -> None:
    log(report.engine, f"{report.period.since}..{report.period.until}: metered {report.metered:.6g} {report.unit}; "
        f"attributed {report.attributed:.6g}, idle {report.idle:.6g}, unattributed {report.unattributed:.6g} "
        f"({'reconciled' if report.reconciled else 'NOT reconciled'})")
    for key, value in list(report.by(by).items())[:4]:
        log.detail(f"{by} {clip(key, 60)}: {value:.6g} {report.unit}")
    if not report.reconciled:
        raise DemoError(f"{report.engine}: the report does not reconcile: {report.reconciliation}")


def _snowflake(home: Path, instance: dg.DagsterInstance, log: Timeline, result: CostDemoResult, days: int,
               today: dt.date, url: str, domains_file: Path) -> CostDemoResult:
    from dw_dagster.core.domains import load_domains
    from dw_dagster.cost.models import Period
    from dw_dagster.cost.sources import CostResource
    from dw_dagster.cost.warehouse import draft_warehouse_changes
    from dw_dagster.definitions import build_warehouse_change_definitions
    from dw_dagster.databases import database_from_url
    from dw_dagster.proposals.change_sets import propose

    db = database_from_url(url)
    month = cw.generate(today - dt.timedelta(days=days), days, bi_per_hour=10)
    seed(url, month, home / "seed")
    log("seed", f"{len(month.queries):,} queries over {days} days on 3 warehouses into stand-in {ACCOUNT_USAGE} views")
    cost = CostResource(url=url)
    period = Period(since=month.since, until=month.until)
    report = cost.report(instance, period)
    _log_report(log, report, "warehouse")
    result.reports.append(report.to_json_dict())

    drafts, notes = draft_warehouse_changes(cost.source(instance), period, load_domains(domains_file))
    result.drafted = [{"id": d.id, "warehouse": d.steps[0].spec["warehouse"], "rule": d.steps[0].spec["rule"],
                       "forward": d.steps[0].sql, "rollback": d.steps[0].rollback_sql,
                       "saving_expected": d.steps[0].spec["saving_expected"], "summary": d.summary} for d in drafts]
    for d in result.drafted:
        log("draft", clip(d["summary"], 150))
    for n in notes:
        log.detail(n)
    chosen = next((d for d in drafts if d.steps[0].spec["warehouse"] == "LOAD_WH" and d.steps[0].spec["rule"] == "idle"), None)
    if chosen is None:
        raise DemoError("draft: no idle change drafted for LOAD_WH")
    cs, _ = propose(instance, chosen)
    step = cs.steps[0]
    log("propose", f"change set {cs.id} for {', '.join(cs.approvers)}: {step.sql[0]} (rollback {step.rollback_sql[0]})")
    log.detail(f"evidence: {clip(' '.join(step.spec['evidence_sql'].split()), 140)}")

    clock = {"now": None}
    defs = build_warehouse_change_definitions(["TRANSFORM_WH", "LOAD_WH", "BI_WH"], cost, domains=str(domains_file),
                                              clock=lambda: clock["now"] or utcnow())
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    _approve(instance, daemon, cs, domains_file, result, log)

    run_ids: dict[str, str] = {}
    _tick(daemon, instance, run_ids, log)  # the ALTER
    after = _show(db, "LOAD_WH")
    log("apply", f"SHOW WAREHOUSES: LOAD_WH auto_suspend={after.auto_suspend} (was 1800)")
    tick = daemon.tick(SENSOR)
    if tick.run_ids:
        raise DemoError("verify: ran before the week after the change was metered")
    log("wait", clip(tick.skip_reason or "", 160))

    res = next(r for r in _step_results(instance, cs))
    since = dt.date.fromisoformat(res["measure"]["since"])
    week = cw.generate(since, (dt.date.fromisoformat(res["measure"]["until"]) - since).days, bi_per_hour=10, seed=30,
                       warehouses=[w if w.name != "LOAD_WH" else cw.Warehouse("LOAD_WH", w.size, after.auto_suspend)
                                   for w in cw.DEFAULT_WAREHOUSES])
    seed(url, week, home / "seed", append=True)
    clock["now"] = dt.datetime.fromisoformat(res["verify_not_before"]) + dt.timedelta(minutes=1)
    log("a week later", f"[simulated] the clock moves to {clock['now'].isoformat()}; the week's {len(week.queries):,} "
        "queries, run with AUTO_SUSPEND 60, are metered")
    _tick(daemon, instance, run_ids, log)  # verify
    _tick(daemon, instance, run_ids, log)  # receipt
    receipts = [r for r in records.receipts(instance) if r.change_set_id == cs.id]
    if not receipts:
        raise DemoError("receipt: none written")
    rc = receipts[0]
    check = next((o for o in rc.checks if o.check_name == WAREHOUSE_SAVING_CHECK), None)
    md = check.metadata if check else {}
    result.receipt = {"id": rc.id, "outcome": rc.outcome, "verified": rc.verified,
                      "repair_cost": rc.evidence_summary.get("repair_cost")}
    result.warehouse_change = {
        "change_set_id": cs.id, "warehouse": "LOAD_WH", "rule": "idle", "forward": step.sql[0],
        "rollback": step.rollback_sql[0], "approved_by": result.warehouse_change.get("approved_by"),
        "saving_expected": md.get("dw/saving_expected"), "saving_measured": md.get("dw/saving_measured"),
        "measured_over": f"{md.get('dw/measure_since')}..{md.get('dw/measure_until')}",
        "credits_per_day_before": md.get("dw/credits_per_day_before"),
        "credits_per_day_after": md.get("dw/credits_per_day_after"), "verified": bool(rc.verified and check and check.passed),
        "run_ids": run_ids}
    log("receipt", f"{rc.id}: {rc.outcome}; verified={rc.verified}; saved {md.get('dw/saving_measured', 0):.4g} credits over "
        f"{result.warehouse_change['measured_over']} (expected {md.get('dw/saving_expected', 0):.4g})")
    result.ok = all(r["reconciled"] for r in result.reports) and result.warehouse_change["verified"]
    if not result.ok:
        raise DemoError("verify: the warehouse change was not verified, or a report did not reconcile")
    return result


def _show(db: Any, name: str):
    from dw_dagster.cost.warehouse import show_warehouse

    return show_warehouse(db, name)


def _step_results(instance: dg.DagsterInstance, cs: Any) -> list[dict]:
    from dw_dagster.changes.steps import step_results

    return step_results(instance, cs)


def _tick(daemon: LocalSensorDaemon, instance: dg.DagsterInstance, run_ids: dict[str, str], log: Timeline) -> None:
    from dw_dagster.core.keys import STAGE_TAG

    tick = daemon.tick(SENSOR)
    if tick.failed_run_ids:
        raise DemoError(f"repair: run {tick.failed_run_ids[0]} failed ({tick.skip_reason})")
    if not tick.run_ids:
        raise DemoError(f"repair: nothing dispatched ({tick.skip_reason})")
    run = instance.get_run_by_id(tick.run_ids[0])
    run_ids[run.tags.get(STAGE_TAG)] = run.run_id
    log("repair", f"{run.tags.get(STAGE_TAG)} run {run.run_id[:8]} succeeded")


def _approve(instance: dg.DagsterInstance, daemon: LocalSensorDaemon, cs: Any, domains_file: Path,
             result: CostDemoResult, log: Timeline) -> None:
    from dw_dagster.approval.job import approve_in_process
    from dw_dagster.core.keys import PROPOSER

    for who, how in ((PROPOSER, dict(approver=PROPOSER)),
                     (f"{NOT_LISTED} (logged in)", dict(id_token=demo_login(domains_file, cs.id, NOT_LISTED, instance)))):
        ok, msg = approve_in_process(instance, cs.id, domains=domains_file, comment="idle tails", **how)
        if ok:
            raise DemoError(f"approve: {who} must be refused")
        result.refused.append({"approver": who, "reason": msg})
        log("approve", f"REFUSED {who}: {clip(msg, 160)}")
    if daemon.tick(SENSOR).run_ids:
        raise DemoError("approve: the change ran before any approval")
    token = demo_login(domains_file, cs.id, OWNER, instance)
    ok, msg = approve_in_process(instance, cs.id, domains=domains_file, id_token=token, comment="idle tails reviewed")
    if not ok:
        raise DemoError(f"approve: the warehouse owner's approval was refused: {msg}")
    (a,) = records.approvals(instance, cs.id, active_only=True)
    result.warehouse_change["approved_by"] = a.identity.describe() if a.identity else a.approver
    log("approve", f"approved by {result.warehouse_change['approved_by']}, the warehouse owner (the demo logs in as them)")


__all__ = ["ACCOUNT_USAGE", "CostDemoResult", "OWNER", "fakesnow_service", "run_cost_demo", "schema_url", "seed",
           "write_domains"]
