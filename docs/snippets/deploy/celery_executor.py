from dagster_celery import celery_executor  # or dagster_k8s.k8s_job_executor, dg.multiprocess_executor
from dw_dagster import build_dw_definitions

defs = build_dw_definitions("dataops.yaml", executor=celery_executor.configured(
    {"broker": "pyamqp://guest:guest@rabbitmq:5672//", "backend": "rpc://"}))
