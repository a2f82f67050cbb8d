"""Undo: every rerun window can be put back exactly as it was before the change.

A change set that reruns partitions carries an :class:`~dw_dagster.core.models.UndoPlan` naming the
target table, its partition column and the warehouse resource. The remediation sensor then runs a
``snapshot`` stage before the window: :func:`snapshot_partitions` copies the window's current rows
into ``dw_undo.<table>__<change set>`` in the same database (``CREATE TABLE ... AS SELECT``, pushed
down; nothing passes through Python) and records their count and checksum.

``dw-dagster undo CHANGE_SET`` proposes the undo as a change set of its own (class ``undo``, never
autonomous: it always waits for a person's approval). Once approved, its ``restore`` stage deletes
the window's rows from the target and re-inserts the snapshot in one transaction, then the
verification checks and the receipt run as for any repair. Tests compare row counts and checksums
(:func:`partition_checksum`) with the state before the change.
"""

import re
from collections.abc import Mapping, Sequence

import dagster as dg
from pydantic import Field

from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.databases import sql
from dw_dagster.databases import Database
from dw_dagster.databases.base import DatabaseError
from dw_dagster.databases.partitions import PartitionError, PartitionFilter, legacy_daily_filter, partition_filter, where_sql
from dw_dagster.core.models import ChangeSet, UndoPlan, utcnow
from dw_dagster.core import records
from dw_dagster.errors import DwDagsterError

UNDO_SCHEMA = "dw_undo"
APPLIED_STATE = "applied"
SNAPSHOT_KEY = c.SNAPSHOT_KEY
SNAPSHOT_OP = c.SNAPSHOT_OP
RESTORE_OP = c.RESTORE_OP


class UndoError(DwDagsterError, RuntimeError):
    """The undo cannot be proposed or run; the message says why."""


def snapshot_table_name(plan: UndoPlan, change_set_id: str, version: str = "") -> str:
    """``dw_undo.<schema>__<table>__<change set id>[_<version prefix>]`` with only letters, digits and underscores."""
    suffix = f"_{version[:12]}" if version else ""
    base = re.sub(r"[^A-Za-z0-9_]", "_", f"{plan.table.replace('.', '__')}__{change_set_id}{suffix}")
    return f"{UNDO_SCHEMA}.{base[:120]}"


def window_filter(plan: UndoPlan, partitions_def: dg.PartitionsDefinition | None = None,
                  dimension_columns: Mapping[str, str] | None = None) -> PartitionFilter:
    """The rows of ``plan``'s window: from the asset's own ``partitions_def`` (its time windows,
    zone and format; static, dynamic and multi-dimensional keys; see
    :mod:`dw_dagster.databases.partitions`), or, without one, UTC days.

    Raises:
        PartitionError: a key is not of the definition (or not a day, without one).
    """
    if partitions_def is None:
        return legacy_daily_filter(plan.partition_column, plan.window)
    return partition_filter(partitions_def, plan.window, plan.partition_column, dimension_columns)


def _as_filter(partition_column: str, window: "Sequence[str] | PartitionFilter | Mapping") -> PartitionFilter:
    if isinstance(window, PartitionFilter):
        return window
    if isinstance(window, Mapping):
        return PartitionFilter.model_validate(window)
    return legacy_daily_filter(partition_column, list(window))


#: the checksum is the sum of each row's 48-bit md5 modulo this prime (no overflow on any engine)
_CHECKSUM_MOD = 1000000007

#: the first 48 bits of an md5 hex digest ``{h}`` as an integer, on engines only the undo checksums
#: (MySQL and MariaDB: ``CONV`` reads 12 of its lower-case hex digits in base 16)
_OWN_HEX48 = {"mysql": "CAST(CONV(SUBSTRING({h}, 1, 12), 16, 10) AS UNSIGNED)"}


