"""Change sets for the causes the watermark fix does not cover, each with the test that would have caught it.

- :func:`propose_upstream_fix` (*upstream failed or stale*): rerun the upstream assets' failed or
  missing partitions, then the same window of every asset that reads them, level by level in
  dependency order (one bounded window stage per level, ``asset_levels``), capped by the domain;
  adds a test that each day of the upstream table has as many rows in the target.
- :func:`propose_duplicate_fix` (*duplicated load*): replace the duplicated partitions in place
  (a ``dedupe`` step, :mod:`dw_dagster.changes.dedupe`: rows after = distinct keys before), the
  window kept first for undo; adds a uniqueness test on the merge key.
- :func:`propose_schema_fix` (*schema change*): the migration :func:`~dw_dagster.changes.migrations.generate_migration`
  writes (forward and rollback) that lets the target take the changed upstream again; adds a
  schema contract test of the target's columns.

Each returns a sealed :class:`~dw_dagster.core.models.ChangeSet` that goes through the same
proposal → approval → guarded repair → verification → receipt path as the watermark fix; the
new test is a file of its diff (merged by the owner), runs in the verify stage
(:func:`dw_dagster.repair.new_tests.build_new_tests_check`) and is named in the receipt. Where no
safe fix exists they raise :class:`~dw_dagster.proposals.watermark.ProposalError` with what a
person must do.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.domains import ADD_TEST, REBUILD_MODELS, RERUN_WINDOW, SCHEMA_MIGRATION, Domain
from dw_dagster.core.models import CauseFinding, ChangeSet, Diagnosis, FileChange, Incident, UndoPlan, stable_hash, utcnow
from dw_dagster.core.windows import split_window
from dw_dagster.databases import Database
from dw_dagster.databases.catalog import read_table_schema
from dw_dagster.proposals.regression_tests import (DEFAULT_TESTS_DIR, RegressionTest, duplicate_keys_test,
                                                   schema_contract_test, upstream_landed_test)
from dw_dagster.proposals.watermark import ProposalError, partition_notes, unified_diff
from dw_dagster.changes.dedupe import dedupe_step

UPSTREAM_KIND = "upstream_not_refreshed_or_failed"
DUPLICATE_KIND = "duplicate_load"
SCHEMA_KIND = "schema_change"
FIXED_KINDS = (UPSTREAM_KIND, DUPLICATE_KIND, SCHEMA_KIND)


@dataclass
class FixContext:
    """What every proposal needs besides its finding.

    Attributes:
        incident, diagnosis: what was found; domain: the owning domain (approvers, cap, expiry).
        pipeline_root: the pipeline repository the diff (the new test) applies to.
        target_table, merge_key, partition_column: the repaired asset's table, key and partition column.
        resource_key: the warehouse ``DatabaseResource``; database: it, opened.
        partitions_def: the repaired asset's partitions (None: unpartitioned).
        rebuild_assets: the downstream models to rebuild after the data steps.
        verify_checks: ``[*asset key, check name]`` proving the repair (the new-tests check is added).
        tests_dir: where the new tests go in the pipeline repository.
    """

    incident: Incident
    diagnosis: Diagnosis
    domain: Domain
    pipeline_root: Path
    target_table: str
    merge_key: Sequence[str]
    partition_column: str
    resource_key: str
    database: Database
    partitions_def: dg.PartitionsDefinition | None
    rebuild_assets: Sequence[Sequence[str]] = ()
    verify_checks: Sequence[Sequence[str]] = ()
    tests_dir: str = DEFAULT_TESTS_DIR
    now: dt.datetime | None = None
    extra_verify: list[list[str]] = field(default_factory=list)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _seal(ctx: FixContext, finding: CauseFinding, *, summary: str, window: Sequence[str], tests: Sequence[RegressionTest],
          classes: Sequence[str], undo: str, **more) -> ChangeSet:
    now = ctx.now or utcnow()
    provisional = "cs-" + stable_hash([ctx.incident.id, finding.kind, list(window), [t.sql for t in tests],
                                       [s.model_dump(mode="json") for s in more.get("steps", [])]], 10)
    changes = {t.path: (None, t.file_text(provisional)) for t in tests if not (ctx.pipeline_root / t.path).exists()}
    target = list(ctx.incident.asset_key)
    checks = [list(k) for k in ctx.verify_checks]
    if changes and [*target, c.NEW_TESTS_CHECK] not in checks:
        checks.append([*target, c.NEW_TESTS_CHECK])
    names = sorted(changes)
    return ChangeSet.seal(
        id=provisional, incident_id=ctx.incident.id, diagnosis_id=ctx.diagnosis.id, domain=ctx.domain.name,
        proposer=c.PROPOSER, created_at=now, expires_at=now + dt.timedelta(hours=ctx.domain.approval_expiry_hours),
        approvers=list(ctx.domain.approvers), cause_kind=finding.kind,
        summary=summary + (f"; add the test {', '.join(n.rsplit('/', 1)[-1] for n in names)}" if names else ""),
        target_asset=target, window=sorted(window), diff=unified_diff(changes),
        files=[FileChange(path=p, before_sha256=None, after_sha256=_sha(a)) for p, (_, a) in sorted(changes.items())],
        rebuild_assets=[list(k) for k in ctx.rebuild_assets], new_tests=names, verify_checks=checks,
        change_classes=[*classes, *([ADD_TEST] if names else []), *([REBUILD_MODELS] if ctx.rebuild_assets else [])],
        undo=undo, **more)


def _window(ctx: FixContext, finding: CauseFinding, wanted: Sequence[str], what: str):
    if ctx.partitions_def is None:
        raise ProposalError(f"{'/'.join(ctx.incident.asset_key)} is not partitioned: {what} needs partitions to bound "
                            "the window; rerun it by hand (`dagster asset materialize`) once the cause is fixed")
    split = split_window(ctx.partitions_def, wanted, ctx.domain.max_window_partitions, now=ctx.now)
    if split.over:
        raise ProposalError(f"window of {len(split.window) + len(split.over)} partitions exceeds domain "
                            f"{ctx.domain.name!r} cap of {ctx.domain.max_window_partitions}; split the repair by hand")
    outside, deferred = partition_notes(split, finding)
    if not split.window:
        raise ProposalError(f"{what}: no partition to run now" + (
            ": " + "; ".join(n.words() for n in outside + deferred) if outside or deferred else ""))
    return split.window, outside, deferred


# -- upstream failed or stale ------------------------------------------------------------------------

def failed_run_partitions(instance: dg.DagsterInstance, finding: CauseFinding) -> list[str]:
    """The partitions the failed runs of the blamed upstream assets were for (their partition or range tags)."""
    ids = [r["run_id"] for i in finding.details.get("upstream", []) for r in i.get("failed_runs_since_last_success", [])]
    out: set[str] = set()
    for run in (instance.get_runs(filters=dg.RunsFilter(run_ids=ids)) if ids else []):
        tags = run.tags
        if tags.get("dagster/partition"):
            out.add(tags["dagster/partition"])
        elif tags.get("dagster/asset_partition_range_start"):
            out.update({tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]})
    return sorted(out)


def dependency_levels(graph, roots: Sequence[dg.AssetKey], target: dg.AssetKey) -> list[list[list[str]]]:
    """``roots``, then each materializable asset downstream of them that is partitioned like ``target``,
    by its longest distance from the roots (one level per distance); the target is always in a level."""
    pdef = graph.get(target).partitions_def
    depth: dict[dg.AssetKey, int] = {r: 0 for r in roots}
    frontier = list(roots)
    while frontier:
        nxt = []
        for k in frontier:
            for child in sorted(graph.get(k).child_keys, key=lambda x: x.to_user_string()):
                node = graph.get(child)
                if not node.is_materializable or node.partitions_def != pdef:
                    continue
                if depth.get(child, -1) < depth[k] + 1:
                    depth[child] = depth[k] + 1
                    nxt.append(child)
        frontier = nxt
    depth.setdefault(target, 1)
    levels: dict[int, list[list[str]]] = {}
    for k, d in depth.items():
        levels.setdefault(d, []).append(list(k.path))
    return [sorted(levels[d]) for d in sorted(levels)]


def propose_upstream_fix(ctx: FixContext, finding: CauseFinding, *, instance: dg.DagsterInstance, graph,
                         upstream_tables: Mapping[str, str] | None = None, stale_window: Sequence[str] = ()) -> ChangeSet:
    """The change set for an ``upstream_not_refreshed_or_failed`` finding (module docstring).

    Args:
        instance, graph: the Dagster instance (the failed runs' partitions) and the asset graph.
        upstream_tables: upstream asset key (``a/b``) → its warehouse table, for the new test.
        stale_window: the partitions to rerun when the upstream was only stale (the incident's window).

    Raises:
        ProposalError: no upstream is blamed, one is not partitioned like the asset, or the window
            is empty or over the cap (the message says what a person must do).
    """
    target = dg.AssetKey(ctx.incident.asset_key)
    blamed = [i for i in finding.details.get("upstream", []) if i.get("signals")]
    if not blamed:
        raise ProposalError("no upstream asset is blamed: nothing to rerun")
    roots = [dg.AssetKey.from_user_string(i["asset"]) for i in blamed]
    tpdef = graph.get(target).partitions_def
    other = [r.to_user_string() for r in roots if not graph.get(r).is_materializable or graph.get(r).partitions_def != tpdef]
    if other:
        raise ProposalError(f"upstream {', '.join(other)} is external or not partitioned like "
                            f"{target.to_user_string()}: refresh it at its source, then rerun {target.to_user_string()}'s "
                            "affected partitions by hand (no bounded window covers both)")
    wanted = sorted(set(finding.window) | set(failed_run_partitions(instance, finding))) or list(stale_window)
    window, outside, deferred = _window(ctx, finding, wanted, "the upstream rerun")
    levels = dependency_levels(graph, roots, target)
    tests = []
    for r in roots:
        table = (upstream_tables or {}).get(r.to_user_string())
        if table:
            tests.append(upstream_landed_test(ctx.target_table, table, ctx.partition_column, ctx.database.dialect,
                                              tests_dir=ctx.tests_dir))
    signals = sorted({s for i in blamed for s in i["signals"]})
    order = " → ".join("+".join("/".join(k) for k in lvl) for lvl in levels)
    return _seal(ctx, finding, tests=tests, window=window, classes=[RERUN_WINDOW],
                 summary=(f"Rerun {len(window)} partition(s) {window[0]}..{window[-1]} of upstream "
                          f"{', '.join(r.to_user_string() for r in roots)} ({', '.join(signals)}), then of what reads it, "
                          f"level by level: {order}"),
                 undo=("The reruns recompute the partitions from the upstream as it is now; to put the asset's "
                       f"partitions back, `dw-dagster change-sets undo` restores the kept window of {ctx.target_table}."),
                 asset_levels=levels, outside_partitions=outside, deferred_details=deferred,
                 deferred_partitions=[n.partition for n in deferred],
                 undo_plan=UndoPlan(resource_key=ctx.resource_key, table=ctx.target_table,
                                    partition_column=ctx.partition_column, window=list(window)))


# -- duplicated load ----------------------------------------------------------------------------------

def propose_duplicate_fix(ctx: FixContext, finding: CauseFinding) -> ChangeSet:
    """The change set for a ``duplicate_load`` finding: a ``dedupe`` step over the duplicated
    partitions, the window kept first (undo) and held, not rerun; the uniqueness test on the merge key.

    Raises:
        ProposalError: no duplicated partition, or over the cap.
    """
    if not finding.window or finding.explained_rows <= 0:
        raise ProposalError("the duplicate load names no partition with duplicated keys")
    window, outside, deferred = _window(ctx, finding, finding.window, "replacing the duplicated partitions")
    step = dedupe_step(table=ctx.target_table, key_columns=ctx.merge_key, partition_column=ctx.partition_column,
                       window=window, resource_key=ctx.resource_key, dialect=ctx.database.dialect,
                       expected_surplus=finding.explained_rows, partitions_def=ctx.partitions_def)
    test = duplicate_keys_test(ctx.target_table, ctx.merge_key, ctx.database.dialect, tests_dir=ctx.tests_dir)
    return _seal(ctx, finding, tests=[test], window=window, classes=[RERUN_WINDOW], steps=[step], hold_only=True,
                 summary=(f"Replace {len(window)} duplicated partition(s) {window[0]}..{window[-1]} of {ctx.target_table} "
                          f"by one row per {', '.join(ctx.merge_key)} ({finding.explained_rows} surplus row(s); guard: "
                          "rows after = distinct keys before)"),
                 undo=f"`dw-dagster change-sets undo` restores partitions {', '.join(window)} from the copy kept first.",
                 expected_recovered_rows=0, outside_partitions=outside, deferred_details=deferred,
                 deferred_partitions=[n.partition for n in deferred],
                 undo_plan=UndoPlan(resource_key=ctx.resource_key, table=ctx.target_table,
                                    partition_column=ctx.partition_column, window=list(window)))


# -- schema change ------------------------------------------------------------------------------------

def _migration_changes(ctx: FixContext, finding: CauseFinding) -> list:
    """The column changes that let the target take its changed upstream (or undo a tightening of its own)."""
    out, refused = [], []
    for entry in finding.details.get("changes", []):
        out += _changes_for_target(ctx, entry, refused=refused)
    if refused and not out:
        raise ProposalError("no safe migration for " + "; ".join(refused) + ": a person must decide (map the column in "
                            "the pipeline, or rename/retype the target with a reviewed migration)")
    if not out:
        raise ProposalError("the schema change needs no change of the target (it already takes the new schema)")
    return out


def _changes_for_target(ctx: FixContext, entry: dict, *, refused: list | None = None, reference: FixContext | None = None) -> list:
    """The column changes of ``reference``'s (default ``ctx``'s) target that one changed table of a finding needs."""
    from dw_dagster.changes.migrations.models import AddColumn, RetypeColumn, SetNullability

    refused = refused if refused is not None else []
    ref = reference or ctx
    current = {col.name.lower(): col for col in read_table_schema(ref.database, ref.target_table).columns}
    out = []
    own = entry["table"].lower() == ref.target_table.lower()
    for ch in entry["changes"]:
        kind, col = ch["kind"], ch["column"]
        mine = current.get(col.lower())
        if own and kind == "nullability_tightened":
            out.append(SetNullability(table=ref.target_table, column=col, nullable=True))
        elif own:
            refused.append(f"{col} {kind} on {ref.target_table} itself")
        elif kind == "added" and mine is None:
            out.append(AddColumn(table=ref.target_table, column=col, type=ch["after"]["data_type"]))
        elif kind in ("nullability_relaxed", "dropped") and mine is not None and mine.nullable is False:
            out.append(SetNullability(table=ref.target_table, column=mine.name, nullable=True))
        elif kind == "retyped" and mine is not None:
            out.append(RetypeColumn(table=ref.target_table, column=mine.name, from_type=mine.data_type,
                                    to_type=ch["after"]["data_type"]))
        elif kind == "renamed":
            refused.append(f"{col} renamed to {ch.get('new_column')} upstream")
    return out


def propose_schema_fix(ctx: FixContext, finding: CauseFinding, *, rerun_window: Sequence[str] = ()) -> ChangeSet:
    """The change set for a ``schema_change`` finding: one migration step per column change, each
    with its rollback, and a schema contract test of the target as migrated.

    Raises:
        ProposalError: nothing to migrate, or no safe migration (renames, changes of the target
            itself other than a tightening, a lossy retype).
    """
    from dw_dagster.changes.migrations import generate_migration
    from dw_dagster.changes.migrations.models import MigrationError
    from dw_dagster.changes.steps import migration_step

    schema = read_table_schema(ctx.database, ctx.target_table)
    steps, contract = [], {col.name: col.nullable for col in schema.columns}
    for change in _migration_changes(ctx, finding):
        try:
            m = generate_migration(change, ctx.database.dialect, current_schema=schema)
        except MigrationError as e:
            raise ProposalError(f"no safe migration: {e}; a person must decide") from e
        steps.append(migration_step(m, resource_key=ctx.resource_key, change_class=SCHEMA_MIGRATION))
        if getattr(change, "nullable", None) is not None or change.kind == "add":
            contract[change.column] = True if change.kind == "add" else change.nullable
    test = schema_contract_test(ctx.target_table, sorted(contract.items()), ctx.database.dialect, tests_dir=ctx.tests_dir)
    more: dict = {}
    window: list[str] = []
    if rerun_window:  # the partitions the change made the load reject: rerun after the migration
        window, outside, deferred = _window(ctx, finding, rerun_window, "the reload after the migration")
        more = dict(steps_first=True, outside_partitions=outside, deferred_details=deferred,
                    deferred_partitions=[n.partition for n in deferred])
    return _seal(ctx, finding, tests=[test], window=window, classes=[SCHEMA_MIGRATION, *([RERUN_WINDOW] if window else [])],
                 steps=steps, **more,
                 summary=f"Migrate {ctx.target_table}: " + "; ".join(s.summary for s in steps)
                 + (f", then rerun {len(window)} partition(s) {window[0]}..{window[-1]}" if window else ""),
                 undo="`dw-dagster change-sets undo` runs each migration's rollback (shown with its step).")




# -- schema change behind a dbt model with a contract -------------------------------------------------

def _contract_edit(doc: dict, model: str, changes: list, path: str) -> list[str]:
    """Apply the column changes to ``model``'s contract in a loaded schema file; the sentences of what changed."""
    node = next((m for m in doc.get("models") or [] if m.get("name") == model), None)
    if node is None:
        raise ProposalError(f"{path} has no model {model!r}: name the schema file that declares its contract")
    enforced = ((node.get("config") or {}).get("contract") or {}).get("enforced")
    if not enforced:
        raise ProposalError(f"{model} has no enforced contract in {path}: propose a migration instead")
    columns = node.setdefault("columns", [])
    by_name = {str(col.get("name", "")).lower(): col for col in columns}
    said = []
    for ch in changes:
        col = by_name.get(ch.column.lower())
        if ch.kind == "nullability" and ch.nullable and col is not None:
            kept = [x for x in col.get("constraints") or [] if x.get("type") != "not_null"]
            if len(kept) != len(col.get("constraints") or []):
                col["constraints"] = kept
                if not kept:
                    del col["constraints"]
                said.append(f"{col['name']} accepts NULL (not_null constraint removed)")
        elif ch.kind == "retype" and col is not None:
            col["data_type"] = ch.to_type.lower()
            said.append(f"{col['name']} data_type {ch.to_type.lower()}")
        elif ch.kind == "add" and col is None:
            columns.append({"name": ch.column, "data_type": ch.type.lower()})
            said.append(f"{ch.column} added ({ch.type.lower()})")
    if not said:
        raise ProposalError(f"the contract of {model} already takes the changed upstream: nothing to change")
    return said


def propose_contract_fix(ctx: FixContext, finding: CauseFinding, *, model: str, schema_file: str, dbt_project: str,
                         upstream_table: str) -> ChangeSet:
    """The change set for a ``schema_change`` upstream of a dbt model with an enforced contract: the
    model's contract diff (its schema file) for the owner to merge, a ``dbt_build`` step that builds
    the model once merged (the contract is enforced by that build), and the schema contract test.

    Args:
        model: the dbt model; schema_file: its properties file, relative to the pipeline repository;
        dbt_project: the dbt project folder, relative to it; upstream_table: the changed table the model reads.

    Raises:
        ProposalError: the file or model is missing, the model has no enforced contract (then the
            migration is the fix), or nothing in the contract has to change.
    """
    import yaml

    from dw_dagster.core.domains import PIPELINE_CODE
    from dw_dagster.core.models import ChangeStep

    file = ctx.pipeline_root / schema_file
    if not file.exists():
        raise ProposalError(f"schema file not found: {file}")
    before = file.read_text()
    doc = yaml.safe_load(before) or {}
    wanted = []
    for entry in finding.details.get("changes", []):
        if entry["table"].lower() == upstream_table.lower():
            wanted += _changes_for_target(ctx, entry)
    said = _contract_edit(doc, model, wanted, schema_file)
    after = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, indent=2)
    node = next(m for m in doc["models"] if m.get("name") == model)
    test = schema_contract_test(ctx.target_table, [(str(col["name"]), not any(
        x.get("type") == "not_null" for x in col.get("constraints") or [])) for col in node["columns"]],
        ctx.database.dialect, tests_dir=ctx.tests_dir)
    step = ChangeStep(kind=c.DBT_BUILD_STEP, change_class=REBUILD_MODELS, resource_key=ctx.resource_key,
                      summary=f"dbt build --select {model} in {dbt_project} (the merged contract is enforced by the build)",
                      spec={"project_dir": dbt_project, "select": model})
    cs = _seal(ctx, finding, tests=[test], window=[], classes=[PIPELINE_CODE], steps=[step],
               summary=f"Change the contract of {model} ({schema_file}): " + "; ".join(said) + f"; then dbt build {model}",
               undo=f"Revert the contract with `git apply -R -p1` of this diff and dbt build {model} again.")
    files = [FileChange(path=schema_file, before_sha256=_sha(before), after_sha256=_sha(after)), *cs.files]
    content = cs.model_dump(exclude={"version"})
    content.update(diff=unified_diff({schema_file: (before, after)}) + cs.diff, files=sorted(files, key=lambda f: f.path),
                   change_classes=[PIPELINE_CODE, REBUILD_MODELS, *[k for k in cs.change_classes if k != PIPELINE_CODE]])
    return ChangeSet.seal(**content)


__all__ = ["DUPLICATE_KIND", "FIXED_KINDS", "FixContext", "SCHEMA_KIND", "UPSTREAM_KIND", "dependency_levels",
           "failed_run_partitions", "propose_contract_fix", "propose_duplicate_fix", "propose_schema_fix",
           "propose_upstream_fix"]
