"""The diagnosis job: one op that explains an incident and proposes a change set.

The op takes the incident as typed config (the incident sensor fills it in), calls a
*diagnoser*, and records what it returns as ``AssetObservation``\\ s on the incident's asset:
``dw/diagnosis`` (causes, evidence with the SQL run and the values seen, blast radius) and, when a
fix can be proposed, ``dw/change_set``.

:class:`IncrementalLoadDiagnoser` is the diagnoser for assets loaded by
:func:`dw_dagster.loads.load_partition`: it tests the late-rows-behind-the-watermark cause,
maps the blast radius through the dbt manifest, and proposes the watermark fix.
"""


import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from pydantic import Field

from dw_dagster import constants as c
from dw_dagster.diagnosis.watermark import PartitionLoad, diagnose_late_rows
from dw_dagster.domains import load_domains
from dw_dagster.lineage import blast_radius, load_manifest, manifest_graph, source_for_asset_key
from dw_dagster.loads import IncrementalLoadSpec
from dw_dagster.models import BlastRadius, ChangeSet, Diagnosis, Incident, stable_hash, utcnow
from dw_dagster.remediation import records
from dw_dagster.remediation.proposals import DbtCountTest, ProposalError, change_set_markdown, propose_watermark_fix

DIAGNOSIS_JOB_NAME = "dw_diagnose_incident"

Diagnoser = Callable[[dg.OpExecutionContext, Incident], tuple[Diagnosis, ChangeSet | None]]


class IncidentConfig(dg.Config):
    incident_json: str = Field(description="the Incident record (JSON), as the incident sensor wrote it")


def diagnosis_markdown(d: Diagnosis) -> str:
    """A diagnosis as markdown for the asset page."""
    lines = [f"### Diagnosis {d.id} for incident {d.incident_id}",
             f"Gap {d.gap_rows} rows; unexplained {d.unexplained_rows} rows.", ""]
    for cause in d.causes:
        lines += [f"**{cause.kind}** (confidence {cause.confidence:.0%}): {cause.summary}", ""]
        for ev in cause.evidence:
            lines += [f"- {ev.description} ({ev.database})", "  ```sql", "  " + ev.sql.replace("\n", "\n  "), "  ```"]
    br = d.blast_radius
    lines += ["", "**Blast radius**", f"- models: {', '.join(m.name for m in br.models) or 'none'}",
              f"- tests: {len(br.tests)}",
              f"- exposures: " + (", ".join(f"{e.label or e.name} ({e.type}, owner {e.owner_name} <{e.owner_email}>)" for e in br.exposures) or "none"),
              f"- owners: {', '.join(br.owners) or 'none'}"]
    return "\n".join(lines)


def build_diagnosis_job(
    *, diagnoser: Diagnoser, name: str = DIAGNOSIS_JOB_NAME, required_resource_keys: Sequence[str] = ()
) -> dg.JobDefinition:
    """A job with one op (``dw_diagnose``) that runs ``diagnoser`` on the incident in its config.

    Args:
        diagnoser: ``(context, incident) -> (Diagnosis, ChangeSet | None)``.
        name: the job name the incident sensor launches.
        required_resource_keys: resources the diagnoser reads from ``context.resources``.
    """

    @dg.op(name="dw_diagnose", required_resource_keys=set(required_resource_keys), tags={"kind": "dw"})
    def _diagnose(context: dg.OpExecutionContext, config: IncidentConfig) -> None:
        incident = Incident.model_validate_json(config.incident_json)
        diagnosis, cs = diagnoser(context, incident)
        key = dg.AssetKey(incident.asset_key)
        primary = diagnosis.primary
        context.log_event(dg.AssetObservation(
            asset_key=key,
            description=f"diagnosis {diagnosis.id}: {primary.kind if primary else 'no cause found'}",
            metadata={c.DIAGNOSIS_KEY: dg.MetadataValue.json(diagnosis.model_dump(mode="json")),
                      c.DIAGNOSIS_MD_KEY: dg.MetadataValue.md(diagnosis_markdown(diagnosis)),
                      c.INCIDENT_ID_KEY: incident.id},
        ))
        if cs is not None:
            context.log_event(dg.AssetObservation(
                asset_key=dg.AssetKey(cs.target_asset),
                description=f"change set {cs.id} proposed; waiting for approval by {', '.join(cs.approvers)}",
                metadata={c.CHANGE_SET_KEY: dg.MetadataValue.json(cs.model_dump(mode="json")),
                          c.CHANGE_SET_MD_KEY: dg.MetadataValue.md(change_set_markdown(cs)),
                          c.CHANGE_SET_ID_KEY: cs.id},
            ))
            context.log.info(f"Proposed change set {cs.id}: {cs.summary}")

    @dg.job(name=name, tags={"dw/kind": "diagnosis"}, description="Diagnose a dw_dagster incident and propose a change set.")
    def _job():
        _diagnose()

    return _job