def _row_hash_sql(db: Database, table: str) -> str:
    """Each row's hash as an integer in ``db``'s dialect: md5 over every column's text (aware
    timestamps as UTC wall clocks, NULL marked apart from ''), its first 48 bits; the same
    definition on every engine (:mod:`dw_dagster.checks.rowdiff.hashdiff`)."""
    from dw_dagster.checks.rowdiff.hashdiff import _md5_hex_sql, _row_string
    from dw_dagster.checks.rowdiff.joindiff import _HEX48
    from dw_dagster.checks.rowdiff.rules import _utc
    from dw_dagster.databases.catalog import quoted, table_columns

    if db.dialect not in _HEX48 and db.dialect not in _OWN_HEX48:
        supported = ", ".join(sorted({*_HEX48, *_OWN_HEX48}))
        raise UndoError(f"no portable row checksum for {db.dialect!r} warehouses yet (supported: {supported})")
    cols = table_columns(db, table)
    row = _row_string([_utc("x." + quoted(n).sql("duckdb"), ty) for n, ty in cols])
    # an engine the cross-database diff does not bucket on has its own 48-bit reading of the same md5
    return {**_OWN_HEX48, **_HEX48}[db.dialect].format(h=_md5_hex_sql(db.dialect, row))


def partition_checksum(db: Database, table: str, partition_column: str,
                       window: "Sequence[str] | PartitionFilter | Mapping") -> tuple[int, int]:
    """(rows, checksum) of the window's rows: the count and the sum of each row's hash (md5 of its
    columns' text, see :func:`_row_hash_sql`) modulo a prime, computed in the warehouse.

    ``window`` is a :class:`PartitionFilter` (from :func:`window_filter`: the asset's own
    partitions), its JSON form, or ``YYYY-MM-DD`` keys of UTC days.

    Raises:
        DatabaseError: the query failed.
        PartitionError: the window's keys cannot be read.
    """
    filt = _as_filter(partition_column, window)
    where = where_sql(db, table, filt)
    t = sql.table(table).sql(db.dialect)
    (n, h), = db.fetch_all(f"SELECT COUNT(*), COALESCE(SUM(MOD({_row_hash_sql(db, table)}, {_CHECKSUM_MOD})), 0) "
                           f"FROM {t} AS x WHERE {where}")
    return int(n), int(h)


def snapshot_partitions(db: Database, plan: UndoPlan, change_set_id: str, version: str = "",
                        partitions: PartitionFilter | None = None) -> dict:
    """Copy the window's current rows aside; returns ``{snapshot_table, rows, checksum, window,
    table, partitions}`` (``partitions``: the rows' filter as JSON, so the restore and any later
    comparison read exactly the same rows). ``partitions`` defaults to UTC days."""
    filt = partitions or window_filter(plan)
    snap = snapshot_table_name(plan, change_set_id, version)
    where = where_sql(db, plan.table, filt)
    t, s = sql.table(plan.table).sql(db.dialect), sql.table(snap).sql(db.dialect)
    schema = sql.identifier(UNDO_SCHEMA).sql(db.dialect)
    _in_transaction(db, [f"CREATE SCHEMA IF NOT EXISTS {schema}", f"DROP TABLE IF EXISTS {s}",
                         f"CREATE TABLE {s} AS SELECT * FROM {t} WHERE {where}"])
    rows, checksum = partition_checksum(db, plan.table, plan.partition_column, filt)
    return {"snapshot_table": snap, "rows": rows, "checksum": checksum, "window": list(plan.window), "table": plan.table,
            "partitions": filt.model_dump(mode="json"), "per_partition": per_partition(db, plan.table, plan.partition_column, filt)}


def _label(keys: Sequence[str]) -> str:
    return keys[0] if len(keys) == 1 else f"{keys[0]}..{keys[-1]}"


def per_partition(db: Database, table: str, partition_column: str, filt: PartitionFilter) -> dict[str, dict[str, int]]:
    """``{partition key (or first..last of neighbouring ones the filter merged): {rows, checksum}}`` of
    ``table``'s rows in each slice of ``filt``."""
    out = {}
    for sl in filt.slices:
        n, h = partition_checksum(db, table, partition_column, PartitionFilter(time_column=filt.time_column, slices=[sl]))
        out[_label(sl.keys)] = {"rows": n, "checksum": h}
    return out


