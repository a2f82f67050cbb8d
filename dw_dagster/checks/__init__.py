"""Asset check factories: reconciliation, row-level key diff, volume, null rate, freshness, dead-letter growth."""

from dw_dagster.checks.dead_letter import build_dead_letter_check
from dw_dagster.checks.freshness import build_freshness_check
from dw_dagster.checks.null_rate import build_null_rate_check
from dw_dagster.checks.reconcile import build_reconciliation_checks, reconcile
from dw_dagster.checks.rowdiff import build_row_diff_check
from dw_dagster.checks.volume import build_volume_check, volume_scores

__all__ = [
    "build_dead_letter_check",
    "build_freshness_check",
    "build_null_rate_check",
    "build_reconciliation_checks",
    "build_row_diff_check",
    "build_volume_check",
    "reconcile",
    "volume_scores",
]
