"""Compare-and-set under real concurrency: threads and two spawned processes race on one instance's ledger.

The ledger's transitions are guarded by a unique key or a compare-and-set ``UPDATE`` (module
docstring of core/ledger.py), never by a look-then-write in the caller. Here contenders start each
call together (a barrier) against the same Dagster instance storage — SQLite (the ledger's
``BEGIN IMMEDIATE`` and busy timeout) and PostgreSQL (dagster-postgres storage; read committed,
unique indexes and row locks) — and for each race exactly one wins, every other gets a refusal that
says why, and the stored rows hold exactly the winner's write:

* ``bind_ticket``: one run takes a stage; the others are told the stage belongs to that run;
* ``record_decision``: one active decision per version; a credential spent by one decision refuses the rest;
* ``use_credential``: a credential is accepted once;
* ``append_receipt``: writers that rebuild on the new head when refused leave one unbroken chain,
  no receipt lost or written twice.

Cases from the field: Dagster's own threaded sensor daemon submitting one run twice through a
look-then-write race (https://github.com/dagster-io/dagster/issues/9360); SQLite's "database is
locked" when several processes write one Dagster storage at once
(https://github.com/dagster-io/dagster/issues/3238).
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from dw_dagster_tests.core.ledger_world import append_chain, change_set, issued, ledger_of, process_contender, race_round
from dw_dagster_tests.core.ledger_world import storage

N = 6  # threads: the PostgreSQL ledger's pool holds 2 connections and 4 more on demand


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    """A Dagster home on SQLite and one on PostgreSQL (dagster-postgres storage in a fresh database)."""
    with storage("sqlite", tmp_path_factory.mktemp("sqlite")) as lite, \
            storage("postgresql", tmp_path_factory.mktemp("postgresql")) as pg:
        yield {"sqlite": lite, "postgresql": pg}


@pytest.fixture(scope="module")
def ledgers(homes):
    return {kind: ledger_of(home) for kind, home in homes.items()}


@pytest.fixture(params=["sqlite", "postgresql"])
def led(request, ledgers):
    return ledgers[request.param]


def _threads(led, race: str, key: str) -> list[str]:
    barrier = threading.Barrier(N, timeout=30)

    def one(i: int) -> str:
        barrier.wait()
        return race_round(led, f"t{i}", race, key)

    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(one, range(N)))


def _one_winner(results: list[str]) -> int:
    assert [r for r in results if r == "won"] == ["won"], results
    return results.index("won")


def test_threads_binding_one_ticket(led):
    ticket = issued(led, "cs-bind")
    results = _threads(led, "bind", ticket)
    winner = _one_winner(results)
    stage = led.stage_by_ticket(ticket)
    assert (stage.state, stage.run_id) == ("started", f"run-t{winner}")
    for r in results:
        assert r == "won" or (r.startswith("refused: stage window-1 of cs-bind") and (
            f"belongs to run run-t{winner}" in r or "was taken by another run" in r)), r


def test_threads_deciding_one_version(led):
    change_set(led, "cs-decide")
    winner = _one_winner(_threads(led, "decide", "cs-decide"))
    (d,) = led.decisions("cs-decide")
    assert (d["approver"], d["active"]) == (f"t{winner}@example.com", True)
    assert led.change_set_row("cs-decide").state == "approved"


def test_threads_spending_one_credential(led):
    results = _threads(led, "credential", "tok-threads")
    _one_winner(results)
    assert sorted(set(results)) == ["refused: used", "won"]
    for i in range(N):
        change_set(led, f"tok-dc-t{i}")
    results = _threads(led, "decide-credential", "tok-dc")
    winner = _one_winner(results)
    assert all(r == "won" or "this credential was already used" in r for r in results), results
    decided = [i for i in range(N) if led.active_decision(f"tok-dc-t{i}", "v1")]
    assert decided == [winner]  # the losers recorded nothing


def test_threads_extending_one_receipt_chain(led):
    with ThreadPoolExecutor(N) as pool:
        lost = sum(pool.map(lambda i: append_chain(led, f"t{i}", 5, asset="shop/threads"), range(N)))
    _assert_one_chain(led, "shop/threads", {f"t{i}-{k}" for i in range(N) for k in range(5)})
    assert lost >= 0


def test_two_processes_race_on_every_transition(homes, ledgers):
    """Two spawned processes (each its own Dagster instance and ledger connections) race round by round,
    on the SQLite instance and then on the PostgreSQL one."""
    kinds = list(homes)
    plans: list[list[tuple[str, str]]] = []
    for kind in kinds:
        led, plan = ledgers[kind], []
        for k in range(4):
            plan.append(("bind", issued(led, f"cs-pbind-{k}")))
            change_set(led, f"cs-pdecide-{k}")
            plan.append(("decide", f"cs-pdecide-{k}"))
            plan.append(("credential", f"tok-p-{k}"))
        plans.append(plan)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=process_contender, args=([str(homes[k]) for k in kinds], who, plans, 15, barrier, out))
             for who in ("p1", "p2")]
    for p in procs:
        p.start()
    try:
        got = {}
        for _ in procs:
            who, results, detail = out.get(timeout=180)
            assert results != "error", detail
            got[who] = results
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():  # only when the test already failed: leave no contender behind
                p.kill()
                p.join(timeout=10)
    assert all(p.exitcode == 0 for p in procs)
    for n, kind in enumerate(kinds):
        led = ledgers[kind]
        for i, (race, key) in enumerate(plans[n]):
            pair = [got["p1"][n][i], got["p2"][n][i]]
            assert sorted(pair)[1] == "won" and sorted(pair)[0].startswith("refused"), (kind, race, pair)
            winner = "p1" if pair[0] == "won" else "p2"
            if race == "bind":
                assert led.stage_by_ticket(key).run_id == f"run-{winner}", (kind, pair)
                assert f"belongs to run run-{winner}" in min(pair) or "was taken by another run" in min(pair), pair
            if race == "decide":
                assert [d["approver"] for d in led.decisions(key)] == [f"{winner}@example.com"], kind
        _assert_one_chain(led, "shop/chain", {f"{who}-{k}" for who in ("p1", "p2") for k in range(15)})


def _assert_one_chain(led, asset: str, receipts: set[str]) -> None:
    """The chain of ``asset`` holds each of ``receipts`` once, seq 1..n, each link on the one before."""
    links = led.receipt_links(asset)
    assert {r.receipt_id for r in links} == receipts and len(links) == len(receipts)
    assert [r.seq for r in links] == list(range(1, len(receipts) + 1))
    assert all(b.previous_hash == a.hash for a, b in zip(links, links[1:])) and links[0].previous_hash is None
    assert led.receipt_head(asset) == (links[-1].seq, links[-1].hash)