def undo_promise(snapshot: dict, restored: dict) -> dict:
    """What an undo promised against what it did: per partition (slice) of the snapshot, the rows and
    checksum kept before the change and those after the restore, and whether they match.

    ``{"verified": bool, "partitions": {key: {kept_rows, kept_checksum, rows, checksum, matches}}, "mismatched": [...]}``;
    a snapshot recorded before per-partition counts existed is compared on its totals."""
    kept, now = snapshot.get("per_partition") or {}, restored.get("per_partition") or {}
    parts = {k: {"kept_rows": v["rows"], "kept_checksum": v["checksum"], "rows": now.get(k, {}).get("rows"),
                 "checksum": now.get(k, {}).get("checksum"), "matches": now.get(k) == v} for k, v in sorted(kept.items())}
    totals = (restored.get("rows"), restored.get("checksum")) == (snapshot.get("rows"), snapshot.get("checksum"))
    bad = [k for k, p in parts.items() if not p["matches"]]
    return {"verified": totals and not bad, "partitions": parts, "mismatched": bad,
            "kept_rows": snapshot.get("rows"), "restored_rows": restored.get("rows")}


def _in_transaction(db: Database, statements: list[str]) -> None:
    """``statements`` all or none: the engine's own transaction (``execute_many``), else one script."""
    many = getattr(db, "execute_many", None)
    if many is not None:
        many(statements)
    else:
        db.execute("BEGIN TRANSACTION; " + "; ".join(statements) + "; COMMIT")


def restore_partitions(db: Database, plan: UndoPlan, snapshot: dict, partitions: PartitionFilter | None = None) -> dict:
    """Put the snapshot back: delete the window's rows, insert the kept ones, in one transaction.
    The rows are those the snapshot read (its recorded ``partitions``), whatever the plan says now;
    a snapshot recorded without them reads ``partitions`` (default: UTC days).

    Raises:
        UndoError: the restored rows do not match the snapshot's count and checksum.
    """
    filt = _as_filter(plan.partition_column, snapshot.get("partitions") or partitions or plan.window)
    where = where_sql(db, plan.table, filt)
    t = sql.table(plan.table).sql(db.dialect)
    snap = sql.table(snapshot["snapshot_table"]).sql(db.dialect)
    before = per_partition(db, plan.table, plan.partition_column, filt)
    # the rows the undo takes back (in the target now, not in the snapshot), kept beside the snapshot
    taken = f"{snapshot['snapshot_table'][:110]}_taken"
    tk = sql.table(taken).sql(db.dialect)
    _in_transaction(db, [f"DROP TABLE IF EXISTS {tk}",
                         f"CREATE TABLE {tk} AS SELECT * FROM {t} WHERE {where} EXCEPT SELECT * FROM {snap}"])
    (n_taken,), = db.fetch_all(f"SELECT COUNT(*) FROM {tk}")
    _in_transaction(db, [f"DELETE FROM {t} WHERE {where}", f"INSERT INTO {t} SELECT * FROM {snap}"])
    rows, checksum = partition_checksum(db, plan.table, plan.partition_column, filt)
    if (rows, checksum) != (snapshot["rows"], snapshot["checksum"]):
        raise UndoError(f"restored {rows} rows (checksum {checksum}) but the snapshot held {snapshot['rows']} "
                        f"(checksum {snapshot['checksum']})")
    after = per_partition(db, plan.table, plan.partition_column, filt)
    kept = snapshot.get("per_partition") or {}
    return {"rows": rows, "checksum": checksum, "per_partition": after,
            "taken_back": {"table": taken, "rows": int(n_taken), "target_table": plan.table, "resource_key": plan.resource_key,
                           "per_partition": {k: before[k]["rows"] - kept[k]["rows"] for k in before
                                             if k in kept and before[k]["rows"] != kept[k]["rows"]}}}


