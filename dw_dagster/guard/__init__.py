"""Guard: run admission (tickets, holds, the run coordinator, the executor) and the org-wide stop.

Name the run coordinator in ``dagster.yaml`` as ``module: dw_dagster.guard``,
``class: GuardedRunCoordinator``.
"""

from dw_dagster.guard.admission import GuardedRunCoordinator, guarded_executor

__all__ = ["GuardedRunCoordinator", "guarded_executor"]
