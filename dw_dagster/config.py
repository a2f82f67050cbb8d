"""The configuration of the whole loop on one project: what :func:`~dw_dagster.definitions.build_dw_definitions`
and :class:`~dw_dagster.components.DataOpsComponent` take.

Every model is a pydantic model that refuses unknown fields (``dg.Model``) and is
``dg.Resolvable``, so the same classes validate a ``defs.yaml`` (with Dagster's templating,
``{{ env.X }}``; an error names the file, line and field, as ``dg check yaml`` shows it) and
Python code. Asset keys are written as Dagster's user strings (``analytics/orders``); tables as
``schema.table``; databases by the name given to them under ``databases``.

.. code-block:: yaml

    domains: domains.yaml                  # a path (relative to this file) or the domains inline
    databases:
      source: {url: "{{ env.SOURCE_URL }}"}
      warehouse: {url: "duckdb:///{{ env.HOME }}/warehouse.duckdb"}
    assets:
      - key: analytics/orders
        table: analytics.orders
        database: warehouse
        checks:
          reconciliation: {source: {database: source, table: raw.orders, asset: raw/orders}, slice_by: [region]}
          volume: {timestamp_column: order_ts}
        pipeline:
          incremental_load: {source_database: source, repo: .., file: pipelines/orders.yaml}
    dbt: {project_dir: ../dbt_project}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import dagster as dg
from pydantic import Field, field_validator, model_validator

from dw_dagster.core import keys as _keys
from dw_dagster.core.domains import Domains
from dw_dagster.errors import DwConfigError
from dw_dagster.migration.config import MigrationConfig
from dw_dagster.dagster_private import public


class DatabaseConfig(dg.Model, dg.Resolvable):
    """One database: a URL dw_dagster opens (``DatabaseResource``), or the key of a resource the
    project already defines (anything with ``get_database()``).

    URLs: ``duckdb:///path``, ``postgresql+psycopg://...`` and other SQLAlchemy URLs,
    ``snowflake://user:password@account/database/schema?warehouse=WH``,
    ``bigquery://project/dataset`` (see :func:`~dw_dagster.databases.database_from_url`).
    """

    url: str | None = Field(None, description="database URL; use {{ env.X }} for secrets")
    resource_key: str | None = Field(None, description="key of an existing resource with get_database()")

    @model_validator(mode="after")
    def _one(self) -> DatabaseConfig:
        if (self.url is None) == (self.resource_key is None):
            raise ValueError("give exactly one of url or resource_key")
        return self


class SourceRef(dg.Model, dg.Resolvable):
    """The other side of a comparison: a table in a named database, and its asset if it has one."""

    database: str = Field(description="a name under databases")
    table: str = Field(description="schema.table")
    asset: str | None = Field(None, description="the source table's asset key (the check depends on it); leave "
                              "it out when the source table is not a Dagster asset")


class ReconciliationConfig(dg.Model, dg.Resolvable):
    """Slice compare of row counts and sums between the source and the asset's table."""

    source: SourceRef
    slice_by: list[str] = Field(min_length=1, description="columns the counts are grouped by")
    measures: list[str] = Field(default_factory=list, description="columns whose exact sums are compared")
    key_columns: list[str] = Field(default_factory=list)
    name: str = _keys.RECONCILIATION_CHECK
    partition_column: str | None = Field(None, description="the column (naive UTC) the asset's time-window partitions "
                                         "are ranges of: a repair's verify run then compares only its window's rows")
    closed_partitions_only: bool = Field(False, description="compare only rows before the partition still in progress "
                                         "(needs partition_column); the cut-off is stated in the result")


class RowDiffConfig(dg.Model, dg.Resolvable):
    """Key-level diff between the source and the asset's table (missing, extra, changed rows)."""

    source: SourceRef
    key_columns: list[str] = Field(min_length=1)
    compare_columns: list[str] | None = None
    timestamp_precision: str | None = None
    timestamp_rounding: Literal["tolerate", "floor", "round"] = "tolerate"
    case_insensitive_keys: bool = False
    trim_trailing_blanks: bool = False
    source_char_columns: list[str] | None = Field(None, description="columns with CHAR semantics in the source (trimmed)")
    target_char_columns: list[str] | None = Field(None, description="columns with CHAR semantics in the target (trimmed)")
    name: str = _keys.ROW_DIFF_CHECK


