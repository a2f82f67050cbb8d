"""Diagnosis and proposal for a dead-letter sink: NULLs in a REQUIRED column, parked in the dead-letter table.

:class:`DeadLetterDiagnoser` diagnoses incidents on the target of a sink described by a
:class:`~dw_dagster.pipelines.sink.SinkTable` (a stream that parks the rows the target's schema
rejects). For an incident (the volume check's low day, or the dead-letter check's growth) it:

1. takes the window from the incident, else from the volume check's failing days (the whole
   table when none failed);
2. runs :func:`~dw_dagster.diagnosis.causes.dead_letter.diagnose_required_nulls` (PUBLIC_CASES C19):
   source keys missing from the target, their NULLs in the target's REQUIRED columns (read from
   the target's catalog), their dead-letter records and reasons;
3. adds the evidence a person asks next: the column's mode in the target's schema (``REQUIRED``),
   and **the source change** — which rows started carrying the NULL and since when, grouped by a
   source column (e.g. one payment method from a release on, none before);
4. maps the blast radius through the dbt manifest (models, tests, exposures and their owners);
5. proposes one change set (:func:`propose_required_null_fix`): relax the column to NULLABLE with
   its rollback (:func:`~dw_dagster.changes.migrations.generate_migration`), replay the parked rows
   guarded on the key with the expected row count (:mod:`dw_dagster.changes.replay`),
   rebuild the downstream models, verify, receipt.
"""

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import dagster as dg

from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.databases import sql
from dw_dagster.databases import Database
from dw_dagster.databases.snippets import to_dialect
from dw_dagster.diagnosis.causes.dead_letter import KIND as REQUIRED_NULL_KIND
from dw_dagster.diagnosis.causes.dead_letter import DeadLetterTable, diagnose_required_nulls
from dw_dagster.diagnosis.history import attach_history
from dw_dagster.diagnosis.mage_evidence import MageSource, apply_mage_evidence, read_mage_evidence
from dw_dagster.diagnosis.job import dbt_blast_radius
from dw_dagster.core.domains import (ADD_TEST, REBUILD_MODELS, REPLAY_DEAD_LETTER, SCHEMA_MIGRATION, Domain, DomainsSource,
                                     resolve_domains)
from dw_dagster.changes.replay import ReplaySpec, classify, replay_step
from dw_dagster.pipelines.sink import MISSING_REQUIRED, SinkTable
from dw_dagster.lineage import blast_radius, load_manifest, manifest_graph, source_for_asset_key
from dw_dagster.changes.migrations import generate_migration
from dw_dagster.changes.migrations import SetNullability
from dw_dagster.databases.catalog import read_table_schema
from dw_dagster.core.models import (BlastRadius, CauseFinding, ChangeSet, Diagnosis, Evidence, FileChange, Incident, stable_hash,
                                    utcnow)
from dw_dagster.changes.manual_steps import MAGE_RERUN_CHECK, mage_rerun_step
from dw_dagster.changes.steps import migration_step, step_stage, steps_markdown

LOW_STATUSES = ("low", "no_rows")
#: metadata key of the change set's steps as markdown (next to dw/change_set_md)
STEPS_MD_KEY = c.STEPS_MD_KEY


def _naive(t: dt.datetime) -> dt.datetime:
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo else t


def volume_window(instance: dg.DagsterInstance, check_key: dg.AssetCheckKey) -> tuple[dt.datetime, dt.datetime] | None:
    """The days the latest evaluation of a volume check scored low (or with no rows), as a half-open
    naive-UTC window ``[first day, last day + 1)``; None when it found none."""
    from dw_dagster.core.check_results import latest_run_evaluation

    rec = latest_run_evaluation(instance, check_key).latest  # a run's evaluation: one reported without a run is a claim
    if rec is None or rec.event is None:
        return None
    md = rec.event.dagster_event.event_specific_data.metadata or {}
    days = getattr(md.get(c.DAYS_JSON_KEY), "value", None) or []
    low = sorted(dt.date.fromisoformat(d["day"]) for d in days if d.get("status") in LOW_STATUSES)
    if not low:
        return None
    return dt.datetime.combine(low[0], dt.time()), dt.datetime.combine(low[-1] + dt.timedelta(days=1), dt.time())