def recorded_snapshot(instance: dg.DagsterInstance, change_set_id: str, asset_key: Sequence[str] | None = None) -> dict | None:
    """The snapshot the ``snapshot`` stage of ``change_set_id``'s latest applied version recorded in
    the ledger (its op's own result), or None. ``asset_key`` is accepted for compatibility."""
    from dw_dagster.core.ledger import SUCCEEDED, ledger_for

    led = ledger_for(instance)
    for row in led.change_set_rows(latest_only=False):
        if row.change_set_id != change_set_id:
            continue
        st = led.stages(row.change_set_id, row.version).get("snapshot")
        if st is not None and st.state == SUCCEEDED and st.result and "snapshot_table" in st.result:
            return st.result
    return None


def _undo_steps(instance: dg.DagsterInstance, cs: ChangeSet) -> list:
    """The undo of each applied step, in reverse order: a migration's rollback, a replay's deletion."""
    from dw_dagster.core.domains import UNDO
    from dw_dagster.core.models import ChangeStep
    from dw_dagster.changes.steps import MIGRATION, MIGRATION_ROLLBACK, step_results

    done = {r.get("step_index") for r in step_results(instance, cs) if not r.get("refused")}
    out = []
    for i, step in reversed(list(enumerate(cs.steps))):
        if i not in done:
            continue  # never applied: nothing to undo
        if step.kind == MIGRATION:
            out.append(ChangeStep(kind=MIGRATION_ROLLBACK, change_class=UNDO, resource_key=step.resource_key,
                                  summary=f"Roll back: {step.summary}", spec=step.spec, sql=list(step.rollback_sql),
                                  rollback_sql=list(step.sql)))
        elif step.kind == "replay":
            out.append(ChangeStep(kind="replay_undo", change_class=UNDO, resource_key=step.resource_key,
                                  summary=f"Delete the rows {cs.id} replayed (they stay parked in the dead-letter table)",
                                  spec={"replay": step.spec, "of_change_set": cs.id}, sql=list(step.rollback_sql),
                                  expected_rows=None))
        else:
            raise UndoError(f"step {i + 1} of {cs.id} is a {step.kind!r} step, which has no automatic undo: {cs.undo}")
    return out


