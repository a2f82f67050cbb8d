"""The stages of a repair: their names and order, the window's contiguous ranges, how a sensor evaluation runs.

The vocabulary the remediation sensor (:mod:`dw_dagster.repair.sensor`) and its tick
(:mod:`dw_dagster.repair.tick`) share.
"""

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.links import describe
from dw_dagster.core.models import Approval, ChangeSet, utcnow
from dw_dagster.changes.steps import step_stages

RECEIPT_OP = c.RECEIPT_OP
HALT_RECEIPT = "receipt-halt"
VERSION_TAG = c.CHANGE_SET_VERSION_KEY


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def unmerged_files(cs: ChangeSet, repo_root: str | Path) -> list[str]:
    """Files of ``cs`` whose content in ``repo_root`` is not the proposed content yet."""
    root = Path(repo_root)
    return [f.path for f in cs.files if _sha256(root / f.path) != f.after_sha256]


def contiguous_ranges(ordered_keys: Sequence[str], window: Sequence[str]) -> list[list[str]]:
    """Split ``window`` into runs of consecutive keys of ``ordered_keys`` (the partitions definition's order)."""
    index = {k: i for i, k in enumerate(ordered_keys)}
    pos = sorted(index[k] for k in window if k in index)
    out: list[list[str]] = []
    for p in pos:
        if out and index[out[-1][-1]] == p - 1:
            out[-1].append(ordered_keys[p])
        else:
            out.append([ordered_keys[p]])
    return out


def stage_plan(cs: ChangeSet, ordered_keys: Sequence[str], undo: bool = False) -> list[str]:
    """The stage names of a change set's repair, in order.

    With ``undo`` (the undo jobs are configured) a change set with an undo plan first keeps its
    window (``snapshot``); an undo change set restores it (``restore``) instead of rerunning.
    The change set's steps (``cs.steps``) come after the windows and before the rebuild, one stage
    each (``migration-1``, ``replay-2``, ...); a change set without steps gets exactly the stages
    it got before steps existed.
    """
    rebuild = ["rebuild"] if cs.rebuild_assets else []
    if undo and cs.undo_plan is not None and cs.undo_plan.of_change_set:
        return ["restore", *rebuild, "verify", "receipt"]
    n = 0 if cs.hold_only else len(contiguous_ranges(ordered_keys, cs.window))
    snapshot = ["snapshot"] if undo and cs.undo_plan is not None else []
    steps = list(step_stages(cs))
    levels = max(1, len(cs.asset_levels))
    windows = [window_stage(i + 1, lvl + 1) for lvl in range(levels) for i in range(n)]
    data = steps + windows if cs.steps_first else windows + steps
    return snapshot + data + rebuild + ["verify", "receipt"]


def window_stage(n: int, level: int = 1) -> str:
    """The stage of the ``n``-th contiguous range at asset level ``level`` (1-based): ``window-<n>``
    for the first level, ``window-<n>-level<level>`` for the levels after it."""
    return f"window-{n}" if level == 1 else f"window-{n}-level{level}"


def window_stage_assets(cs: ChangeSet, stage: str) -> tuple[int, list[dg.AssetKey]]:
    """(range index, 0-based; the assets it reruns) of a ``window-`` stage of ``cs``."""
    parts = stage.split("-")
    level = int(parts[2].removeprefix("level")) if len(parts) > 2 else 1
    keys = cs.asset_levels[level - 1] if cs.asset_levels else [cs.target_asset]
    return int(parts[1]) - 1, [dg.AssetKey(k) for k in keys]


#: stages that change data: each waits for the owner's merge of the change set's files
def changes_data(stage: str, steps: Mapping[str, int]) -> bool:
    return stage.startswith("window-") or stage in ("snapshot", "restore") or stage in steps


IN_PROCESS, DAEMON, DRY_RUN = "in_process", "daemon", "dry_run"


def sensor_evaluation(context: dg.SensorEvaluationContext) -> tuple[str, str | None, str | None, str | None]:
    """How this evaluation of the sensor runs: ``(mode, code location, repository, daemon tick id)``.

    - ``daemon``: a tick of the sensor daemon. The daemon creates the tick (status started) before it
      asks the code server to evaluate, and passes its id in the log key; the tick is read back from
      the instance and must be this sensor's. Tickets issued now bind only runs the daemon reserves
      in this tick (:func:`dw_dagster.guard.admission.admit_run`).
    - ``dry_run``: evaluated in a code server outside a daemon tick: the UI's "Test sensor" (GraphQL
      ``sensorDryRun``), which anyone who can open the UI may press. Nothing is issued: the dry run
      shows what would be dispatched without a ticket.
    - ``in_process``: evaluated without a code location (``build_sensor_context``, the
      :class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon`): tickets bind runs made in process.
    """
    origin = getattr(context, "code_location_origin", None)
    if origin is None:
        return IN_PROCESS, None, None, None
    location, repository = origin.location_name, context.repository_name
    log_key = list(context.log_key or [])
    tick_id = str(log_key[-1]) if log_key else ""
    if tick_id.isdigit() and context.instance_ref is not None:
        from dw_dagster.dagster_private import InstigatorSelector
        from dw_dagster.dagster_private import TickStatus

        try:
            tick = context.instance.schedule_storage.get_tick(int(tick_id))
        except Exception:  # noqa: BLE001 - no such tick: not the daemon
            tick = None
        selector = InstigatorSelector(location_name=location, repository_name=repository, name=context.sensor_name)
        if (tick is not None and tick.status == TickStatus.STARTED and tick.instigator_name == context.sensor_name
                and tick.selector_id in (None, selector.get_id())):
            return DAEMON, location, repository, tick_id
    return DRY_RUN, location, repository, None


def receipt_config(cs: ChangeSet) -> dict:
    return {"ops": {RECEIPT_OP: {"config": {"change_set_id": cs.id}}}}


def withdrawal_observation(cs: ChangeSet, d: Approval, reason: str) -> dg.AssetObservation:
    return dg.AssetObservation(asset_key=dg.AssetKey(cs.target_asset),
                               description=describe(f"approval {d.id} of change set {cs.id} withdrawn: {reason}", change_set_id=cs.id),
                               metadata={c.APPROVAL_WITHDRAWN_KEY: dg.MetadataValue.json(
                                   {"change_set_id": cs.id, "version": cs.version, "approval_id": d.id,
                                    "approver": d.approver, "reason": reason, "at": utcnow().isoformat()}),
                                   c.CHANGE_SET_ID_KEY: cs.id})
