"""Metadata keys and run tags that dw_dagster writes, all under the ``dw/`` namespace.

Dagster reserves ``dagster/`` for its own keys (``dagster/row_count`` and the like); every fact
dw_dagster records on an asset lives under ``dw/`` so it can be read back from the event log by
:mod:`dw_dagster.core.records`.
"""

# AssetObservation / check-result metadata keys
INCIDENT_KEY = "dw/incident"
INCIDENT_ID_KEY = "dw/incident_id"
DIAGNOSIS_KEY = "dw/diagnosis"
DIAGNOSIS_MD_KEY = "dw/diagnosis_md"
CHANGE_SET_KEY = "dw/change_set"
CHANGE_SET_MD_KEY = "dw/change_set_md"
CHANGE_SET_ID_KEY = "dw/change_set_id"
APPROVAL_KEY = "dw/approval"
APPROVAL_REFUSED_KEY = "dw/approval_refused"
RECEIPT_KEY = "dw/receipt"
RECEIPT_MD_KEY = "dw/receipt_md"
RECEIPT_HASH_KEY = "dw/receipt_hash"

# One line that says what an event is, first among its metadata (materializations have no description)
SUMMARY_KEY = "dw/summary"

# Loader materialization metadata (incremental loads by high-watermark)
WATERMARK_COLUMN_KEY = "dw/watermark_column"
LOOKBACK_HOURS_KEY = "dw/lookback_hours"
ROWS_READ_KEY = "dw/rows_read"
ROWS_INSERTED_KEY = "dw/rows_inserted"

# Asset definition metadata ({dimension: column} of a multi-partitioned asset's other dimensions)
PARTITION_COLUMNS_KEY = "dw/partition_columns"

# Run tags
CHANGE_SET_TAG = "dw/change_set_id"
APPROVAL_TAG = "dw/approval_id"
STAGE_TAG = "dw/stage"
INCIDENT_TAG = "dw/incident_id"

# The proposer name dw_dagster signs its change sets with. An approver may never be the proposer.
PROPOSER = "dw-dagster"

# Environment variable holding the HMAC key that signs approvals.
SIGNING_KEY_ENV = "DW_APPROVAL_SIGNING_KEY"

# -- cost (dw_dagster.cost) ---------------------------------------------------------------------
# The query tag dw_dagster's database resources put on every statement they issue inside a Dagster
# step (Snowflake QUERY_TAG and an appended /* ... */ comment; BigQuery job labels and the comment),
# so the warehouse's own query history says which run, asset and partition a query served.
QUERY_TAG_APP = "dw_dagster"
QUERY_TAG_APP_KEY = "app"
QUERY_TAG_RUN_KEY = "dagster_run_id"
QUERY_TAG_ASSET_KEY = "asset_key"
QUERY_TAG_PARTITION_KEY = "partition"
# What dbt puts in its query comment (``node_id``) and in its query tag / BigQuery job labels.
DBT_NODE_ID_KEY = "node_id"
DBT_INVOCATION_ID_KEY = "dbt_invocation_id"
DBT_INVOCATION_ID_ALT_KEY = "invocation_id"