def propose_undo(instance: dg.DagsterInstance, change_set_id: str, proposer: str = c.PROPOSER) -> ChangeSet:
    """The undo of an applied change set, as its own change set (class ``undo``; needs its own approval).

    A window rerun is undone by restoring the rows kept before it (``restore`` stage); steps are
    undone in reverse order: a replay by deleting the keys it inserted, a migration by its
    rollback (whose guard refuses, e.g., to re-impose REQUIRED while NULLs exist).

    Raises:
        UndoError: no such change set, nothing undoable in it, it has not run (no snapshot, no
            applied step), or an undo of it is pending or done (a rejected or expired one is
            proposed anew as ``<id>-undo-<n>``).
    """
    import datetime as dt

    from dw_dagster.core.domains import UNDO

    cs = records.find_change_set(instance, change_set_id)
    if cs is None:
        raise UndoError(f"no change set {change_set_id!r} in this Dagster instance")
    if cs.cause_kind == "undo" or (cs.undo_plan is not None and cs.undo_plan.of_change_set):
        from dw_dagster.repair.repropose import ReproposeError, repropose

        try:  # the undo of an undo: the original change set, proposed again as a new version
            return repropose(instance, cs.id, proposer)
        except ReproposeError as e:
            raise UndoError(f"{cs.id} is itself an undo, and its change set cannot be proposed again: {e}") from e
    if cs.undo_plan is None and not cs.steps:
        raise UndoError(f"change set {cs.id} has no undo plan; its undo is manual: {cs.undo}")
    undo_plan, snap = None, None
    if cs.undo_plan is not None:
        snap = recorded_snapshot(instance, cs.id, cs.target_asset)
        if snap is None:
            raise UndoError(f"change set {cs.id} has not run its window (no snapshot was kept); there is nothing to undo")
        undo_plan = cs.undo_plan.model_copy(update={"of_change_set": cs.id})
    steps = _undo_steps(instance, cs) if cs.steps else []
    if cs.steps and not steps and snap is None:
        raise UndoError(f"change set {cs.id} has applied none of its steps; there is nothing to undo")
    from dw_dagster.core.ledger import APPLIED, EXPIRED, FAILED, HALTED, REJECTED, ledger_for

    led = ledger_for(instance)
    undo_id, attempt = f"{cs.id}-undo", 1
    row = led.change_set_row(cs.id, cs.version)
    while (earlier := led.change_set_row(undo_id)) is not None:
        if earlier.state == APPLIED and row is not None and row.recorded_at > earlier.recorded_at:
            attempt += 1  # an undo of an earlier version; this version (re-proposed since) is undone anew
            undo_id = f"{cs.id}-undo-{attempt}"
            continue
        if earlier.state not in (REJECTED, EXPIRED):  # pending, running or done: one undo at a time
            raise UndoError(f"an undo of {cs.id} was already proposed ({undo_id}, {earlier.state})")
        attempt += 1  # a rejected or expired undo ends; a new proposal is a change set of its own
        undo_id = f"{cs.id}-undo-{attempt}"
    if row is None or row.state not in (APPLIED, FAILED, HALTED):
        raise UndoError(f"change set {cs.id} is {row.state if row else 'unknown'}; only a repair that ran (applied, "
                        "failed or halted) is undone")
    parts = []
    if snap is not None:
        parts.append(f"restore partitions {', '.join(cs.undo_plan.window)} of {cs.undo_plan.table} to the "
                     f"{snap['rows']} rows kept before it ran")
    parts += [s.summary[0].lower() + s.summary[1:] for s in steps]
    code = _code_note(cs, row.state)
    now = utcnow()
    content = dict(
        id=undo_id, incident_id=cs.incident_id, diagnosis_id=cs.diagnosis_id, domain=cs.domain, proposer=proposer,
        created_at=now, expires_at=now + (cs.expires_at - cs.created_at if cs.expires_at > cs.created_at else dt.timedelta(hours=24)),
        approvers=list(cs.approvers), cause_kind="undo",
        summary=f"Undo change set {cs.id}: " + "; then ".join(parts) + (f". {code}" if code else ""),
        target_asset=list(cs.target_asset), window=list(cs.undo_plan.window) if snap is not None else [],
        diff=reverse_diff(cs.diff) if code else "", files=[],
        rebuild_assets=[list(k) for k in cs.rebuild_assets], verify_checks=[list(k) for k in cs.verify_checks],
        change_classes=[UNDO], undo=f"re-propose change set {cs.id}: `dw-dagster change-sets repropose {cs.id}` "
                                     f"(or `dw-dagster undo {undo_id}`)" + (f". {code}" if code else ""),
        undo_plan=undo_plan, steps=steps,
        manual_steps=_reruns_after(cs, steps),
    )
    return ChangeSet.seal(**content)


def _code_note(cs: ChangeSet, state: str) -> str:
    """What an undo says about the code change of ``cs`` when its diff was merged: the data is put
    back, the code is not, so the next load re-applies the fix unless the owner merges the reverse diff."""
    if not cs.diff.strip() or (state != APPLIED_STATE and not cs.diff_merged_in):
        return ""
    return (f"The code change of {cs.id} stays merged: the next load will re-apply the fix (and load the rows this "
            f"undo takes back) unless the pipeline's owner merges the reverse diff carried here "
            f"(`dw-dagster change-sets show {cs.id} --patch | git apply -R -p1`)")


def reverse_diff(diff: str) -> str:
    """The unified diff that undoes ``diff`` (``git apply -R`` as a diff of its own): hunks' sides
    swapped, added lines removed and removed ones added, a new file deleted."""
    import re as _re

    out, lines = [], diff.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:], lines[i + 1][4:]
            old_r = "/dev/null" if new == "/dev/null" else ("a/" + new[2:] if new.startswith("b/") else new)
            new_r = "/dev/null" if old == "/dev/null" else ("b/" + old[2:] if old.startswith("a/") else old)
            if old == "/dev/null":
                old_r = "a/" + new[2:] if new.startswith("b/") else new
            out += [f"--- {old_r}", f"+++ {new_r}"]
            i += 2
            continue
        m = _re.match(r"^@@ -(\S+) \+(\S+) @@(.*)$", line)
        if m:
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}")
        elif line.startswith("new file mode"):
            out.append(line.replace("new file mode", "deleted file mode"))
        elif line.startswith("deleted file mode"):
            out.append(line.replace("deleted file mode", "new file mode"))
        elif line.startswith("+"):
            out.append("-" + line[1:])
        elif line.startswith("-"):
            out.append("+" + line[1:])
        else:
            out.append(line)
        i += 1
    return "\n".join(out) + ("\n" if diff.endswith("\n") else "")


