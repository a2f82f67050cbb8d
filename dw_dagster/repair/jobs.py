"""The asset jobs the remediation sensor runs: bounded windows, rebuilds, verification checks.

Each is an ordinary ``define_asset_job`` with two additions: the ``dw/kind`` tag that marks it as a
repair job (so :func:`~dw_dagster.guard.admission.admit_run` refuses a run of it without the
ticket the remediation sensor issued: from the Launchpad, GraphQL or ``dagster job execute``),
and the guarded executor, so the refusal happens in the run worker too, whatever launched it.
"""

from collections.abc import Sequence

import dagster as dg
from dw_dagster.dagster_private import UnresolvedAssetJobDefinition

from dw_dagster.core import keys as c
from dw_dagster.core.keys import KIND_KEY as KIND_TAG
from dw_dagster.guard.admission import guarded_executor
from dw_dagster.dagster_private import public


def _job(name: str, kind: str, selection, partitions_def=None, description: str | None = None,
         executor: dg.ExecutorDefinition | None = None) -> "UnresolvedAssetJobDefinition":
    return dg.define_asset_job(name, selection=selection, partitions_def=partitions_def, tags={KIND_TAG: kind},
                               executor_def=executor or guarded_executor(dg.in_process_executor),
                               description=description)


@public
def build_window_job(name: str, assets: Sequence[dg.AssetKey | str] | dg.AssetSelection,
                     partitions_def: dg.PartitionsDefinition | None, *, description: str | None = None,
                     executor: dg.ExecutorDefinition | None = None) -> "UnresolvedAssetJobDefinition":
    """The job that reruns an approved window of partitions (stage ``window-<n>``; assets need
    ``BackfillPolicy.single_run()`` so one run covers the range)."""
    selection = assets if isinstance(assets, dg.AssetSelection) else dg.AssetSelection.assets(*assets)
    return _job(name, c.WINDOW_KIND, selection, partitions_def,
                description or "Approved reruns of a bounded window of partitions (dispatched by the remediation sensor).",
                executor)


@public
def build_rebuild_job(name: str, selection: dg.AssetSelection, *, description: str | None = None,
                      executor: dg.ExecutorDefinition | None = None) -> "UnresolvedAssetJobDefinition":
    """The job that rebuilds the models downstream of a repaired asset (stage ``rebuild``)."""
    return _job(name, c.REBUILD_KIND, selection, None,
                description or "Approved rebuilds of the models downstream of a repaired asset.", executor)


@public
def build_verify_job(name: str, check_keys: Sequence[dg.AssetCheckKey], *, description: str | None = None,
                     executor: dg.ExecutorDefinition | None = None) -> "UnresolvedAssetJobDefinition":
    """The checks-only job that proves a repair (stage ``verify``). It reads only, so anyone may run
    it (CI, a person checking); a receipt counts only the run the remediation sensor dispatched."""
    return _job(name, c.CHECK_KIND, dg.AssetSelection.checks(*check_keys), None,
                description or "The checks that prove a repair (dispatched by the remediation sensor).", executor)


__all__ = ["build_rebuild_job", "build_verify_job", "build_window_job"]