# Daily cost observation metadata (numeric, so the Dagster UI plots them per asset)
COST_CREDITS_KEY = "dw/cost_credits"
COST_BYTES_BILLED_KEY = "dw/cost_bytes_billed"
COST_USD_KEY = "dw/cost_usd"
COST_SLOT_MS_KEY = "dw/cost_slot_ms"
COST_SECONDS_KEY = "dw/cost_seconds"
COST_QUERIES_KEY = "dw/cost_queries"
COST_DAY_KEY = "dw/cost_day"
COST_ENGINE_KEY = "dw/cost_engine"
COST_REPORT_KEY = "dw/cost_report"
# A receipt's evidence_summary key holding what its repair cost
REPAIR_COST_KEY = "repair_cost"
COST_JOB_NAME = "dw_cost_observations"
COST_OP_NAME = "dw_observe_cost"
COST_REPORT_ASSET_PREFIX = "dw_cost"
WAREHOUSE_ASSET_PREFIX = "warehouse"
WAREHOUSE_SAVING_CHECK = "warehouse_saving"
WAREHOUSE_SETTING_STEP = "warehouse_setting"
COST_KIND = "cost"
COST_METERED_KEY = "dw/cost_metered"
COST_ATTRIBUTED_KEY = "dw/cost_attributed"
COST_IDLE_KEY = "dw/cost_idle"
COST_UNATTRIBUTED_KEY = "dw/cost_unattributed"
# The warehouse_saving check's metadata (what the receipt says was saved)
SAVING_EXPECTED_KEY = "dw/saving_expected"
SAVING_MEASURED_KEY = "dw/saving_measured"
SAVING_BEFORE_KEY = "dw/credits_per_day_before"
SAVING_AFTER_KEY = "dw/credits_per_day_after"
SAVING_SINCE_KEY = "dw/measure_since"
SAVING_UNTIL_KEY = "dw/measure_until"
SAVING_DAYS_KEY = "dw/metered_days"
SAVING_RULE_KEY = "dw/rule"
SAVING_EVIDENCE_KEY = "dw/evidence_sql"
# The jobs and the sensor that carry an approved warehouse change
WAREHOUSE_VERIFY_JOB = "dw_warehouse_verify"
WAREHOUSE_RECEIPT_JOB = "dw_warehouse_receipts"
WAREHOUSE_SENSOR = "dw_warehouse_remediation_sensor"

# Access requests (dw_dagster.access): time-bound grants the data owners approve
#: the asset whose events show every access request, grant, reminder, revoke and receipt
ACCESS_ASSET = "dw_access"
ACCESS_REQUEST_KEY = "dw/access_request"
ACCESS_EVENT_KEY = "dw/access_event"
ACCESS_RECEIPT_KEY = "dw/access_receipt"
ACCESS_RECEIPT_MD_KEY = "dw/access_receipt_md"
ACCESS_RECEIPT_HASH_KEY = "dw/access_receipt_hash"
ACCESS_RECEIPT_SIG_KEY = "dw/access_receipt_sig"
ACCESS_REQUEST_ID_KEY = "dw/access_request_id"
ACCESS_REQUEST_TAG = "dw/access_request_id"
#: jobs, ops and the sensor of the access machinery; ``dw/kind`` of its jobs (a ticket is needed)
ACCESS_GRANT_JOB = "dw_access_grant"
ACCESS_REVOKE_JOB = "dw_access_revoke"
ACCESS_GRANT_OP = "dw_apply_access_grant"
ACCESS_REVOKE_OP = "dw_revoke_access_grant"
ACCESS_SENSOR = "dw_access_sensor"
ACCESS_KIND = "access"
#: the resource key of the pager a failed revoke pages through
ACCESS_PAGER_KEY = "dw_access_pager"
#: the step kind of an access change set (its stages: ``grant``, then ``revoke-1``, ``revoke-2`` ...)
ACCESS_STEP_KIND = "access_grant"
#: prefix of the change sets that ask one domain's owners to approve an access request
ACCESS_CHANGE_SET_PREFIX = "ar-"
# The escalation ladder and notifications (integrations/notifications.py)
ESCALATION_KEY = "dw/escalation"
EXPIRED_KEY = "dw/change_set_expired"
NOTIFICATION_KEY = "dw/notification"
NOTIFICATION_STEP_KEY = "dw/notification_step"
UNREACHABLE_KEY = "dw/unreachable"

# The approval job's run ends successfully when it refused a decision: a refusal is an outcome, not a failure
DECISION_TAG = "dw/decision"
REFUSAL_TAG = "dw/refusal_reason"

# Evidence masked before it leaves the warehouse (lineage/sensitive.py): the columns whose values were masked
MASKED_COLUMNS_KEY = "dw/masked_columns"

# Check evaluation metadata that notifications and the review site read back
QUERY_KEY = "dw/query"
QUERIES_KEY = "dw/queries"
SLICES_JSON_KEY = "dw/slices_json"

