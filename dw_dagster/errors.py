"""The root of dw_dagster's errors: catch :class:`DwDagsterError` to catch any of them.

Each error says what was wrong and where (the file and field, the table, the change set) and
what to do next; nothing is half-written when one is raised. The root is a ``dagster.Failure``
(as dagster-dbt's ``DagsterDbtError`` is), so an op that lets one through fails its step with
the message as the failure's description, which the Dagster UI shows first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
from dw_dagster.dagster_private import public


@public
class DwDagsterError(dg.Failure):
    """Base class of every error dw_dagster raises on purpose.

    Raised like any exception (``DwDagsterError("what went wrong")``, or with ``description=`` as a
    ``dagster.Failure``); the first argument is the description. ``metadata`` and ``allow_retries`` are ``Failure``'s.
    """

    def __init__(self, *args: Any, description: str | None = None, metadata: Mapping[str, Any] | None = None,
                 allow_retries: bool | None = None) -> None:
        if description is not None:
            args = (description, *args)
        super().__init__(description=str(args[0]) if args else None, metadata=metadata, allow_retries=allow_retries)
        self.args = args  # as raised: str(), repr() and pickling see the arguments given


@public
class DwConfigError(DwDagsterError, ValueError):
    """The configuration of the loop does not fit together; the message names the field."""


__all__ = ["DwConfigError", "DwDagsterError"]
