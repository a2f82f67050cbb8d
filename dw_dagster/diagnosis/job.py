"""The diagnosis job: one op that explains an incident and proposes a change set.

The op takes the incident as typed config (the incident sensor fills it in), calls a
*diagnoser*, and records what it returns as ``AssetObservation``\\ s on the incident's asset:
``dw/diagnosis`` (causes, evidence with the SQL run and the values seen, blast radius) and, when a
fix can be proposed, ``dw/change_set``.

:class:`IncrementalLoadDiagnoser` is the diagnoser for assets loaded by
:func:`dw_dagster.pipelines.incremental.load_partition`: it tests the late-rows-behind-the-watermark cause,
maps the blast radius through the dbt manifest, and proposes the watermark fix. It also tests
the other causes (REQUIRED-column NULLs and the dead-letter table, duplicate loads, upstream
assets not refreshed or failed, schema changes from ``dw/schema`` snapshots), combines them
without double counting (:func:`~dw_dagster.diagnosis.combine.combine_findings`), reports what no
cause explains as ``unexplained``, and notes when the primary cause happened before on the asset
(:func:`~dw_dagster.diagnosis.history.attach_history`).

:class:`RecordedLoadDiagnoser` does the same for an asset that loads by its own code and records
each load with :func:`~dw_dagster.pipelines.incremental.load_metadata`: its tables and columns
come from the configuration, the watermark column from the recorded loads, and the fix is a diff
of the asset's own settings file. Both read what each load did from the ``dw/loads`` metadata of
the asset's latest materialization of each partition.
"""


import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from pydantic import Field

from dw_dagster.lineage.sensitive import mask_diagnosis, rules_in_force
from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.databases.snippets import DAGSTER_EVENT_LOG
from dw_dagster.diagnosis.combine import combine_findings
from dw_dagster.diagnosis.fixes import FIXED_KINDS
from dw_dagster.diagnosis.causes.dead_letter import DeadLetterTable, diagnose_required_nulls
from dw_dagster.diagnosis.causes.duplicates import diagnose_duplicates
from dw_dagster.diagnosis.history import attach_history
from dw_dagster.diagnosis.causes.schema_change import diagnose_schema_change
from dw_dagster.diagnosis.causes.schema_change import required_columns as catalog_required_columns
from dw_dagster.diagnosis.causes.upstream import diagnose_upstream, upstream_keys
from dw_dagster.diagnosis.causes.watermark import KIND as WATERMARK_KIND
from dw_dagster.diagnosis.causes.watermark import PartitionLoad, diagnose_late_rows
from dw_dagster.core.domains import DomainsSource, domain_for, resolve_domains
from dw_dagster.core.ledger import (
    ACTIVE_STATES,
    CLOSED,
    DIAGNOSED,
    DIAGNOSING,
    DIAGNOSIS_FAILED,
    OPEN,
    UNREPAIRED,
    ledger_for,
)
from dw_dagster.core.asset_graph import asset_graph_of
from dw_dagster.lineage import blast_radius, load_manifest, manifest_graph, source_for_asset_key
from dw_dagster.pipelines.incremental import IncrementalLoadSpec
from dw_dagster.core.models import UndoPlan, BlastRadius, ChangeSet, Diagnosis, Incident, stable_hash, utcnow
from dw_dagster.core import records
from dw_dagster.proposals.change_sets import change_set_observation, record_proposal
from dw_dagster.proposals.watermark import DbtCountTest, ProposalError, propose_watermark_fix
from dw_dagster.dagster_private import public

DIAGNOSIS_JOB_NAME = c.DIAGNOSIS_JOB

Diagnoser = Callable[[dg.OpExecutionContext, Incident], tuple[Diagnosis, ChangeSet | None]]


class IncidentConfig(dg.Config):
    incident_json: str = Field(description="the Incident record (JSON), as the incident sensor wrote it")


