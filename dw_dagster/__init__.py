"""dw_dagster: Dagster-native data operations, from the first wrong number to the receipt."""

from dw_dagster.checks import (
    build_dead_letter_check,
    build_freshness_check,
    build_null_rate_check,
    build_reconciliation_checks,
    build_row_diff_check,
    build_volume_check,
)
from dw_dagster.checks.rowdiff import row_diff
from dw_dagster.checks.rowdiff import row_diff_across
from dw_dagster.checks.volume import score_days
from dw_dagster.components import DataOpsComponent
from dw_dagster.config import DataOpsConfig, WatchedAssetConfig, load_dataops_config
from dw_dagster.definitions import build_dw_definitions, dbt_executable, prepare_manifest
from dw_dagster.errors import DwConfigError, DwDagsterError
from dw_dagster.databases import Database, DatabaseError, DatabaseResource, DuckDBDatabase, database_from_url, sql
from dw_dagster.databases.catalog import CatalogError
from dw_dagster.diagnosis import (
    DeadLetterTable,
    build_schema_snapshot_check,
    combine_findings,
    diagnose_duplicates,
    diagnose_required_nulls,
    diagnose_schema_change,
    diagnose_upstream,
    diff_schemas,
    incident_history,
    record_schema_snapshot,
    schema_metadata,
    schema_snapshot,
    take_schema_snapshot,
)
from dw_dagster.diagnosis.job import IncrementalLoadDiagnoser, build_diagnosis_job
from dw_dagster.core.domains import Domain, Domains, load_domains
from dw_dagster.lineage import Review, blast_radius, dbt_ls, lineage_graph, manifest_graph, review_manifests, select_nodes
from dw_dagster.integrations.lightup import LightupClient, LightupResource
from dw_dagster.integrations.mage import MageClient, MageResource
from dw_dagster.detection.lightup import build_lightup_compare_check, build_lightup_incident_sensor
from dw_dagster.pipelines.dbt_incremental import dbt_incremental_build
from dw_dagster.pipelines.incremental import IncrementalLoadSpec, LoadError, LoadResult, PipelineRepoResource, load_metadata, load_partition
from dw_dagster.core.windows import partition_window_utc
from dw_dagster.changes.migrations import generate_migration
from dw_dagster.changes.migrations import apply_migration, verify_migration
from dw_dagster.changes.migrations import AddColumn, DropColumn, LossyRetypeError, Migration, MigrationError, MigrationRefused, RenameColumn, RetypeColumn, SetNullability
from dw_dagster.changes.migrations import classify_retype
from dw_dagster.databases.catalog import TableSchema, read_table_schema
from dw_dagster.core.models import ChangeStep, Approval, BlastRadius, CauseFinding, ChangeSet, Diagnosis, Incident, Receipt
from dw_dagster.integrations.notifications import build_notification_sensor
from dw_dagster.integrations.paging import Pager, dedup_key_for, page_incident
from dw_dagster.integrations.opsgenie import OpsgenieResource
from dw_dagster.integrations.pagerduty import PagerDutyResource
from dw_dagster.approval.job import build_approval_job
from dw_dagster.repair.sensor import build_remediation_sensor
from dw_dagster.detection.incidents import build_check_incident_sensor
from dw_dagster.receipts.job import build_receipt_job
from dw_dagster.core import records
from dw_dagster.approval.job import approve_in_process, decide
from dw_dagster.receipts.chain import verify_receipts
from dw_dagster.repair.replay_checks import build_replay_checks
from dw_dagster.pipelines.sink import Column as SinkColumn
from dw_dagster.pipelines.sink import SinkTable
from dw_dagster.proposals.change_sets import propose
from dw_dagster.guard.admission import GuardedRunCoordinator, guarded_executor
from dw_dagster.repair.jobs import build_rebuild_job, build_verify_job, build_window_job
from dw_dagster.changes.steps import StepRefused, migration_step, run_migration_step, step_results, step_stage
from dw_dagster.repair.steps import build_step_jobs
from dw_dagster.approval.identity import IdentityError, VerifiedIdentity, canonical_email, decision_nonce
from dw_dagster.core.ledger import Ledger, LedgerError, ledger_for
from dw_dagster.integrations.slack import SlackResource, approval_request_message
from dw_dagster.integrations.jira import JiraResource
from dw_dagster.integrations.mail import EmailResource
from dw_dagster.integrations.servicenow import ServiceNowResource
from dw_dagster.version import __version__
from dw_dagster.access import (AccessRequest, AccessSpec, EmailNotifier, SlackNotifier, build_access_definitions,
                               request_access, request_nonce)
