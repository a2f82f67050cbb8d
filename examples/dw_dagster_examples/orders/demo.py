"""The orders-stream incident end to end, in one process, against a real Dagster instance.

Timeline (``shared/design/DESIGN.md`` §3, orders stream): the sink applies the orders change
stream through Monday and every check passes; the orders-service release of Tuesday
2026-11-24 09:00 UTC starts writing NULL into ``shipping_country`` for gift-card orders; the sink
parks those rows in ``analytics.orders_dlq`` and the stream stays green; the nightly dbt build of
the ``finance_daily`` models runs short of gift cards. The volume check finds Tuesday 9 % under its
baseline and the dead-letter check finds the parked rows; the incident sensor opens one incident
and launches the diagnosis (REQUIRED column now receives NULLs: the dead-letter reason, the
source change, the column's mode in the target's schema; the blast radius through dbt to the
Lightdash "Daily GMV" dashboard); dw_dagster proposes one change set (relax the column, with its
rollback; replay the parked rows, guarded); the proposer and an unlisted person are refused, the
finance data owner approves; the remediation sensor migrates, replays, rebuilds the models,
verifies and writes the receipts.

Sensors are ticked by :class:`dw_dagster.testing.local_daemon.LocalSensorDaemon`; every run goes through
Dagster and is stored in the instance, so ``dagster dev`` opened on the same ``DAGSTER_HOME``
shows all of it.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dagster as dg

from dw_dagster import records
from dw_dagster.databases import DuckDBDatabase
from dw_dagster.changes.steps import step_results
from dw_dagster.repair.steps import step_stage
from dw_dagster_examples.orders import generator as gen
from dw_dagster_examples.orders import home as h
from dw_dagster_examples.orders import paths as p
from dw_dagster_examples.orders.definitions import build_definitions
from dw_dagster_examples.orders.mage import OrdersMage
from dw_dagster_examples.orders.source import write_source
from dw_dagster_examples.orders.verify import gift_card_gmv_compare
from dw_dagster_dev.demo import (
    DemoError,
    DemoSpec,
    Timeline,
    claim_demo_dir,
    demo_approvals,
    evaluations,
    run_job,
    run_repair_stages,
    clip,
    source_change_sentence,
)
from dw_dagster_dev.bi_services import BiFakes, bi_refreshed, needed_by
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_dev.services import OidcProvider

OWNER = "maya.chen@shop.example"
NOT_LISTED = "leo.park@shop.example"
DEFAULT_SCALE = p.DEFAULT_SCALE
#: the first sink run reads the stream up to Tuesday 00:00 UTC (Monday's nightly)
MONDAY_END = dt.datetime.combine(gen.INCIDENT_DAY, dt.time())

__all__ = ["DEFAULT_SCALE", "DEMO", "NOT_LISTED", "OWNER", "OrdersDemoResult", "prepare_incident_data", "run_orders_demo"]


@dataclass
class OrdersDemoResult:
    """What the demo found and did (``--json``); counts in rows, percentages in %."""

    cause: str | None = None
    cause_summary: str | None = None
    source_change: str | None = None
    column_mode: dict = field(default_factory=dict)
    parked_rows: int = 0
    parked_reasons: dict[str, int] = field(default_factory=dict)
    expected_rows: int = 0
    replayed_rows: int = 0
    gap_before: dict = field(default_factory=dict)
    gap_after: dict = field(default_factory=dict)
    volume_before_pct: float | None = None
    volume_after_pct: float | None = None
    gift_cards_before: dict = field(default_factory=dict)
    gift_cards_after: dict = field(default_factory=dict)
    blast_radius: dict = field(default_factory=dict)
    needed_by: dict[str, str] = field(default_factory=dict)
    bi_refreshed: list[dict] = field(default_factory=list)
    incident_id: str | None = None
    change_set_id: str | None = None
    migration_forward: list[str] = field(default_factory=list)
    migration_rollback: list[str] = field(default_factory=list)
    migration: dict[str, list[str]] = field(default_factory=dict)
    mage_runs: dict[str, list[str]] = field(default_factory=dict)
    mage_rerun: dict = field(default_factory=dict)
    dlq_rows_before: int | None = None
    dlq_rows_after: int | None = None
    replayed: int = 0
    duplicates_after: int | None = None
    volume_gap_before: float | None = None
    volume_gap_after: float | None = None
    refused: list[dict] = field(default_factory=list)
    approver: str | None = None
    approval_identity: dict = field(default_factory=dict)
    run_ids: dict[str, str] = field(default_factory=dict)
    checks_after: dict[str, bool] = field(default_factory=dict)
    receipt_assets: list[str] = field(default_factory=list)
    verified: bool = False
    scale: float = DEFAULT_SCALE
    seconds: float = 0.0
    dagster_home: str = ""
    orders_home: str = ""
    ok: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def _line(ev: dg.AssetCheckEvaluation | None, name: str) -> str:
    if ev is None:
        return f"{name} did not run"
    return f"{name} {'passed' if ev.passed else 'FAILED'}: {ev.description}"


def _md(ev: dg.AssetCheckEvaluation, key: str):
    return getattr((ev.metadata or {}).get(key), "value", None)


def _incident_day_volume(ev: dg.AssetCheckEvaluation | None) -> tuple[float | None, str]:
    days = _md(ev, "dw/days_json") if ev else None
    day = next((d for d in days or [] if d["day"] == gen.INCIDENT_DAY.isoformat()), None)
    if not day:
        return None, "no score for the incident day"
    return day["deviation_pct"], (f"{day['day']}: {day['rows']:,} rows, {day['status']} ({day['deviation_pct']:+.2f} % against "
                                  f"the mean {day['mean']:,.1f} of {day['baseline_days']} Tuesdays; band "
                                  f"{day['lower']:,.0f}..{day['upper']:,.0f})")


def day_gap(home: Path, day: dt.date = gen.INCIDENT_DAY) -> dict:
    """Rows of ``day`` (by ``order_ts``) at the source and in ``analytics.orders``: ``{day, source, target, rows, pct}``."""
    lo, hi = dt.datetime.combine(day, dt.time()), dt.datetime.combine(day + dt.timedelta(days=1), dt.time())
    q = f"SELECT count(*) FROM {{t}} WHERE order_ts >= TIMESTAMP '{lo}' AND order_ts < TIMESTAMP '{hi}'"
    src = DuckDBDatabase(p.source_path(home)).fetch_all(q.format(t="shop.orders"))[0][0]
    tgt = DuckDBDatabase(h.warehouse_path(home)).fetch_all(q.format(t="analytics.orders"))[0][0]
    return {"day": day.isoformat(), "source": int(src), "target": int(tgt), "rows": int(src - tgt),
            "pct": round((src - tgt) / src * 100, 3) if src else 0.0}


def _gift_cards(ev: dg.AssetCheckEvaluation | None) -> dict:
    if ev is None:
        return {}
    return {"day": _md(ev, "dw/last_day"), "model_orders": _md(ev, "dw/last_day_model_orders"),
            "source_orders": _md(ev, "dw/last_day_source_orders"), "gmv": _md(ev, "dw/last_day_gmv_json"), "passed": ev.passed}


def prepare_incident_data(home: Path, instance: dg.DagsterInstance, scale: float, log: Timeline | None = None) -> dg.Definitions:
    """Stage the incident up to the morning after; return the definitions.

    Writes the orders service's table up to Tuesday 00:00 and runs the sink over the stream to
    there (Monday's nightly) and the detection checks (all pass); then the table to
    2026-11-25 06:00 and the sink again (the release's gift-card orders are parked), and the dbt
    build of the finance_daily models. The stream is the generator's replay (no server), whatever
    ``$DW_ORDERS_SOURCE_URL`` says.

    Raises:
        DemoError: a run failed, or the checks failed before the release.
    """
    log = log or Timeline()
    p.prepare_home(home)
    p.write_scale(home, scale)
    plan = gen.plan(scale)
    src = DuckDBDatabase(p.source_path(home))
    n = write_source(src, scale, MONDAY_END)
    log("setup", f"orders service stand-in {p.source_path(home)} (scale {scale}); warehouse {h.warehouse_path(home)}")
    log.detail(f"shop.orders holds {n:,} orders placed {gen.FIRST_DAY}..{gen.INCIDENT_DAY - dt.timedelta(days=1)}")
    defs = build_definitions(home, binlog=False)
    stream = defs.resolve_job_def("orders_stream")
    res = run_job(stream, instance, "stream", run_config={"ops": {"orders": {"config": {"until": MONDAY_END.isoformat()}}}})
    md = _materialization(res)
    log("stream", f"CDC sink (replayed change stream) to {MONDAY_END}: {md['dw/cdc_applied']:,} changes applied, "
        f"{md['dw/cdc_parked']} parked; analytics.orders {md['dagster/row_count']:,} rows")
    checks = run_job(defs.resolve_job_def("orders_checks"), instance, "checks")
    evs = evaluations(instance, checks.run_id)
    log("detect", _line(evs.get("daily_volume"), "daily_volume") + " (Monday's nightly)")
    log("detect", _line(evs.get("dead_letter"), "dead_letter"))
    if not all(e.passed for e in evs.values()):
        raise DemoError("stream: the checks failed before the release")
    n = write_source(src, scale)
    parked_plan = sum(x.null_country for x in plan)
    log("release", f"{gen.RELEASE_TS} UTC: the orders-service release stops copying the billing country into "
        f"shipping_country for gift-card orders ({parked_plan:,} of them by {gen.STREAM_END})")
    res = run_job(stream, instance, "stream")
    md = _materialization(res)
    log("stream", f"CDC sink to {gen.STREAM_END}: {md['dw/cdc_applied']:,} changes applied, {md['dw/cdc_parked']:,} parked "
        f"in analytics.orders_dlq ({'; '.join(f'{v:,} × {k!r}' for k, v in md['dw/cdc_parked_reasons'].items())}); "
        f"run {res.run_id[:8]} SUCCESS: the stream stayed green")
    log("load", "dbt build of fct_daily_gmv, finance_gmv_by_payment_method, finance_gmv_mtd (the nightly) ...")
    run_job(defs.resolve_job_def("finance_daily_models"), instance, "dbt build")
    return defs


def _materialization(result: dg.ExecuteInProcessResult) -> dict:
    mats = result.asset_materializations_for_node("orders")
    md = mats[-1].metadata if mats else {}
    return {k: getattr(v, "value", v) for k, v in md.items()}


def run_orders_demo(*, home: Path, instance: dg.DagsterInstance, scale: float = DEFAULT_SCALE,
                    log: Timeline | None = None, result: OrdersDemoResult | None = None) -> OrdersDemoResult:
    """Run the whole loop; raise :class:`~dw_dagster_dev.demo.DemoError` naming the
    first stage that went wrong. ``home`` is cleared first when an earlier demo made it. ``result``,
    when given, is filled in as the stages finish (what came before a failure is kept).

    Raises:
        ValueError: ``scale`` outside the generator's range (checked before anything on disk changes).
        DemoError: a stage did not produce what it must.
    """
    log = log or Timeline()
    res = result if result is not None else OrdersDemoResult(scale=scale)
    res.scale, res.orders_home = scale, str(home)
    gen.plan(scale)  # validates the scale before anything on disk changes
    claim_demo_dir(home)
    with OrdersMage() as mage, BiFakes(dashboards={"Daily GMV": ["GMV by day", "GMV by payment method", "GMV month to date"]}) as bi:
        log("setup", f"fake Mage {mage.url} (user authentication on): {', '.join(mage.state.pipelines)}; {bi.urls()}")
        defs = prepare_incident_data(home, instance, scale, log)
        with OidcProvider(home / "services", [OWNER, NOT_LISTED]) as idp:
            log("setup", f"stand-in identity provider {idp.url} (the approvers log in there)")
            return _loop(home, instance, defs, res, log, mage)


def pending_dlq_rows(home: Path) -> int:
    """Rows of ``analytics.orders_dlq`` not replayed yet (its ``_pending`` view; the whole table before the view exists)."""
    db = DuckDBDatabase(h.warehouse_path(home))
    have = {r[0] for r in db.fetch_all("SELECT table_name FROM information_schema.tables WHERE table_schema = 'analytics'")}
    table = "orders_dlq_pending" if "orders_dlq_pending" in have else "orders_dlq"
    return int(db.fetch_all(f"SELECT count(*) FROM analytics.{table}")[0][0])


def duplicate_orders(home: Path) -> int:
    """``order_id`` values present more than once in ``analytics.orders``."""
    q = "SELECT count(*) FROM (SELECT order_id FROM analytics.orders GROUP BY order_id HAVING count(*) > 1) AS d"
    return int(DuckDBDatabase(h.warehouse_path(home)).fetch_all(q)[0][0])


def _loop(home: Path, instance: dg.DagsterInstance, defs: dg.Definitions, res: OrdersDemoResult, log: Timeline,
          mage: OrdersMage) -> OrdersDemoResult:
    # detect: the volume and dead-letter checks fail; the incident sensor opens one incident
    res.gap_before = day_gap(home)
    res.volume_gap_before = res.gap_before["pct"]
    res.dlq_rows_before = pending_dlq_rows(home)
    checks = run_job(defs.resolve_job_def("orders_checks"), instance, "checks")
    evs = evaluations(instance, checks.run_id)
    vol, dlq = evs.get("daily_volume"), evs.get("dead_letter")
    res.volume_before_pct, vol_text = _incident_day_volume(vol)
    log("detect", f"daily_volume {'passed' if vol and vol.passed else 'FAILED'}: {vol_text}")
    log("detect", _line(dlq, "dead_letter"))
    if vol is None or vol.passed or dlq is None or dlq.passed:
        raise DemoError("detect: the volume or dead-letter check passed; the incident did not reproduce")
    res.parked_rows = int(_md(dlq, "dw/parked_rows") or 0)
    res.parked_reasons = {r["reason"]: r["rows"] for r in _md(dlq, "dw/reasons_json") or []}
    log.detail(f"Tuesday: {res.gap_before['source']:,} orders at the source, {res.gap_before['target']:,} in "
               f"analytics.orders ({res.gap_before['rows']:,} short, {res.gap_before['pct']:.2f} %)")
    cmp = gift_card_gmv_compare(DuckDBDatabase(h.warehouse_path(home)), DuckDBDatabase(p.source_path(home)))
    last = cmp.day_totals(cmp.last_day)
    res.gift_cards_before = {"day": cmp.last_day.isoformat(), "model_orders": last["orders"][0],
                             "source_orders": last["orders"][1], "gmv": last["gmv"], "passed": cmp.passed}
    log("detect", f"fct_daily_gmv {cmp.description}")
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    tick = daemon.tick("dw_check_incident_sensor")
    if not tick.run_ids:
        raise DemoError(f"detect: the incident sensor launched no diagnosis ({tick.skip_reason or tick.failed_run_ids})")
    incidents = records.incidents(instance)
    inc = incidents[0]
    res.incident_id = inc.id
    log("detect", f"incident sensor: incident {inc.id} on orders ({inc.check_name}); {len(incidents)} incident(s) "
        f"for 2 failed checks; diagnosis run {tick.run_ids[0][:8]}")

    # diagnose
    diag = records.diagnoses(instance)[0]
    cause = diag.primary
    if cause is None or cause.explained_rows == 0:
        raise DemoError("diagnose: no cause found")
    d = cause.details
    res.cause, res.cause_summary = cause.kind, cause.summary
    res.column_mode = {k: v["mode"] for k, v in (d.get("column_modes") or {}).items()}
    res.source_change = source_change_sentence(d.get("source_change") or {})
    log("cause", f"{cause.kind} (confidence {cause.confidence:.0%}): REQUIRED column now receives NULLs from the source")
    errs = d["dead_letter"].get("errors", [])
    log.detail(f"dead letter: {d['null_rows_dead_lettered']:,} of {d['missing_rows']:,} missing Tuesday orders are parked in "
               f"analytics.orders_dlq, reason " + ", ".join(f"{e['error']!r} × {e['rows']:,}" for e in errs))
    log.detail("target schema: " + ", ".join(f"{k} is {v}" for k, v in res.column_mode.items()) + " in analytics.orders")
    log.detail(res.source_change)
    log.detail(f"explains {cause.explained_rows:,} of {diag.gap_rows:,} missing rows; {diag.unexplained_rows} unexplained")
    mage_md = d.get("mage") or {}
    res.mage_runs = dict(mage_md.get("statuses") or {})
    for line in mage_md.get("timeline") or []:
        log("mage", clip(line.split(" <")[0], 150))
    if mage_md.get("error"):
        log("mage", f"Mage could not be read: {mage_md['error'][:150]}")
    if mage_md:
        log.detail(clip(cause.summary.split(" Mage: ", 1)[-1], 200))
    br = diag.blast_radius
    res.blast_radius = {"models": [m.name for m in br.models], "tests": len(br.tests),
                        "exposures": [f"{e.label} ({e.type}, {e.owner_email})" for e in br.exposures],
                        "urls": [e.url for e in br.exposures]}
    log("blast", f"models {', '.join(m.name for m in br.models)}; {len(br.tests)} dbt tests; exposure " +
        ", ".join(f"'{e.label}' (Lightdash {e.type}, owner {e.owner_name} <{e.owner_email}>) {e.url}" for e in br.exposures))
    res.needed_by = needed_by(br)
    for name, when in res.needed_by.items():
        log.detail(f"{name} is needed by {when}")

    # propose
    cs = records.change_sets(instance)[0]
    res.change_set_id = cs.id
    log("propose", f"change set {cs.id} v{cs.version[:16]}: {cs.summary}")
    for i, step in enumerate(cs.steps):
        log.detail(f"{step_stage(i, step)}: {step.summary}")
        if step.kind == "migration":
            res.migration_forward += step.sql
            res.migration_rollback += step.rollback_sql
            res.migration = {"forward": res.migration_forward, "rollback": res.migration_rollback}
            for s in step.sql:
                log.detail(f"  forward:  {s}")
            for s in step.rollback_sql:
                log.detail(f"  rollback: {s[:150]}" + (" ..." if len(s) > 150 else ""))
        else:
            res.expected_rows = step.expected_rows or 0
            log.detail(f"  expected rows: {step.expected_rows:,}; SQL: {step.sql[0][:150]} ...")
    log.detail(f"then rebuild {', '.join('/'.join(k) for k in cs.rebuild_assets)}; verify "
               f"{', '.join(k[-1] for k in cs.verify_checks)}; receipt")
    for m in cs.manual_steps:
        log.detail(f"for the engineer: {m.summary.split(':')[0]}")
        log.detail(f"  {m.command}" + (f"; UI {m.url}" if m.url else ""))

    # approve
    res.approval_identity = demo_approvals(instance, daemon, cs.id, owner=OWNER, not_listed=NOT_LISTED,
                                           comment="relax + replay reviewed with finance", refused=res.refused, log=log,
                                           owner_role="the orders domain's finance data owner",
                                           domains_file=p.domains_path(home))
    res.approver = res.approval_identity["email"]

    # repair, verify, receipt: one stage per tick
    def describe(stage: str, run: dg.DagsterRun) -> str:
        result = next((r for r in step_results(instance, cs) if r.get("run_id") == run.run_id), None)
        if result and result["kind"] == "migration":
            return ": " + ("already applied" if result["already_applied"] else "; ".join(result["statements"]))
        if result and result["kind"] == "replay":
            res.replayed_rows = result["inserted_rows"]
            return (f": replayed {result['inserted_rows']:,} of {result['expected_rows']:,} expected rows into analytics.orders "
                    f"({result['already_replayed_rows']} before, {result['rejected_rows']} stay parked)")
        if stage == "rebuild":
            return f": {len(cs.rebuild_assets)} models and their dbt tests"
        return ""

    def engineer(stage: str) -> None:  # the engineer reruns the Mage pipelines once the data steps are done
        for m in cs.manual_steps:
            if m.kind == "mage_rerun" and m.after and stage == m.after[-1]:
                run = mage.rerun(m.target)
                log("mage", f"the engineer reruns {m.target} in Mage after {stage} (as `{m.command}` would): "
                    f"run {run['id']} {run['status']}")

    run_repair_stages(daemon, instance, res.run_ids, log, ticks=10, describe=describe, after_stage=engineer)
    evs = evaluations(instance, res.run_ids["verify"])
    res.checks_after = {k: v.passed for k, v in evs.items()}
    for name in ("parked_rows_replayed", "dead_letter", "no_new_dead_letters"):
        log("verify", _line(evs.get(name), name))
    res.volume_after_pct, vol_text = _incident_day_volume(evs.get("daily_volume"))
    log("verify", f"daily_volume {'passed' if evs['daily_volume'].passed else 'FAILED'}: {vol_text}")
    log("verify", _line(evs.get("gift_card_gmv"), "gift_card_gmv"))
    res.gift_cards_after = _gift_cards(evs.get("gift_card_gmv"))
    rerun = evs.get("mage_rerun")
    if rerun is not None:
        log("verify", _line(rerun, "mage_rerun"))
        res.mage_rerun = {"pipeline": _md(rerun, "dw/mage_pipeline"), "run_id": _md(rerun, "dw/mage_run_id"),
                          "status": _md(rerun, "dw/mage_status")}
    res.gap_after = day_gap(home)
    res.volume_gap_after = res.gap_after["pct"]
    res.dlq_rows_after = pending_dlq_rows(home)
    res.duplicates_after = duplicate_orders(home)
    res.replayed = res.replayed_rows
    log.detail(f"analytics.orders_dlq: {res.dlq_rows_before:,} rows pending before, {res.dlq_rows_after:,} after; "
               f"{res.duplicates_after} order_id(s) more than once in analytics.orders")
    log.detail(f"Tuesday: {res.gap_after['source']:,} orders at the source, {res.gap_after['target']:,} in analytics.orders "
               f"({res.gap_after['rows']:,} short)")
    receipts = [r for r in records.receipts(instance) if r.change_set_id == cs.id]
    res.receipt_assets = sorted("/".join(r.asset_key) for r in receipts)
    res.verified = bool(receipts) and all(r.verified for r in receipts)
    log("receipt", f"{len(receipts)} receipts (dw/receipt) on {', '.join(res.receipt_assets)}; verified={res.verified}")
    res.bi_refreshed = bi_refreshed(instance, cs.target_asset, cs.id)
    for b in res.bi_refreshed:
        log("bi", f"{b['exposure']} ({b['tool']}) refreshed at {b['refreshed_at']}: "
            + ("before its deadline " if b["before_deadline"] else "NOT before its deadline ") + str(b["deadline"])
            + (f" ({b['error']})" if b.get("error") else ""))
    res.ok = (res.verified and all(res.checks_after.values()) and res.gap_after.get("rows") == 0
              and res.replayed_rows == res.expected_rows == res.parked_rows and res.dlq_rows_after == 0
              and res.duplicates_after == 0 and res.mage_rerun.get("status") == "completed")
    if not res.ok:
        raise DemoError("verify: the repair did not close the gap, or a check or the receipt did not verify")
    return res


#: what ``dw-dagster demo orders`` runs (:class:`~dw_dagster_dev.demo.DemoSpec`)
DEMO = DemoSpec(
    name="orders", run=run_orders_demo, new_result=lambda scale: OrdersDemoResult(scale=scale),
    home_attr="orders_home", home_folder="orders", instance_folder="orders_dagster_home", log_name="orders_demo.log",
    home_env=h.HOME_ENV, location_module="dw_dagster_examples.orders.definitions", asset="orders",
    events="dw/change_set, dw/approval, dw/step_result, dw/receipt", default_scale=DEFAULT_SCALE,
    min_scale=gen.MIN_SCALE, max_scale=gen.MAX_SCALE)