def diagnosis_markdown(d: Diagnosis) -> str:
    """A diagnosis as markdown for the asset page."""
    lines = [f"### Diagnosis {d.id} for incident {d.incident_id}",
             f"Gap {d.gap_rows} rows; unexplained {d.unexplained_rows} rows.", ""]
    notes = [cause.details["history_note"] for cause in d.causes if cause.details.get("history_note")]
    lines += [f"**Repeat:** {n}" for n in notes] + ([""] if notes else [])
    for cause in d.causes:
        lines += [f"**{cause.kind}** (confidence {cause.confidence:.0%}, explains {cause.explained_rows} rows): "
                  f"{cause.summary}", ""]
        if cause.details.get("remediation"):
            lines += [f"*Remediation:* {cause.details['remediation']}", ""]
        mage = cause.details.get("mage") or {}
        if mage.get("timeline") or mage.get("error"):
            lines += ["*Mage runs in the window:*"] + [f"- {x}" for x in mage.get("timeline") or []]
            lines += ([f"- Mage could not be read: {mage['error']}"] if mage.get("error") else []) + [""]
        for ev in cause.evidence:
            lang = ("python" if ev.database == DAGSTER_EVENT_LOG  # event-log reads are instance calls
                    else "http" if ev.database.startswith("mage ") else "sql")
            lines += [f"- {ev.description} ({ev.database})", f"  ```{lang}", "  " + ev.sql.replace("\n", "\n  "), "  ```"]
    br = d.blast_radius
    lines += ["", "**Blast radius**", f"- models: {', '.join(m.name for m in br.models) or 'none'}",
              f"- tests: {len(br.tests)}",
              "- exposures: " + (", ".join(f"{e.label or e.name} ({e.type}, owner {e.owner_name} <{e.owner_email}>"
                                           + (f", needed by {e.needed_by}" if e.needed_by else "") + ")"
                                           for e in br.exposures) or "none"),
              f"- owners: {', '.join(br.owners) or 'none'}"]
    return "\n".join(lines)


def claim_incident(led, incident_json: str) -> Incident:
    """Take the incident a diagnosis run was launched for, as the ledger holds it (``open`` → ``diagnosing``).

    Args:
        led: the instance's :class:`~dw_dagster.core.ledger.Ledger`.
        incident_json: the run's ``incident_json`` config (what the detection sensor wrote).

    Returns:
        The incident as recorded in the ledger (the config is only its request).

    Raises:
        dagster.Failure: the config does not parse; the ledger holds no such incident (no sensor
            recorded it: it is not recorded now either); the config differs from the recorded
            incident; or the incident is not waiting for a diagnosis (closed, being diagnosed,
            diagnosed, failed, quarantined, linked). Nothing is changed then.
    """
    try:
        asked = Incident.model_validate_json(incident_json)
    except ValueError as e:
        raise dg.Failure(description=f"refused: incident_json is not an incident ({str(e)[:300]}); nothing diagnosed") from e
    row = led.incident(asked.id)
    if row is None:
        raise dg.Failure(description=(
            f"refused: incident {asked.id} is not in this instance's ledger. The diagnosis job diagnoses only incidents "
            "a detection sensor recorded (or a person asked to diagnose again with `dw-dagster incidents rediagnose`); "
            "it records none itself. Nothing was recorded or changed."))
    try:
        recorded = Incident.model_validate_json(row.body)
    except ValueError as e:
        raise dg.Failure(description=f"refused: the recorded incident {row.incident_id} does not parse ({str(e)[:300]})") from e
    mine, theirs = recorded.model_dump(mode="json"), asked.model_dump(mode="json")
    differs = sorted(k for k in mine if mine[k] != theirs.get(k))
    if differs:
        raise dg.Failure(description=(
            f"refused: the incident_json of this run differs from incident {row.incident_id} as recorded "
            f"({', '.join(differs)}); the diagnosis job diagnoses the recorded incident only. Nothing was changed."))
    if row.state == CLOSED:
        raise dg.Failure(description=f"incident {row.incident_id} is closed; `dw-dagster incidents reopen` first")
    if row.linked_to is not None or not led.set_incident_state(row.incident_id, DIAGNOSING, from_states=[OPEN]):
        now = led.incident(row.incident_id)
        why = f"linked to incident {now.linked_to}" if now.linked_to else now.state
        raise dg.Failure(description=(
            f"refused: incident {row.incident_id} is {why}, not waiting for a diagnosis. It is diagnosed when a detection "
            f"sensor requests it (a new failure of its checks) or a person asks: `dw-dagster incidents rediagnose "
            f"{row.incident_id} --by EMAIL --reason ...`. Nothing was changed."))
    return recorded