def _reruns_after(cs: ChangeSet, steps) -> list:
    """The Mage reruns ``cs`` asked for, asked again after the undo's own steps (the downstream
    pipelines read the table as the undo leaves it)."""
    from dw_dagster.changes.manual_steps import mage_rerun_step, mage_reruns
    from dw_dagster.changes.steps import step_stage

    after = [step_stage(i, st) for i, st in enumerate(steps)]
    return [mage_rerun_step(m.target, after, ui_url=m.url.split("/pipelines/")[0] if m.url else None, check=m.check)
            for m in mage_reruns(cs)]


from dw_dagster.proposals.change_sets import change_set_observation, propose  # noqa: E402,F401 - re-exported


def asset_partitions(context: dg.OpExecutionContext, asset_key: Sequence[str]
                     ) -> tuple[dg.PartitionsDefinition | None, dict[str, str]]:
    """The asset's own partitions definition in the code location the op runs in, and its
    ``dw/partition_columns`` metadata (a multi-partitioned asset's {dimension: column}); (None, {})
    when the location does not define the asset (a window of UTC days is then assumed)."""
    from dw_dagster.core.asset_graph import asset_graph_of
    from dw_dagster.core.keys import PARTITION_COLUMNS_KEY

    graph = asset_graph_of(context)
    key = dg.AssetKey(list(asset_key))
    if graph is None or not graph.has(key):
        return None, {}
    node = graph.get(key)
    cols = (node.metadata or {}).get(PARTITION_COLUMNS_KEY) or {}
    cols = getattr(cols, "value", getattr(cols, "data", cols))  # a MetadataValue or the plain mapping
    return node.partitions_def, dict(cols)


class UndoStageConfig(dg.Config):
    change_set_id: str = Field(description="the change set whose window is snapshotted or restored")


def _snapshot(context: dg.OpExecutionContext, config: UndoStageConfig) -> None:
    from dw_dagster.guard.admission import hold_stage

    held = hold_stage(context, expect=["snapshot"], change_set_id=config.change_set_id)
    cs = held.change_set
    if cs.undo_plan is None:
        raise dg.Failure(description=f"change set {cs.id} has no undo plan")
    db = getattr(context.resources, cs.undo_plan.resource_key).get_database()
    try:
        filt = window_filter(cs.undo_plan, *asset_partitions(context, cs.target_asset))
        snap = snapshot_partitions(db, cs.undo_plan, cs.id, cs.version, filt)
    except (PartitionError, DatabaseError) as e:
        held.complete(context.instance, context.run_id, success=False, result={"reason": str(e)})
        raise dg.Failure(description=f"snapshot of {cs.undo_plan.table} failed: {e}") from e
    loads = records.latest_loads(context.instance, dg.AssetKey(cs.target_asset))
    snap = {**snap, "change_set_id": cs.id, "version": cs.version, "at": utcnow().isoformat(),
            "loads": {k: {n: v for n, v in loads[k].items() if n not in ("run_id", "timestamp")}
                      for k in cs.undo_plan.window if k in loads}}
    held.complete(context.instance, context.run_id, success=True, result=snap)
    context.log_event(dg.AssetObservation(
        asset_key=dg.AssetKey(cs.target_asset), description=describe(f"kept {snap['rows']} rows of {cs.undo_plan.table} before {cs.id}", change_set_id=cs.id),
        metadata={SNAPSHOT_KEY: dg.MetadataValue.json(snap), c.CHANGE_SET_ID_KEY: cs.id}))


