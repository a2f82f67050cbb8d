"""Deprecated path of the guard: use :mod:`dw_dagster.guard` (``dw_dagster.guard.admission``).

Kept so a ``dagster.yaml`` naming ``module: dw_dagster.repair.guard``, ``class: GuardedRunCoordinator``
keeps loading; new configurations name ``module: dw_dagster.guard``. It will be removed in a later release.
"""

from dw_dagster.guard.admission import GuardedRunCoordinator, guarded_executor

__all__ = ["GuardedRunCoordinator", "guarded_executor"]
