"""Quality tools: ``run_quality_check``, ``get_quality_score``, ``explain_table``.

``run_quality_check`` executes an asset's checks as one Dagster run on the instance (a
checks-only subset of the code location's asset job: it materializes nothing, so no data
changes), waits a bounded time and reads each check's evaluation back from that run.
``get_quality_score`` and ``explain_table`` read the latest evaluations and the ledger; they run
nothing.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.core import records
from dw_dagster.core.check_results import latest_run_evaluation
from dw_dagster.core.ledger import OPEN_INCIDENT_STATES, asset_str
from dw_dagster.mcp.models import ReceiptVerdict, receipt_check, receipt_verdicts
from dw_dagster.mcp.cost import AssetCost, asset_cost
from dw_dagster.mcp.state import DwState, fail, shown
from dw_dagster.mcp.untrusted import CHECK, REPORTED, Untrusted, untrusted
from dw_dagster.core import keys as _keys

#: the weight of a check's latest result in the score, by severity
WEIGHTS = {"ERROR": 2, "WARN": 1}
#: points taken off the score per open incident on the asset
INCIDENT_PENALTY = 25
FORMULA = ("score = max(0, 100 × Σ weight(passing checks) / Σ weight(evaluated checks) − 25 × open incidents), "
           "over each asset check's latest evaluation written by a run (one reported through the API without a run "
           "is not a result), weight 2 for severity ERROR and 1 for WARN; an open incident is "
           "one in the ledger that is not closed (open, diagnosing, diagnosed, diagnosis_failed, rediagnose) and not "
           "linked to another; None when no check of the asset was ever evaluated")


def _numbers(metadata: dict) -> dict[str, Any]:
    """The plain numbers of an evaluation's metadata (text, tables and JSON are not numbers)."""
    out = {}
    for k, v in (metadata or {}).items():
        val = getattr(v, "value", v)
        if isinstance(val, bool) or isinstance(val, (int, float)):
            out[k] = val
    return out


def _texts(metadata: dict, origin: str) -> dict[str, Untrusted]:
    """The short texts of an evaluation's metadata, each marked as untrusted data (whoever wrote the
    evaluation chose them: the check's code, or anyone reporting one through the API)."""
    out = {}
    for k, v in (metadata or {}).items():
        val = getattr(v, "value", v)
        if isinstance(val, str) and len(val) <= 200 and not isinstance(val, bool):
            out[k] = Untrusted(untrusted_data=val, origin=origin)
    return out


class CheckResult(BaseModel):
    """One asset check's evaluation."""

    check: str
    asset_key: list[str]
    passed: bool | None = Field(description="None when it never ran (or its run has not finished)")
    from_run: bool = Field(default=True, description="True: written by a run of the check (a result). False: reported "
                           "through the API without a run (GraphQL reportAssetCheckEvaluations): a claim by whoever "
                           "sent it, never a result; it counts for nothing here")
    severity: str | None = Field(default=None, description="ERROR or WARN")
    description: Untrusted | None = Field(default=None, description="the evaluation's description, as written")
    numbers: dict[str, Any] = Field(default_factory=dict, description="the evaluation's numeric metadata (rows, gaps, "
                                    "percentages)")
    texts: dict[str, Untrusted] = Field(default_factory=dict, description="the evaluation's short text metadata (the "
                                        "query, statuses), as written")
    run_id: str | None = None
    evaluated_at: dt.datetime | None = None


def _checks_of(state: DwState, key: dg.AssetKey) -> tuple[Any, list[dg.AssetCheckKey]]:
    ws = state.workspace()
    locs = ws.locations_of(key)
    if not locs:
        raise fail(f"{key.to_user_string()} is not an asset of the workspace's code locations "
                   f"({', '.join(loc.name for loc in ws.loaded())}); restart the server with the -w file that defines it")
    loc = next((x for x in locs if any(k.asset_key == key for k in x.asset_graph.asset_check_keys)), locs[0])
    return loc, sorted((k for k in loc.asset_graph.asset_check_keys if k.asset_key == key), key=lambda k: k.name)