def _with_undone(context: dg.OpExecutionContext, led, incident: Incident, diagnosis: Diagnosis) -> Diagnosis:
    """The rows an undo of this incident's repair took back, as a cause of what is otherwise unexplained
    (:mod:`dw_dagster.diagnosis.causes.undone`), counted in the target when the run holds its resource."""
    from dw_dagster.diagnosis.causes.undone import undo_record, with_undone_rows

    record = undo_record(led, incident.id)
    if record is None:
        return diagnosis
    key = (record.get("taken_back") or {}).get("resource_key")
    res = getattr(context.resources, key, None) if key else None
    try:
        return with_undone_rows(diagnosis, record, res.get_database() if res is not None else None)
    except Exception as e:  # noqa: BLE001 - the count is evidence, not the diagnosis: fall back to what the undo recorded
        context.log.warning(f"could not count the rows the undo took back in the target ({type(e).__name__}: {e}); "
                            "using the undo's own count")
        return with_undone_rows(diagnosis, record, None)


@public
def build_diagnosis_job(
    *, diagnoser: Diagnoser, name: str = DIAGNOSIS_JOB_NAME, required_resource_keys: Sequence[str] = (),
    domains: DomainsSource = None,
) -> dg.JobDefinition:
    """A job with one op (``dw_diagnose``) that runs ``diagnoser`` on the incident in its config.

    The op diagnoses only an incident the ledger already holds and that is waiting for this
    diagnosis (:func:`claim_incident`): one a detection sensor recorded and requested, or one a
    person asked to diagnose again (``dw-dagster incidents rediagnose``). A run launched by hand
    with a made-up ``incident_json``, an altered copy of a real one, or a re-executed run of an
    incident already diagnosed is refused before anything is recorded. The op records the
    incident's progress in the ledger: ``diagnosing`` when it starts,
    ``diagnosed`` when it recorded a diagnosis, ``diagnosis_failed`` (with the error) when the
    diagnoser raised, so a later failure of the asset's checks, or ``dw-dagster incidents
    rediagnose``, diagnoses it again. A proposed change set is recorded in the ledger first: the
    same content proposed again keeps its first record and expiry and is not shown twice; when
    that record already ended (rejected, expired, failed, applied, superseded) it is not revived,
    and the incident stays ``unrepaired`` (diagnosed again on the next new evidence).

    Args:
        diagnoser: ``(context, incident) -> (Diagnosis, ChangeSet | None)``.
        name: the job name the incident sensor launches.
        required_resource_keys: resources the diagnoser reads from ``context.resources``.
        domains: the domains (autonomy L1 proposes nothing); default ``$DW_DOMAINS_FILE``.
    """

    @dg.op(name=c.DIAGNOSE_OP, required_resource_keys=set(required_resource_keys), tags={"kind": "dw"})
    def _diagnose(context: dg.OpExecutionContext, config: IncidentConfig) -> None:
        led = ledger_for(context.instance)
        incident = claim_incident(led, config.incident_json)
        try:
            diagnose_claimed(context, led, incident)
        except BaseException as e:  # whatever stopped it, the incident is diagnosed again on new evidence
            led.set_incident_state(incident.id, DIAGNOSIS_FAILED, from_states=[DIAGNOSING], note=f"{type(e).__name__}: {e}")
            raise

    def diagnose_claimed(context: dg.OpExecutionContext, led, incident: Incident) -> None:
        diagnosis, cs = diagnoser(context, incident)
        diagnosis = _with_undone(context, led, incident, diagnosis)
        # sample values leave the warehouse in this record (asset metadata, the MCP server, notifications):
        # masked by the domains file's review.sensitive rules before it is written
        diagnosis = mask_diagnosis(diagnosis, rules_in_force(domains))
        domain = domain_for(incident.asset_key, domains)
        if cs is not None and domain is not None and not domain.proposes:
            context.log.info(f"Domain {domain.name} is at autonomy {domain.autonomy}: diagnosed and annotated, "
                             "proposing no change.")
            cs = None
        key = dg.AssetKey(incident.asset_key)
        primary = diagnosis.primary
        context.log_event(dg.AssetObservation(
            asset_key=key,
            description=describe(f"diagnosis {diagnosis.id}: {primary.kind if primary else 'no cause found'}",
                                 incident_id=diagnosis.incident_id),
            metadata={c.DIAGNOSIS_KEY: dg.MetadataValue.json(diagnosis.model_dump(mode="json")),
                      c.DIAGNOSIS_MD_KEY: dg.MetadataValue.md(diagnosis_markdown(diagnosis)),
                      c.INCIDENT_ID_KEY: incident.id},
        ))
        note = primary.kind if primary else "no cause found"
        if cs is not None:
            recorded, new = record_proposal(led, cs)
            row = led.change_set_row(recorded.id, recorded.version)
            if not new and row is not None and row.state not in ACTIVE_STATES:
                # the same content as a version that ended (rejected, expired, failed, applied, superseded):
                # a person's rejection or an expiry is not undone by re-proposing it, and nothing acts on it
                why = (f"diagnosed again; it proposes change set {recorded.id} version {recorded.version[:12]}… again, "
                       f"which is {row.state}: nothing new to decide (a new failure diagnoses it again; or close it)")
                led.set_incident_state(incident.id, UNREPAIRED, from_states=[DIAGNOSING], note=why)
                led.audit("incident_unrepaired", incident.id, "dw-dagster", {"change_set_id": recorded.id,
                                                                            "version": recorded.version, "reason": why})
                context.log.warning(f"Incident {incident.id} {why}")
                return
            led.set_incident_state(incident.id, DIAGNOSED, from_states=[DIAGNOSING], note=note)
            if not new:
                context.log.info(f"Change set {recorded.id} version {recorded.version[:12]}… was proposed before with the "
                                 f"same content; it keeps its expiry {recorded.expires_at.isoformat()}")
                return
            context.log_event(change_set_observation(recorded))
            context.log.info(f"Proposed change set {recorded.id}: {recorded.summary}")
            return
        led.set_incident_state(incident.id, DIAGNOSED, from_states=[DIAGNOSING], note=note)

    @dg.job(name=name, tags={c.KIND_KEY: c.DIAGNOSIS_KIND}, description="Diagnose a dw_dagster incident and propose a change set.")
    def _job():
        _diagnose()

    return _job