class VolumeConfig(dg.Model, dg.Resolvable):
    """Rows per UTC day against the same weekday's baseline."""

    timestamp_column: str
    evaluate_days: int = Field(7, ge=1)
    training_days: int = Field(28, ge=7)
    sensitivity: float = Field(3.0, gt=0)
    min_band_pct: float = Field(2.0, ge=0)
    method: Literal["zscore", "mad"] = "zscore"
    as_of: str | None = Field(None, description="the last day evaluated, YYYY-MM-DD (default: today, UTC)")
    name: str = _keys.VOLUME_CHECK


class NullRateConfig(dg.Model, dg.Resolvable):
    """NULL rate of columns in the latest day(s) against a baseline."""

    columns: list[str] = Field(min_length=1)
    timestamp_column: str | None = None
    tolerance_pct: float = Field(1.0, ge=0)
    as_of: str | None = Field(None, description="the last day evaluated, YYYY-MM-DD (default: today, UTC)")
    name: str = _keys.NULL_RATE_CHECK


class FreshnessConfig(dg.Model, dg.Resolvable):
    """Age of the newest row."""

    timestamp_column: str
    max_lag_hours: float | None = Field(None, gt=0, description="elapsed hours (24 is 24 h, even across DST)")
    max_lag_days: int | None = Field(None, ge=1, description="calendar days in deadline_timezone (wall clock "
                                     "across DST); with max_lag_hours, both must hold")
    deadline_timezone: str = "UTC"
    naive_timezone: str = "UTC"
    name: str = _keys.FRESHNESS_CHECK

    @model_validator(mode="after")
    def _one_lag(self) -> "FreshnessConfig":
        if self.max_lag_hours is None and self.max_lag_days is None:
            raise ValueError("give max_lag_hours (elapsed) or max_lag_days (calendar days)")
        return self


class DeadLetterConfig(dg.Model, dg.Resolvable):
    """Rows parked in a dead-letter table (or a view of the rows still waiting) in the last hours."""

    table: str | None = Field(None, description="default: the sink's pending view (pipeline.dead_letter_sink)")
    timestamp_column: str = "failed_at"
    reason_column: str = "error_reason"
    lookback_hours: float = Field(24, gt=0)
    max_rows: int = Field(0, ge=0)
    name: str = _keys.DEAD_LETTER_CHECK


class ChecksConfig(dg.Model, dg.Resolvable):
    """The asset checks on one watched asset (each optional)."""

    reconciliation: ReconciliationConfig | None = None
    row_diff: RowDiffConfig | None = None
    volume: VolumeConfig | None = None
    null_rate: NullRateConfig | None = None
    freshness: FreshnessConfig | None = None
    dead_letter: DeadLetterConfig | None = None

    def configured(self) -> list[tuple[str, dg.Model]]:
        """``(kind, config)`` of the checks that are set, in a fixed order."""
        return [(k, getattr(self, k)) for k in ("reconciliation", "row_diff", "volume", "null_rate", "freshness",
                                                 "dead_letter") if getattr(self, k) is not None]


class DbtCountTestConfig(dg.Model, dg.Resolvable):
    """The regression test a watermark fix proposes: a model's count per group equals the landed rows'."""

    dbt_model: str = Field(description="the model whose counts are tested")
    count_column: str
    source_name: str
    source_table: str
    group: dict[str, str] = Field(description="model column → expression over the source table")


def _tests_dir_field() -> Any:
    return Field(None, description="where the test a fix adds goes, relative to repo (default: the dbt project's first "
                 "test-paths folder when dbt.project_dir is inside repo, else tests)")


def _upstream_tables_field() -> Any:
    return Field(default_factory=dict, description="upstream asset key → its table in this asset's database, for the "
                 "test an upstream fix adds; each is rerun by that fix, so it must be an asset of this code location "
                 "partitioned like this one (default: the other watched assets and check sources in the same database)")