def _from_record(ck: dg.AssetCheckKey, rec) -> CheckResult:
    ev = rec.event.dagster_event.event_specific_data
    origin = CHECK if rec.run_id else REPORTED
    return CheckResult(check=ck.name, asset_key=list(ck.asset_key.path), passed=ev.passed, from_run=bool(rec.run_id),
                       severity=ev.severity.value, description=untrusted(ev.description, origin),
                       numbers=_numbers(ev.metadata), texts=_texts(ev.metadata, origin), run_id=rec.run_id or None,
                       evaluated_at=dt.datetime.fromtimestamp(rec.event.timestamp, dt.timezone.utc))


def check_history(instance: dg.DagsterInstance, ck: dg.AssetCheckKey) -> tuple[CheckResult, list[CheckResult]]:
    """The newest evaluation of one check that a run wrote (``passed`` None when no run evaluated it),
    and the evaluations reported without a run since (listed, never taken as the result:
    :mod:`dw_dagster.core.check_results`)."""
    hist = latest_run_evaluation(instance, ck)
    latest = (_from_record(ck, hist.latest) if hist.latest is not None
              else CheckResult(check=ck.name, asset_key=list(ck.asset_key.path), passed=None))
    return latest, [_from_record(ck, r) for r in hist.reported[:5]]


def latest_result(instance: dg.DagsterInstance, ck: dg.AssetCheckKey) -> CheckResult:
    """The newest evaluation of one check that a run wrote (``passed`` None when none did)."""
    return check_history(instance, ck)[0]


class QualityCheckRun(BaseModel):
    """The checks of one asset, run now as one Dagster run (no data change)."""

    asset_key: list[str]
    location: str
    run_id: str
    status: str = Field(description="SUCCESS, FAILURE (a check could not run; see error), or RUNNING when the wait "
                        "ended first (the run goes on; get_quality_score reads its results later)")
    seconds: float
    checks: list[CheckResult] = Field(description="each check's result from this run")
    error: str | None = Field(default=None, description="what failed, in dw_dagster's words (the run's own error "
                              "text is in the Dagster UI, not here)")