def dbt_blast_radius(manifest_path: Callable[[], Path] | None, asset: dg.AssetKey,
                     dbt_asset_keys: Mapping[str, Sequence[str]]) -> BlastRadius:
    """What the dbt project has downstream of ``asset`` (its source node): models, tests, exposures,
    owners; empty when there is no manifest or the asset is no dbt source."""
    if manifest_path is None:
        return BlastRadius(root="(no dbt project)")
    graph = manifest_graph(load_manifest(manifest_path()))
    src = source_for_asset_key(graph, asset.path)
    return blast_radius(graph, [src], {u: list(k) for u, k in dbt_asset_keys.items()}) if src else BlastRadius(root="(none)")


def _naive(v) -> dt.datetime | None:
    if v is None:
        return None
    t = dt.datetime.fromisoformat(v) if isinstance(v, str) else v
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo else t


@dataclass(frozen=True)
class LoadShape:
    """What the causes need to know of an incremental load, whatever describes it (a pipeline file,
    the watched asset's configuration, a dbt model): the same names as
    :class:`~dw_dagster.pipelines.incremental.IncrementalLoadSpec`.

    Attributes:
        source_table, target_table: ``[catalog.]schema.table`` in the source and the warehouse.
        merge_key: the one column the load merges on.
        partition_column: the timestamp/date column whose UTC day is the partition.
        watermark_column: the column the load compared with the high-watermark.
        arrival_column: when a row reached the source; None: the late-rows cause is not tested.
    """

    source_table: str
    target_table: str
    merge_key: str
    partition_column: str
    watermark_column: str
    arrival_column: str | None


