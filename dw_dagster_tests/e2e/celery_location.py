"""The store-sales code location with the loop's jobs on ``dagster-celery`` (loaded by test_celery).

The same location as ``dw_dagster_examples.store_sales.definitions`` (home from
``$DW_STORE_SALES_HOME``), built with ``executor=celery_executor`` on the loopback RabbitMQ broker:
every step of a repair stage (snapshot, window, rebuild, verify, receipt) is a celery task that a
worker started by the test runs; the guard stays in front of it.
"""

import dagster as dg
from dagster_celery import celery_executor

from dw_dagster_examples.store_sales.definitions import build_definitions
from dw_dagster_tests.harness.celery_cluster import BROKER

LOCATION = "store_sales_celery"
#: dagster-celery's executor on the loopback broker, results back through it (rpc://)
CELERY = celery_executor.configured({"broker": BROKER, "backend": "rpc://"}, name="celery")


@dg.definitions
def defs() -> dg.Definitions:
    """The store-sales location whose loop runs its steps on celery workers."""
    return build_definitions(executor=CELERY)
