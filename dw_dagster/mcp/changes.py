"""Change tools: ``generate_migration`` (SQL, never applied) and ``remediate`` (a proposal, never approved or run).

``remediate`` proposes exactly as the loop does: when the incident has no live change set, it
runs the code location's diagnosis job (``dw_diagnose_incident``) for the incident, as the
incident sensor would launch it (:func:`dw_dagster.detection.incidents.diagnosis_request`), and
that job records the change set in the ledger and shows it on the asset
(:func:`dw_dagster.proposals.change_sets.record_proposal`). The notification sensor then sends the
approval request where Slack is configured. Nothing here decides: the change set waits for a
listed approver in the approval job like any other, and the remediation sensor dispatches
nothing before that approval.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Union

import dagster as dg
from pydantic import BaseModel, Field, ValidationError

from dw_dagster.core import records
from dw_dagster.core.ledger import APPLIED, APPROVED, CLOSED, DIAGNOSING, HALTED, PROPOSED, RUNNING
from dw_dagster.core.models import ChangeSet, Incident
from dw_dagster.mcp.models import ChangeSetBrief, change_set_brief
from dw_dagster.mcp.state import DwState, asset_of, fail, parse_asset_key
from dw_dagster.mcp.untrusted import UPSTREAM, Untrusted, untrusted
from dw_dagster.changes.migrations import (
    DIALECTS,
    AddColumn,
    DropColumn,
    LossyRetypeError,
    Migration,
    MigrationError,
    RenameColumn,
    RetypeColumn,
    SetNullability,
)
from dw_dagster.core import keys as c

_TABLE = Field(default=None, description="leave out: the tool's `table` argument names the table")


class AddColumnChange(AddColumn):
    """Add `column` of `type` (nullable unless `nullable` is false; a NOT NULL column needs `default`)."""

    table: str | None = _TABLE


class DropColumnChange(DropColumn):
    """Drop `column`; its values are kept in a backup table by `key_columns` so the rollback restores them."""

    table: str | None = _TABLE


class RenameColumnChange(RenameColumn):
    """Rename `column` to `new_name`."""

    table: str | None = _TABLE


class RetypeColumnChange(RetypeColumn):
    """Change `column` from `from_type` to `to_type` (lossy only with `allow_lossy` and `key_columns`)."""

    table: str | None = _TABLE


class SetNullabilityChange(SetNullability):
    """Make `column` nullable (`nullable: true`) or NOT NULL (`nullable: false`)."""

    table: str | None = _TABLE


ColumnChangeArg = Annotated[Union[AddColumnChange, DropColumnChange, RenameColumnChange, RetypeColumnChange,
                                  SetNullabilityChange], Field(discriminator="kind")]
_REAL = {AddColumnChange: AddColumn, DropColumnChange: DropColumn, RenameColumnChange: RenameColumn,
         RetypeColumnChange: RetypeColumn, SetNullabilityChange: SetNullability}


class MigrationAnswer(BaseModel):
    """Forward and rollback SQL for one column change, for the table's dialect. Not applied."""

    table: str = Field(description="the table the SQL names")
    table_from: str = Field(description="how the table was found: the asset's dagster/table_name, or as given")
    dialect: str
    dialect_from: str = Field(description="the resource whose URL gave the dialect, or 'given'")
    migration: Migration = Field(description="forward, rollback, guards (must count 0 before a direction runs), checks, "
                                 "cleanup, backup table, notes on the dialect's limits")
    applied: bool = Field(default=False, description="always False: this tool only writes SQL")
    next_step: str = Field(description="how such a change reaches the warehouse")


def _dialect_of(url: str) -> str | None:
    u = url.strip()
    if u.startswith("duckdb:") or (u.endswith(".duckdb") and "://" not in u):
        return "duckdb"
    for d in DIALECTS:
        if u.startswith(f"{d}://"):
            return d
    return None


