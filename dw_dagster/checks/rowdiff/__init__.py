"""Row-level key diff: which keys are missing, extra, duplicated or changed, and in which columns.

:func:`row_diff` (:mod:`.joindiff`) diffs two tables inside one database with one pushed-down
query; :func:`row_diff_across` (:mod:`.hashdiff`) diffs a table in one database against its copy
in another by bucketed row hashes; both follow the typed compare rules of :mod:`.rules`;
:func:`build_row_diff_check` (:mod:`.check`) runs either as an asset check.
"""

from dw_dagster.checks.rowdiff.check import build_row_diff_check, row_diff_metadata, row_diff_summary
from dw_dagster.checks.rowdiff.hashdiff import row_diff_across
from dw_dagster.checks.rowdiff.joindiff import row_diff, row_diff_sql
from dw_dagster.checks.rowdiff.rules import (
    TIMESTAMP_PRECISIONS,
    TIMESTAMP_ROUNDINGS,
    KeyCollision,
    RowDiffEntry,
    RowDiffResult,
    key_digest,
)

__all__ = ["KeyCollision", "RowDiffEntry", "RowDiffResult", "TIMESTAMP_PRECISIONS", "TIMESTAMP_ROUNDINGS", "build_row_diff_check", "key_digest", "row_diff",
           "row_diff_across", "row_diff_metadata", "row_diff_sql", "row_diff_summary"]
