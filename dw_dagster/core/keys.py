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

# Run tags
CHANGE_SET_TAG = "dw/change_set_id"
APPROVAL_TAG = "dw/approval_id"
STAGE_TAG = "dw/stage"
INCIDENT_TAG = "dw/incident_id"

# The proposer name dw_dagster signs its change sets with. An approver may never be the proposer.
PROPOSER = "dw-dagster"

# Environment variable holding the HMAC key that signs approvals.
SIGNING_KEY_ENV = "DW_APPROVAL_SIGNING_KEY"

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