def column_modes(db: Database, table: str, columns: Sequence[str]) -> Evidence:
    """The mode (REQUIRED / NULLABLE) and type of ``columns`` in ``table``'s catalog, as evidence.

    DuckDB and Snowflake: ``information_schema.columns``; BigQuery: the tables API
    (:func:`~dw_dagster.changes.migrations.read_table_schema`).
    """
    schema = read_table_schema(db, table)
    wanted = {x.lower() for x in columns}
    values = {col.name: {"type": col.type, "mode": "NULLABLE" if col.nullable else "REQUIRED"}
              for col in schema.columns if col.name.lower() in wanted}
    if db.dialect == "bigquery":
        how = f"tables.get({table}).schema -- the BigQuery tables API (INFORMATION_SCHEMA may lag a schema change)"
    else:
        parts = sql.table_parts(table)
        how = sql.render("SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                         "WHERE table_schema = :s AND table_name = :t ORDER BY ordinal_position", db.dialect,
                         s=parts[-2], t=parts[-1])
    return Evidence(description=f"the mode of {', '.join(columns)} in {table}'s schema (target catalog)",
                    database=db.name, sql=how, values=values)


def source_change(db: Database, table: str, column: str, group_column: str, partition_column: str,
                  window: tuple[dt.datetime, dt.datetime] | None) -> tuple[dict, Evidence]:
    """Which source rows started carrying NULL in ``column``, and since when.

    Returns ``(details, evidence)``: per ``group_column`` value, the rows with ``column`` NULL in
    ``window`` (count, first and last ``partition_column``), the same value's rows that still
    carried ``column`` in the window before the first NULL, and the NULLs before the window.
    """
    col, grp, ts = (sql.identifier(x).sql("duckdb") for x in (column, group_column, partition_column))
    src = sql.table(table).sql("duckdb")
    lo = sql.literal(window[0]).sql("duckdb") if window else None
    hi = sql.literal(window[1]).sql("duckdb") if window else None
    in_window = f"{ts} >= {lo} AND {ts} < {hi}" if window else "1 = 1"
    q_nulls = (f"SELECT {grp}, COUNT(*), MIN({ts}), MAX({ts}) FROM {src} WHERE {col} IS NULL AND {in_window} "
               f"GROUP BY {grp} ORDER BY 2 DESC, 1")
    rows = db.fetch_all(to_dialect(q_nulls, db.dialect))
    groups = [{"value": r[0], "rows": int(r[1]), "first": r[2].isoformat(sep=" ") if r[2] else None,
               "last": r[3].isoformat(sep=" ") if r[3] else None} for r in rows]
    queries = [q_nulls]
    before_window = 0
    if window:
        q_before = f"SELECT COUNT(*) FROM {src} WHERE {col} IS NULL AND {ts} < {lo}"
        before_window = int(db.fetch_all(to_dialect(q_before, db.dialect))[0][0] or 0)
        queries.append(q_before)
    for g in groups[:3]:
        if g["first"] is None:
            continue
        first = sql.literal(dt.datetime.fromisoformat(g["first"])).sql("duckdb")
        start = lo or "(SELECT MIN(" + ts + ") FROM " + src + ")"
        q_prior = (f"SELECT COUNT(*), MAX({ts}) FROM {src} WHERE {grp} = {sql.literal(g['value']).sql('duckdb')} "
                   f"AND {col} IS NOT NULL AND {ts} >= {start} AND {ts} < {first}")
        n, last = db.fetch_all(to_dialect(q_prior, db.dialect))[0]
        g["carried_before_first_null"] = int(n or 0)
        g["last_carried"] = last.isoformat(sep=" ") if last else None
        queries.append(q_prior)
    details = {"column": column, "group_column": group_column, "groups": groups, "nulls_before_window": before_window}
    ev = Evidence(description=f"source rows with {column} NULL by {group_column} (count, first, last {partition_column}), "
                  f"rows of the same {group_column} that still carried it before the first NULL, and NULLs before the window",
                  database=db.name, sql=";\n".join(queries), values=details)
    return details, ev


