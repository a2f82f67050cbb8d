"""Errors that name their cause: the whole chain of an exception, and the fix when it is known.

Loading a code location wraps what went wrong: Dagster's "Error while building definitions" (or
"Error occurred while loading ...") is the first line, the cause (``FileNotFoundError: ... 'dbt'``)
sits two links down. :func:`cause_chain` walks ``__cause__`` / ``__context__`` (and Dagster's
serialized ``cause`` of a user-code error) and :func:`explain` joins the links, newest last, with
the fix when one is known (:data:`KNOWN_FIXES`), e.g. dbt not on ``PATH`` when a server is started
as ``.venv/bin/dw-dagster`` by an MCP client without the venv activated.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_MAX = 300


def _line(e: BaseException | object) -> str:
    name = type(e).__name__ if isinstance(e, BaseException) else (getattr(e, "cls_name", "") or "Error")
    text = str(e).strip() if isinstance(e, BaseException) else (getattr(e, "message", "") or "").strip()
    first = text.splitlines()[0] if text else ""
    head, sep, rest = first.partition(": ")
    if sep and (head == name or head.endswith("." + name)):
        first = rest
    return f"{name}: {first[:_MAX]}".rstrip(": ")


def cause_chain(e: BaseException) -> list[BaseException | object]:
    """``e`` and every exception (or serialized error) that caused it, outermost first."""
    out: list = []
    seen: set[int] = set()
    cur: object = e
    while cur is not None and id(cur) not in seen and len(out) < 20:
        seen.add(id(cur))
        out.append(cur)
        if isinstance(cur, BaseException):
            nxt = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
            infos = getattr(cur, "user_code_process_error_infos", None) or []
            cur = nxt or (infos[0] if infos else None)
        else:
            cur = getattr(cur, "cause", None) or getattr(cur, "context", None)
    return out


def _dbt_missing(chain: list) -> bool:
    for e in chain:
        text = _line(e)
        if isinstance(e, FileNotFoundError) and (getattr(e, "filename", None) or "").rsplit("/", 1)[-1] == "dbt":
            return True
        if re.search(r"No such file or directory: '(?:[^']*/)?dbt'", text) or "dbt executable" in text.lower():
            return True
    return False


#: (test over the chain, the fix in words)
KNOWN_FIXES: list[tuple[Callable[[list], bool], str]] = [
    (_dbt_missing, "dbt is not on PATH: pass --dbt-executable (the dbt of the project's venv, e.g. "
                   ".venv/bin/dbt), set DW_DBT_EXECUTABLE, or put the venv's bin first on PATH "
                   "(PATH=\"$PWD/.venv/bin:$PATH\") in the command that starts the server"),
]


def known_fix(e: BaseException) -> str | None:
    """The fix for a known cause anywhere in ``e``'s chain, or None."""
    chain = cause_chain(e)
    return next((fix for test, fix in KNOWN_FIXES if test(chain)), None)


def explain(e: BaseException) -> str:
    """``Outer: message ← caused by Inner: message ← ...`` plus ``; fix: ...`` when the cause is known."""
    links, out = [_line(x) for x in cause_chain(e)], []
    for link in links:
        if link not in out:
            out.append(link)
    text = " ← caused by ".join(out)
    fix = known_fix(e)
    return f"{text}; fix: {fix}" if fix else text


__all__ = ["KNOWN_FIXES", "cause_chain", "explain", "known_fix"]
