"""Causes: each module tests one cause and reports evidence, confidence and the unexplained rest."""

from dw_dagster.diagnosis.watermark import PartitionLoad, diagnose_late_rows

__all__ = ["PartitionLoad", "diagnose_late_rows"]