def source_change_sentence(details: dict) -> str:
    """One sentence naming the source change, e.g. "every gift_card order since 2026-11-24 09:00:05 ..."."""
    groups = details.get("groups") or []
    if not groups:
        return f"no source row has {details.get('column')} NULL"
    g = groups[0]
    others = sum(x["rows"] for x in groups[1:])
    s = (f"the source changed: {details['group_column']} = {g['value']!r} rows have {details['column']} NULL from "
         f"{g['first']} on ({g['rows']:,} rows, to {g['last']})")
    if g.get("carried_before_first_null") is not None:
        s += (f", while the {g['carried_before_first_null']:,} {g['value']!r} rows before it carried it"
              + (f" (last at {g['last_carried']})" if g.get("last_carried") else ""))
    s += f"; {details.get('nulls_before_window', 0)} NULLs before that day"
    if others:
        s += f"; {others} NULL rows of other {details['group_column']} values"
    return s


@dataclasses.dataclass
class DeadLetterDiagnoser:
    """The diagnoser of a dead-letter sink's target (module docstring): ``(context, incident) -> (Diagnosis, ChangeSet | None)``.

    Attributes:
        target_asset: the sink's asset.
        sink_table: the target, dead-letter table, key and columns; or a callable that reads
            them from the target database when the incident is diagnosed.
        source_table: the source table (``schema.table``) in the source resource's database.
        source_resource_key, target_resource_key: resources with ``get_database()``.
        partition_column: the day column of the volume check and the evidence (``order_ts``).
        group_column: the source column the NULLs are broken down by (``payment_method``).
        volume_check: its failing days give the window.
        manifest_path: returns the dbt ``manifest.json`` path; None when the project has no dbt (empty blast radius).
        dbt_asset_keys: dbt unique id → Dagster asset key path.
        domains_file: the domains (any :data:`~dw_dagster.core.domains.DomainsSource`: a file path, a
            callable returning one, or the model), read when a proposal is made.
        verify_checks: ``[*asset key, check name]`` of the checks that prove the repair.
        mage: the Mage pipelines that write and read the target (their runs in the window are
            evidence; the readers are reruns the change set names); None without Mage.
        tests_dir, pipeline_root: where the fix's new test goes (a folder of the pipeline
            repository); None adds no test (then the change set has no diff).
    """

    target_asset: dg.AssetKey
    sink_table: SinkTable | Callable[[Database], SinkTable]
    source_table: str
    source_resource_key: str
    target_resource_key: str
    partition_column: str
    group_column: str
    volume_check: dg.AssetCheckKey
    manifest_path: Callable[[], Path] | None
    dbt_asset_keys: Mapping[str, Sequence[str]]
    domains_file: DomainsSource
    verify_checks: Sequence[Sequence[str]]
    history: bool = True
    mage: MageSource | None = None
    tests_dir: str | None = None
    pipeline_root: Callable[[], Path] | None = None

    def table(self, target: Database) -> SinkTable:
        """The sink's tables and columns (read from ``target`` when given as a callable)."""
        return self.sink_table if isinstance(self.sink_table, SinkTable) else self.sink_table(target)

    def diagnose(self, instance: dg.DagsterInstance, source: Database, target: Database,
                 incident: Incident, mage_client=None) -> tuple[Diagnosis, CauseFinding]:
        """The diagnosis and its finding (no proposal).

        ``mage_client`` (a :class:`~dw_dagster.integrations.mage.MageClient` or a function returning
        one) reads the runs of :attr:`mage`'s pipelines in the window; Mage unreachable is evidence,
        never an error."""
        t = self.table(target)
        if incident.window_start is not None and incident.window_end is not None:
            window = (_naive(incident.window_start), _naive(incident.window_end))
        else:
            window = volume_window(instance, self.volume_check)
        finding = diagnose_required_nulls(
            source, target, source_table=self.source_table, target_table=t.table, key_columns=[t.key],
            dead_letter=DeadLetterTable(t.dead_letter_table, [t.key], payload_column="payload", error_column="error_reason",
                                        timestamp_column="failed_at"),
            partition_column=self.partition_column, window=window)
        evidence = list(finding.evidence)
        details = dict(finding.details)
        null_cols = [col for col, n in details.get("nulls_per_column", {}).items() if n]
        summary = finding.summary
        if null_cols:
            modes = column_modes(target, t.table, null_cols)
            evidence.append(modes)
            details["column_modes"] = modes.values
            change, ev = source_change(source, self.source_table, null_cols[0], self.group_column,
                                       self.partition_column, window)
            evidence.append(ev)
            details["source_change"] = change
            sentence = source_change_sentence(change)
            summary += (" " + "; ".join(f"{col} is {m['mode']} in {t.table}'s schema" for col, m in modes.values.items())
                        + ". " + sentence[0].upper() + sentence[1:] + ".")
        finding = finding.model_copy(update={"summary": summary, "details": details, "evidence": evidence})
        if self.history:
            finding = attach_history(finding, instance, self.target_asset, incident.id)
        # the id hashes what the warehouse says: Mage's runs in progress move between two reads
        diagnosis_id = "dg-" + stable_hash([incident.id, finding.model_dump(mode="json", exclude={"evidence"})], 10)
        if self.mage is not None and mage_client is not None:
            mage_window = window or (_naive(incident.detected_at) - dt.timedelta(hours=24), _naive(incident.detected_at))
            finding = apply_mage_evidence(finding, read_mage_evidence(mage_client, self.mage, mage_window))
        br = dbt_blast_radius(self.manifest_path, self.target_asset, self.dbt_asset_keys)
        diagnosis = Diagnosis(
            id=diagnosis_id,
            incident_id=incident.id, asset_key=list(self.target_asset.path), created_at=utcnow(), causes=[finding],
            blast_radius=br, gap_rows=finding.explained_rows + finding.unexplained_rows,
            unexplained_rows=finding.unexplained_rows)
        return diagnosis, finding

    def __call__(self, context: dg.OpExecutionContext, incident: Incident) -> tuple[Diagnosis, ChangeSet | None]:
        source = getattr(context.resources, self.source_resource_key).get_database()
        target = getattr(context.resources, self.target_resource_key).get_database()
        mage = getattr(context.resources, self.mage.resource_key, None) if self.mage is not None else None
        diagnosis, finding = self.diagnose(context.instance, source, target, incident,
                                           mage_client=mage.get_client if mage is not None else None)
        if finding.kind != REQUIRED_NULL_KIND or finding.explained_rows == 0 or not finding.details.get("null_rows_dead_lettered"):
            context.log.warning(f"No parked rows explain the incident ({finding.summary[:200]}); proposing nothing.")
            return diagnosis, None
        domain = resolve_domains(self.domains_file).for_asset(self.target_asset.path)
        cs = propose_required_null_fix(
            incident=incident, diagnosis=diagnosis, finding=finding, domain=domain, target=target,
            sink_table=self.table(target), resource_key=self.target_resource_key,
            rebuild_assets=[m.asset_key for m in diagnosis.blast_radius.models if m.asset_key],
            verify_checks=self.verify_checks, mage_reruns=self.mage.reads if mage is not None else (),
            mage_ui_url=_ui_url(mage), tests_dir=self.tests_dir,
            pipeline_root=self.pipeline_root() if self.pipeline_root is not None else None)
        if domain.proposes:  # the steps' SQL on the asset page, beside the change set (which shows its diff)
            context.log_event(dg.AssetObservation(
                asset_key=dg.AssetKey(cs.target_asset), description=describe(f"change set {cs.id}: its steps (migration, replay)", change_set_id=cs.id),
                metadata={STEPS_MD_KEY: dg.MetadataValue.md(steps_markdown(cs)), c.CHANGE_SET_ID_KEY: cs.id}))
        return diagnosis, cs


