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


# -- racing: the same calls from several threads or processes ---------------------------------------

def race_round(led: Ledger, who: str, race: str, key: str) -> str:
    """One contender's attempt in ``race`` on ``key``; returns ``"won"`` or ``"refused: <why>"``.

    Races: ``bind`` (bind ticket ``key`` to run ``<who>``), ``decide`` (approve change set ``key``),
    ``credential`` (use credential ``key``), ``decide-credential`` (approve change set ``<key>-<who>``
    with credential ``key``).
    """
    from dw_dagster.core.ledger import LedgerError

    try:
        if race == "bind":
            return "won" if led.bind_ticket(key, f"run-{who}", "dw_window").run_id == f"run-{who}" else "refused: ?"
        if race == "decide":
            return "won" if approve(led, key, approval=f"ap-{key}-{who}", approver=f"{who}@example.com") \
                else "refused: a decision exists"
        if race == "credential":
            return "won" if led.use_credential(key, f"resume by {who}") else "refused: used"
        if race == "decide-credential":
            return "won" if approve(led, f"{key}-{who}", credential_id=key) else "refused: a decision exists"
    except LedgerError as e:
        return f"refused: {e}"
    raise ValueError(race)


def append_chain(led: Ledger, who: str, n: int, asset: str = "shop/chain") -> int:
    """Append ``n`` receipts of ``who`` to ``asset``'s chain as the receipt writer does: build on the head
    read, and when another writer moved it first (compare-and-set refused), read it again; returns the
    refusals met."""
    lost = 0
    for i in range(n):
        while True:
            head = led.receipt_head(asset)
            ok = led.append_receipt(asset_key=asset, expected_head=head, receipt_id=f"{who}-{i}",
                                    hash=f"{who}-{i}-on-{head[0] if head else 0}", previous_hash=head[1] if head else None,
                                    change_set_id=f"cs-{who}", run_id=None)
            if ok:
                break
            lost += 1
    return lost


def process_contender(homes: list[str], who: str, plans: list[list[tuple[str, str]]], chain: int, barrier, out) -> None:
    """A spawned process's part of the race: for each Dagster home of ``homes`` (with its plan), open its
    instance, then for each ``(race, key)`` of the plan meet the other process at ``barrier`` and try;
    last, append ``chain`` receipts. Puts ``(who, [[results] per home], refusals met on the chains)`` on
    ``out`` (or ``(who, "error", traceback)``)."""
    try:
        results, lost = [], 0
        for home, plan in zip(homes, plans):
            led = ledger_of(home)
            results.append([])
            for race, key in plan:
                barrier.wait(timeout=60)
                results[-1].append(race_round(led, who, race, key))
            barrier.wait(timeout=60)
            lost += append_chain(led, who, chain)
        out.put((who, results, lost))
    except BaseException as e:  # noqa: BLE001 - reported to the test, which fails with it
        import traceback

        out.put((who, "error", traceback.format_exc() + repr(e)))


__all__ = ["ASSET", "DOMAIN", "append_chain", "approve", "change_set", "issued", "ledger_of", "open_instance",
           "postgres_server", "process_contender", "race_round", "storage", "write_instance"]
