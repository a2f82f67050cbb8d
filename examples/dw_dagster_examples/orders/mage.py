"""The orders story's Mage, for the demo: a fake Mage OSS server with the stream and the finance batch.

In the orders story the stream (``orders_stream``, a streaming pipeline) and the nightly
``finance_daily`` batch run in Mage. :class:`OrdersMage` serves the protocol-accurate fake
(:mod:`dw_dagster_dev.fakes.mage_server`, user authentication on) with their history: one stream
run ``running`` since the first day of the data (healthy throughout), and one ``finance_daily`` run
per night at 02:00 UTC that completed (every Mage run green while the warehouse is short). It sets
``$MAGE_URL``, ``$MAGE_EMAIL`` and ``$MAGE_PASSWORD`` while it runs (``dataops.yaml`` reads Mage's URL
from ``$MAGE_URL``), and :meth:`OrdersMage.rerun` plays the engineer who reruns ``finance_daily``
after the fix, with the pipeline's API trigger, as Mage's UI or ``mage-agent run_pipeline`` would.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import httpx

from dw_dagster_examples.orders import generator as gen
from dw_dagster_dev.fakes.mage_server import DEFAULT_EMAIL, DEFAULT_PASSWORD, FakeMage, FakeMageServer

STREAM, BATCH = "orders_stream", "finance_daily"
RERUN_TRIGGER = "engineer_rerun"
#: the variables MageResource reads (dw_dagster.integrations.mage)
URL_ENV, EMAIL_ENV, PASSWORD_ENV = "MAGE_URL", "MAGE_EMAIL", "MAGE_PASSWORD"
UTC = dt.timezone.utc


class OrdersMage:
    """The fake Mage of the orders story, as a context manager (module docstring).

    Attributes:
        url: the server's URL once started.
        state: the fake's state (pipelines, triggers, runs).
    """

    def __init__(self) -> None:
        self.state = FakeMage()
        self.server = FakeMageServer(self.state)
        self.url = self.server.url
        self._saved: dict[str, str | None] = {}
        s = self.state
        s.add_pipeline(STREAM, type="streaming", description="the orders change stream into analytics.orders")
        s.add_pipeline(BATCH, description="the nightly finance models built on analytics.orders")
        s.add_block(BATCH, "load_orders", "data_loader")
        s.add_block(BATCH, "gmv_by_day", "transformer", upstream_blocks=["load_orders"])
        first = dt.datetime.combine(gen.FIRST_DAY, dt.time(), UTC)
        s.add_run(STREAM, "running", first + dt.timedelta(minutes=5), trigger="stream")
        day = gen.INCIDENT_DAY - dt.timedelta(days=3)
        while day <= gen.INCIDENT_DAY + dt.timedelta(days=1):
            start = dt.datetime.combine(day, dt.time(2), UTC)
            s.add_run(BATCH, "completed", start, start + dt.timedelta(minutes=4), trigger="nightly")
            day += dt.timedelta(days=1)
        self._trigger = s.add_trigger(BATCH, RERUN_TRIGGER, schedule_type="api")

    def __enter__(self) -> OrdersMage:
        self.server.start()
        env = {URL_ENV: self.url, EMAIL_ENV: DEFAULT_EMAIL, PASSWORD_ENV: DEFAULT_PASSWORD}
        for k, v in env.items():
            self._saved[k] = os.environ.get(k)
            os.environ[k] = v
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.server.stop()

    def rerun(self, pipeline: str = BATCH) -> dict[str, Any]:
        """Start a run of ``pipeline`` as the engineer would (its API trigger); returns the run as Mage shows it.

        Raises:
            httpx.HTTPError: the fake refused (it does not).
        """
        if pipeline != BATCH:
            raise ValueError(f"the orders story reruns {BATCH} only, not {pipeline!r}")
        t = self._trigger
        r = httpx.post(f"{self.url}/api/pipeline_schedules/{t['id']}/pipeline_runs/{t['token']}",
                       json={"pipeline_run": {"variables": {}}}, timeout=10)
        r.raise_for_status()
        return r.json()["pipeline_run"]


__all__ = ["BATCH", "STREAM", "OrdersMage"]
