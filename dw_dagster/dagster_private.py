"""Dagster's private APIs dw_dagster relies on, in one place.

Each name below has no public equivalent in the Dagster versions of :data:`CHECKED_ON` (the
``dagster`` pin of ``pyproject.toml``); ``test_dagster_private.py`` imports every one of them and
fails when the installed Dagster is outside those versions, so a Dagster upgrade re-checks this
list first. Everything else dw_dagster uses from Dagster is public (``import dagster as dg``).
Names load when first used, so importing this module costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

from dagster._annotations import beta, public

#: the Dagster minor versions these names were checked on
CHECKED_ON = ("1.13",)

#: name → (private module, attribute); what each is for is said where it is used
PRIVATE: dict[str, tuple[str, str]] = {
    "UnresolvedAssetJobDefinition": ("dagster._core.definitions.unresolved_asset_job_definition",
                                     "UnresolvedAssetJobDefinition"),  # repair jobs built before resolution
    "InstigatorSelector": ("dagster._core.definitions.selector", "InstigatorSelector"),  # the daemon's tick selector
    "TickStatus": ("dagster._core.scheduler.instigation", "TickStatus"),  # a started daemon tick
    "current_execution_context": ("dagster._core.execution.context.compute", "current_execution_context"),  # query tags
    "InMemoryRunStorage": ("dagster._core.storage.runs.in_memory", "InMemoryRunStorage"),  # ephemeral instances
    "EventLogCursor": ("dagster._core.event_api", "EventLogCursor"),  # paging the event log by storage id
    "make_new_run_id": ("dagster._core.utils", "make_new_run_id"),  # a run id for a check run made in process
    "CodePointer": ("dagster._core.code_pointer", "CodePointer"),  # loading a workspace's code locations (MCP)
    "load_python_file": ("dagster._core.code_pointer", "load_python_file"),
    "location_origins_from_yaml_paths": ("dagster._core.workspace.load", "location_origins_from_yaml_paths"),
    "cron_string_iterator": ("dagster._utils.schedules", "cron_string_iterator"),  # exposure deadlines (needed_by)
    "is_valid_cron_string": ("dagster._utils.schedules", "is_valid_cron_string"),
}

__all__ = ["CHECKED_ON", "PRIVATE", "beta", "public", *PRIVATE]


def __getattr__(name: str) -> Any:
    if name not in PRIVATE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = PRIVATE[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
