"""The ledger's "one open incident per asset" under concurrent writers (core/ledger_incidents.py).

Four threads, each with its own connection, record an incident on the same asset at the same
moment. Each waits (up to a second) on a barrier right after its look for an open incident, so
without the asset's lock all four would look, find none and insert. With it, one records and the
other three find its incident (or link to it).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from dw_dagster.core.ledger import Ledger
from dw_dagster.core.ledger_incidents import IncidentsMixin
from dw_dagster.core.ledger_tables import _sqlite_engine

N = 4


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        engine = _sqlite_engine(f"sqlite:///{tmp_path / 'dw_ledger.db'}")
        yield Ledger(engine, url=str(engine.url))
        engine.dispose()
        return
    from dw_dagster_tests.harness.dagster_dev import postgres_database

    with postgres_database() as url:
        engine = sa.create_engine("postgresql+psycopg2://" + url.removeprefix("postgresql://"), pool_size=N)
        yield Ledger(engine, url=str(engine.url))
        engine.dispose()


def _race(ledger: Ledger, monkeypatch, link: bool) -> tuple[list[tuple[bool, object]], int]:
    """N threads record ``inc-<i>`` on asset ``shop/orders`` at once; (their results, threads that met)."""
    barrier, met = threading.Barrier(N, timeout=1.0), []
    real = IncidentsMixin._open_incident

    def look_then_wait(conn, asset_key):
        found = real(conn, asset_key)
        try:
            barrier.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            pass
        return found

    monkeypatch.setattr(IncidentsMixin, "_open_incident", staticmethod(look_then_wait))

    def record(i: int):
        return ledger.record_incident_unless_open(incident_id=f"inc-{i}", asset_key="shop/orders", source="volume_sensor",
                                                  external_id=None, body="{}", link=link)

    with ThreadPoolExecutor(N) as pool:
        results = list(pool.map(record, range(N)))
    return results, len(met)


def test_writers_at_the_same_moment_open_one_incident(ledger, monkeypatch):
    results, met = _race(ledger, monkeypatch, link=False)
    assert met < N  # never all four between their look and their insert at once
    recorded = [r for r in results if r[0]]
    assert len(recorded) == 1 and recorded[0][1] is None, results
    first = ledger.open_incident("shop/orders").incident_id
    assert all(found.incident_id == first for ok, found in results if not ok), results
    assert [r.incident_id for r in ledger.incidents(asset_key="shop/orders")] == [first]


def test_linked_writers_link_to_the_one_they_found(ledger, monkeypatch):
    """A second alert about the same problem (Lightup's) is recorded, linked to the open one."""
    results, _ = _race(ledger, monkeypatch, link=True)
    assert all(ok for ok, _ in results), results
    rows = ledger.incidents(asset_key="shop/orders")
    unlinked = [r for r in rows if r.linked_to is None]
    assert len(rows) == N and len(unlinked) == 1, rows
    assert {r.linked_to for r in rows if r.linked_to} == {unlinked[0].incident_id}


def test_a_known_id_is_not_recorded_twice(ledger):
    args = dict(asset_key="shop/orders", source="lightup", external_id="lu-1", body="{}")
    assert ledger.record_incident_unless_open(incident_id="inc-a", **args) == (True, None)
    ledger.set_incident_state("inc-a", "closed")
    assert ledger.record_incident_unless_open(incident_id="inc-b", **args) == (False, None)  # same external id
    assert ledger.record_incident_unless_open(incident_id="inc-a", **{**args, "external_id": None}) == (False, None)


# -- many incidents in one transaction (a volume tick's anomalies) ---------------------------------


def _item(i: int, asset: str, external: str | None = None) -> dict:
    return {"incident_id": f"inc-{i}", "asset_key": asset, "source": "volume_sensor", "external_id": external, "body": "{}"}


def test_a_batch_records_each_asset_once_and_finds_what_is_open(ledger):
    ledger.record_incident_unless_open(**_item(0, "shop/a"))
    out = ledger.record_incidents_unless_open([_item(1, "shop/a"), _item(2, "shop/b"), _item(3, "shop/b"),
                                               _item(4, "shop/c", "x"), _item(5, "shop/d", "x")])
    assert [(ok, found.incident_id if found else None) for ok, found in out] == [
        (False, "inc-0"), (True, None), (False, "inc-2"), (True, None), (False, None)]
    assert sorted(r.incident_id for r in ledger.incidents()) == ["inc-0", "inc-2", "inc-4"]


def test_a_batch_whose_id_is_known_records_the_others_one_by_one(ledger):
    """An id already in the ledger (a closed incident) makes the batch's insert fail: nothing of it is
    half-written, and every item is recorded on its own."""
    ledger.record_incident_unless_open(**_item(1, "shop/a"))
    ledger.set_incident_state("inc-1", "closed")
    out = ledger.record_incidents_unless_open([_item(2, "shop/b"), _item(1, "shop/a"), _item(3, "shop/c")])
    assert [ok for ok, _ in out] == [True, False, True]
    assert sorted(r.incident_id for r in ledger.incidents()) == ["inc-1", "inc-2", "inc-3"]


def test_a_batch_of_more_assets_than_one_look_holds(ledger):
    from dw_dagster.core.ledger_incidents import LOOK_CHUNK

    n = LOOK_CHUNK * 2 + 3
    ledger.record_incident_unless_open(**_item(n, f"a/{n - 1:05d}"))
    out = ledger.record_incidents_unless_open([_item(i, f"a/{i:05d}") for i in range(n)])
    assert sum(ok for ok, _ in out) == n - 1 and out[-1][1].incident_id == f"inc-{n}"


def test_a_warehouse_wide_reload_records_every_incident(ledger):
    """Every watched table anomalous at once (a reload): 20,000 incidents, the last naming the first's asset
    again. In one transaction PostgreSQL would hold 20,000 advisory locks, past its shared lock table
    (``max_locks_per_transaction`` 64 × 100 connections by default; "out of shared memory", as in
    https://github.com/NixOS/nix-security-tracker/issues/1153 after a change that took a lock per row).
    The batch commits every BATCH incidents; the repeated asset finds the incident an earlier
    transaction recorded."""
    n = 20_000
    out = ledger.record_incidents_unless_open([_item(i, f"wh/t{i:05d}") for i in range(n)] + [_item(n, "wh/t00000")])
    assert sum(ok for ok, _ in out) == n and out[-1][1].incident_id == "inc-0"
    assert len(ledger.incidents(states=["open"])) == n