def _ui_url(mage) -> str | None:
    """The Mage UI's base URL for the rerun's link (no request is made), or None when not configured."""
    if mage is None:
        return None
    try:
        return mage.get_client().ui_url
    except Exception:  # noqa: BLE001 - a missing URL only leaves the link out
        return None


def propose_required_null_fix(
    *,
    incident: Incident,
    diagnosis: Diagnosis,
    finding: CauseFinding,
    domain: Domain,
    target: Database,
    sink_table: SinkTable,
    resource_key: str = "warehouse",
    rebuild_assets: Sequence[Sequence[str]] = (),
    verify_checks: Sequence[Sequence[str]] = (),
    proposer: str = c.PROPOSER,
    now: dt.datetime | None = None,
    mage_reruns: Sequence[str] = (),
    mage_ui_url: str | None = None,
    tests_dir: str | None = None,
    pipeline_root: Path | None = None,
) -> ChangeSet:
    """One change set for a ``required_null_dead_letter`` finding: relax, replay, rebuild.

    Steps, in order: one ``migration`` per column that received NULLs (``SetNullability(...,
    nullable=True)`` for the target's dialect, read against its current schema: forward
    ``DROP NOT NULL``, rollback re-imposing it — refused while NULLs exist; on BigQuery a rebuild),
    then one ``replay`` of the rows parked with those columns' "missing required field" reasons up
    to now, with the number of rows it must insert (counted now, as the rows neither in the target
    nor replayed before). Then the rebuild of ``rebuild_assets``, the ``verify_checks``, the receipt.
    Each of ``mage_reruns`` (Mage pipelines that read the target downstream) becomes a manual step
    for the engineer after the data steps (:func:`~dw_dagster.changes.manual_steps.mage_rerun_step`,
    with the ``mage-agent`` call and the link under ``mage_ui_url``); the verify stage waits for it.

    With ``tests_dir`` (a folder of the pipeline repository ``pipeline_root``), the change set also
    adds the test that would have caught it: no parked row that is neither in the target nor
    replayed (:func:`~dw_dagster.proposals.regression_tests.dead_letter_outstanding_test`), a file
    of its diff, run in the verify stage by the ``dw_new_tests`` check.

    Raises:
        ValueError: the finding names no REQUIRED column that received NULLs.
        dw_dagster.changes.migrations.MigrationError: the target's schema does not fit the migration.
    """
    now = now or utcnow()
    t = sink_table
    null_cols = [col for col, n in finding.details.get("nulls_per_column", {}).items() if n]
    if not null_cols:
        raise ValueError("the finding names no REQUIRED column that received NULLs")
    schema = read_table_schema(target, t.table)
    migrations = [generate_migration(SetNullability(table=t.table, column=col, nullable=True), target.dialect,
                                     current_schema=schema) for col in null_cols]
    reasons = [MISSING_REQUIRED.format(column=col) for col in null_cols]
    errors = [e["error"] for e in finding.details.get("dead_letter", {}).get("errors", [])]
    reasons = [r for r in reasons if r in errors] or reasons
    required_after = [col.name for col in schema.columns if not col.nullable and col.name not in null_cols]
    spec = ReplaySpec.for_sink_table(t, expected_rows=0, reasons=reasons, parked_until=_naive(now))
    counts = classify(target, spec, "cs-proposal", required_columns=required_after)
    spec = spec.model_copy(update={"expected_rows": counts.new})
    cs_id = "cs-" + stable_hash([incident.id, [m.forward for m in migrations], spec.model_dump(mode="json")], 10)
    steps = [migration_step(m, resource_key=resource_key,
                            summary=f"{m.summary} (the sink validates against the target's schema, so it accepts the "
                            f"column's NULLs from then on)") for m in migrations]
    steps.append(replay_step(spec, resource_key=resource_key, change_set_id=cs_id, dialect=target.dialect,
                             required_columns=required_after))
    parked = finding.details.get("null_rows_dead_lettered", 0) + finding.details.get("other_rows_dead_lettered", 0)
    mode = "REQUIRED" if target.dialect == "bigquery" else "NOT NULL"
    relaxed = ", ".join(f"{t.table}.{col}" for col in null_cols)
    summary = (f"Relax {relaxed} from {mode} to {'NULLABLE' if target.dialect == 'bigquery' else 'nullable'} (rollback "
               f"re-imposes it, refused while NULLs exist), replay {counts.new:,} parked row(s) from {t.dead_letter_table} "
               f"guarded on {t.key}, rebuild {len(rebuild_assets)} downstream model(s)")
    if counts.new != parked:
        summary += f" (the diagnosis counted {parked:,} parked missing row(s) in its window)"
    undo_lines = [
        "Undo in reverse order, each through its own approval:",
        f"1. delete the replayed rows (keys from the ledger {spec.ledger_table}):",
        *[f"   {s};" for s in steps[-1].rollback_sql],
        f"2. roll the migration back (refused while {', '.join(null_cols)} holds NULLs: fix them upstream first):",
        *[f"   {s};" for m in migrations for s in m.rollback],
        "3. rebuild " + (", ".join("/".join(k) for k in rebuild_assets) or "nothing") + ".",
    ]
    diff, files, new_tests, checks = "", [], [], [list(k) for k in verify_checks]
    if tests_dir is not None:
        from dw_dagster.proposals.regression_tests import dead_letter_outstanding_test
        from dw_dagster.proposals.watermark import _sha, unified_diff

        test = dead_letter_outstanding_test(t.dead_letter_table, t.key, t.table, "error_reason", target.dialect,
                                            ledger_table=spec.ledger_table, tests_dir=tests_dir)
        if pipeline_root is None or not (Path(pipeline_root) / test.path).exists():
            text = test.file_text(cs_id)
            diff, new_tests = unified_diff({test.path: (None, text)}), [test.path]
            files = [FileChange(path=test.path, before_sha256=None, after_sha256=_sha(text))]
            checks += [[*incident.asset_key, c.NEW_TESTS_CHECK]]
            summary += f"; add the test {test.name}"
    content = dict(
        id=cs_id, incident_id=incident.id, diagnosis_id=diagnosis.id, domain=domain.name, proposer=proposer,
        created_at=now, expires_at=now + dt.timedelta(hours=domain.approval_expiry_hours),
        approvers=list(domain.approvers), cause_kind=finding.kind, summary=summary,
        target_asset=list(incident.asset_key), window=[], diff=diff, files=files, new_tests=new_tests,
        rebuild_assets=[list(k) for k in rebuild_assets], verify_checks=checks,
        expected_recovered_rows=counts.new, undo="\n".join(undo_lines),
        change_classes=[SCHEMA_MIGRATION, REPLAY_DEAD_LETTER] + ([REBUILD_MODELS] if rebuild_assets else [])
        + ([ADD_TEST] if new_tests else []),
        steps=steps,
        manual_steps=[mage_rerun_step(pipeline, [step_stage(i, st) for i, st in enumerate(steps)], ui_url=mage_ui_url,
                                      check=[*incident.asset_key, MAGE_RERUN_CHECK]) for pipeline in mage_reruns],
    )
    return ChangeSet.seal(**content)


__all__ = ["DeadLetterDiagnoser", "column_modes", "propose_required_null_fix", "source_change", "source_change_sentence",
           "volume_window"]