def _naive(v) -> dt.datetime | None:
    if v is None:
        return None
    t = dt.datetime.fromisoformat(v) if isinstance(v, str) else v
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo else t


@dataclass
class IncrementalLoadDiagnoser:
    """Diagnoses incidents on an asset loaded by :func:`dw_dagster.loads.load_partition`.

    Attributes:
        target_asset: the loaded asset.
        source_resource_key, target_resource_key: ``DatabaseResource`` keys of source and warehouse.
        pipeline_root: the pipeline repository working copy; ``pipeline_file`` is relative to it.
        manifest_path: a callable returning the dbt ``manifest.json`` path (read at diagnosis time).
        partitions_def: the asset's daily partitions.
        domains_file: the domains YAML (approvers, caps).
        dbt_asset_keys: dbt unique id → Dagster asset key path, for the rebuild.
        verify_checks: ``[*asset key, check name]`` of the checks that prove a repair.
        group_by: breakdown columns for the evidence (e.g. ``["store_id"]``).
        dbt_test: the regression test to propose.
    """

    target_asset: dg.AssetKey
    source_resource_key: str
    target_resource_key: str
    pipeline_root: Callable[[], Path]
    pipeline_file: str
    manifest_path: Callable[[], Path]
    partitions_def: dg.TimeWindowPartitionsDefinition
    domains_file: Callable[[], Path]
    dbt_asset_keys: Mapping[str, Sequence[str]]
    verify_checks: Sequence[Sequence[str]]
    group_by: Sequence[str] = ()
    dbt_test: DbtCountTest | None = None
    extra: dict = field(default_factory=dict)

    def __call__(self, context: dg.OpExecutionContext, incident: Incident) -> tuple[Diagnosis, ChangeSet | None]:
        spec = IncrementalLoadSpec.from_file(self.pipeline_root() / self.pipeline_file)
        source = getattr(context.resources, self.source_resource_key).get_database()
        target = getattr(context.resources, self.target_resource_key).get_database()
        loads_meta = records.latest_loads(context.instance, self.target_asset)
        if not loads_meta:
            raise dg.Failure(description=f"no recorded loads of {self.target_asset.to_user_string()}; nothing to diagnose")
        latest = max(loads_meta.values(), key=lambda m: m["timestamp"])
        hwm = _naive(latest.get("watermark_low"))
        loads = [PartitionLoad(pk, _naive(m["partition_start"]), _naive(m["partition_end"]),
                               _naive(m.get("source_snapshot_ts")), m.get("run_id")) for pk, m in sorted(loads_meta.items())]
        causes = []
        if hwm is not None and spec.arrival_column:
            causes.append(diagnose_late_rows(
                source, target, source_table=spec.source_table, target_table=spec.target_table, key_column=spec.merge_key,
                partition_column=spec.partition_column, watermark_column=spec.watermark_column,
                arrival_column=spec.arrival_column, loads=loads, high_watermark=hwm,
                gap_rows=incident.gap_rows, group_by=self.group_by))
        graph = manifest_graph(load_manifest(self.manifest_path()))
        src = source_for_asset_key(graph, self.target_asset.path)
        br = blast_radius(graph, [src], {u: list(k) for u, k in self.dbt_asset_keys.items()}) if src else BlastRadius(root="(none)")
        explained = max((f.explained_rows for f in causes), default=0)
        diagnosis = Diagnosis(
            id="dg-" + stable_hash([incident.id, [f.model_dump(mode="json", exclude={"evidence"}) for f in causes]], 10),
            incident_id=incident.id, asset_key=list(self.target_asset.path), created_at=utcnow(), causes=causes,
            blast_radius=br, gap_rows=incident.gap_rows, unexplained_rows=max(0, incident.gap_rows - explained),
        )
        primary = diagnosis.primary
        if primary is None or primary.explained_rows == 0:
            context.log.warning("No cause explains the gap; reporting it as unexplained, proposing nothing.")
            return diagnosis, None
        domain = load_domains(self.domains_file()).for_asset(self.target_asset.path)
        try:
            cs = propose_watermark_fix(
                incident=incident, diagnosis=diagnosis, finding=primary, domain=domain,
                pipeline_root=self.pipeline_root(), pipeline_file=self.pipeline_file, partitions_def=self.partitions_def,
                rebuild_assets=[m.asset_key for m in br.models if m.asset_key], verify_checks=self.verify_checks,
                dbt_test=self.dbt_test)
        except ProposalError as e:
            context.log.warning(f"Diagnosed, but no change set could be proposed: {e}")
            return diagnosis, None
        return diagnosis, cs
