"""Riding out a storage outage: the ledger's calls retry while its database cannot be reached.

The ledger lives in the Dagster instance's database. When that database restarts or fails over,
Dagster's own PostgreSQL storage retries its connections; the ledger does the same, so a run
worker, the daemon's sensor tick or the run coordinator that touches the ledger during a short
outage waits for it (exponential backoff, up to :data:`OUTAGE_SECONDS`) instead of failing the
repair stage it is part of. Only errors that say the database was unreachable or busy are retried
(:func:`transient_storage_error`); a wrong statement or a refused transition raises at once.

A retried transaction is safe: a transaction that did not reach its ``COMMIT`` changed nothing,
and one whose acknowledgement was lost is refused on the retry by the same unique key or
compare-and-set that guards it (a decision already recorded, a stage already bound to that run).
"""

from __future__ import annotations

import sqlalchemy as sa

#: how long a ledger call keeps retrying while the database is unreachable (a restart, a failover)
OUTAGE_SECONDS = 60.0
#: how long it keeps retrying PostgreSQL's "out of shared memory" (SQLSTATE 53200): other sessions' locks
#: filling the shared lock table clear in moments, a transaction that needs more locks than the table holds
#: never fits, and retrying it for :data:`OUTAGE_SECONDS` would only delay its error
SQUEEZE_SECONDS = 5.0
_CONNECTION_WORDS = ("could not connect", "connection refused", "server closed the connection", "terminating connection",
                     "connection to server", "database is locked", "ssl syscall", "broken pipe", "connection reset",
                     "connection timed out", "connection already closed", "the database system is starting up",
                     "the database system is shutting down")


def transient_storage_error(e: BaseException) -> bool:
    """Whether ``e`` says the ledger's database could not be reached (or was busy), not that a statement
    was wrong: a dropped or refused connection, PostgreSQL's SQLSTATE class 08 (connection exception),
    57P (operator intervention: shutdown, restart) or 53 (insufficient resources), SQLite's lock."""
    if isinstance(e, sa.exc.DBAPIError) and e.connection_invalidated:
        return True
    if not isinstance(e, (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError)):
        return False
    code = _sqlstate(e)
    if code:
        return code.startswith(("08", "57P", "53"))
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).lower()
    return any(w in text for w in _CONNECTION_WORDS)


def _sqlstate(e: BaseException | None) -> str:
    """The SQLSTATE of the driver's error ``e`` wraps (psycopg's ``sqlstate``, psycopg2's ``pgcode``), or ``""``."""
    orig = getattr(e, "orig", None)
    return str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")


def _out_of_shared_memory(e: BaseException | None) -> bool:
    code = _sqlstate(e)
    return code == "53200" or (not code and "out of shared memory" in str(e).lower())


def _stop(retry_state) -> bool:
    """Stop after :data:`OUTAGE_SECONDS`, or :data:`SQUEEZE_SECONDS` when the last error was "out of shared memory"."""
    elapsed = retry_state.seconds_since_start or 0.0
    last = retry_state.outcome.exception() if retry_state.outcome is not None else None
    return elapsed >= (SQUEEZE_SECONDS if _out_of_shared_memory(last) else OUTAGE_SECONDS)


def _riding_out_outages(fn):
    """Retry ``fn`` (a ledger call: one transaction, or a read) while the database is unreachable, with
    exponential backoff, for up to :data:`OUTAGE_SECONDS` (:data:`SQUEEZE_SECONDS` for "out of shared memory");
    any other error is raised at once."""
    import functools

    from tenacity import Retrying, retry_if_exception, wait_exponential

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for attempt in Retrying(retry=retry_if_exception(transient_storage_error), reraise=True,
                                wait=wait_exponential(multiplier=0.25, max=5), stop=_stop):
            with attempt:
                return fn(*args, **kwargs)

    wrapper.__wrapped_for_outages__ = True
    return wrapper


def wrap_public_methods(cls: type) -> None:
    """Wrap every public method of ``cls`` (and its bases) in :func:`_riding_out_outages`."""
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, attr in list(vars(klass).items()):
            if name.startswith("_") or not callable(attr) or isinstance(attr, (staticmethod, classmethod, type)):
                continue
            if getattr(getattr(cls, name), "__wrapped_for_outages__", False):
                continue
            setattr(cls, name, _riding_out_outages(attr))



__all__ = ["OUTAGE_SECONDS", "SQUEEZE_SECONDS", "transient_storage_error", "wrap_public_methods"]
