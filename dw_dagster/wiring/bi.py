"""The BI refresh after a verified receipt, from ``integrations.tableau`` / ``integrations.lightdash``.

:func:`bi_refresh_factory` gives the receipt job (:func:`dw_dagster.build_receipt_job`'s
``bi_refresh``) a function that opens the configured clients for one refresh round, credentials
read from the environment when the receipt runs. An ``optional`` integration whose URL or
credentials are not in the environment as the definitions load is left out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def _set(*names: str | None) -> bool:
    return all(n and os.environ.get(n) for n in names)


def bi_refresh_factory(integrations: Any) -> Callable[[], Any] | None:
    """A function returning the :class:`~dw_dagster.integrations.bi_refresh.BiClients` of the configured
    tools, or None when neither Tableau nor Lightdash is on."""
    t, ld = getattr(integrations, "tableau", None), getattr(integrations, "lightdash", None)
    if t is not None and t.optional and not (t.server and _set(t.token_name_env, t.token_secret_env)):
        t = None
    if ld is not None and ld.optional and not (ld.url and ld.project_uuid and _set(ld.api_key_env)):
        ld = None
    if t is None and ld is None:
        return None

    def open_clients():
        from dw_dagster.integrations.bi_refresh import BiClients

        tableau = lightdash = None
        if t is not None:
            from dw_dagster.integrations.tableau import TableauClient

            tableau = TableauClient(t.server, t.site, os.environ[t.token_name_env], os.environ[t.token_secret_env])
        if ld is not None:
            from dw_dagster.integrations.lightdash import LightdashClient

            lightdash = LightdashClient(ld.url, os.environ[ld.api_key_env], ld.project_uuid)
        return BiClients(tableau=tableau, lightdash=lightdash)

    return open_clients


__all__ = ["bi_refresh_factory"]