def _database_resources(state: DwState, key: dg.AssetKey | None) -> list[tuple[str, str, str]]:
    """``(location, resource key, dialect)`` of the DatabaseResources of the asset's locations (or all)."""
    from dw_dagster.databases import DatabaseResource

    if not state.workspace_path:
        return []
    ws = state.workspace()
    locs = ws.locations_of(key) if key is not None else ws.loaded()
    out = []
    for loc in locs:
        for name, res in (loc.defs.resources or {}).items():
            if isinstance(res, DatabaseResource):
                d = _dialect_of(str(res.url))
                if d:
                    out.append((loc.name, name, d))
    return out


def generate_migration(state: DwState, table: str, change: Any, dialect: str | None) -> MigrationAnswer:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    if not table or not table.strip() or len(table) > 1000:
        raise fail("name the table: an asset key (its dagster/table_name is used) or schema.table")
    key, table_name, table_from = None, table.strip(), "as given"
    if state.workspace_path:
        try:
            k = parse_asset_key(table)
            locs = state.workspace().locations_of(k)
        except Exception:  # noqa: BLE001 - not an asset key: a table name
            locs = []
        for loc in locs:
            md = loc.asset_graph.get(k).metadata or {}
            if md.get("dagster/table_name"):
                key, table_name = k, str(getattr(md["dagster/table_name"], "value", md["dagster/table_name"]))
                table_from = f"dagster/table_name of asset {k.to_user_string()} (location {loc.name})"
                break
    real_cls = _REAL[type(change)]
    try:
        real = real_cls.model_validate({**change.model_dump(exclude={"table"}), "table": table_name})
    except ValidationError as e:
        raise fail(f"the change does not fit table {table_name!r}: " + "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'change'}: {err['msg']}" for err in e.errors())) from None
    dialect_from = "given"
    if dialect is None:
        found = _database_resources(state, key)
        first = table_name.split(".")[0]
        named = [f for f in found if f[1] == first]
        pick = named or found
        dialects = sorted({f[2] for f in pick})
        if len(dialects) != 1:
            raise fail(f"cannot tell the dialect of {table_name!r} "
                       + (f"(its code location has {', '.join(f'{r} ({d})' for _, r, d in found)})" if found else
                          "(no DatabaseResource with a duckdb, snowflake or bigquery URL in the workspace)")
                       + f": give dialect, one of {', '.join(DIALECTS)}")
        dialect = dialects[0]
        dialect_from = f"resource {pick[0][1]} of location {pick[0][0]} ({dialect} URL)"
    try:
        migration = _generate(real, dialect)
    except LossyRetypeError as e:
        raise fail(f"{e}; to do it anyway give allow_lossy: true and key_columns (the values are kept for the rollback)") from e
    except MigrationError as e:
        raise fail(f"{e}") from e
    return MigrationAnswer(table=table_name, table_from=table_from, dialect=dialect, dialect_from=dialect_from,
                           migration=migration,
                           next_step="not applied: a schema change reaches the warehouse only as a step of a change set "
                                     "a listed approver approved (dw_step_migration), with this rollback as its undo")


def _generate(change: Any, dialect: str) -> Migration:
    from dw_dagster.changes.migrations import generate_migration as gen

    return gen(change, dialect)


class StepView(BaseModel):
    kind: str
    summary: str
    sql: list[str]
    rollback_sql: list[str]
    expected_rows: int | None


class ManualStepView(BaseModel):
    """What the engineer does outside dw_dagster; its names and link come from that system (marked)."""

    kind: str = Field(description="e.g. mage_rerun")
    target: Untrusted = Field(description="what the engineer acts on (a Mage pipeline, named by Mage)")
    after: list[str] = Field(description="the stages it follows")
    summary: Untrusted
    command: Untrusted = Field(description="how to do it (the mage-agent run_pipeline call)")
    url: Untrusted | None = Field(description="where to do it in the system's UI")


