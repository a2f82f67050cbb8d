"""dw_dagster: Dagster-native data operations, from the first wrong number to the receipt.

The names here are what a definitions file uses: the Component and :func:`build_dw_definitions`,
the factories of checks and sensors, the resources, the config models, the error root with its
main subclasses and the record readers. Everything else is importable from its submodule and is
not a promise (the reference pages list this surface; ``test_public_surface.py`` locks it).
"""

# the whole loop as one Definitions, and its Component
from dw_dagster.components import DataOpsComponent
from dw_dagster.definitions import build_dw_definitions
from dw_dagster.access import build_access_definitions

# the config models users construct
from dw_dagster.config import DataOpsConfig, WatchedAssetConfig, load_dataops_config
from dw_dagster.pipelines.incremental import IncrementalLoadSpec
from dw_dagster.pipelines.sink import Column as SinkColumn
from dw_dagster.pipelines.sink import SinkTable
from dw_dagster.access import AccessSpec
from dw_dagster.detection.volume import VolumeTable

# what a pipeline's assets call
from dw_dagster.pipelines.incremental import LoadResult, load_metadata, load_partition
from dw_dagster.pipelines.dbt_incremental import dbt_incremental_build

# checks and sensors
from dw_dagster.checks import (
    build_dead_letter_check,
    build_freshness_check,
    build_null_rate_check,
    build_reconciliation_checks,
    build_row_diff_check,
    build_volume_check,
)
from dw_dagster.detection.volume import build_volume_sensor
from dw_dagster.detection.lightup import build_lightup_compare_check, build_lightup_incident_sensor
from dw_dagster.integrations.notifications import build_notification_sensor

# resources
from dw_dagster.databases import Database, DatabaseResource, database_from_url
from dw_dagster.pipelines.incremental import PipelineRepoResource
from dw_dagster.integrations.lightup import LightupResource
from dw_dagster.integrations.mage import MageResource
from dw_dagster.integrations.pagerduty import PagerDutyResource
from dw_dagster.integrations.opsgenie import OpsgenieResource
from dw_dagster.integrations.slack import SlackResource
from dw_dagster.integrations.jira import JiraResource
from dw_dagster.integrations.servicenow import ServiceNowResource
from dw_dagster.integrations.mail import EmailResource
from dw_dagster.cost.sources import CostResource

# run admission (dagster.yaml's run coordinator, a job's executor)
from dw_dagster.guard.admission import GuardedRunCoordinator, guarded_executor

# the error root and its main subclasses
from dw_dagster.errors import DwConfigError, DwDagsterError
from dw_dagster.databases import DatabaseError
from dw_dagster.pipelines.incremental import LoadError
from dw_dagster.changes.migrations import MigrationError

# the record readers
from dw_dagster.core import records
from dw_dagster.diagnosis import incident_history
from dw_dagster.receipts.chain import verify_receipts

from dw_dagster.version import __version__

__all__ = [
    "AccessSpec",
    "CostResource",
    "DataOpsComponent",
    "DataOpsConfig",
    "Database",
    "DatabaseError",
    "DatabaseResource",
    "DwConfigError",
    "DwDagsterError",
    "EmailResource",
    "GuardedRunCoordinator",
    "IncrementalLoadSpec",
    "JiraResource",
    "LightupResource",
    "LoadError",
    "LoadResult",
    "MageResource",
    "MigrationError",
    "OpsgenieResource",
    "PagerDutyResource",
    "PipelineRepoResource",
    "ServiceNowResource",
    "SinkColumn",
    "SinkTable",
    "SlackResource",
    "VolumeTable",
    "WatchedAssetConfig",
    "__version__",
    "build_access_definitions",
    "build_dead_letter_check",
    "build_dw_definitions",
    "build_freshness_check",
    "build_lightup_compare_check",
    "build_lightup_incident_sensor",
    "build_notification_sensor",
    "build_null_rate_check",
    "build_reconciliation_checks",
    "build_row_diff_check",
    "build_volume_check",
    "build_volume_sensor",
    "database_from_url",
    "dbt_incremental_build",
    "guarded_executor",
    "incident_history",
    "load_dataops_config",
    "load_metadata",
    "load_partition",
    "records",
    "verify_receipts",
]

# Dagster lists the libraries of a deployment (telemetry and `dagster --version`-style reports) from this registry.
from dagster import DagsterLibraryRegistry  # noqa: E402

DagsterLibraryRegistry.register("dw-dagster", __version__, is_dagster_package=False)