from dw_dagster.detection.volume import build_volume_sensor
from dw_dagster.detection.volume import VolumeTable, days_ago
from dw_dagster.cost.models import CostReport
from dw_dagster.cost.observe import build_cost_observation_job
from dw_dagster.cost.sources import CostResource
from dw_dagster.cost.warehouse import draft_warehouse_changes
from dw_dagster.definitions import build_warehouse_change_definitions

__all__ = [
    "CostReport",
    "CostResource",
    "build_cost_observation_job",
    "build_warehouse_change_definitions",
    "draft_warehouse_changes",
    "AccessRequest",
    "AccessSpec",
    "EmailNotifier",
    "SlackNotifier",
    "build_access_definitions",
    "request_access",
    "request_nonce",
    "CatalogError",
    "DatabaseError",
    "DuckDBDatabase",
    "SinkColumn",
    "dbt_executable",
    "load_dataops_config",
    "prepare_manifest",
    "score_days",
    "sql",
    "step_stage",
    "DataOpsComponent",
    "DataOpsConfig",
    "DwConfigError",
    "DwDagsterError",
    "LoadError",
    "LoadResult",
    "SinkTable",
    "WatchedAssetConfig",
    "approve_in_process",
    "build_dw_definitions",
    "build_replay_checks",
    "dbt_incremental_build",
    "load_metadata",
    "records",
    "verify_receipts",
    "GuardedRunCoordinator",
    "IdentityError",
    "Ledger",
    "LedgerError",
    "VerifiedIdentity",
    "build_rebuild_job",
    "build_verify_job",
    "build_window_job",
    "canonical_email",
    "decide",
    "decision_nonce",
    "guarded_executor",
    "ledger_for",
    "propose",
    "AddColumn",
    "Approval",
    "BlastRadius",
    "CauseFinding",
    "ChangeSet",
    "ChangeStep",
    "Database",
    "DatabaseResource",
    "DeadLetterTable",
    "Diagnosis",
    "Domain",
    "Domains",
    "DropColumn",
    "Incident",
    "IncrementalLoadDiagnoser",
    "IncrementalLoadSpec",
    "LightupClient",
    "LightupResource",
    "MageClient",
    "MageResource",
    "LossyRetypeError",
    "Migration",
    "MigrationError",
    "MigrationRefused",
    "OpsgenieResource",
    "JiraResource",
    "EmailResource",
    "ServiceNowResource",
    "Pager",
    "PagerDutyResource",
    "PipelineRepoResource",
    "Receipt",
    "RenameColumn",
    "RetypeColumn",
    "Review",
    "SetNullability",
    "SlackResource",
    "StepRefused",
    "TableSchema",
    "VolumeTable",
    "__version__",
    "apply_migration",
    "approval_request_message",
    "blast_radius",
    "build_approval_job",
    "build_check_incident_sensor",
    "build_dead_letter_check",
    "build_diagnosis_job",
    "build_freshness_check",
    "build_lightup_compare_check",
    "build_lightup_incident_sensor",
    "build_notification_sensor",
    "build_null_rate_check",
    "build_receipt_job",
    "build_reconciliation_checks",
    "build_remediation_sensor",
    "build_row_diff_check",
    "build_schema_snapshot_check",
    "build_step_jobs",
    "build_volume_check",
    "build_volume_sensor",
    "classify_retype",
    "combine_findings",
    "database_from_url",
    "days_ago",
    "dbt_ls",
    "dedup_key_for",
    "diagnose_duplicates",
    "diagnose_required_nulls",
    "diagnose_schema_change",
    "diagnose_upstream",
    "diff_schemas",
    "generate_migration",
    "incident_history",
    "lineage_graph",
    "load_domains",
    "load_partition",
    "partition_window_utc",
    "manifest_graph",
    "migration_step",
    "page_incident",
    "read_table_schema",
    "record_schema_snapshot",
    "review_manifests",
    "row_diff",
    "row_diff_across",
    "run_migration_step",
    "schema_metadata",
    "schema_snapshot",
    "select_nodes",
    "step_results",
    "take_schema_snapshot",
    "verify_migration",
]

# Dagster lists the libraries of a deployment (telemetry and `dagster --version`-style reports) from this registry.
from dagster import DagsterLibraryRegistry  # noqa: E402

DagsterLibraryRegistry.register("dw-dagster", __version__, is_dagster_package=False)