# ---- migrations (dw_dagster.migration): waves of table pairs, parity checks, the completion gate ----
#: the parity kinds a pair is checked for, in the order they are reported
PARITY_SCHEMA = "schema"
PARITY_COUNTS = "counts"
PARITY_KEY_DIFF = "key_diff"
PARITY_LIGHTUP = "lightup"
PARITY_KINDS = (PARITY_SCHEMA, PARITY_COUNTS, PARITY_KEY_DIFF, PARITY_LIGHTUP)
#: the asset check of each parity kind on a pair's target asset (``parity_counts`` ...)
PARITY_CHECK_PREFIX = "parity_"
#: the first part of every wave asset's key: ``migration/<migration>/<wave>``
MIGRATION_ASSET_PREFIX = "migration"
#: the job that evaluates one wave's parity and materializes its wave asset: ``dw_migration__<migration>__<wave>``
MIGRATION_WAVE_JOB_PREFIX = "dw_migration__"
#: the multi-check op evaluating one wave's pairs: ``dw_parity__<migration>__<wave>``
MIGRATION_PARITY_OP_PREFIX = "dw_parity__"
#: the schedule running a migration's wave jobs: ``dw_migration_schedule__<migration>``
MIGRATION_SCHEDULE_PREFIX = "dw_migration_schedule__"
#: the step kind and change class of a wave sign-off (a change set whose only step records the sign-off)
WAVE_SIGN_OFF = "wave_sign_off"
#: the step job that records a sign-off after the owner's verified approval
WAVE_SIGN_OFF_JOB = "dw_step_wave_sign_off"
#: the receipt kind of an ordinary repair (receipts recorded before kinds existed are this kind)
RECEIPT_KIND_REPAIR = "change_set"
#: the id prefix of a wave's sign-off change set
SIGN_OFF_ID_PREFIX = "so-"
#: wave asset metadata: the wave's state as JSON (pairs, streaks, evidence), its table, its numbers
MIGRATION_WAVE_KEY = "dw/migration_wave"
MIGRATION_PAIRS_TABLE_KEY = "dw/migration_pairs"
MIGRATION_STATE_KEY = "dw/migration_state"
MIGRATION_PAIRS_HOLDING_KEY = "dw/pairs_holding"
MIGRATION_PAIRS_TOTAL_KEY = "dw/pairs_total"
MIGRATION_ROWS_COMPARED_KEY = "dw/rows_compared"
MIGRATION_LARGEST_GAP_KEY = "dw/largest_gap_pct"
MIGRATION_EVIDENCE_HASH_KEY = "dw/evidence_hash"
MIGRATION_REOPENED_KEY = "dw/migration_reopened"
#: parity check result metadata: the kind, the pair, the SQL run and the values compared
PARITY_KIND_KEY = "dw/parity_kind"
PARITY_PAIR_KEY = "dw/parity_pair"
PARITY_VALUES_KEY = "dw/parity_values"
PARITY_SQL_KEY = "dw/parity_sql"
CHECK_KIND_KEY = "dw/check_kind"
#: ledger control key of a wave's gate state (round, sign-off, reopen): ``migration:<migration>/<wave>``
MIGRATION_CONTROL_PREFIX = "migration:"
#: run tag on a wave job's runs naming the migration and wave
MIGRATION_TAG = "dw/migration"
WAVE_TAG = "dw/wave"
#: parity check metadata beside the above: seconds taken, the column mapping table, the cut-off of
#: closed partitions, the Lightup compare metric read, the pair's tables on the check's spec
PARITY_SECONDS_KEY = "dw/seconds"
PARITY_COLUMNS_KEY = "dw/columns"
COMPARED_UP_TO_KEY = "dw/compared_up_to"
LIGHTUP_METRIC_KEY = "dw/lightup_metric"
SOURCE_TABLE_KEY = "dw/source_table"
TARGET_TABLE_KEY = "dw/target_table"
#: undo: the rows a restore took back (per partition, with the table keeping them), on the
#: materialization that records the restored partition (beside LOADS_KEY, the load the kept rows came from)
UNDO_TAKEN_KEY = "dw/undo_taken_back"

# -- dw_dagster.approval.job -------------------------------------------------------------------------
KIND_KEY = "dw/kind"

# -- dw_dagster.checks.dead_letter -------------------------------------------------------------------
REASONS_JSON_KEY = "dw/reasons_json"
REASONS_KEY = "dw/reasons"
SINCE_UTC_KEY = "dw/since_utc"
PARKED_ROWS_KEY = "dw/parked_rows"
TABLE_KEY = "dw/table"