@public
@dataclass
class IncrementalLoadDiagnoser:
    """Diagnoses incidents on an asset loaded by :func:`dw_dagster.pipelines.incremental.load_partition`.

    Attributes:
        target_asset: the loaded asset.
        source_resource_key, target_resource_key: ``DatabaseResource`` keys of source and warehouse.
        pipeline_root: the pipeline repository working copy; ``pipeline_file`` is relative to it.
        manifest_path: a callable returning the dbt ``manifest.json`` path (read at diagnosis time);
            None when the project has no dbt (empty blast radius).
        partitions_def: the asset's time-window partitions; None reads them from the code location's
            asset graph when the incident is diagnosed.
        domains_file: the domains (approvers, caps): any :data:`~dw_dagster.core.domains.DomainsSource`.
        dbt_asset_keys: dbt unique id → Dagster asset key path, for the rebuild.
        verify_checks: ``[*asset key, check name]`` of the checks that prove a repair.
        group_by: breakdown columns for the evidence (e.g. ``["store_id"]``).
        dbt_test: the regression test to propose.
        check_required_nulls: test NULLs in REQUIRED columns (given in ``required_columns``, else
            read from the target's catalog) and the dead-letter table; skipped when there are
            neither REQUIRED columns nor a dead-letter table.
        required_columns: the REQUIRED columns; None reads them from the target's catalog.
        dead_letter: the sink's dead-letter table, if it has one; its ``database`` is taken from
            ``dead_letter_resource_key`` (default: the warehouse).
        check_duplicates: count duplicated merge keys and partitions loaded twice.
        check_upstream: read the run and materialization history of the asset's parents.
        asset_graph: returns the asset graph (e.g. ``defs.resolve_asset_graph``), for runs that
            have no repository (``execute_in_process``); by default the op's
            ``context.repository_def.asset_graph`` is used.
        upstream_max_age: a parent older than this when the asset ran is stale (None: not tested).
        check_schema: compare the ``dw/schema`` snapshots on the asset and its parents.
        history: note when the primary cause happened before on this asset.
        scan_days: without an incident window, the costlier queries (NULLs, duplicates) look at the
            latest ``scan_days`` loaded partitions.
        tests_dir: where a fix's new test goes in the pipeline repository.
        upstream_tables: upstream asset key (``a/b``) → its warehouse table, for the test an upstream fix adds.
    """

    target_asset: dg.AssetKey
    source_resource_key: str
    target_resource_key: str
    pipeline_root: Callable[[], Path]
    pipeline_file: str
    manifest_path: Callable[[], Path] | None
    partitions_def: dg.TimeWindowPartitionsDefinition | None
    domains_file: DomainsSource
    dbt_asset_keys: Mapping[str, Sequence[str]]
    verify_checks: Sequence[Sequence[str]]
    group_by: Sequence[str] = ()
    dbt_test: DbtCountTest | None = None
    extra: dict = field(default_factory=dict)
    check_required_nulls: bool = True
    required_columns: Sequence[str] | None = None
    dead_letter: DeadLetterTable | None = None
    dead_letter_resource_key: str | None = None
    check_duplicates: bool = True
    check_upstream: bool = True
    asset_graph: Callable[[], object] | None = None
    upstream_max_age: dt.timedelta | None = None
    check_schema: bool = True
    history: bool = True
    scan_days: int = 7
    tests_dir: str = "dbt_project/tests"
    upstream_tables: Mapping[str, str] | None = None

    def _partitions(self, context) -> dg.PartitionsDefinition:
        if self.partitions_def is not None:
            return self.partitions_def
        graph = asset_graph_of(context, self.asset_graph)
        pdef = graph.get(self.target_asset).partitions_def if graph is not None and graph.has(self.target_asset) else None
        if pdef is None:
            raise dg.Failure(description=f"{self.target_asset.to_user_string()} has no partitions in this code location: "
                             "a watermark fix reruns a window of partitions")
        return pdef

    def _partition_keys(self, context, window: tuple[dt.datetime, dt.datetime] | None) -> list[str] | None:
        """The asset's partition keys whose start is in ``window`` (None without a window)."""
        if window is None:
            return None
        pdef = self._partitions(context)
        return [k for k in pdef.get_partition_keys()
                if window[0] <= _naive(pdef.time_window_for_partition_key(k).start) < window[1]]

    def _shape(self, context: dg.OpExecutionContext, loads_meta: Mapping[str, Mapping]) -> "LoadShape | IncrementalLoadSpec":
        """What the causes need to know of the load: tables, key, partition, watermark and arrival
        columns; here the pipeline file, as it is now."""
        return IncrementalLoadSpec.from_file(self.pipeline_root() / self.pipeline_file)

    def _recorded_loads(self, context: dg.OpExecutionContext, incident: Incident) -> tuple[dict[str, dict], list[PartitionLoad], dt.datetime | None]:
        """(the latest ``dw/loads`` entry per partition, those loads for the cause, the high-watermark
        the latest load read above).

        Raises:
            dg.Failure: the asset has no recorded loads.
        """
        loads_meta = records.latest_loads(context.instance, self.target_asset)
        if not loads_meta:
            raise dg.Failure(description=f"no recorded loads of {self.target_asset.to_user_string()}; nothing to diagnose "
                             "(record each load with dw_dagster.load_metadata)")
        latest = max(loads_meta.values(), key=lambda m: m["timestamp"])
        loads = [PartitionLoad(pk, _naive(m["partition_start"]), _naive(m["partition_end"]),
                               _naive(m.get("source_snapshot_ts")), m.get("run_id")) for pk, m in sorted(loads_meta.items())]
        return loads_meta, loads, _naive(latest.get("watermark_low"))

    def _blast_radius(self) -> BlastRadius:
        """What the dbt project has downstream of the asset (as a dbt source)."""
        return dbt_blast_radius(self.manifest_path, self.target_asset, self.dbt_asset_keys)

    def _propose(self, context: dg.OpExecutionContext, incident: Incident, diagnosis: Diagnosis, finding,
                 br: BlastRadius, shape) -> ChangeSet:
        """The change set for a late-rows finding: the diff of the pipeline file and the window rerun.

        Raises:
            ProposalError: the change cannot be proposed (window over the cap, file missing...).
        """
        domain = resolve_domains(self.domains_file).for_asset(self.target_asset.path)
        return propose_watermark_fix(
            incident=incident, diagnosis=diagnosis, finding=finding, domain=domain,
            pipeline_root=self.pipeline_root(), pipeline_file=self.pipeline_file, partitions_def=self._partitions(context),
            rebuild_assets=[m.asset_key for m in br.models if m.asset_key], verify_checks=self.verify_checks,
            dbt_test=self.dbt_test,
            undo=UndoPlan(resource_key=self.target_resource_key, table=shape.target_table,
                          partition_column=shape.partition_column, window=[]))

    def _scan_window(self, incident: Incident, loads_meta: Mapping[str, Mapping]) -> tuple[dt.datetime, dt.datetime] | None:
        """The incident's window (naive UTC), else the span of the latest ``scan_days`` loaded partitions."""
        if incident.window_start is not None and incident.window_end is not None:
            return _naive(incident.window_start), _naive(incident.window_end)
        latest = sorted(loads_meta.values(), key=lambda m: _naive(m["partition_start"]))[-max(1, self.scan_days):]
        if not latest:
            return None
        return min(_naive(m["partition_start"]) for m in latest), max(_naive(m["partition_end"]) for m in latest)

    def _other_causes(self, context: dg.OpExecutionContext, incident: Incident, spec: IncrementalLoadSpec, source, target,
                      window: tuple[dt.datetime, dt.datetime] | None) -> list:
        """The causes other than the watermark; a cause whose queries fail is logged and left out."""
        found = []
        partition_keys = self._partition_keys(context, window)

        def attempt(name, fn):
            try:
                f = fn()
            except Exception as e:  # one cause failing must not lose the others (the watermark above all)
                context.log.warning(f"cause {name} not tested: {type(e).__name__}: {e}")
                return
            if f is not None and f.details.get("tested", True):
                found.append(f)

        if self.check_required_nulls:
            def _nulls():
                required = (list(self.required_columns) if self.required_columns is not None
                            else catalog_required_columns(target, spec.target_table))
                if not required and self.dead_letter is None:
                    return None
                dlq = self.dead_letter
                if dlq is not None and dlq.database is None:
                    key = self.dead_letter_resource_key
                    db = getattr(context.resources, key).get_database() if key else target
                    dlq = dataclasses.replace(dlq, database=db)
                return diagnose_required_nulls(
                    source, target, source_table=spec.source_table, target_table=spec.target_table,
                    key_columns=[spec.merge_key], required_columns=required, dead_letter=dlq,
                    partition_column=spec.partition_column, window=window, gap_rows=incident.gap_rows)
            attempt("required_null_dead_letter", _nulls)
        if self.check_duplicates:
            attempt("duplicate_load", lambda: diagnose_duplicates(
                target, target_table=spec.target_table, key_columns=[spec.merge_key], partition_column=spec.partition_column,
                window=window, gap_rows=incident.gap_rows, instance=context.instance, asset_key=self.target_asset))
        graph = None
        if self.check_upstream or self.check_schema:
            graph = asset_graph_of(context, self.asset_graph)
            if graph is None:
                context.log.warning("no asset graph (the run has no repository; give IncrementalLoadDiagnoser "
                                    "asset_graph=defs.resolve_asset_graph): upstream causes not tested")
        if self.check_upstream and graph is not None:
            attempt("upstream", lambda: diagnose_upstream(
                context.instance, graph, self.target_asset, max_age=self.upstream_max_age, partitions=partition_keys,
                gap_rows=incident.gap_rows))
        if self.check_schema:
            keys = [self.target_asset, *(upstream_keys(graph, self.target_asset) if graph is not None else [])]
            attempt("schema_change", lambda: diagnose_schema_change(
                context.instance, keys, as_of=incident.detected_at, gap_rows=incident.gap_rows))
        return found

    def __call__(self, context: dg.OpExecutionContext, incident: Incident) -> tuple[Diagnosis, ChangeSet | None]:
        source = getattr(context.resources, self.source_resource_key).get_database()
        target = getattr(context.resources, self.target_resource_key).get_database()
        loads_meta, loads, hwm = self._recorded_loads(context, incident)
        spec = self._shape(context, loads_meta)
        causes = []
        if hwm is not None and spec.arrival_column:
            causes.append(diagnose_late_rows(
                source, target, source_table=spec.source_table, target_table=spec.target_table, key_column=spec.merge_key,
                partition_column=spec.partition_column, watermark_column=spec.watermark_column,
                arrival_column=spec.arrival_column, loads=loads, high_watermark=hwm,
                gap_rows=incident.gap_rows, group_by=self.group_by))
        causes += self._other_causes(context, incident, spec, source, target, self._scan_window(incident, loads_meta))
        combined = combine_findings(incident.gap_rows, causes)
        causes = combined.findings
        if self.history and causes:
            top = max(range(len(causes)), key=lambda i: causes[i].explained_rows)
            causes[top] = attach_history(causes[top], context.instance, self.target_asset, incident.id)
        br = self._blast_radius()
        diagnosis = Diagnosis(
            id="dg-" + stable_hash([incident.id, [f.model_dump(mode="json", exclude={"evidence"}) for f in causes]], 10),
            incident_id=incident.id, asset_key=list(self.target_asset.path), created_at=utcnow(), causes=causes,
            blast_radius=br, gap_rows=incident.gap_rows, unexplained_rows=combined.unexplained_rows,
        )
        primary = acting_finding(diagnosis)
        if primary is None:
            context.log.warning("No cause explains the gap; reporting it as unexplained, proposing nothing.")
            return diagnosis, None
        if primary.kind != WATERMARK_KIND and primary.kind not in FIXED_KINDS:
            context.log.warning(f"Primary cause {primary.kind}: no automatic change set for it; "
                                f"{primary.details.get('remediation') or 'see the diagnosis'}")
            return diagnosis, None
        try:
            if primary.kind == WATERMARK_KIND:
                cs = self._propose(context, incident, diagnosis, primary, br, spec)
            else:
                cs = self._propose_fix(context, incident, diagnosis, primary, br, spec, target,
                                       self._scan_window(incident, loads_meta))
        except ProposalError as e:
            context.log.warning(f"Diagnosed {primary.kind}, but no change set could be proposed: {e}")
            return diagnosis, None
        return diagnosis, cs

    def _propose_fix(self, context, incident: Incident, diagnosis: Diagnosis, finding, br: BlastRadius, shape, target,
                     window) -> ChangeSet:
        """The change set of an upstream, duplicate-load or schema-change finding (:mod:`dw_dagster.diagnosis.fixes`)."""
        from dw_dagster.diagnosis import fixes

        pdef = self._partitions(context) if finding.kind != fixes.SCHEMA_KIND or window else None
        ctx = fixes.FixContext(
            incident=incident, diagnosis=diagnosis, domain=resolve_domains(self.domains_file).for_asset(self.target_asset.path),
            pipeline_root=self.pipeline_root(), target_table=shape.target_table, merge_key=[shape.merge_key],
            partition_column=shape.partition_column, resource_key=self.target_resource_key, database=target,
            partitions_def=pdef, rebuild_assets=[m.asset_key for m in br.models if m.asset_key],
            verify_checks=self.verify_checks, tests_dir=self.tests_dir)
        gap_partitions = self._partition_keys(context, window) or []
        if finding.kind == fixes.DUPLICATE_KIND:
            return fixes.propose_duplicate_fix(ctx, finding)
        if finding.kind == fixes.SCHEMA_KIND:
            from dw_dagster.diagnosis.contracts import contract_fix_args

            # a dbt model with an enforced contract is fixed in its contract, not by migrating its table
            args = (contract_fix_args(self.manifest_path(), self.target_asset.path, self.dbt_asset_keys, ctx.pipeline_root,
                                      finding, shape.target_table) if self.manifest_path is not None else None)
            if args is not None:
                return fixes.propose_contract_fix(ctx, finding, **args)
            return fixes.propose_schema_fix(ctx, finding, rerun_window=gap_partitions)
        graph = asset_graph_of(context, self.asset_graph)
        if graph is None:
            raise ProposalError("no asset graph to order the upstream rerun (give asset_graph=defs.resolve_asset_graph)")
        return fixes.propose_upstream_fix(ctx, finding, instance=context.instance, graph=graph,
                                          upstream_tables=self.upstream_tables, stale_window=gap_partitions)


