"""Diagnose: why an incident happened, with evidence, and what the diagnosis proposes.

- :mod:`.causes` — one module per cause, each with evidence (queries run, values seen), confidence
  and the unexplained rest: :mod:`.causes.watermark` (late rows behind a high-watermark, and rows
  tied with it), :mod:`.causes.dead_letter` (NULLs in a REQUIRED column, dead-lettered or dropped),
  :mod:`.causes.schema_change`, :mod:`.causes.upstream` (not refreshed, or its runs failed),
  :mod:`.causes.duplicates` (duplicated merge keys, a partition loaded twice)
- :mod:`.combine` — explained total without double counting; the unexplained remainder
- :mod:`.history` — past incidents, diagnoses, change sets and receipts of an asset
- :mod:`.job` — the diagnosis job and the incremental-load diagnoser; :mod:`.sink_diagnoser` the
  dead-letter sink's
"""

from dw_dagster.diagnosis.combine import CombinedFindings, combine_findings, unexplained_finding
from dw_dagster.diagnosis.causes.dead_letter import DeadLetterTable, diagnose_required_nulls
from dw_dagster.diagnosis.causes.duplicates import diagnose_duplicates, partition_load_history
from dw_dagster.diagnosis.history import IncidentHistoryEntry, attach_history, history_note, incident_history, repeats
from dw_dagster.diagnosis.causes.schema_change import (
    ColumnInfo,
    SchemaChange,
    SchemaSnapshot,
    build_schema_snapshot_check,
    diagnose_schema_change,
    diff_schemas,
    record_schema_snapshot,
    required_columns,
    schema_history,
    schema_metadata,
    schema_snapshot,
    take_schema_snapshot,
)
from dw_dagster.diagnosis.causes.upstream import diagnose_upstream, upstream_keys
from dw_dagster.diagnosis.causes.watermark import PartitionLoad, diagnose_late_rows

__all__ = [
    "ColumnInfo",
    "CombinedFindings",
    "DeadLetterTable",
    "IncidentHistoryEntry",
    "PartitionLoad",
    "SchemaChange",
    "SchemaSnapshot",
    "attach_history",
    "build_schema_snapshot_check",
    "combine_findings",
    "diagnose_duplicates",
    "diagnose_late_rows",
    "diagnose_required_nulls",
    "diagnose_schema_change",
    "diagnose_upstream",
    "diff_schemas",
    "history_note",
    "incident_history",
    "partition_load_history",
    "record_schema_snapshot",
    "repeats",
    "required_columns",
    "schema_history",
    "schema_metadata",
    "schema_snapshot",
    "take_schema_snapshot",
    "unexplained_finding",
    "upstream_keys",
]
