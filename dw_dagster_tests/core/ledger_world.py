"""Shared helpers of the ledger tests: a SQLite or PostgreSQL Dagster instance and a change set walked to a state.

Not a test module: ``test_ledger_*`` import it (and the concurrency test's spawned processes import
:func:`open_instance`, so it takes only picklable arguments).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from dw_dagster.core.ledger import Ledger, ledger_for

DOMAIN, ASSET = "orders", "shop/orders"


def write_instance(home: Path, postgres_url: str | None = None) -> Path:
    """``dagster.yaml`` in ``home`` (SQLite, Dagster's default, or dagster-postgres storage); returns ``home``."""
    from dw_dagster_tests.harness.dagster_dev import write_instance_yaml

    write_instance_yaml(home, postgres_url)
    return home


def open_instance(home: str | Path) -> dg.DagsterInstance:
    """The Dagster instance whose ``dagster.yaml`` is in ``home``."""
    return dg.DagsterInstance.from_config(str(home))


def postgres_server() -> str:
    """``postgresql://user@host:port`` of the server ``$DW_TEST_POSTGRES_URL`` names (its database left out)."""
    from dw_dagster_tests.conftest import POSTGRES_URL

    return re.sub(r"^postgresql(\+\w+)?://", "postgresql://", POSTGRES_URL).rsplit("/", 1)[0]


@contextlib.contextmanager
def storage(kind: str, tmp: Path) -> Iterator[Path]:
    """A Dagster home on SQLite, or on dagster-postgres in a fresh database of the test server (dropped after)."""
    if kind == "sqlite":
        yield write_instance(tmp / "home")
        return
    from dw_dagster_tests.harness.dagster_dev import postgres_database

    with postgres_database(postgres_server()) as url:
        yield write_instance(tmp / "home", url)


def change_set(led: Ledger, cs: str = "cs-1", version: str = "v1", *, incident: str = "inc-1", content: str | None = None):
    """Record version ``version`` of ``cs`` (content key ``content`` or ``k-<version>``); returns the row."""
    row, _ = led.record_change_set(change_set_id=cs, version=version, content_key=content or f"k-{version}",
                                   target_asset=ASSET, incident_id=incident, domain=DOMAIN, expires_at=4e9,
                                   body='{"id": "%s"}' % cs)
    return row


def approve(led: Ledger, cs: str = "cs-1", version: str = "v1", approval: str | None = None, **kw) -> bool:
    """Record an approval of ``cs``/``version`` by ``owner@example.com``."""
    return led.record_decision(approval_id=approval or f"ap-{cs}-{version}", change_set_id=cs, version=version,
                               decision=kw.pop("decision", "approve"), approver=kw.pop("approver", "owner@example.com"),
                               method="oidc", decided_at=1.0, body="{}", **kw)


def issued(led: Ledger, cs: str = "cs-1", stage: str = "window-1", job: str = "dw_window", **kw) -> str:
    """A change set approved and its stage ``stage`` issued; returns the ticket."""
    change_set(led, cs)
    assert approve(led, cs)
    ticket = led.issue_ticket(cs, "v1", stage, f"ap-{cs}-v1", job, **kw)
    assert ticket is not None
    return ticket


def ledger_of(home: str | Path) -> Ledger:
    return ledger_for(open_instance(home))


__all__ = ["ASSET", "DOMAIN", "approve", "change_set", "issued", "ledger_of", "open_instance", "postgres_server",
           "storage", "write_instance"]
