"""The asset graph of the code location a run or sensor belongs to (its repository's, or the definitions of a run executed in process)."""

from __future__ import annotations

import contextvars

import dagster as dg

#: the Definitions of the run being executed in process (a run worker has its repository instead)
CURRENT_DEFINITIONS: contextvars.ContextVar[dg.Definitions | None] = contextvars.ContextVar("dw_current_definitions",
                                                                                            default=None)


def asset_graph_of(context, fallback=None):
    """The asset graph of the code location a run or sensor belongs to: its repository's, else the
    in-process run's definitions (:class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon`), else ``fallback()``; None if none."""
    try:
        return context.repository_def.asset_graph
    except Exception:  # noqa: BLE001 - an in-process run has no repository on its context
        pass
    defs = CURRENT_DEFINITIONS.get()
    if defs is not None:
        return defs.resolve_asset_graph()
    return fallback() if fallback is not None else None