def _upstream_max_age_field() -> Any:
    return Field(None, gt=0, description="an upstream asset older than this many hours when this one ran is stale "
                 "(default: staleness is not tested; failed upstream runs always are)")


class IncrementalLoadConfig(dg.Model, dg.Resolvable):
    """An incremental load reading rows above a high-watermark (what the late-rows diagnosis tests).

    The pipeline file (YAML, :class:`~dw_dagster.pipelines.incremental.IncrementalLoadSpec`) names the source and
    target tables, the merge key, partition, watermark and arrival columns and the lookback; the
    watermark fix is a diff to it. Loads are read from the asset's ``dw/loads`` metadata
    (:func:`~dw_dagster.pipelines.incremental.load_partition`'s results recorded with
    :func:`~dw_dagster.pipelines.incremental.load_metadata`)."""

    source_database: str = Field(description="a name under databases")
    repo: str = Field(description="the pipeline repository's working copy (where the fix's diff applies)")
    file: str = Field(description="the pipeline file, relative to repo")
    group_by: list[str] = Field(default_factory=list, description="breakdown columns of the evidence")
    dbt_test: DbtCountTestConfig | None = None
    tests_dir: str | None = _tests_dir_field()
    upstream_tables: dict[str, str] = _upstream_tables_field()
    upstream_max_age_hours: float | None = _upstream_max_age_field()


class RecordedLoadConfig(dg.Model, dg.Resolvable):
    """An asset that loads incrementally by its own code and records each load with
    :func:`dw_dagster.load_metadata` (one :class:`~dw_dagster.pipelines.incremental.LoadResult` per
    partition: its window, the watermark column, the value it read above, the source's newest
    arrival time when it read). The asset must have time-window partitions.

    The asset reads its watermark column and lookback at run time from a settings file of its
    own (YAML with top-level ``watermark_column: <column>`` and ``lookback_hours: <hours>`` lines,
    or the keys named here); the fix is a diff of those two lines, and the repair reruns the
    partitions holding late rows once the owner merged it.
    """

    source_database: str = Field(description="a name under databases")
    source_table: str = Field(description="the table the asset reads, schema.table")
    key: str = Field(description="the column the asset merges on")
    partition_column: str = Field(description="the column whose UTC day is the asset's partition")
    arrival_column: str = Field(description="when a row reached the source (posted_ts, ingested_at)")
    repo: str = Field(description="the working copy holding the settings file (where the fix's diff applies)")
    settings_file: str = Field(description="the asset's settings file, relative to repo")
    watermark_key: str = Field("watermark_column", description="the settings file's key for the watermark column")
    lookback_key: str = Field("lookback_hours", description="the settings file's key for the lookback in hours")
    group_by: list[str] = Field(default_factory=list, description="breakdown columns of the evidence")
    dbt_test: DbtCountTestConfig | None = None
    tests_dir: str | None = _tests_dir_field()
    upstream_tables: dict[str, str] = _upstream_tables_field()
    upstream_max_age_hours: float | None = _upstream_max_age_field()


class DbtIncrementalConfig(dg.Model, dg.Resolvable):
    """A dbt model materialized ``incremental`` whose ``is_incremental()`` filter reads rows above the
    largest value already in the model (``where updated_at > (select max(updated_at) from {{ this }})``).

    The model's ``@dbt_assets`` function builds it through :func:`dw_dagster.dbt_incremental_build`,
    which records the high-watermark and the source's newest arrival before each run. The fix is a
    diff of the model's SQL (a lookback, by the arrival column when the model has it, a
    bounded-rebuild clause, ``unique_key`` when missing) and the repair a ``dbt build --select
    <model> --vars`` over the days holding late rows. Needs ``dbt.project_dir``.
    """

    dbt_model: str = Field(description="the dbt model's name")
    arrival_column: str = Field(description="the column of the model's source telling when a row arrived")
    key: str | None = Field(None, description="the key late rows are matched by; default the model's unique_key "
                            "(added to the model by the fix when it has none)")
    repo: str = Field(description="the git working copy holding the dbt project (where the fix's diff applies)")
    source_table: str | None = Field(None, description="the table the watermark follows; default the model's one "
                                     "upstream source or model")
    source_database: str | None = Field(None, description="where source_table is read; default the asset's database")
    dbt_target: str | None = Field(None, description="the dbt target of the bounded rebuild (default: the profile's)")
    group_by: list[str] = Field(default_factory=list, description="breakdown columns of the evidence")