class RemediationProposal(BaseModel):
    """The change set proposed for an incident: what the owner reviews before anything runs."""

    incident_id: str
    proposed_now: bool = Field(description="True when this call recorded a new change set; False when one was already "
                               "proposed (or applied) for the incident and is returned as it stands")
    change_set: ChangeSetBrief
    diff: str = Field(description="unified diff against the pipeline repository (git apply -p1)")
    files: list[str] = Field(description="files the diff edits or adds")
    window: list[str] = Field(description="partition keys the repair reruns (capped by the domain)")
    deferred_partitions: list[str] = Field(description="partitions the cause reaches that do not exist yet or are "
                                           "still in progress; not run")
    not_run: list[str] = Field(default_factory=list, description="each partition the cause reaches that the change set "
                               "does not run (outside the asset's partitions, deferred), with its rows, the reason and, "
                               "for a deferred one, when it exists or closes")
    rebuild_order: list[list[str]] = Field(description="asset keys rebuilt after the window, in order")
    new_tests: list[str]
    verify_checks: list[list[str]] = Field(description="[asset key path..., check name] that must pass for the receipt")
    steps: list[StepView] = Field(description="warehouse changes run between the window and the rebuild")
    manual_steps: list[ManualStepView] = Field(default_factory=list, description="what the engineer does outside "
                                               "dw_dagster (rerun a Mage pipeline); the verify stage waits for it")
    expected_recovered_rows: int
    undo: str
    expires_at: dt.datetime = Field(description="unanswered by then, it expires; it is never granted")
    diagnosis_run_id: str | None = Field(default=None, description="the diagnosis run this call launched, if any")
    approval: str = Field(description="who must approve it and how; this server cannot")
    approval_request: str = Field(description="whether and how the approvers are asked (Slack)")


def _proposal(state: DwState, incident_id: str, cs: ChangeSet, proposed_now: bool, run_id: str | None) -> RemediationProposal:
    brief = change_set_brief(state.ledger(), cs)
    # ``Definitions.sensors`` (the sensors as defined) is public on every Dagster the package allows;
    # there is no ``resolve_all_sensor_defs`` in Dagster 1.13
    slack = [loc.name for loc in (state.workspace().locations_of(dg.AssetKey(cs.target_asset)) if state.workspace_path else [])
             if "slack" in (loc.defs.resources or {}) and any(getattr(s, "name", None) == c.NOTIFICATION_SENSOR
                                                              for s in (loc.defs.sensors or ()))]
    if brief.state == PROPOSED:
        approval = (f"waiting for a listed approver of domain {cs.domain} ({', '.join(cs.approvers)}) to approve it "
                    f"through the approval job: `dw-dagster approve {cs.id} --login`, the review page of "
                    "`dw-dagster approvals serve`, or the Slack buttons. Nothing runs before that; this server cannot "
                    "approve")
    else:
        approval = f"change set {cs.id} is {brief.state}" + (" (change_set.note says why)" if brief.note else "")
    return RemediationProposal(
        incident_id=incident_id, proposed_now=proposed_now, change_set=brief, diff=cs.diff, files=[f.path for f in cs.files],
        window=cs.window, deferred_partitions=cs.deferred_partitions, not_run=[n.words() for n in cs.not_run()],
        rebuild_order=cs.rebuild_assets, new_tests=cs.new_tests,
        verify_checks=cs.verify_checks, steps=[StepView(kind=s.kind, summary=s.summary, sql=s.sql, rollback_sql=s.rollback_sql,
                                                        expected_rows=s.expected_rows) for s in cs.steps],
        manual_steps=[ManualStepView(kind=m.kind, target=Untrusted(untrusted_data=m.target, origin=UPSTREAM), after=m.after,
                                     summary=Untrusted(untrusted_data=m.summary, origin=UPSTREAM),
                                     command=Untrusted(untrusted_data=m.command, origin=UPSTREAM),
                                     url=untrusted(m.url, UPSTREAM)) for m in cs.manual_steps],
        expected_recovered_rows=cs.expected_recovered_rows, undo=cs.undo, expires_at=cs.expires_at,
        diagnosis_run_id=run_id, approval=approval,
        approval_request=(f"the notification sensor (dw_notification_sensor, location {', '.join(slack)}) posts the "
                          "request with Approve/Reject buttons to Slack on its next tick") if slack else
                         "no Slack in its code location: tell the approvers yourself (get_audit_trail shows the request "
                         "once one is sent)")


