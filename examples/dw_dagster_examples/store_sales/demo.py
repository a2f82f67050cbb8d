"""The store-sales incident end to end, in one process, against a real Dagster instance.

Timeline (``shared/design/DESIGN.md`` §3): the nightly loads run while 19 Southwest stores are
offline; the stores come back and post two days of back-dated lines; the next load's
high-watermark skips them; the region reconciliation check fails for Southwest; the incident
sensor opens an incident and launches the diagnosis; dw_dagster proposes one change set; two
approvals are refused and the listed owner approves; the owner merges the diff; the
remediation sensor reruns the two-day window, rebuilds the dbt models, runs the checks and
writes the receipts.

Sensors are ticked by :class:`dw_dagster.testing.local_daemon.LocalSensorDaemon` (the daemon's job in
``dagster dev``); every run goes through Dagster and is stored in the instance, so ``dagster dev``
opened on the same ``DAGSTER_HOME`` shows all of it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dagster as dg

from dw_dagster import records
from dw_dagster.databases import DuckDBDatabase
from dw_dagster.integrations.paging import dedup_key_for
from dw_dagster.core.windows import partition_window_utc
from dw_dagster_examples.store_sales import generator as gen
from dw_dagster_examples.store_sales import home as h
from dw_dagster_examples.store_sales.definitions import build_definitions, partitions_for
from dw_dagster_dev.demo import (
    REVIEW_URL,
    REVIEW_URL_ENV,
    ladder_after,
    RANGE_END_TAG,
    RANGE_START_TAG,
    DemoError,
    DemoSpec,
    Timeline,
    claim_demo_dir,
    clip,
    demo_approvals,
    evaluations,
    notifications,
    owner_merges,
    run_job,
    run_repair_stages,
)
from dw_dagster_dev.bi_services import BiFakes, bi_refreshed, needed_by
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_dev.services import FakeServices

OWNER = "dana.ortiz@grocer.example"
NOT_LISTED = "sam.lee@grocer.example"
DEFAULT_SCALE = 0.01


@dataclass
class DemoResult:
    cause: str | None = None
    window: list[str] = field(default_factory=list)
    approver: str | None = None
    approval_identity: dict = field(default_factory=dict)
    gap_before: dict[str, float] = field(default_factory=dict)
    gap_after: dict[str, float] = field(default_factory=dict)
    gap_rows_before: int = 0
    recovered_rows: int = 0
    receipt_assets: list[str] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    incident_id: str | None = None
    change_set_id: str | None = None
    blast_radius: dict = field(default_factory=dict)
    needed_by: dict[str, str] = field(default_factory=dict)
    bi_refreshed: list[dict] = field(default_factory=list)
    run_ids: dict[str, str] = field(default_factory=dict)
    verified: bool = False
    scale: float = DEFAULT_SCALE
    seconds: float = 0.0
    dagster_home: str = ""
    store_sales_home: str = ""
    incident_source: str | None = None
    lightup_incident: str | None = None
    lightup_comments: int = 0
    lightup_gap_after: float | None = None
    lightup_closed: bool = False
    page_annotated: bool = False
    page_resolved: bool = False
    page_retriggered: bool = False
    receipt_verified: bool = False
    outcome: str = ""
    outcome_in_messages: dict[str, bool] = field(default_factory=dict)
    escalated_to: list[str] = field(default_factory=list)
    approval_dms: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    review_page_url: str = ""
    fail_verify: bool = False
    partitions: str = "daily"
    slack_messages: int = 0
    repair_cost: dict = field(default_factory=dict)
    undo: dict = field(default_factory=dict)
    incident_state_after_undo: str | None = None
    reproposed: str = ""
    ok: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def diff_for_timeline(diff: str) -> list[str]:
    """The changed lines of a unified diff, file by file under their names, edits to existing files
    first (the change a reader looks for), new files after."""
    files: list[tuple[str, bool, list[str]]] = []
    for line in diff.splitlines():
        if line.startswith("--- "):
            new_file = line[4:].strip() in ("/dev/null", "a/dev/null")
            files.append(("", new_file, []))
        elif line.startswith("+++ ") and files:
            name = line[4:].strip()
            files[-1] = (name[2:] if name.startswith("b/") else name, files[-1][1], files[-1][2])
        elif line.startswith(("+", "-")) and files and not line.startswith("+--"):
            files[-1][2].append(line)
    out = []
    for name, new_file, lines in sorted(files, key=lambda f: f[1]):  # stable: existing files keep their order
        out.append(f"{'new file' if new_file else 'edit'} {name}:")
        out += [f"  {clip(x, 108)}" for x in lines]
    return out


def _gap_text(gaps: dict[str, float]) -> str:
    """Per region, the gap in words: ``Southwest 1.80 % short`` (a negative gap is rows over)."""
    return ", ".join(f"{r} {abs(p):.2f} % {'short' if p > 0 else 'over'}" if p else f"{r} 0.00 %" for r, p in sorted(gaps.items()))


def _volume(instance: dg.DagsterInstance, run_id: str) -> str:
    ev = evaluations(instance, run_id).get("daily_volume")
    return f"daily_volume {'passed' if ev.passed else 'FAILED'}: {ev.description}" if ev else "daily_volume did not run"


def _gaps(instance: dg.DagsterInstance, run_id: str) -> tuple[dict[str, float], int, bool]:
    ev = evaluations(instance, run_id).get("region_compare")
    if ev is None:
        raise DemoError(f"run {run_id} recorded no region_compare evaluation")
    slices = records.metadata_json(ev.metadata, "dw/slices_json") or []
    return {s["slice"]["region"]: s["gap_pct"] for s in slices}, sum(s["gap_rows"] for s in slices), ev.passed


def run_store_sales_demo(
    *, home: Path, instance: dg.DagsterInstance, scale: float = DEFAULT_SCALE, log: Timeline | None = None,
    result: DemoResult | None = None, fail_verify: bool = False, partitions: str = "daily", undo: bool = False,
) -> DemoResult:
    """Run the whole loop; raise :class:`DemoError` naming the first stage that went wrong.

    ``result``, when given, is filled in as the stages finish, so a caller still has what the
    stages before a failure found.

    With ``fail_verify``, a straggler store posts more lines for the window's last day while the
    repair runs (after its window stage, before its verify stage): the verify finds the gap still
    open, the receipt says NOT verified, the page is re-triggered with the failing check (never
    resolved), Lightup's incident stays open, and six hours later (on the demo's clock) the
    escalation ladder asks the escalation approver.

    ``partitions`` (``daily``, ``hourly`` or ``weekly``) partitions the load: the same 28 days of
    sales, loaded, diagnosed, repaired and undone by the hour or the week (an hourly repair's
    window is the 30 business hours of the two offline days, so the demo's domain allows 48
    partitions instead of 7).

    With ``undo``, the demo continues after the verified receipt: the owner proposes and approves the
    undo, its receipt is verified against the snapshot, the incident is open again and the original
    change set is proposed again (:func:`dw_dagster_dev.demo_undo.undo_and_repropose`).

    The fake Lightup and the fake PagerDuty/Slack run as child processes on loopback for the
    duration (:class:`~dw_dagster_dev.services.FakeServices`).
    """
    log = log or Timeline()
    res = result if result is not None else DemoResult(scale=scale)
    res.scale, res.store_sales_home, res.fail_verify, res.partitions = scale, str(home), fail_verify, partitions
    gen.plan(scale)  # validates the scale before anything on disk changes
    if partitions not in h.SHAPES:
        raise DemoError(f"setup: unknown partitions {partitions!r}; use one of {', '.join(h.SHAPES)}")
    claim_demo_dir(home)
    h.set_partitions_shape(home, partitions)
    h.ensure_home(home)
    if partitions == "hourly":  # two offline days are 30 hourly partitions: over the daily demo's cap of 7
        d = h.domains_path(home)
        d.write_text(d.read_text().replace("max_window_partitions: 7", "max_window_partitions: 48"))
    with FakeServices(home / "services", f"duckdb:///{h.source_path(home)}", f"duckdb:///{h.warehouse_path(home)}",
                      oidc_users=[OWNER, NOT_LISTED]) as svc, BiFakes(workbooks=("Store P&L",)) as bi:
        log("setup", f"fake Lightup {svc.lightup_url} (workspace {svc.workspace_uuid[:8]}); "
            f"fake PagerDuty/Slack {svc.paging_url}; stand-in identity provider {svc.oidc_url}; {bi.urls()}")
        saved = os.environ.get(REVIEW_URL_ENV)
        os.environ[REVIEW_URL_ENV] = os.environ.get(REVIEW_URL_ENV) or REVIEW_URL  # every link points at the review site
        try:
            res = _loop(home, instance, scale, log, res, svc, fail_verify)
            if undo:
                _undo(home, instance, log, res)
            return res
        finally:
            if saved is None:
                os.environ.pop(REVIEW_URL_ENV, None)
            else:
                os.environ[REVIEW_URL_ENV] = saved


def _undo(home: Path, instance: dg.DagsterInstance, log: Timeline, res: DemoResult) -> None:
    from dw_dagster_dev.demo_undo import undo_and_repropose

    daemon = LocalSensorDaemon(build_definitions(home), instance, log_level="WARNING")
    out = undo_and_repropose(instance, daemon, res.change_set_id, owner=OWNER, domains_file=h.domains_path(home), log=log)
    res.undo, res.incident_state_after_undo, res.reproposed = out["undo"], out["incident_state_after_undo"], out["reproposed"]
    res.ok = res.ok and res.undo["verified"] and res.incident_state_after_undo == "open" and bool(res.reproposed)
    if not res.ok:
        raise DemoError(f"undo: expected a verified undo, the incident open again and the change set re-proposed: {out}")


def _day(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d")


def _notified(instance: dg.DagsterInstance, after: int) -> list[dict]:
    return [n for n in notifications(instance) if n["storage_id"] > after]


def prepare_incident_data(home: Path, instance: dg.DagsterInstance, scale: float, log: Timeline | None = None) -> dg.Definitions:
    """Stage the incident up to the moment the reconciliation check would fail; return the definitions.

    Posts the POS lines rung up before the stores came back, runs the history load (one run over
    2026-11-01..11-27) and the dbt build, posts the back-dated lines, then runs the 11-28 load
    (whose high-watermark skips them) and the dbt build again. Every run goes through Dagster on
    ``instance``, so the diagnosis later finds the load times it needs there. ``home`` must be
    prepared already (:func:`~dw_dagster_examples.store_sales.home.ensure_home`).

    Raises:
        DemoError: a load or dbt run failed.
    """
    log = log or Timeline()
    src = DuckDBDatabase(h.source_path(home))
    log("setup", f"POS source {h.source_path(home)} (scale {scale}); warehouse {h.warehouse_path(home)}")
    n = gen.post_lines(src, scale, gen.BEFORE_RECOVERY)
    log.detail(f"posted {n:,} lines rung up 2026-11-01..11-27; 19 Southwest stores offline since 11-26")
    defs = build_definitions(home)
    load_job, models_job = defs.resolve_job_def("store_sales_daily_load"), defs.resolve_job_def("store_sales_models")
    pdef, night = partitions_for(home), dt.datetime(2026, 11, 28)
    keys = pdef.get_partition_keys()
    win = {k: partition_window_utc(pdef, k) for k in keys}
    before = [k for k in keys if win[k][0] < night]  # loaded before the stores came back (a week in progress too)
    after = [k for k in keys if win[k][1] > night]  # loaded again, or for the first time, after
    per_run = 24 if h.partitions_shape(home) == "hourly" else len(keys)  # one run over the range, hourly a day a run
    _load(load_job, instance, log, before, "history load", per_run)
    log("load", "dbt build of fct_store_sales_daily, region_sales_daily, region_sales_mtd ...")
    run_job(models_job, instance, "dbt build")
    n = gen.post_lines(src, scale, gen.AFTER_RECOVERY)
    log("outage", f"stores back online 2026-11-28 09:00: posted {n:,} lines, back-dated and new")
    _load(load_job, instance, log, after, "nightly load", per_run)
    log("load", "dbt build ...")
    run_job(models_job, instance, "dbt build")
    return defs


def _load(load_job, instance: dg.DagsterInstance, log: Timeline, keys: list[str], what: str, per_run: int = 24) -> None:
    """Load ``keys`` (in order) in runs of at most ``per_run`` partitions (a day of hourly ones: each
    partition's materialization carries every load of its run)."""
    for i in range(0, len(keys), per_run):
        part = keys[i:i + per_run]
        if i == 0:
            log("load", f"{what} of {keys[0]}..{keys[-1]} ({len(keys)} partitions, {-(-len(keys) // per_run)} run(s)) ...")
        run_job(load_job, instance, what, tags={RANGE_START_TAG: part[0], RANGE_END_TAG: part[-1]})


def _loop(home: Path, instance: dg.DagsterInstance, scale: float, log: Timeline, res: DemoResult, svc: FakeServices,
          fail_verify: bool = False) -> DemoResult:
    defs = prepare_incident_data(home, instance, scale, log)

    # detect: Lightup's scheduled collection raises a compare incident; the Lightup sensor picks it up
    svc.lightup_collect()
    raised = [i for i in svc.lightup_state()["incidents"] if i["ongoing"]]
    if not raised:
        raise DemoError("detect: Lightup's compare metric raised no incident")
    for i in raised:
        log("lightup", f"compare incident {i['uuid'][:8]}: sales_line rows, {i['slice']}, "
            f"{_day(i['start_ts'])}..{_day(i['end_ts'] - 1)}, impact {i['impact']}/10")
    checks = run_job(defs.resolve_job_def("dw_verify"), instance, "checks")
    res.gap_before, res.gap_rows_before, passed = _gaps(instance, checks.run_id)
    log("detect", f"region_compare {'passed' if passed else 'FAILED'}: target vs source rows: {_gap_text(res.gap_before)}")
    log("detect", _volume(instance, checks.run_id))
    if passed:
        raise DemoError("detect: the reconciliation check passed; the incident did not reproduce")
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    daemon.tick("dw_notification_sensor")  # its first tick starts after what the instance already holds
    tick = daemon.tick("dw_lightup_incident_sensor")
    if not tick.run_ids:
        raise DemoError(f"detect: the Lightup sensor launched no diagnosis ({tick.skip_reason or tick.failed_run_ids})")
    inc = records.incidents(instance)[0]
    res.incident_id, res.incident_source, res.lightup_incident = inc.id, inc.source, inc.external_id
    log("detect", f"Lightup sensor: incident {inc.id} ({inc.source} {inc.external_id[:8]}) on store_sales_line: "
        f"{inc.gap_rows:,} rows short; lightup_compare check failed; diagnosis run {tick.run_ids[0][:8]}")

    # diagnose
    diag = records.diagnoses(instance)[0]
    cause = diag.primary
    if cause is None:
        raise DemoError("diagnose: no cause found")
    res.cause = cause.kind
    d = cause.details
    if "per_partition" not in d:
        raise DemoError(f"diagnose: {cause.kind} explained none of the gap (confidence {cause.confidence:.0%}): "
                        f"{cause.summary}")
    log("cause", f"{cause.kind} (confidence {cause.confidence:.0%})")
    log.detail(cause.summary)
    for p in d["per_partition"]:
        log.detail(f"partition {p['partition']}: {p['late_rows']:,} late rows ({p['below_rows']:,} below, "
                   f"{p['tied_rows']} tied with the watermark); gap {p['gap_rows']:,}")
    log.detail(f"stores: {len(d['groups'])} ({', '.join(str(g['store_id']) for g in d['groups'][:6])}, ...)")
    br = diag.blast_radius
    res.blast_radius = {"models": [m.name for m in br.models], "tests": len(br.tests),
                        "exposures": [f"{e.label} ({e.owner_email})" for e in br.exposures]}
    log("blast", f"models {', '.join(m.name for m in br.models)}; {len(br.tests)} dbt tests; exposure " +
        ", ".join(f"'{e.label}' ({e.type}, owner {e.owner_name} <{e.owner_email}>)" for e in br.exposures))
    res.needed_by = needed_by(br)
    for name, when in res.needed_by.items():
        log.detail(f"{name} is needed by {when}")

    # propose
    cs = records.change_sets(instance)[0]
    res.change_set_id, res.window = cs.id, cs.window
    log("propose", f"change set {cs.id} v{cs.version[:16]}: {cs.summary}")
    for line in diff_for_timeline(cs.diff):
        log.detail(line)

    # tell people: Lightup comment, page triggered and annotated, approval request in Slack
    mark = max((n["storage_id"] for n in notifications(instance)), default=0)
    tick = daemon.tick("dw_notification_sensor")
    for n in _notified(instance, mark):
        log("notify", f"{n['channel']:<7} {n['action']}: {clip(n['detail'], 100)}" + ("" if n["ok"] else " (FAILED)"))
    sent = [n for n in _notified(instance, mark) if n["ok"]]
    if not any(n["action"] == "annotate" for n in sent) or not any(n["action"] == "approval_request" for n in sent):
        raise DemoError(f"notify: page annotation or approval request missing ({tick.skip_reason})")
    res.approval_dms = sorted(n["person"] for n in sent if n["channel"].startswith("slack_dm:"))
    res.unreachable = sorted(n["person"] for n in _notified(instance, mark) if n.get("unreachable"))
    res.review_page_url = f"{os.environ[REVIEW_URL_ENV].rstrip('/')}/incidents/{inc.id}"
    log("notify", f"asked directly (Slack DM): {', '.join(res.approval_dms) or 'nobody'}; review page {res.review_page_url}")

    # approve
    res.approval_identity = demo_approvals(
        instance, daemon, cs.id, owner=OWNER, not_listed=NOT_LISTED, comment="watermark fix reviewed", refused=res.refused,
        log=log, owner_role="the domain's listed approver", domains_file=h.domains_path(home))
    res.approver = res.approval_identity["email"]
    tick = daemon.tick("dw_remediation_sensor")
    log("repair", f"remediation sensor: {tick.skip_reason or tick.run_ids}")

    # the owner merges the diff, the code location reloads with the new dbt test
    commit = owner_merges(cs, h.repo_dir(home), OWNER)
    (h.dbt_dir(home) / "target" / "manifest.json").unlink(missing_ok=True)
    daemon.defs = build_definitions(home)
    log("merge", f"{OWNER} merged the diff as {commit[:10]}; code location reloaded ({len(cs.new_tests)} new dbt test)")

    # repair, verify, receipt: one stage per tick
    def straggler(stage: str) -> None:
        if fail_verify and stage.startswith("window"):
            last_day = (partition_window_utc(partitions_for(home), cs.window[-1])[1] - dt.timedelta(seconds=1)).date()
            n = gen.post_straggler_day(DuckDBDatabase(h.source_path(home)), last_day,
                                       max(5, round(2000 * scale)), dt.datetime(2026, 11, 29, 2, 0))
            log("outage", f"--fail-verify: a straggler store posted {n} more lines sold {cs.window[-1]} after the "
                "window ran: the verify will find the gap open")

    run_repair_stages(daemon, instance, res.run_ids, log, ticks=8, after_stage=straggler, describe=lambda stage, run: (
        f" partitions {run.tags.get(RANGE_START_TAG)}..{run.tags.get(RANGE_END_TAG)}" if stage.startswith("window") else ""))
    res.gap_after, _, passed = _gaps(instance, res.run_ids["verify"])
    log("verify", f"region_compare {'passed' if passed else 'FAILED'}: target vs source rows: {_gap_text(res.gap_after)}")
    log("verify", _volume(instance, res.run_ids["verify"]))
    receipts = [r for r in records.receipts(instance) if r.change_set_id == cs.id]
    res.receipt_assets = sorted("/".join(r.asset_key) for r in receipts)
    res.verified = res.receipt_verified = bool(receipts) and all(r.verified for r in receipts)
    res.outcome = receipts[0].outcome if receipts else ""
    res.recovered_rows = res.gap_rows_before
    log("receipt", f"{len(receipts)} receipts (dw/receipt) on {', '.join(res.receipt_assets)}; verified={res.verified}")
    res.bi_refreshed = bi_refreshed(instance, cs.target_asset, cs.id)
    for b in res.bi_refreshed:
        log("bi", f"{b['exposure']} ({b['tool']}) refreshed at {b['refreshed_at']}: "
            + ("before its deadline " if b["before_deadline"] else "NOT before its deadline ") + str(b["deadline"])
            + (f" ({b['error']})" if b.get("error") else ""))
    res.repair_cost = receipts[0].evidence_summary.get("repair_cost", {}) if receipts else {}
    if res.repair_cost:
        log.detail(f"the repair cost {res.repair_cost['seconds']:.1f} s over {res.repair_cost['runs']} runs "
                   f"({', '.join(f'{k} {v:.1f} s' for k, v in res.repair_cost['by_stage'].items())}); "
                   f"dbt: {len(res.repair_cost['dbt_nodes'])} nodes, {sum(res.repair_cost['dbt_nodes'].values()):.1f} s")
    # close the loop outside: Lightup re-collects and confirms, the page is resolved with the receipt link
    mark = max((n["storage_id"] for n in notifications(instance)), default=0)
    daemon.tick("dw_notification_sensor")
    for n in _notified(instance, mark):
        log("notify", f"{n['channel']:<7} {n['action']}: {clip(n['detail'])}" + ("" if n["ok"] else " (FAILED)"))
    tick = daemon.tick("dw_lightup_incident_sensor")
    for ev in tick.events:
        if isinstance(ev, dg.AssetCheckEvaluation):
            log("lightup", f"lightup_compare {'passed' if ev.passed else 'FAILED'}: {clip(ev.description)}")
    lu = next(i for i in svc.lightup_state()["incidents"] if i["uuid"] == inc.external_id)
    verify_note = next((n for n in notifications(instance) if n["action"] == "verify"), None)
    res.lightup_gap_after = 0.0 if verify_note and verify_note.get("gap_zero") else None
    res.lightup_closed = not lu["ongoing"] and lu["status"] == 5
    res.lightup_comments = len(svc.lightup_state()["comments"].get(inc.external_id, []))
    pd = svc.paging_state()["pagerduty"]["incidents"]
    page = next((p for p in pd if p.get("incident_key") == dedup_key_for(inc.id)), None)
    res.page_annotated = bool(page and len(page.get("notes", [])) >= 1)
    res.page_resolved = bool(page and page.get("status") == "resolved")
    triggers = [e for e in svc.paging_state()["pagerduty"]["events"]
                if e.get("dedup_key") == dedup_key_for(inc.id) and e.get("event_action") == "trigger"]
    res.page_retriggered = any("verdict" in (e.get("payload", {}).get("custom_details") or {}) for e in triggers)
    told = _notified(instance, mark)
    verdict = "verified" if res.verified else "NOT verified"  # the outcome, and whether it verified, in every message
    own = next((r for r in receipts if r.asset_key == inc.asset_key), receipts[0])  # the receipt on the incident's asset
    res.outcome_in_messages = {n["channel"]: all(w in _told_text(svc, n, inc) for w in (res.outcome, verdict, own.id))
                               for n in told if n.get("incident_id") == inc.id and n["channel"] in ("pager", "slack", "lightup")}
    if not res.verified:
        steps = ladder_after(instance, h.domains_path(home), cs.id, hours=6.1)
        res.escalated_to = sorted({p for s in steps if s["step"] == "escalate" for p in s["to"]})
        log("ladder", f"6 hours later (demo clock) nobody acted: escalated to {', '.join(res.escalated_to) or 'nobody'} "
            "(who may now decide)")
        mark2 = max((n["storage_id"] for n in notifications(instance)), default=0)
        daemon.tick("dw_notification_sensor")
        for n in _notified(instance, mark2):
            log("notify", f"{n['channel']:<7} {n['action']}: {clip(n['detail'])}" + ("" if n["ok"] else " (FAILED)"))
    res.slack_messages = sum(len(m) for m in svc.paging_state()["slack"]["messages"].values())
    log("close", f"Lightup incident {'CLOSED' if res.lightup_closed else 'still open'} ({res.lightup_comments} comments); "
        f"page {'resolved' if res.page_resolved else 'NOT resolved'} ({len(page.get('notes', [])) if page else 0} notes); "
        f"{res.slack_messages} Slack messages")
    if fail_verify:
        res.ok = (not res.verified and not res.page_resolved and res.page_retriggered and not res.lightup_closed
                  and bool(res.escalated_to) and bool(res.outcome_in_messages) and all(res.outcome_in_messages.values()))
        if not res.ok:
            raise DemoError(f"verify: --fail-verify expected an open page, a re-triggered page, an escalation and the "
                            f"outcome in every message: {res.outcome_in_messages}, escalated to {res.escalated_to}")
        return res
    res.ok = (passed and res.verified and all(v == 0.0 for v in res.gap_after.values()) and res.lightup_closed
              and res.page_annotated and res.page_resolved)
    if not res.ok:
        raise DemoError("verify: the repair did not bring every region to 0.0 %, or Lightup/the page did not close")
    return res


def _told_text(svc: FakeServices, n: dict, inc) -> str:
    """What a channel was told about the receipt, as the fake service holds it (the page's notes, the Slack
    messages, the Lightup comments)."""
    if n["channel"] == "pager":
        pd = svc.paging_state()["pagerduty"]["incidents"]
        return " ".join(note.get("content", "") for p in pd if p.get("incident_key") == dedup_key_for(inc.id)
                        for note in p.get("notes", []))
    if n["channel"] == "slack":
        return json.dumps(svc.paging_state()["slack"]["messages"])
    return json.dumps(svc.lightup_state()["comments"].get(inc.external_id, []))


#: what ``dw-dagster demo store-sales`` runs (:class:`~dw_dagster_dev.demo.DemoSpec`)
DEMO = DemoSpec(
    name="store-sales", run=run_store_sales_demo, new_result=lambda scale: DemoResult(scale=scale),
    home_attr="store_sales_home", home_folder="store_sales", instance_folder="dagster_home", log_name="demo.log",
    home_env=h.HOME_ENV, location_module="dw_dagster_examples.store_sales.definitions", asset="store_sales_line",
    events="dw/change_set, dw/approval, dw/receipt", default_scale=DEFAULT_SCALE, min_scale=gen.MIN_SCALE,
    max_scale=gen.MAX_SCALE)

__all__ = ["DEFAULT_SCALE", "DEMO", "NOT_LISTED", "OWNER", "DemoResult", "prepare_incident_data", "run_store_sales_demo"]
