"""Remediation: change sets, the approval job, repair sensors, receipts."""

from dw_dagster.remediation.approval import APPROVAL_JOB_NAME, approve_in_process, build_approval_job
from dw_dagster.remediation.proposals import DbtCountTest, apply_change_set, propose_watermark_fix
from dw_dagster.remediation.receipts import RECEIPT_JOB_NAME, build_receipt_job
from dw_dagster.remediation.sensors import build_check_incident_sensor, build_remediation_sensor

__all__ = [
    "APPROVAL_JOB_NAME",
    "RECEIPT_JOB_NAME",
    "DbtCountTest",
    "apply_change_set",
    "approve_in_process",
    "build_approval_job",
    "build_check_incident_sensor",
    "build_receipt_job",
    "build_remediation_sensor",
    "propose_watermark_fix",
]