class DeadLetterSinkConfig(dg.Model, dg.Resolvable):
    """A sink that parks the rows its target rejects (:mod:`dw_dagster.pipelines.sink`)."""

    source_database: str
    source_table: str = Field(description="the source table, schema.table")
    dead_letter_table: str
    key: str = Field(description="the merge key")
    partition_column: str = Field(description="the day column (volume check, evidence)")
    group_column: str = Field(description="the source column NULLs are broken down by")


class PipelineConfig(dg.Model, dg.Resolvable):
    """What loads the asset, for diagnosis and repair: exactly one kind."""

    incremental_load: IncrementalLoadConfig | None = None
    dead_letter_sink: DeadLetterSinkConfig | None = None
    recorded_load: RecordedLoadConfig | None = None
    dbt_incremental: DbtIncrementalConfig | None = None

    #: the pipeline kinds, in the order an error message lists them
    KINDS: ClassVar[tuple[str, ...]] = ("incremental_load", "dead_letter_sink", "recorded_load", "dbt_incremental")

    def configured(self) -> tuple[str, dg.Model]:
        """``(kind, its config)`` of the one kind that is set."""
        return next((k, getattr(self, k)) for k in self.KINDS if getattr(self, k) is not None)

    @model_validator(mode="after")
    def _one(self) -> PipelineConfig:
        if sum(getattr(self, k) is not None for k in self.KINDS) != 1:
            raise ValueError(f"give exactly one of {', '.join(self.KINDS)}")
        return self


class MageSourceConfig(dg.Model, dg.Resolvable):
    """The Mage pipelines around an asset's table (needs ``integrations.mage``): the one that writes
    it, and those that read it downstream. The dead-letter sink's diagnosis lists their runs in the
    incident's window (status, start, end, block runs); its change set names the downstream ones as
    reruns for the engineer after its data steps, and the verify stage's ``mage_rerun`` check waits
    for those reruns."""

    writes: str | None = Field(None, description="uuid of the Mage pipeline that writes the table (e.g. the stream)")
    reads: list[str] = Field(default_factory=list, description="uuids of the Mage pipelines that read the table "
                             "downstream (rerun by the engineer after a fix, in this order)")
    lookback_hours: float = Field(24, gt=0, description="how long before the window a run still going in it may "
                                  "have started (runs still in progress are always read)")

    @model_validator(mode="after")
    def _some(self) -> MageSourceConfig:
        if self.writes is None and not self.reads:
            raise ValueError("give writes or reads (or both)")
        return self


@public
class WatchedAssetConfig(dg.Model, dg.Resolvable):
    """One asset dw_dagster watches, diagnoses and repairs."""

    key: str = Field(description="the asset key, e.g. analytics/orders (the asset is defined by your project)")
    table: str = Field(description="its table, schema.table")
    database: str = Field(description="a name under databases")
    checks: ChecksConfig = Field(default_factory=ChecksConfig)
    detect: list[str] | None = Field(None, description="check names whose failure opens an incident (default: all)")
    verify: list[str] = Field(default_factory=list, description="more checks that prove a repair, as asset/key:check")
    pipeline: PipelineConfig | None = None
    mage: MageSourceConfig | None = Field(None, description="the Mage pipelines that write and read the table")


class DbtConfig(dg.Model, dg.Resolvable):
    """The dbt project that maps the blast radius (models, tests, exposures, owners)."""

    project_dir: str | None = Field(None, description="the dbt project (parsed when its manifest is missing, and under "
                                    "`dagster dev` when a file, the profiles or the environment changed since the last parse)")
    profiles_dir: str | None = None
    manifest: str | None = Field(None, description="a manifest.json instead of a project")

    @model_validator(mode="after")
    def _one(self) -> DbtConfig:
        if (self.project_dir is None) == (self.manifest is None):
            raise ValueError("give exactly one of project_dir or manifest")
        return self


