"""The demos' BI tools on loopback: the fake Tableau and the fake Lightdash, with the environment a deployment gives.

:class:`BiFakes` starts the fakes (:mod:`dw_dagster_dev.fakes.tableau_server`,
:mod:`dw_dagster_dev.fakes.lightdash_server`; uvicorn in threads of this process) and, while
they run, sets what ``integrations.tableau`` / ``integrations.lightdash`` of a demo's
``dataops.yaml`` read: ``TABLEAU_SERVER``, ``TABLEAU_TOKEN_NAME``, ``TABLEAU_TOKEN_SECRET``,
``LIGHTDASH_URL``, ``LIGHTDASH_PROJECT_UUID``, ``LIGHTDASH_API_KEY``; the environment is put
back afterwards. :func:`bi_refreshed` reads a receipt's refreshes back from the instance.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.models import BlastRadius
from dw_dagster_dev.fakes.lightdash_server import FakeLightdash, FakeLightdashServer
from dw_dagster_dev.fakes.tableau_server import FakeTableau, FakeTableauServer


class BiFakes:
    """Start the fakes for the named workbooks (Tableau) and dashboards (Lightdash); a context manager."""

    def __init__(self, *, workbooks: tuple[str, ...] = (), dashboards: dict[str, list[str]] | None = None,
                 site: str = "grocer") -> None:
        self.tableau = FakeTableau(site=site, workbooks={w: True for w in workbooks}, polls_to_finish=1) if workbooks else None
        self.lightdash = FakeLightdash(dashboards=dashboards, polls_to_ready=1) if dashboards else None
        self.env: dict[str, str] = {}
        self._stack = ExitStack()
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> "BiFakes":
        try:
            if self.tableau is not None:
                srv = self._stack.enter_context(FakeTableauServer(self.tableau))
                self.env.update(TABLEAU_SERVER=srv.url, TABLEAU_TOKEN_NAME=self.tableau.token_name,
                                TABLEAU_TOKEN_SECRET=self.tableau.token_secret)
            if self.lightdash is not None:
                srv = self._stack.enter_context(FakeLightdashServer(self.lightdash))
                self.env.update(LIGHTDASH_URL=srv.url, LIGHTDASH_PROJECT_UUID=self.lightdash.project_uuid,
                                LIGHTDASH_API_KEY=self.lightdash.token)
        except BaseException:
            self._stack.close()
            raise
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._stack.close()

    def urls(self) -> str:
        """``Tableau http://...; Lightdash http://...`` for the demo's setup line."""
        return "; ".join(f"fake {name} {self.env[var]}" for name, var in (("Tableau", "TABLEAU_SERVER"),
                                                                         ("Lightdash", "LIGHTDASH_URL")) if var in self.env)


def needed_by(br: BlastRadius) -> dict[str, str]:
    """Each exposure of the blast radius with a ``needed_by``: name → the deadline as written."""
    return {e.name: e.needed_by for e in br.exposures if e.needed_by}


def bi_refreshed(instance: dg.DagsterInstance, asset_key: list[str], change_set_id: str) -> list[dict]:
    """The refreshes recorded after the receipt of ``change_set_id`` (``dw/bi_refreshed``), each as
    ``{exposure, tool, refreshed_at, deadline, before_deadline}``; empty when none was recorded."""
    for rec in instance.fetch_observations(dg.AssetKey(asset_key), limit=500).records:
        md = rec.asset_observation.metadata if rec.asset_observation else {}
        cs = md.get(c.CHANGE_SET_ID_KEY)
        if c.BI_REFRESHED_KEY in md and getattr(cs, "value", cs) == change_set_id:
            return [{k: row.get(k) for k in ("exposure", "tool", "refreshed_at", "deadline", "before_deadline", "error")}
                    for row in md[c.BI_REFRESHED_KEY].value]
    return []


__all__ = ["BiFakes", "bi_refreshed", "needed_by"]
