from dw_dagster import VolumeTable, build_volume_sensor
from dw_dagster.detection.volume import days_ago

volume = build_volume_sensor(
    tables=[VolumeTable("pos.sales_line", "store_sales_line"),                        # catalog row count
            VolumeTable("pos.sales_line_dlq", "store_sales_line", dead_letter=True),  # any growth reported
            VolumeTable("pos.sales_line", "store_sales_line", partition_column="sale_ts",
                        partition=days_ago(1))],                                     # COUNT(*) of one day
    diagnosis_job_name="dw_diagnose_incident", min_history=7, history_length=28,
)