# -- dw_dagster.checks.freshness ---------------------------------------------------------------------
MAX_LAG_KEY = "dw/max_lag"
REASON_KEY = "dw/reason"
ROWS_KEY = "dw/rows"
REQUIRED_AFTER_UTC_KEY = "dw/required_after_utc"
LAG_SECONDS_KEY = "dw/lag_seconds"
MAX_TIMESTAMP_UTC_KEY = "dw/max_timestamp_utc"
TIMESTAMP_COLUMN_KEY = "dw/timestamp_column"

# -- dw_dagster.checks.null_rate ---------------------------------------------------------------------
COLUMNS_JSON_KEY = "dw/columns_json"

# -- dw_dagster.checks.reconcile ---------------------------------------------------------------------
CHANGE_SET_VERSION_KEY = "dw/change_set_version"
COMPARED_PARTITIONS_KEY = "dw/compared_partitions"
TARGET_RESOURCE_KEY_KEY = "dw/target_resource_key"
SOURCE_RESOURCE_KEY_KEY = "dw/source_resource_key"
KEY_COLUMNS_KEY = "dw/key_columns"
MEASURES_KEY = "dw/measures"
SLICE_BY_KEY = "dw/slice_by"
READ_ATTEMPTS_KEY = "dw/read_attempts"
FAILING_SLICES_KEY = "dw/failing_slices"
WORST_GAP_PCT_KEY = "dw/worst_gap_pct"
WORST_SLICE_KEY = "dw/worst_slice"
TARGET_ROWS_KEY = "dw/target_rows"
SOURCE_ROWS_KEY = "dw/source_rows"
GAP_ROWS_KEY = "dw/gap_rows"
SLICES_KEY = "dw/slices"
INCONCLUSIVE_KEY = "dw/inconclusive"

# -- dw_dagster.checks.rowdiff.check -----------------------------------------------------------------
BYTES_SENT_KEY = "dw/bytes_sent"
BYTES_FETCHED_KEY = "dw/bytes_fetched"
DOWNLOAD_PASSES_KEY = "dw/download_passes"
TRANSFER_KEY = "dw/transfer"
TRANSFER_PROBE_MBPS_KEY = "dw/transfer_probe_mbps"
ROWS_DOWNLOADED_KEY = "dw/rows_downloaded"
BUCKETS_DOWNLOADED_KEY = "dw/buckets_downloaded"
BUCKETS_COMPARED_KEY = "dw/buckets_compared"
TIMESTAMP_RULE_KEY = "dw/timestamp_rule"
WARNINGS_KEY = "dw/warnings"
KEY_SAMPLE_KEY = "dw/key_sample"
CHANGED_COLUMNS_KEY = "dw/changed_columns"
COLLISIONS_KEY = "dw/collisions"
COLLIDED_TARGET_KEY = "dw/collided_target"
COLLIDED_SOURCE_KEY = "dw/collided_source"
DUPLICATED_TARGET_KEY = "dw/duplicated_target"
DUPLICATED_SOURCE_KEY = "dw/duplicated_source"
CHANGED_KEY = "dw/changed"
EXTRA_KEY = "dw/extra"
MISSING_KEY = "dw/missing"

# -- dw_dagster.checks.volume ------------------------------------------------------------------------
DAYS_OUT_OF_BAND_KEY = "dw/days_out_of_band"
DAYS_JSON_KEY = "dw/days_json"
DAYS_KEY = "dw/days"

# -- dw_dagster.core.records -------------------------------------------------------------------------
LOADS_KEY = "dw/loads"
QUARANTINED_KEY = "dw/quarantined"

# -- dw_dagster.detection.lightup --------------------------------------------------------------------
INCIDENTS_KEY = "dw/incidents"
ONGOING_INCIDENTS_KEY = "dw/ongoing_incidents"
LIGHTUP_URL_KEY = "dw/lightup_url"
LIGHTUP_UPDATED_TS_KEY = "dw/lightup_updated_ts"
GAPS_KEY = "dw/gaps"
GAP_PCT_KEY = "dw/gap_pct"
WINDOW_END_KEY = "dw/window_end"
WINDOW_START_KEY = "dw/window_start"
COMPARE_METRIC_KEY = "dw/compare_metric"
LIGHTUP_STATUS_KEY = "dw/lightup_status"
LIGHTUP_ONGOING_KEY = "dw/lightup_ongoing"
LIGHTUP_ID_KEY = "dw/lightup_incident"