_OPTIONAL = ("leave this integration out, instead of failing when it runs, if its credentials are not in the "
             "environment as the definitions load (one configuration for a laptop and production)")


class LightupConfig(dg.Model, dg.Resolvable):
    """Lightup incidents become dw_dagster incidents. Credentials from ``LIGHTUP_CREDENTIAL_FILE``
    (or ``LIGHTUP_SERVER`` + ``LIGHTUP_REFRESH_TOKEN``), as :class:`~dw_dagster.integrations.lightup.LightupResource` reads them."""

    tables: dict[str, str] = Field(description="'datasource:schema.table' → asset key")
    compare_metrics: list[str] = Field(
        default_factory=list, description="compare metric uuids for the on-demand check: a list, or one "
        "comma-separated string (e.g. \"{{ env('LIGHTUP_COMPARE_METRICS', '') }}\"); empty: no compare check")
    compare_asset: str | None = Field(
        None, description="the asset the compare check is on (default: the first of the tables' assets that is "
        "watched under assets, else the first)")
    workspace: str | None = None
    optional: bool = Field(False, description=_OPTIONAL)

    @field_validator("compare_metrics", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if v is None:
            return []
        if isinstance(v, str):
            return [m.strip() for m in v.split(",") if m.strip()]
        return v


class PagerDutyConfig(dg.Model, dg.Resolvable):
    """Page on incidents (PagerDuty Events API v2; notes on the page through the REST API with a token)."""

    routing_key_env: str = Field("PAGERDUTY_ROUTING_KEY", description="the env var holding the integration key")
    api_token_env: str | None = Field(
        None, description="the env var holding a REST API token (notes on the page); with optional: true, notes are "
        "left out when it is not set")
    from_email: str | None = Field(None, description="the PagerDuty user notes are written as")
    events_url: str = "https://events.pagerduty.com"
    api_url: str = "https://api.pagerduty.com"
    optional: bool = Field(False, description=_OPTIONAL)


class SlackConfig(dg.Model, dg.Resolvable):
    """Approval requests and outcomes in Slack."""

    bot_token_env: str = Field("SLACK_BOT_TOKEN", description="the env var holding the bot token")
    channel: str | None = None
    api_url: str = "https://slack.com/api"
    optional: bool = Field(False, description=_OPTIONAL)


class JiraConfig(dg.Model, dg.Resolvable):
    """One Jira Cloud issue per incident (:class:`~dw_dagster.integrations.jira.JiraResource`); when Lightup's
    alert channel is Jira, the issue Lightup opened is the one annotated."""

    url: str = Field(description="https://<site>.atlassian.net")
    email: str = Field(description="the Atlassian account of the API token")
    api_token_env: str = Field("JIRA_API_TOKEN", description="the env var holding the API token")
    project_key: str = Field(description="the project issues are opened in", pattern=r"^[A-Z][A-Z0-9_]+$")
    issue_type: str = "Task"
    done_transition: str | None = Field(None, description="the transition to done (default: any into the done category)")
    optional: bool = Field(False, description=_OPTIONAL)


class ServiceNowConfig(dg.Model, dg.Resolvable):
    """One ServiceNow incident per dw_dagster incident (:class:`~dw_dagster.integrations.servicenow.ServiceNowResource`)."""

    instance_url: str = Field(description="https://<instance>.service-now.com")
    username: str = Field(description="the integration user")
    password_env: str = Field("SERVICENOW_PASSWORD", description="the env var holding its password")
    assignment_group: str | None = None
    close_code: str = Field("Solution provided", description="incident.close_code of a verified repair")
    optional: bool = Field(False, description=_OPTIONAL)


class EmailConfig(dg.Model, dg.Resolvable):
    """Email over SMTP with STARTTLS (:class:`~dw_dagster.integrations.mail.EmailResource`): requests,
    ladder steps, receipts. The login comes from the environment variables named here."""

    host: str
    port: int = Field(587, ge=1, le=65535)
    sender: str = Field(description="the From address")
    username_env: str | None = Field(None, description="the env var holding the SMTP user (no login when unset)")
    password_env: str | None = Field(None, description="the env var holding the SMTP password")
    starttls: bool = Field(True, description="STARTTLS before anything else (false only for a trusted local relay)")
    ca_file: str | None = Field(None, description="CA bundle of the server's certificate (default: the system's)")
    optional: bool = Field(False, description=_OPTIONAL)

    @model_validator(mode="after")
    def _login_pair(self) -> EmailConfig:
        if bool(self.username_env) != bool(self.password_env):
            raise ValueError("password_env: give username_env and password_env together (or neither)")
        return self


class MageConfig(dg.Model, dg.Resolvable):
    """A Mage OSS server dw_dagster reads (never changes): runs in an incident's window, the outcome of a
    rerun. The resource ``mage`` (:class:`~dw_dagster.integrations.mage.MageResource`) reads the
    API key, email and password from the named environment variables at run time."""

    url: str | None = Field(None, description="the server's URL, e.g. http://mage.internal:6789 "
                            "(default: $MAGE_URL at run time); \"{{ env('MAGE_URL', '') }}\" works too")
    ui_url: str | None = Field(None, description="base of links into Mage's UI (default: url)")
    api_key_env: str = Field("MAGE_API_KEY", description="the env var holding the API key (unset: Mage OSS's public key)")
    email_env: str = Field("MAGE_EMAIL", description="the env var holding a Mage user's email (user authentication)")
    password_env: str = Field("MAGE_PASSWORD", description="the env var holding that user's password")
    rerun_timeout_s: float = Field(1800, gt=0, description="how long the verify stage waits for a rerun to finish")
    poll_s: float = Field(15, gt=0, description="seconds between reads while it waits")
    optional: bool = Field(False, description="leave Mage out when no URL is configured or in $MAGE_URL as the "
                           "definitions load")

    @field_validator("url", "ui_url", mode="before")
    @classmethod
    def _blank(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v


class TableauConfig(dg.Model, dg.Resolvable):
    """After a verified repair, refresh the extract of each Tableau workbook in the blast radius (an
    exposure's ``meta.dw.bi: {tool: tableau, workbook: <name>}``), signed in with a personal access token."""

    server: str | None = Field(None, description="Tableau Server or Cloud URL, e.g. https://10ax.online.tableau.com "
                               "(\"{{ env('TABLEAU_SERVER', '') }}\" works too)")
    site: str = Field("", description="the site's content URL (empty: the default site)")
    token_name_env: str = Field("TABLEAU_TOKEN_NAME", description="the env var holding the personal access token's name")
    token_secret_env: str = Field("TABLEAU_TOKEN_SECRET", description="the env var holding its secret")
    optional: bool = Field(False, description=_OPTIONAL)


class LightdashConfig(dg.Model, dg.Resolvable):
    """After a verified repair, refresh each Lightdash dashboard in the blast radius (an exposure's
    ``meta.dw.bi: {tool: lightdash, dashboard: <uuid, slug or name>}``): its cache invalidated, its charts run again."""

    url: str | None = Field(None, description="the Lightdash instance, e.g. https://app.lightdash.cloud "
                            "(\"{{ env('LIGHTDASH_URL', '') }}\" works too)")
    project_uuid: str | None = Field(None, description="the project the dashboards are in")
    api_key_env: str = Field("LIGHTDASH_API_KEY", description="the env var holding a personal access token "
                             "(or a service-account token, ldsvc_...)")
    optional: bool = Field(False, description=_OPTIONAL)


class IntegrationsConfig(dg.Model, dg.Resolvable):
    """Optional integrations, each switched on by being present (and, with ``optional: true``, by its credentials)."""

    lightup: LightupConfig | None = None
    pagerduty: PagerDutyConfig | None = None
    slack: SlackConfig | None = None
    jira: JiraConfig | None = None
    servicenow: ServiceNowConfig | None = None
    email: EmailConfig | None = None
    mage: MageConfig | None = None
    tableau: TableauConfig | None = None
    lightdash: LightdashConfig | None = None
    dagster_url: str = Field("http://localhost:3000", description="base of links in notifications")
    review_url: str | None = Field(None, description="the review site (dw-dagster approvals serve) every notification "
                                   "links to (default: $DW_REVIEW_URL)")


@public
class DataOpsConfig(dg.Model, dg.Resolvable):
    """The whole loop on one code location (module docstring)."""

    domains: str | dict[str, Any] = Field(
        description="the domains file (a path; read when used, so edits apply at once) or the domains inline "
        "({domains: [...], identity: ..., operators: [...]}, the same shape as the file)")
    databases: dict[str, DatabaseConfig] = Field(min_length=1)
    assets: list[WatchedAssetConfig] = Field(default_factory=list, description="the watched assets (at least one, "
                                             "unless a migration is configured)")
    migration: MigrationConfig | None = Field(None, description="a migration: waves of table pairs, their parity "
                                              "checks and the completion gate (dw_dagster.migration)")
    dbt: DbtConfig | None = None
    integrations: IntegrationsConfig = Field(default_factory=IntegrationsConfig)
    location_name: str = Field("dw_dagster", description="the code location's name (links in notifications)")
    sensors_running: bool = Field(False, description="start the sensors running (default: stopped until turned on)")
    sensor_interval_seconds: int = Field(30, description="seconds between ticks of the loop's "
                                         "incident, remediation and notification sensors (Dagster's daemon looks "
                                         "every 5 s; each repair stage waits for one tick)")

    @field_validator("sensor_interval_seconds", mode="before")
    @classmethod
    def _interval(cls, v: Any) -> int:
        # checked here, not with Field(ge=...): a templated value arrives as a string (``{{ env(...) }}``)
        try:
            seconds = int(str(v).strip())
        except ValueError:
            raise ValueError(f"a whole number of seconds, not {v!r}") from None
        if not 5 <= seconds <= 86_400:
            raise ValueError(f"between 5 (Dagster's daemon looks every 5 s) and 86400, not {seconds}")
        return seconds

    @field_validator("domains", mode="before")
    @classmethod
    def _domains(cls, v: Any) -> Any:
        if isinstance(v, Domains):
            return v.model_dump(mode="json")
        if isinstance(v, dict):
            Domains.model_validate(v)  # a mistake names its field (e.g. domains.0.approvers)
        return v

    def domains_model(self) -> Domains | None:
        """The inline domains as the model; None when ``domains`` is a file path."""
        return Domains.model_validate(self.domains) if isinstance(self.domains, dict) else None

    @model_validator(mode="after")
    def _references(self) -> DataOpsConfig:
        problems = []
        for i, a in enumerate(self.assets):
            refs = [("database", a.database)]
            for kind, cfg in a.checks.configured():
                if hasattr(cfg, "source"):
                    refs.append((f"checks.{kind}.source.database", cfg.source.database))
            if a.pipeline is not None:
                kind, p = a.pipeline.configured()
                if getattr(p, "source_database", None) is not None:
                    refs.append((f"pipeline.{kind}.source_database", p.source_database))
                if a.pipeline.dead_letter_sink is None and a.checks.dead_letter is not None and a.checks.dead_letter.table is None:
                    problems.append(f"assets.{i}.checks.dead_letter.table: needed without a dead_letter_sink pipeline")
                if a.pipeline.dbt_incremental is not None and (self.dbt is None or self.dbt.project_dir is None):
                    problems.append(f"assets.{i}.pipeline.dbt_incremental: needs dbt.project_dir (the model is rebuilt "
                                    "with dbt)")
            elif a.checks.dead_letter is not None and a.checks.dead_letter.table is None:
                problems.append(f"assets.{i}.checks.dead_letter.table: needed without a dead_letter_sink pipeline")
            for field, name in refs:
                if name not in self.databases:
                    problems.append(f"assets.{i}.{field}: {name!r} is not under databases ({sorted(self.databases)})"
                                    + did_you_mean(name, self.databases))
            if a.mage is not None and self.integrations.mage is None:
                problems.append(f"assets.{i}.mage: needs integrations.mage (the Mage server to read)")
            names = [cfg.name for _, cfg in a.checks.configured()]
            for n in a.detect or []:
                if n not in names:
                    problems.append(f"assets.{i}.detect: {n!r} is not one of this asset's checks ({names})")
        if not self.assets and self.migration is None:
            problems.append("assets: give at least one watched asset (or a migration)")
        if self.migration is not None:
            for i, w in enumerate(self.migration.waves):
                for j, p in enumerate(w.pairs):
                    for side, ref in (("source", p.source), ("target", p.target)):
                        if ref.database not in self.databases:
                            problems.append(f"migration.waves.{i}.pairs.{j}.{side}.database: {ref.database!r} is not "
                                            f"under databases ({sorted(self.databases)})" + did_you_mean(ref.database, self.databases))
        keys = [a.key for a in self.assets]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            problems.append(f"assets: {dup} listed more than once")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def did_you_mean(name: str, known, cutoff: float = 0.6) -> str:
    """``; did you mean 'x'?`` for the closest of ``known`` (difflib), or ``""``."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_template_names(path: Path, text: str, scope: set[str]) -> None:
    """Refuse a ``{{ name }}`` the scope does not define: Jinja renders it as an empty string inside
    a longer value (``duckdb:///{{ home }}/x`` would silently become ``duckdb:////x``)."""
    import re

    import yaml
    from jinja2 import Environment, TemplateSyntaxError, meta

    known = scope | {"env", "dg", "datetime"}

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}.{i}")
        elif isinstance(value, str):
            for expr in re.findall(r"\{\{.*?\}\}", value, flags=re.S):
                try:
                    names = meta.find_undeclared_variables(Environment().parse(expr))
                except TemplateSyntaxError as e:
                    raise DwConfigError(f"{path}: {where}: the template {expr} is not valid Jinja ({e.message})") from e
                unknown = sorted(names - known)
                if unknown:
                    raise DwConfigError(f"{path}: {where}: the template {expr} uses {', '.join(unknown)}, which is "
                                        f"not defined (defined: {', '.join(sorted(known))})")

    try:
        walk(yaml.safe_load(text), "")
    except yaml.YAMLError as e:
        raise DwConfigError(f"{path}: not YAML: {e}") from e


@public
def load_dataops_config(path: str | os.PathLike[str], *, scope: Mapping[str, Any] | None = None) -> DataOpsConfig:
    """Read a :class:`DataOpsConfig` from a YAML file holding the same fields as the Component's ``attributes``.

    Templates are resolved as in a ``defs.yaml``: ``{{ env.X }}`` / ``{{ env('X', 'default') }}``
    read the environment, and every name in ``scope`` is available too (``{{ home }}``).

    Args:
        path: the YAML file.
        scope: more template values, name → value.

    Returns:
        The validated configuration (relative paths in it are not resolved here; see
        :func:`~dw_dagster.definitions.build_dw_definitions`'s ``base_dir``).

    Raises:
        DwConfigError: the file cannot be read, is not YAML, a template uses a name that is not
            defined or fails, or a field is wrong; the message starts with the file and names
            the field (and its line).
    """
    import yaml
    from dagster.components.resolved.errors import ResolutionException
    from pydantic import ValidationError

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise DwConfigError(f"{p}: cannot read the configuration ({e.strerror or e})") from e
    _check_template_names(p, text, set(scope or {}))
    try:
        cfg = DataOpsConfig.resolve_from_yaml(text, scope=dict(scope or {}))
    except ValidationError as e:
        from dw_dagster.core.config_files import describe_validation_error

        raise DwConfigError(describe_validation_error(e, text, p)) from e
    except (ResolutionException, yaml.YAMLError, ValueError, TypeError) as e:
        raise DwConfigError(f"{p}: {e}") from e
    return cfg


__all__ = [
    "ChecksConfig", "DataOpsConfig", "DatabaseConfig", "DbtConfig", "DbtCountTestConfig", "DbtIncrementalConfig", "DeadLetterConfig",
    "DeadLetterSinkConfig", "EmailConfig", "FreshnessConfig", "IncrementalLoadConfig", "IntegrationsConfig", "JiraConfig", "LightupConfig", "MageConfig", "MageSourceConfig",
    "NullRateConfig", "PagerDutyConfig", "PipelineConfig", "ReconciliationConfig", "RecordedLoadConfig", "RowDiffConfig", "ServiceNowConfig",
    "SlackConfig", "SourceRef", "VolumeConfig", "WatchedAssetConfig", "load_dataops_config",
]