def _diagnosis_job(state: DwState, key: dg.AssetKey) -> tuple[Any, dg.JobDefinition]:
    locs = state.workspace().locations_of(key)
    for loc in locs:
        for job in loc.defs.resolve_all_job_defs():
            if (job.tags or {}).get(c.KIND_KEY) == c.DIAGNOSIS_KIND:
                return loc, job
    raise fail(f"no code location of the workspace has a diagnosis job for {key.to_user_string()} "
               "(a job tagged dw/kind: diagnosis, as build_diagnosis_job and DataOpsComponent make); restart the server "
               "with the -w file of the location that runs dw_dagster's loop")


def remediate(state: DwState, incident_id: str) -> RemediationProposal:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    from dw_dagster.core.asset_graph import CURRENT_DEFINITIONS
    from dw_dagster.detection.incidents import diagnosis_request

    row = state.incident_row(incident_id)
    led = state.ledger()
    existing = led.change_set_rows(incident_id=row.incident_id)
    live = [r for r in existing if r.state in (PROPOSED, APPROVED, RUNNING, HALTED, APPLIED)]
    if live:
        return _proposal(state, row.incident_id, records.parse_change_set(live[0].body), False, None)
    if row.state == CLOSED:
        raise fail(f"incident {row.incident_id} is closed (get_incident shows its note); a person re-opens it with "
                   f"`dw-dagster incidents reopen {row.incident_id} --by EMAIL --reason WHY` before anything is proposed")
    if row.state == DIAGNOSING:
        raise fail(f"incident {row.incident_id} is being diagnosed now; call remediate again when it is diagnosed")
    key = asset_of(row.asset_key)
    try:
        inc = Incident.model_validate_json(row.body)
    except ValueError as e:
        raise fail(f"incident {row.incident_id}'s record does not parse; it is quarantined") from e
    loc, job = _diagnosis_job(state, key)
    before = {(r.change_set_id, r.version) for r in led.change_set_rows(incident_id=row.incident_id, latest_only=False)}
    rr = diagnosis_request(inc, f"{inc.id}:mcp-remediate", job.name)
    token = CURRENT_DEFINITIONS.set(loc.defs)
    try:
        result = job.execute_in_process(
            instance=state.instance(), raise_on_error=False,
            run_config={**rr.run_config, "loggers": {"console": {"config": {"log_level": "WARNING"}}}},
            tags={**rr.tags, c.LAUNCHED_BY_KEY: "dw-dagster mcp remediate"})
    finally:
        CURRENT_DEFINITIONS.reset(token)
    # a run's messages and errors quote the warehouse and whatever failed: the answer names the run, never quotes it
    if not result.success:
        failure = next((e for e in result.all_events if e.is_step_failure), None)
        err = getattr(getattr(failure, "event_specific_data", None), "error", None)
        raise fail(f"the diagnosis run {result.run_id} of {job.name} failed"
                   + (f" ({err.cls_name} in step {failure.step_key})" if err is not None and failure is not None else "")
                   + "; its error is in the run's events in the Dagster UI; fix its cause and call remediate again")
    new = [r for r in led.change_set_rows(incident_id=row.incident_id, latest_only=False)
           if (r.change_set_id, r.version) not in before]
    if not new:
        raise fail(f"the diagnosis run {result.run_id} proposed no new change set (its log in the Dagster UI says why). "
                   f"diagnose_incident {row.incident_id} shows what it found; a change set with the same content as "
                   "an earlier one keeps that one's record and expiry")
    return _proposal(state, row.incident_id, records.parse_change_set(new[0].body), True, result.run_id)


__all__ = ["ColumnChangeArg", "MigrationAnswer", "RemediationProposal", "generate_migration", "remediate"]