# -- dw_dagster.detection.volume.history -------------------------------------------------------------
VOLUME_TABLE_KEY = "dw/volume_table"
VOLUME_OPEN_INCIDENT_KEY = "dw/volume_open_incident"
VOLUME_DEAD_LETTER_KEY = "dw/volume_dead_letter"
VOLUME_DEVIATION_KEY = "dw/volume_deviation_pct"
VOLUME_UPPER_KEY = "dw/volume_upper"
VOLUME_LOWER_KEY = "dw/volume_lower"
VOLUME_MEAN_KEY = "dw/volume_mean"
VOLUME_BASELINE_N_KEY = "dw/volume_baseline_n"
VOLUME_CHANGE_KEY = "dw/volume_change"
VOLUME_PARTITION_KEY = "dw/volume_partition"
VOLUME_SOURCE_KEY = "dw/volume_source"
VOLUME_STATUS_KEY = "dw/volume_status"

# -- dw_dagster.detection.volume.sensor --------------------------------------------------------------
VOLUME_UNOBSERVED_KEY = "dw/volume_unobserved_counts"

# -- dw_dagster.diagnosis.causes.schema_change -------------------------------------------------------
SCHEMA_CHANGES_KEY = "dw/schema_changes"
SCHEMA_HASH_KEY = "dw/schema_hash"
SCHEMA_KEY = "dw/schema"

# -- dw_dagster.diagnosis.sink_diagnoser -------------------------------------------------------------
STEPS_MD_KEY = "dw/change_set_steps_md"

# -- dw_dagster.integrations.outcomes ----------------------------------------------------------------
DW_PREFIX = "dw/"

# -- dw_dagster.mcp.changes --------------------------------------------------------------------------
LAUNCHED_BY_KEY = "dw/launched_by"

# -- dw_dagster.pipelines.dbt_incremental ------------------------------------------------------------
INCREMENTAL_RUN_KEY = "dw/incremental_run"

# -- dw_dagster.receipts.chain -----------------------------------------------------------------------
RECEIPT_SIG_KEY = "dw/receipt_sig"

# -- dw_dagster.guard.stop -----------------------------------------------------------------------
STOPPED_KEY = "dw/stopped"
STOP_KEY = "dw/stop"

# -- dw_dagster.guard.admission -------------------------------------------------------------------------
TICKET_TAG = "dw/ticket"

# -- dw_dagster.repair.mage_rerun --------------------------------------------------------------------
MAGE_RUN_URL_KEY = "dw/mage_run_url"
MAGE_RUN_ID_KEY = "dw/mage_run_id"
MAGE_RERUNS_JSON_KEY = "dw/mage_reruns_json"
MAGE_AFTER_UTC_KEY = "dw/mage_after_utc"
MAGE_STATUS_KEY = "dw/mage_status"
MAGE_PIPELINE_KEY = "dw/mage_pipeline"

# -- dw_dagster.repair.replay_checks -----------------------------------------------------------------
EXPECTED_ROWS_KEY = "dw/expected_rows"
REPLAYED_ROWS_KEY = "dw/replayed_rows"
PARKED_STATES_JSON_KEY = "dw/parked_states_json"
DUPLICATED_KEY = "dw/duplicated"
PRESENT_ONCE_KEY = "dw/present_once"
PARKED_KEYS_KEY = "dw/parked_keys"

# -- dw_dagster.repair.sensor ------------------------------------------------------------------------
APPROVAL_WITHDRAWN_KEY = "dw/approval_withdrawn"

# -- dw_dagster.changes.steps -------------------------------------------------------------------------
STEP_KIND_KEY = "dw/step_kind"
REFUSAL_KEY = "dw/refusal"
STEP_STAGE_KEY = "dw/step_stage"
STEP_RESULT_KEY = "dw/step_result"

# -- dw_dagster.repair.undo --------------------------------------------------------------------------
SNAPSHOT_KEY = "dw/undo_snapshot"