def _restore(context: dg.OpExecutionContext, config: UndoStageConfig) -> None:
    from dw_dagster.guard.admission import hold_stage

    held = hold_stage(context, expect=["restore"], change_set_id=config.change_set_id)
    cs = held.change_set
    if cs.undo_plan is None or not cs.undo_plan.of_change_set:
        raise dg.Failure(description=f"change set {cs.id} is not an undo")
    snap = recorded_snapshot(context.instance, cs.undo_plan.of_change_set)
    if snap is None:
        raise dg.Failure(description=f"no snapshot of {cs.undo_plan.of_change_set} to restore")
    db = getattr(context.resources, cs.undo_plan.resource_key).get_database()
    try:
        filt = None if snap.get("partitions") else window_filter(cs.undo_plan, *asset_partitions(context, cs.target_asset))
        out = restore_partitions(db, cs.undo_plan, snap, filt)
    except (UndoError, PartitionError, DatabaseError) as e:
        held.complete(context.instance, context.run_id, success=False, result={"reason": str(e)})
        raise dg.Failure(description=str(e)) from e
    out["promise"] = undo_promise(snap, out)
    held.complete(context.instance, context.run_id, success=True, result=out)
    _restored_loads(context, cs, snap, out)
    context.log.info(f"Restored {out['rows']} rows of {cs.undo_plan.table} as kept before {cs.undo_plan.of_change_set}; "
                     f"took back {out['taken_back']['rows']} rows.")


def _restored_loads(context: dg.OpExecutionContext, cs: ChangeSet, snap: dict, out: dict) -> None:
    """One materialization per restored partition carrying the load the kept rows came from (``dw/loads``),
    so a diagnosis after the undo reads the partition as the load before the change left it (the rows
    the undo took back are late again, not loaded)."""
    of = cs.undo_plan.of_change_set
    for key, load in sorted((snap.get("loads") or {}).items()):
        context.log_event(dg.AssetMaterialization(
            asset_key=dg.AssetKey(cs.target_asset), partition=key,
            description=describe(f"partition {key} restored as kept before {of} (undo {cs.id})", change_set_id=cs.id),
            metadata={c.LOADS_KEY: dg.MetadataValue.json({key: load}), c.CHANGE_SET_ID_KEY: cs.id,
                      c.UNDO_TAKEN_KEY: dg.MetadataValue.json({"partitions": out["taken_back"]["per_partition"],
                                                             "table": out["taken_back"]["table"]})}))


def build_undo_jobs(resource_keys: Sequence[str], *, executor: dg.ExecutorDefinition | None = None
                    ) -> tuple[dg.JobDefinition, dg.JobDefinition]:
    """The ``dw_undo_snapshot`` and ``dw_undo_restore`` jobs (ops ``dw_snapshot_window`` /
    ``dw_restore_window``; Dagster wants op and job names distinct), needing ``resource_keys`` (the
    warehouse resources undo plans name); pass them to :func:`build_remediation_sensor`'s ``undo_jobs``.
    ``executor`` (default the guarded in-process one) runs their steps."""
    keys = set(resource_keys)

    snapshot_op = dg.op(name=SNAPSHOT_OP, required_resource_keys=keys, tags={"kind": "dw"})(_snapshot)
    restore_op = dg.op(name=RESTORE_OP, required_resource_keys=keys, tags={"kind": "dw"})(_restore)

    from dw_dagster.guard.admission import guarded_executor

    executor = executor or guarded_executor(dg.in_process_executor)

    @dg.job(name=c.UNDO_SNAPSHOT_JOB, tags={c.KIND_KEY: c.UNDO_KIND}, executor_def=executor,
            description="Keep a window's rows before a rerun (dispatched by the remediation sensor only).")
    def snapshot_job():
        snapshot_op()

    @dg.job(name=c.UNDO_RESTORE_JOB, tags={c.KIND_KEY: c.UNDO_KIND}, executor_def=executor,
            description="Put a window back as it was before a change (an approved undo, dispatched by the sensor only).")
    def restore_job():
        restore_op()

    return snapshot_job, restore_job
