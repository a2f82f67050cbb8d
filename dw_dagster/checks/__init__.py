"""Asset check factories: reconciliation, volume."""

from dw_dagster.checks.reconcile import build_reconciliation_checks, reconcile
from dw_dagster.checks.volume import build_volume_check, volume_scores

__all__ = ["build_reconciliation_checks", "build_volume_check", "reconcile", "volume_scores"]