#: the check that runs the tests a fix added (issue 31), its metadata (the tests and their results),
#: the step kind that replaces a duplicated load's partitions, and the receipt's entry naming the tests
NEW_TESTS_CHECK = "dw_new_tests"
NEW_TESTS_KEY = "dw/new_tests_json"
NEW_TESTS_RUN_KEY = "dw/new_tests_run"
CHANGE_SET_VERSION_TAG = "dw/change_set_version"
DEDUPE_STEP = "dedupe"
#: a receipt's ``evidence_summary`` entry: the tests the fix added, with their verify-run results
RECEIPT_NEW_TESTS = "new_tests"
DBT_BUILD_STEP = "dbt_build"
#: after a verified receipt: the BI refreshes of the blast radius (issue 31 item 3) and the receipt they follow
BI_REFRESHED_KEY = "dw/bi_refreshed"
#: a receipt whose BI refreshes failed or landed after their deadline: paged and escalated once (notify_bi)
BI_ESCALATION_KEY = "dw/bi_escalation"
RECEIPT_ID_KEY = "dw/receipt_id"

# -- job, op and sensor names (typed once, here: a test fails on a copy typed elsewhere) ------------
DIAGNOSIS_JOB = "dw_diagnose_incident"  # the diagnosis job and its op
DIAGNOSE_OP = "dw_diagnose"
APPROVAL_JOB = "dw_approve_change_set"  # the approval job and its op (launched by name)
APPROVAL_OP = "dw_record_decision"
RECEIPT_JOB = "dw_receipts"  # the receipt job and its op
RECEIPT_OP = "dw_write_receipts"
STOP_JOB = "dw_stop"  # the org-wide stop: its jobs and ops, and the asset whose events show it
STOP_OP = "dw_set_stop"
RESUME_JOB = "dw_resume"
RESUME_OP = "dw_lift_stop"
CONTROL_ASSET_NAME = "dw_control"
WINDOW_JOB = "dw_rerun_window"  # the repair jobs ``build_dw_definitions`` defines
REBUILD_JOB = "dw_rebuild_downstream"
VERIFY_JOB = "dw_verify"
UNDO_SNAPSHOT_JOB = "dw_undo_snapshot"  # undo: the snapshot and restore jobs and their ops
UNDO_RESTORE_JOB = "dw_undo_restore"
SNAPSHOT_OP = "dw_snapshot_window"
RESTORE_OP = "dw_restore_window"
STEP_JOB_PREFIX = "dw_step_"  # a step job is ``dw_step_<kind>``, its op ``dw_apply_<kind>_step``
STEP_OP_PREFIX = "dw_apply_"
GUARDED_EXECUTOR_PREFIX = "dw_guarded_"  # the guarded executor wraps an executor as ``dw_guarded_<name>``
REMEDIATION_SENSOR = "dw_remediation_sensor"  # the sensors
EXPIRY_SENSOR = "dw_expiry_sensor"
CHECK_INCIDENT_SENSOR = "dw_check_incident_sensor"
LIGHTUP_SENSOR = "dw_lightup_incident_sensor"
VOLUME_SENSOR = "dw_volume_sensor"
NOTIFICATION_SENSOR = "dw_notification_sensor"

# -- job kinds: the dw/kind job tag the guard reads from the job definition (REPAIR_KINDS need a ticket) --
WINDOW_KIND = "window"
STEP_KIND = "step"
UNDO_KIND = "undo"
REBUILD_KIND = "rebuild"
RECEIPT_KIND = "receipt"
CHECK_KIND = "check"
CONTROL_KIND = "control"
DIAGNOSIS_KIND = "diagnosis"
APPROVAL_KIND = "approval"
REPAIR_KINDS = frozenset({WINDOW_KIND, STEP_KIND, UNDO_KIND, REBUILD_KIND, RECEIPT_KIND, ACCESS_KIND})

# -- asset-check names (the defaults of the check builders) -----------------------------------------
RECONCILIATION_CHECK = "reconciliation"
ROW_DIFF_CHECK = "row_diff"
VOLUME_CHECK = "daily_volume"
NULL_RATE_CHECK = "null_rate"
FRESHNESS_CHECK = "freshness"
DEAD_LETTER_CHECK = "dead_letter"
SCHEMA_CHANGE_CHECK = "schema_change"
LIGHTUP_CHECK = "lightup_compare"
REPLAYED_CHECK = "parked_rows_replayed"  # the dead-letter replay's two checks
NO_NEW_DLQ_CHECK = "no_new_dead_letters"
MAGE_RERUN_CHECK = "mage_rerun"  # the check that waits for a Mage pipeline's rerun (the manual step's check)
