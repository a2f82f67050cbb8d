"""How long a ledger call rides out its database's errors: a connection lost is retried for the outage budget,
PostgreSQL's "out of shared memory" (SQLSTATE 53200) only for a short squeeze.

A transaction that takes more locks than PostgreSQL's shared lock table holds fails with 53200 every time
(https://github.com/NixOS/nix-security-tracker/issues/1153); before, the ledger retried it for 60 s as if the
server were restarting. The errors are psycopg's own classes wrapped by SQLAlchemy, as a real driver raises them.
"""

import time

import psycopg
import pytest
import sqlalchemy as sa

from dw_dagster.core import ledger_outage
from dw_dagster.core.ledger_outage import _riding_out_outages, transient_storage_error


def _error(sqlstate: str, message: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT ...", {}, psycopg.errors.lookup(sqlstate)(message))


def _failing(outcomes):
    """A call that raises ``outcomes``' errors in turn (the last one again once they run out); ``None`` returns."""
    calls = []

    def call():
        calls.append(time.monotonic())
        e = outcomes[min(len(calls), len(outcomes)) - 1]
        if e is None:
            return "done"
        raise e

    return call, calls


def test_out_of_shared_memory_is_retried_only_for_a_squeeze(monkeypatch):
    monkeypatch.setattr(ledger_outage, "SQUEEZE_SECONDS", 0.6)
    err = _error("53200", "out of shared memory\nHINT: You might need to increase max_locks_per_transaction.")
    assert transient_storage_error(err)
    call, calls = _failing([err] * 1000)
    t0 = time.monotonic()
    with pytest.raises(sa.exc.OperationalError, match="out of shared memory"):
        _riding_out_outages(call)()
    assert 0.6 <= time.monotonic() - t0 < 5 and len(calls) >= 2  # retried, then given up long before 60 s


def test_a_squeeze_that_clears_succeeds(monkeypatch):
    monkeypatch.setattr(ledger_outage, "SQUEEZE_SECONDS", 3.0)
    call, calls = _failing([_error("53200", "out of shared memory"), None])
    assert _riding_out_outages(call)() == "done" and len(calls) == 2


def test_a_lost_connection_keeps_the_outage_budget(monkeypatch):
    """The same errors for longer than the squeeze: a connection failure (08006) is still retried."""
    monkeypatch.setattr(ledger_outage, "SQUEEZE_SECONDS", 0.2)
    lost = _error("08006", "server closed the connection unexpectedly")
    call, calls = _failing([lost, lost, lost, lost, None])
    t0 = time.monotonic()
    assert _riding_out_outages(call)() == "done" and len(calls) == 5
    assert time.monotonic() - t0 > 0.2  # past the squeeze, within the outage budget


def test_a_wrong_statement_is_not_retried():
    call, calls = _failing([sa.exc.ProgrammingError("SELECT", {}, psycopg.errors.lookup("42P01")("relation does not exist"))])
    with pytest.raises(sa.exc.ProgrammingError):
        _riding_out_outages(call)()
    assert len(calls) == 1