def acting_finding(diagnosis: Diagnosis):
    """The finding a change set acts on: the one explaining the most rows; when none counts rows, the
    upstream or schema change finding with the highest confidence (they count no rows by design)."""
    from dw_dagster.diagnosis.fixes import SCHEMA_KIND, UPSTREAM_KIND

    primary = diagnosis.primary
    if primary is not None and primary.explained_rows > 0:
        return primary
    priors = [f for f in diagnosis.causes if f.kind in (UPSTREAM_KIND, SCHEMA_KIND) and f.confidence > 0]
    return max(priors, key=lambda f: f.confidence, default=None)


@dataclass(kw_only=True)
class RecordedLoadDiagnoser(IncrementalLoadDiagnoser):
    """Diagnoses incidents on an asset that loads by its own code and records each load with
    :func:`~dw_dagster.pipelines.incremental.load_metadata` (no pipeline file of dw_dagster's shape).

    The tables and columns come from the configuration; the watermark column from the latest
    recorded load. ``pipeline_file`` (under ``pipeline_root``) is the asset's own settings file, a
    YAML file the asset reads at run time with a top-level ``watermark_key: <column>`` and
    ``lookback_key: <hours>`` line: the fix is a diff of those two lines (read by arrival, with the
    lookback the diagnosis measured) and a rerun of the partitions holding late rows, once merged.

    Attributes:
        source_table, target_table: ``schema.table`` of the source and of the asset's table.
        key_column: the key the asset merges on.
        partition_column: the column (naive UTC) whose values the asset's partitions' time windows are ranges of.
        arrival_column: when a row reached the source.
        watermark_key, lookback_key: the settings file's keys for the watermark column and the lookback hours.
        (the other attributes: :class:`IncrementalLoadDiagnoser`)
    """

    source_table: str
    target_table: str
    key_column: str
    partition_column: str
    arrival_column: str
    watermark_key: str = "watermark_column"
    lookback_key: str = "lookback_hours"

    def _shape(self, context: dg.OpExecutionContext, loads_meta: Mapping[str, Mapping]) -> LoadShape:
        latest = max(loads_meta.values(), key=lambda m: m["timestamp"])
        return LoadShape(source_table=self.source_table, target_table=self.target_table, merge_key=self.key_column,
                         partition_column=self.partition_column, watermark_column=latest["watermark_column"],
                         arrival_column=self.arrival_column)

    def _propose(self, context: dg.OpExecutionContext, incident: Incident, diagnosis: Diagnosis, finding,
                 br: BlastRadius, shape) -> ChangeSet:
        domain = resolve_domains(self.domains_file).for_asset(self.target_asset.path)
        return propose_watermark_fix(
            incident=incident, diagnosis=diagnosis, finding=finding, domain=domain,
            pipeline_root=self.pipeline_root(), pipeline_file=self.pipeline_file, partitions_def=self._partitions(context),
            rebuild_assets=[m.asset_key for m in br.models if m.asset_key], verify_checks=self.verify_checks,
            dbt_test=self.dbt_test, watermark_key=self.watermark_key, lookback_key=self.lookback_key,
            undo=UndoPlan(resource_key=self.target_resource_key, table=shape.target_table,
                          partition_column=shape.partition_column, window=[]))
