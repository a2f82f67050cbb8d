"""The optional surfaces and the extra that installs each: a missing one is an ``ImportError`` naming it.

The library's hard dependencies are what its loop imports; the review page (starlette, uvicorn),
Slack's Web API client (slack_sdk), the MCP server (mcp) and each warehouse's driver come with an
extra (``pip install 'dw-dagster[review]'``), imported only when that surface is used.
"""

from __future__ import annotations

import importlib

#: extra → (what it serves, the modules it brings)
EXTRAS = {
    "review": ("the review page and Slack's interactivity endpoint (dw-dagster approvals serve)", ("starlette", "uvicorn")),
    "slack": ("Slack direct messages (slack_sdk's Web API client)", ("slack_sdk",)),
    "mcp": ("the MCP server (dw-dagster mcp)", ("mcp", "starlette", "uvicorn")),
}


def missing_extra(extra: str, error: ImportError | None = None) -> ImportError:
    """The ``ImportError`` to raise when a module of ``extra`` cannot be imported: what needs it and the pip line."""
    what, _ = EXTRAS[extra]
    missing = f" ({error.name or error} is not installed)" if error is not None else ""
    return ImportError(f"{what} needs the {extra!r} extra of dw-dagster{missing}: pip install 'dw-dagster[{extra}]'")


def require(extra: str) -> None:
    """Import the modules of ``extra``; raises :func:`missing_extra`'s error for the first that is missing."""
    for module in EXTRAS[extra][1]:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise missing_extra(extra, e) from e