def run_quality_check(state: DwState, asset: str, checks: list[str] | None, timeout_seconds: float) -> QualityCheckRun:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    from dw_dagster.dagster_private import make_new_run_id

    key = state.asset(asset, with_workspace=True)
    loc, keys = _checks_of(state, key)
    if not keys:
        raise fail(f"{key.to_user_string()} has no asset checks in location {loc.name}; get_quality_score and "
                   "explain_table show what is known about it")
    if checks:
        names = {k.name for k in keys}
        unknown = [c for c in checks if c not in names]
        if unknown:
            raise fail(f"{key.to_user_string()} has no check {', '.join(shown(c) for c in unknown)}; its checks are "
                       f"{', '.join(sorted(names))}")
        keys = [k for k in keys if k.name in set(checks)]
    instance = state.instance()
    job = loc.defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=set(),
                                                                     asset_check_selection=set(keys))
    run_id = make_new_run_id()
    outcome: dict[str, Any] = {}

    def run() -> None:
        from dw_dagster.core.asset_graph import CURRENT_DEFINITIONS

        token = CURRENT_DEFINITIONS.set(loc.defs)
        try:
            outcome["result"] = job.execute_in_process(
                instance=instance, run_id=run_id, raise_on_error=False,
                tags={_keys.LAUNCHED_BY_KEY: "dw-dagster mcp run_quality_check", _keys.KIND_KEY: _keys.CHECK_KIND},
                run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
        except Exception as e:  # noqa: BLE001 - reported in the answer
            outcome["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        finally:
            CURRENT_DEFINITIONS.reset(token)

    t0 = dt.datetime.now(dt.timezone.utc)
    worker = threading.Thread(target=run, name=f"dw-mcp-check-{run_id[:8]}", daemon=True)
    worker.start()
    worker.join(timeout_seconds)
    seconds = round((dt.datetime.now(dt.timezone.utc) - t0).total_seconds(), 2)
    if worker.is_alive():
        return QualityCheckRun(asset_key=list(key.path), location=loc.name, run_id=run_id, status="RUNNING",
                               seconds=seconds, checks=[])
    res = outcome.get("result")
    error = outcome.get("error")
    if res is not None and not res.success:
        failure = next((e for e in res.all_events if e.is_step_failure or e.event_type_value == "PIPELINE_FAILURE"), None)
        err = getattr(getattr(failure, "event_specific_data", None), "error", None) if failure else None
        error = (f"the run failed ({err.cls_name or 'an error'} in a step); its error is in the Dagster UI"
                 if err else "the run failed; see it in the Dagster UI")
    found = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        ev = entry.dagster_event.event_specific_data
        found[ev.check_name] = CheckResult(
            check=ev.check_name, asset_key=list(ev.asset_key.path), passed=ev.passed, severity=ev.severity.value,
            description=untrusted(ev.description, CHECK), numbers=_numbers(ev.metadata), texts=_texts(ev.metadata, CHECK),
            run_id=run_id, evaluated_at=dt.datetime.fromtimestamp(entry.timestamp, dt.timezone.utc))
    results = [found.get(k.name) or CheckResult(check=k.name, asset_key=list(key.path), passed=None, run_id=run_id)
               for k in keys]
    return QualityCheckRun(asset_key=list(key.path), location=loc.name, run_id=run_id,
                           status="SUCCESS" if res is not None and res.success else "FAILURE", seconds=seconds,
                           checks=results, error=error)


class QualityScore(BaseModel):
    """One score for an asset from its checks' latest results and its open incidents."""

    asset_key: list[str]
    score: float | None = Field(description="0–100 by `formula`; None when no check was ever evaluated")
    formula: str = Field(default=FORMULA)
    checks_score: float | None = Field(description="100 × Σ weight(passing) / Σ weight(evaluated), before the penalty")
    incident_penalty: float = Field(description="25 × open incidents")
    checks: list[CheckResult] = Field(description="each check's latest evaluation written by a run (passed None: no run "
                                      "evaluated it)")
    reported_without_run: list[CheckResult] = Field(
        default_factory=list, description="evaluations reported through the API without a run after each check's "
        "latest run (at most 5 per check, newest first): claims by whoever sent them; not results, not in the score")
    open_incidents: list[str] = Field(description="ids of the open incidents counted")


def quality_score(state: DwState, key: dg.AssetKey) -> QualityScore:
    """The score of ``key`` (see :data:`FORMULA`)."""
    _, keys = _checks_of(state, key)
    instance = state.view()
    histories = [check_history(instance, ck) for ck in keys]
    results = [h[0] for h in histories]
    evaluated = [r for r in results if r.passed is not None]
    total = sum(WEIGHTS.get(r.severity or "ERROR", 2) for r in evaluated)
    good = sum(WEIGHTS.get(r.severity or "ERROR", 2) for r in evaluated if r.passed)
    rows = [r for r in state.ledger().incidents(asset_key=asset_str(key), states=OPEN_INCIDENT_STATES) if r.linked_to is None]
    penalty = INCIDENT_PENALTY * len(rows)
    checks_score = round(100.0 * good / total, 1) if total else None
    return QualityScore(asset_key=list(key.path), score=max(0.0, round(checks_score - penalty, 1)) if checks_score is not None
                        else None, checks_score=checks_score, incident_penalty=penalty, checks=results,
                        reported_without_run=[r for h in histories for r in h[1]],
                        open_incidents=[r.incident_id for r in rows])


def get_quality_score(state: DwState, asset: str) -> QualityScore:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    return quality_score(state, state.asset(asset, with_workspace=True))


class ColumnView(BaseModel):
    name: str
    type: str | None = None
    nullable: bool | None = None
    description: str | None = None


class DomainView(BaseModel):
    """Who owns the asset and how far dw_dagster may act on it."""

    name: str
    source: str = Field(description="the domains file now, or the newest change set's record when no file is configured")
    approvers: list[str]
    autonomy: str | None = Field(default=None, description="L0–L4 (README rule 4)")
    identity: str | None = Field(default=None, description="verified (an OIDC or Slack identity) or unverified (sandbox)")
    max_window_partitions: int | None = None
    approval_expiry_hours: float | None = None
    allowed_change_classes: list[str] = Field(default_factory=list)


class PartitionsView(BaseModel):
    kind: str = Field(description="the partitions definition's class, e.g. DailyPartitionsDefinition")
    description: str
    count: int | None
    first: str | None
    last: str | None


class TableExplanation(BaseModel):
    """What an asset is, who owns it, how it is checked, where it comes from and goes, and what happened to it."""

    asset_key: list[str]
    location: str
    description: str | None
    owners: list[str]
    group: str | None
    kinds: list[str]
    table: str | None = Field(description="dagster/table_name metadata: where the rows live")
    domain: DomainView | None
    partitions: PartitionsView | None
    columns: list[ColumnView]
    columns_from: str = Field(description="where the columns were read: dagster/column_schema, a dw/schema snapshot, "
                              "the dbt manifest, or 'not recorded'")
    checks: list[CheckResult] = Field(description="each check's latest evaluation written by a run (quality.reported_without_run lists the ones reported without a run)")
    quality: QualityScore
    upstream: list[list[str]] = Field(description="parent asset keys")
    downstream: list[list[str]] = Field(description="child asset keys")
    downstream_exposures: list[str] = Field(description="dbt exposures (dashboards) reading it, any depth, with owner")
    open_incidents: list[str]
    receipts: list[ReceiptVerdict] = Field(description="receipts on it, newest first")
    cost: AssetCost | None = Field(default=None, description="what it cost over the last 30 days (credits, bytes "
                                   "billed or seconds) and where that comes from; None when nothing is recorded")
    migration: dict | None = Field(default=None, description="the migration wave a table pair lands in this asset: "
                                   "{migration, wave, wave_state, pair, state, signed_off_by}; None when none does")


def _columns(state: DwState, loc: Any, key: dg.AssetKey) -> tuple[list[ColumnView], str]:
    node = loc.asset_graph.get(key)
    schema = (node.metadata or {}).get("dagster/column_schema")
    schema = getattr(schema, "schema", getattr(schema, "value", schema))
    if schema is not None and getattr(schema, "columns", None):
        return [ColumnView(name=c.name, type=c.type, description=c.description,
                           nullable=None if c.constraints is None else c.constraints.nullable)
                for c in schema.columns], "dagster/column_schema"
    from dw_dagster.diagnosis.causes.schema_change import schema_history

    snaps = schema_history(state.view(), key, limit=5)  # a snapshot rides on the newest events when one is kept
    if snaps:
        s = snaps[0]
        return ([ColumnView(name=c.name, type=c.data_type, nullable=c.nullable) for c in s.columns],
                f"{_keys.SCHEMA_KEY} snapshot of {s.table} at {s.taken_at.isoformat()}")
    g = loc.lineage()
    for v in g.graph.get("asset_index", {}).get(tuple(key.path), ()):
        cols = (g.nodes[v].get("data") or {}).get("columns") or {}
        if cols:
            return [ColumnView(name=str(c.get("name") or n), type=c.get("data_type"), description=c.get("description") or None)
                    for n, c in cols.items()], f"the dbt manifest ({v}, documented columns)"
    return [], "not recorded (no dagster/column_schema, dw/schema snapshot or documented dbt columns)"


def _domain(state: DwState, key: dg.AssetKey, asset_graph: Any) -> DomainView | None:
    doms = state.domains()
    if doms is not None:
        try:
            d = doms.for_asset(key.path, asset_graph)
        except KeyError:
            d = None
        if d is not None:
            return DomainView(name=d.name, source=f"domains file {state.domains_path}", approvers=list(d.approvers),
                              autonomy=d.autonomy, identity=d.identity, max_window_partitions=d.max_window_partitions,
                              approval_expiry_hours=d.approval_expiry_hours,
                              allowed_change_classes=list(d.allowed_change_classes))
    rows = state.ledger().change_set_rows(target_asset=asset_str(key), limit=1)
    if rows:
        cs = records.parse_change_set(rows[0].body)
        return DomainView(name=cs.domain, source=f"change set {cs.id} as recorded (no domains file: --domains or "
                          "DW_DOMAINS_FILE gives autonomy and limits)", approvers=cs.approvers)
    return None


def explain_table(state: DwState, asset: str) -> TableExplanation:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    key = state.asset(asset, with_workspace=True)
    ws = state.workspace()
    locs = ws.locations_of(key)
    if not locs:
        raise fail(f"{key.to_user_string()} has records in the instance but no code location of the workspace defines it; "
                   "restart the server with the -w file that does")
    loc = next((x for x in locs if x.asset_graph.get(key).is_materializable), locs[0])
    node = loc.asset_graph.get(key)
    meta = node.metadata or {}
    table = meta.get("dagster/table_name")
    pdef = node.partitions_def
    parts = None
    if pdef is not None:
        try:
            pkeys = pdef.get_partition_keys(dynamic_partitions_store=state.instance())
        except Exception:  # noqa: BLE001 - a partition set that cannot be listed is still described
            pkeys = None
        parts = PartitionsView(kind=type(pdef).__name__, description=str(pdef), count=len(pkeys) if pkeys is not None else None,
                               first=pkeys[0] if pkeys else None, last=pkeys[-1] if pkeys else None)
    columns, columns_from = _columns(state, loc, key)
    score = quality_score(state, key)
    g = loc.lineage()
    exposures = []
    for v in g.graph.get("asset_index", {}).get(tuple(key.path), ()):
        from dw_dagster.lineage import downstream

        for u in downstream(g, [v]):
            a = g.nodes[u]
            if a.get("resource_type") == "exposure":
                o = (a.get("data") or {}).get("owner") or {}
                exposures.append(f"{(a.get('data') or {}).get('label') or a['name']} ({u}; owner {o.get('name')} "
                                 f"<{o.get('email')}>)")
    receipts = records.receipts(state.view(), key)
    checked, problems, _ = receipt_check(state, [key]) if receipts else (False, {}, "")
    return TableExplanation(
        asset_key=list(key.path), location=loc.name, description=node.description, owners=list(node.owners or []),
        group=node.group_name, kinds=sorted(node.kinds or []), table=str(getattr(table, "value", table)) if table else None,
        domain=_domain(state, key, loc.asset_graph), partitions=parts, columns=columns, columns_from=columns_from, checks=score.checks,
        quality=score, upstream=sorted(list(k.path) for k in node.parent_keys),
        downstream=sorted(list(k.path) for k in node.child_keys), downstream_exposures=sorted(set(exposures)),
        open_incidents=score.open_incidents, receipts=receipt_verdicts(receipts, checked, problems),
        cost=asset_cost(state, key), migration=_wave_of(state, key))


def _wave_of(state: DwState, key: dg.AssetKey) -> dict | None:
    """The wave (and the pair's state) of a migration whose pair lands in ``key``."""
    from dw_dagster.migration.status import table_wave

    return table_wave(state.instance(), key)


__all__ = ["CheckResult", "FORMULA", "QualityCheckRun", "QualityScore", "TableExplanation", "explain_table",
           "get_quality_score", "quality_score", "run_quality_check"]
