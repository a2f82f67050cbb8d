"""The migration story end to end, in one process, against a real Dagster instance.

Timeline: the POS consolidation database (a DuckDB file, or PostgreSQL with ``--source
postgres``) is moved to the warehouse in two waves of five table pairs. The loaders run; three
Southwest stores post two days of back-dated lines after the incremental load passed them; both
waves are evaluated: wave 1's ``sales_line`` pair fails parity (rows behind the loader's
watermark), wave 2 holds. The failing pair enters the loop: incident, diagnosis (late rows behind
the watermark), change set, the owner's verified approval, the merge, the window rerun, the
verification and the receipt. Both waves then hold for three consecutive evaluations; the gate
asks the owner to sign each off (a colleague and a typed email are refused); the owner signs off
through the identity provider; ``wave_sign_off`` receipts land on every asset of each wave. Then
a source update lands behind the watermark: wave 1's next evaluation fails and reopens it.

Sensors are ticked by :class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon` (the daemon's job
in ``dagster dev``); every run goes through Dagster and is stored in the instance.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dagster as dg

from dw_dagster import records
from dw_dagster_examples.migration import definitions as mdefs
from dw_dagster_examples.migration import generator as gen
from dw_dagster_dev.demo import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    DemoError,
    DemoSpec,
    Timeline,
    claim_demo_dir,
    demo_approvals,
    owner_merges,
    run_job,
    run_repair_stages,
)
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_dev.services import OidcProvider, PagingFake

OWNER = "dana.ortiz@grocer.example"
NOT_LISTED = "sam.lee@grocer.example"
MIGRATION = "pos_to_warehouse"
WAVES = ("wave1", "wave2")
DEFAULT_SCALE = 0.01
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@dataclass
class MigrationDemoResult:
    waves: list[dict] = field(default_factory=list)
    parity: dict[str, dict] = field(default_factory=dict)
    repaired: dict = field(default_factory=dict)
    reopened: dict = field(default_factory=dict)
    refused: list[dict] = field(default_factory=list)
    source: str = "duckdb"
    scale: float = DEFAULT_SCALE
    seconds: float = 0.0
    dagster_home: str = ""
    migration_home: str = ""
    ok: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def _wave_json(instance: dg.DagsterInstance, wave: str) -> dict:
    """The wave asset's newest materialization's state (``dw/migration_wave``)."""
    ev = instance.get_latest_materialization_event(dg.AssetKey(["migration", MIGRATION, wave]))
    if ev is None:
        raise DemoError(f"evaluate: wave {wave} was never materialized")
    return records.metadata_json(ev.asset_materialization.metadata, "dw/migration_wave") or {}


def _evaluate(defs: dg.Definitions, instance: dg.DagsterInstance, log: Timeline, waves=WAVES, times: int = 1) -> dict:
    out = {}
    for _ in range(times):
        for w in waves:
            run_job(defs.resolve_job_def(f"dw_migration__{MIGRATION}__{w}"), instance, f"evaluate {w}")
            out[w] = _wave_json(instance, w)
    for w, data in out.items():
        log("evaluate", f"{w}: {data['state']}, {data['pairs_holding']}/{data['pairs_total']} pairs holding"
            + "".join(f"; {p['pair']}: {p['state']}" for p in data["pairs"] if not p["state"].startswith(("holding", "signed"))))
    return out


def _parity(data: dict) -> dict[str, dict]:
    return {p["pair"]: {kind: {"passed": v["passed"], "values": v["values"]} for kind, v in p["latest"].items()}
            for p in data["pairs"]}


def _load(defs: dg.Definitions, instance: dg.DagsterInstance, home: Path, log: Timeline, scale: float) -> None:
    src = mdefs.source_database(home)
    days = mdefs.sale_days(home).get_partition_keys()
    run_job(defs.resolve_job_def("pos_copy_tables"), instance, "copy")
    run_job(defs.resolve_job_def("pos_sales_line_load"), instance, "history load",
            tags={RANGE_START_TAG: days[0], RANGE_END_TAG: days[-1]})
    log("load", f"copied 9 tables; loaded sales lines {days[0]}..{days[-1]} (one run over the range)")
    n, late_days = gen.post_late_lines(src, scale)
    log("outage", f"3 Southwest stores back online: posted {n} lines back-dated to {', '.join(late_days)}")
    run_job(defs.resolve_job_def("pos_sales_line_load"), instance, "nightly load", partition_key=days[-1])
    log("load", f"nightly load of {days[-1]}: the high-watermark skips the back-dated lines")


def _repair(daemon: LocalSensorDaemon, instance: dg.DagsterInstance, home: Path, log: Timeline,
            res: MigrationDemoResult) -> None:
    tick = daemon.tick("dw_check_incident_sensor")
    if not tick.run_ids:
        raise DemoError(f"detect: the incident sensor launched no diagnosis ({tick.skip_reason})")
    inc = next(i for i in records.incidents(instance) if i.asset_key == ["warehouse", "sales_line"])
    log("detect", f"incident {inc.id} on warehouse/sales_line from {inc.check_name}: {inc.summary[:100]}")
    diag = next(d for d in records.diagnoses(instance) if d.incident_id == inc.id)
    if diag.primary is None:
        raise DemoError("diagnose: no cause found")
    log("cause", f"{diag.primary.kind} (confidence {diag.primary.confidence:.0%}): {diag.primary.summary[:140]}")
    cs = next(c for c in records.change_sets(instance) if c.incident_id == inc.id)
    log("propose", f"change set {cs.id}: {cs.summary[:140]}")
    ident = demo_approvals(instance, daemon, cs.id, owner=OWNER, not_listed=NOT_LISTED, comment="watermark fix reviewed",
                           refused=res.refused, log=log, owner_role="the pairs' owner", domains_file=home / "domains.yaml")
    commit = owner_merges(cs, home / "repo", OWNER)
    daemon.defs = mdefs.build_definitions(home)
    log("merge", f"{OWNER} merged the diff as {commit[:10]}; code location reloaded")
    run_ids: dict[str, str] = {}
    run_repair_stages(daemon, instance, run_ids, log, ticks=8, describe=lambda stage, run: (
        f" partitions {run.tags.get(RANGE_START_TAG)}..{run.tags.get(RANGE_END_TAG)}" if stage.startswith("window") else ""))
    receipts = [r for r in records.receipts(instance) if r.change_set_id == cs.id]
    if not receipts or not all(r.verified for r in receipts):
        raise DemoError("repair: the receipt is missing or not verified")
    res.repaired = {"pair": "pos.sales_line → warehouse/sales_line", "change_set": cs.id, "cause": diag.primary.kind,
                    "approved_by": ident, "receipt_id": receipts[0].id, "window": cs.window}
    log("receipt", f"receipt {receipts[0].id} (verified) on {', '.join('/'.join(r.asset_key) for r in receipts)}")


def _sign_off(daemon: LocalSensorDaemon, instance: dg.DagsterInstance, home: Path, log: Timeline,
              res: MigrationDemoResult, wave: str) -> None:
    from dw_dagster.core.ledger import ledger_for

    rec = ledger_for(instance).control(f"migration:{MIGRATION}/{wave}") or {}
    req = rec.get("requested")
    if not req:
        raise DemoError(f"gate: wave {wave} held but no sign-off was requested")
    log("gate", f"{wave}: every pair held 3 evaluations in a row; sign-off {req['change_set_id']} requested, "
        f"bound to evidence {req['evidence_hash'][:12]}…")
    demo_approvals(instance, daemon, req["change_set_id"], owner=OWNER, not_listed=NOT_LISTED,
                   comment=f"{wave} parity reviewed", refused=res.refused, log=log, owner_role="the wave's owner",
                   domains_file=home / "domains.yaml")
    run_ids: dict[str, str] = {}
    run_repair_stages(daemon, instance, run_ids, log, ticks=6, describe=lambda stage, run: "")
    receipts = [r for r in records.receipts(instance) if r.change_set_id == req["change_set_id"]]
    if not receipts or not all(r.kind == "wave_sign_off" and r.verified for r in receipts):
        raise DemoError(f"sign-off: the wave_sign_off receipts of {wave} are missing or not verified")
    log("receipt", f"{len(receipts)} wave_sign_off receipts on {wave}'s assets (the wave asset and its 5 targets)")


def run_migration_demo(*, home: Path, instance: dg.DagsterInstance, scale: float = DEFAULT_SCALE,
                       log: Timeline | None = None, result: MigrationDemoResult | None = None, source: str = "duckdb",
                       source_url: str | None = None) -> MigrationDemoResult:
    """Run the whole story (module docstring); raise :class:`DemoError` naming the first stage that went wrong."""
    log = log or Timeline()
    res = result if result is not None else MigrationDemoResult(scale=scale)
    res.scale, res.source, res.migration_home = scale, source, str(home)
    claim_demo_dir(home)
    saved = {k: os.environ.get(k) for k in (mdefs.SOURCE_URL_ENV, mdefs.HOME_ENV)}
    if source == "postgres":
        os.environ[mdefs.SOURCE_URL_ENV] = source_url or os.environ.get("DW_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    elif source != "duckdb":
        raise DemoError(f"setup: --source is duckdb or postgres, got {source!r}")
    else:
        os.environ.pop(mdefs.SOURCE_URL_ENV, None)
    os.environ[mdefs.HOME_ENV] = str(home)
    try:
        mdefs.ensure_home(home)
        with OidcProvider(home / "services", [OWNER, NOT_LISTED]) as oidc, PagingFake(home / "services") as paging:
            counts = gen.create_source(mdefs.source_database(home), scale)
            log("setup", f"source {mdefs.source_url(home).split('@')[-1]}: {sum(counts.values()):,} rows in 10 tables; "
                f"identity provider {oidc.url}; fake PagerDuty/Slack {paging.url}")
            return _story(home, instance, scale, log, res, paging)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _story(home: Path, instance: dg.DagsterInstance, scale: float, log: Timeline, res: MigrationDemoResult,
           paging: PagingFake) -> MigrationDemoResult:
    from dw_dagster.core.ledger import ledger_for

    defs = mdefs.build_definitions(home)
    _load(defs, instance, home, log, scale)
    daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
    daemon.tick("dw_notification_sensor")  # its first tick starts after what the instance already holds
    first = _evaluate(defs, instance, log)
    res.parity = {**_parity(first["wave1"]), **_parity(first["wave2"])}
    bad = [p for p in first["wave1"]["pairs"] if p["state"].startswith("failing")]
    if not bad or "sales_line" not in bad[0]["pair"]:
        raise DemoError("evaluate: the sales_line pair did not fail parity")
    _repair(daemon, instance, home, log, res)
    held = _evaluate(daemon.defs, instance, log, times=3)
    for w in WAVES:
        if held[w]["state"] != "awaiting_sign_off":
            raise DemoError(f"gate: {w} is {held[w]['state']} after three evaluations, not awaiting its sign-off")
        _sign_off(daemon, instance, home, log, res, w)
    signed = _evaluate(daemon.defs, instance, log)
    res.waves = [{"name": w, "pairs": [p["pair"] for p in signed[w]["pairs"]], "state": signed[w]["state"],
                  "signed_off_by": signed[w]["signed_off_by"], "evidence_hash": signed[w]["evidence_hash"]} for w in WAVES]
    res.parity = {**_parity(signed["wave1"]), **_parity(signed["wave2"])}
    n, day = gen.post_source_update(mdefs.source_database(home))
    log("update", f"{n} lines back-dated to {day} land in the source behind the warehouse's watermark")
    after = _evaluate(daemon.defs, instance, log, waves=("wave1",))
    rec = ledger_for(instance).control(f"migration:{MIGRATION}/wave1") or {}
    if after["wave1"]["state"] != "reopened" or not rec.get("reopened"):
        raise DemoError(f"reopen: wave1 is {after['wave1']['state']} after the source update, not reopened")
    tick = daemon.tick("dw_check_incident_sensor")
    incident = next((i for i in records.incidents(instance) if i.asset_key == ["warehouse", "sales_line"]
                     and i.id != res.repaired.get("incident")), None)
    daemon.tick("dw_notification_sensor")
    pages = paging.state().get("pagerduty", {}).get("incidents", [])
    res.reopened = {"wave": "wave1", "cause": rec["reopened"]["cause"], "incident": incident.id if incident else None,
                    "diagnosis_run": tick.run_ids[0] if tick.run_ids else None, "pages": len(pages)}
    log("reopen", f"wave1 REOPENED: {rec['reopened']['cause'][:120]}; incident {res.reopened['incident']}, "
        f"{len(pages)} page(s); a new sign-off is needed")
    for w in res.waves:
        w["state"] = "reopened" if w["name"] == "wave1" else w["state"]
    res.ok = True
    return res


DEMO = DemoSpec(
    name="migration", run=run_migration_demo, new_result=lambda scale: MigrationDemoResult(scale=scale),
    home_attr="migration_home", home_folder="migration", instance_folder="dagster_home_migration",
    log_name="demo_migration.log", home_env=mdefs.HOME_ENV, location_module="dw_dagster_examples.migration.definitions",
    asset="migration/pos_to_warehouse/wave1", events="dw/migration_wave, dw/change_set, dw/receipt",
    default_scale=DEFAULT_SCALE, min_scale=0.001, max_scale=1.0)

__all__ = ["DEMO", "MigrationDemoResult", "NOT_LISTED", "OWNER", "run_migration_demo"]
