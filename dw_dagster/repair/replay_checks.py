"""The checks that prove a dead-letter replay: every parked key present once, no new dead letters.

Both are ordinary asset checks on the sink's target, so they run from the UI and CI like any
other; under the verify stage of a change set (the run holds the ticket the remediation sensor
issued; its tags alone are never trusted) they use that change set's replay selection and the
start of its first step. Run by hand, they use every parked row and the latest change applied to
the asset (else the last 24 h).
"""


import datetime as dt
from collections.abc import Callable

import dagster as dg

from dw_dagster.checks.dead_letter import parked_rows
from dw_dagster.databases import Database
from dw_dagster.core.models import ChangeSet
from dw_dagster.core import records
from dw_dagster.guard.admission import TICKET_TAG
from dw_dagster.changes.replay import REPLAY, ReplaySpec, parked_states, verify_replay
from dw_dagster.changes.steps import STEP_RESULT_KEY, first_step_started, step_results
from dw_dagster.pipelines.sink import SinkTable
from dw_dagster.core import keys as c
from dw_dagster.dagster_private import public

REPLAYED_CHECK = c.REPLAYED_CHECK
NO_NEW_DLQ_CHECK = c.NO_NEW_DLQ_CHECK


def change_set_of_run(context) -> "ChangeSet | None":
    """The change set version whose stage this run holds (from its ticket in the ledger, not from
    its tags); None for a run launched by hand."""
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.core.records import load_change_set

    ticket = context.run.tags.get(TICKET_TAG) if context.run else None
    stage = ledger_for(context.instance).stage_by_ticket(ticket) if ticket else None
    if stage is None or stage.run_id != context.run.run_id:
        return None
    return load_change_set(context.instance, stage.change_set_id, stage.version)


def _replay_spec(cs: ChangeSet | None) -> ReplaySpec | None:
    step = next((s for s in (cs.steps if cs else []) if s.kind == REPLAY), None)
    return ReplaySpec.model_validate(step.spec) if step else None


def _latest_step_time(instance: dg.DagsterInstance, asset: dg.AssetKey) -> dt.datetime | None:
    for rec in records.iter_observations(instance, asset):
        data = records.metadata_json(rec.asset_observation.metadata, STEP_RESULT_KEY)
        if data and data.get("started_at"):
            cs = records.find_change_set(instance, data["change_set_id"])
            first = first_step_started(instance, cs) if cs else None
            return first or dt.datetime.fromisoformat(data["started_at"])
    return None


@public
def build_replay_checks(*, asset: dg.AssetKey | str, sink_table: SinkTable | Callable[[Database], SinkTable],
                        resource_key: str = "warehouse",
                        replayed_name: str = REPLAYED_CHECK, no_new_name: str = NO_NEW_DLQ_CHECK,
                        ) -> list[dg.AssetChecksDefinition]:
    """The two checks that prove a replay into ``sink_table``'s target (module docstring).

    Args:
        asset: the sink's target asset.
        sink_table: the target, its dead-letter table, key and columns; or a callable giving them
            from the warehouse (e.g. read from its catalog when the check runs) that carries
            ``table``, ``dead_letter_table`` and ``key`` as attributes.
        resource_key: the :class:`~dw_dagster.databases.DatabaseResource` holding both tables.

    Returns:
        ``[parked_rows_replayed, no_new_dead_letters]`` (names configurable). The first reports
        ``dw/parked_keys``, ``dw/present_once``, ``dw/missing``, ``dw/duplicated``,
        ``dw/parked_states_json`` (the selection's parked rows per recorded state: replayed,
        superseded, duplicate, already_landed, pending) (and under a
        change set ``dw/replayed_rows`` / ``dw/expected_rows``); the second ``dw/parked_rows`` and
        ``dw/since_utc``. Both put their SQL in ``dw/query``.
    """
    key = asset if isinstance(asset, dg.AssetKey) else dg.AssetKey.from_user_string(asset)
    t = sink_table  # a SinkTable, or a callable that carries .table, .dead_letter_table and .key

    def table_of(db: Database) -> SinkTable:
        return sink_table if isinstance(sink_table, SinkTable) else sink_table(db)

    @dg.asset_check(asset=key, name=replayed_name, required_resource_keys={resource_key},
                    metadata={c.CHECK_KIND_KEY: "replay", c.TABLE_KEY: t.table},
                    description=f"Every parked {t.key} (the change set's replay selection) is in {t.table} exactly once.")
    def _replayed(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        db = getattr(context.resources, resource_key).get_database()
        cs = change_set_of_run(context)
        spec = _replay_spec(cs) or ReplaySpec.for_sink_table(table_of(db), expected_rows=0)
        v = verify_replay(db, spec)
        states = parked_states(db, spec)
        md = {c.PARKED_KEYS_KEY: v.parked_keys, c.PRESENT_ONCE_KEY: v.present_once, c.MISSING_KEY: v.missing,
              c.DUPLICATED_KEY: v.duplicated, c.QUERY_KEY: dg.MetadataValue.md(f"```sql\n{v.sql}\n```"),
              c.PARKED_STATES_JSON_KEY: dg.MetadataValue.json(states)}
        if cs is not None:
            done = [r for r in step_results(context.instance, cs) if r.get("kind") == REPLAY and not r.get("refused")]
            md[c.REPLAYED_ROWS_KEY] = sum(r.get("inserted_rows", 0) for r in done)
            md[c.EXPECTED_ROWS_KEY] = spec.expected_rows
        return dg.AssetCheckResult(
            passed=v.passed, metadata=md,
            description=(f"{v.present_once:,} of {v.parked_keys:,} parked {t.key}(s) present exactly once in {spec.target_table}"
                         + (f"; {v.missing:,} missing (e.g. {v.missing_sample[:5]})" if v.missing else "")
                         + (f"; {v.duplicated:,} more than once" if v.duplicated else "")
                         + "; parked rows: " + ", ".join(f"{n:,} {st}" for st, n in states.items() if n)))

    @dg.asset_check(asset=key, name=no_new_name, required_resource_keys={resource_key},
                    metadata={c.CHECK_KIND_KEY: "dead_letter", c.TABLE_KEY: t.dead_letter_table},
                    description=f"No row parked in {t.dead_letter_table} since the change was applied.")
    def _no_new(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        db = getattr(context.resources, resource_key).get_database()
        cs = change_set_of_run(context)
        since = (first_step_started(context.instance, cs) if cs else None) or _latest_step_time(context.instance, key)
        how = "the change set's first step" if cs else f"the latest change applied to {key.to_user_string()}"
        if since is None:
            since, how = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=24), "24 h ago (no change applied yet)"
        since = since.astimezone(dt.timezone.utc).replace(tzinfo=None)
        reasons, q = parked_rows(db, t.dead_letter_table, "failed_at", "error_reason", since)
        total = sum(r.rows for r in reasons)
        return dg.AssetCheckResult(
            passed=total == 0,
            description=f"{total} row(s) parked since {since.isoformat(sep=' ', timespec='seconds')} UTC ({how})" + (
                ": " + "; ".join(f"{r.rows} × {r.reason!r}" for r in reasons[:3]) if reasons else ""),
            metadata={c.PARKED_ROWS_KEY: total, c.SINCE_UTC_KEY: since.isoformat(), c.QUERY_KEY: dg.MetadataValue.md(f"```sql\n{q}\n```")})

    return [_replayed, _no_new]


__all__ = ["NO_NEW_DLQ_CHECK", "REPLAYED_CHECK", "build_replay_checks", "change_set_of_run"]
