"""The ledger's state machine (core/ledger.py), transition by transition, on a real SQLite-backed Dagster instance.

Each test walks one promise of the module docstrings: the transitions that are allowed, and the
ones that are refused with a :class:`LedgerError` that says why (or a False / None that says "not
this time"). Cases from the field these guard against:

* a job retried for ever because the attempt counter was lost when it was abandoned — a process
  killed before it could count the failure (https://github.com/algolia/algoliasearch-magento/pull/105,
  https://github.com/cherkovskiyandrey/distributed-task-framework/issues/4): here ``abandon_stage``
  wrote its result without the attempts ``retry_stage`` counts, so a receipt stage whose runs kept
  vanishing was issued again without end (fixed; :func:`test_retry_counts_attempts_even_when_runs_vanish`);
* a decision recorded on a version that ended between the approval job's look and its write (a
  look-then-write race, as in https://github.com/dagster-io/dagster/issues/9360): the person was told
  "approved" for a version nothing would run; the ledger now refuses it in the write's transaction
  (:func:`test_a_version_that_ended_is_not_decided`);
* a re-executed run taking the slot of the run a sensor dispatched
  (https://github.com/dagster-io/dagster/issues/3594): a stage runs once.
"""

from __future__ import annotations

import json

import pytest

from dw_dagster.core import ledger as L
from dw_dagster.core.ledger import LedgerError
from dw_dagster.core.ledger_tables import _meta, meta_t
from dw_dagster_tests.core.ledger_world import ASSET, approve, change_set, issued, ledger_of, write_instance


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return write_instance(tmp_path_factory.mktemp("ledger") / "home")


@pytest.fixture(scope="module")
def module_led(home):
    return ledger_of(home)


@pytest.fixture
def led(module_led):
    """The module's instance's ledger, emptied (one SQLite Dagster instance for the file: each costs a second or two)."""
    led = module_led
    with led.engine.begin() as conn:
        for table in reversed(_meta.sorted_tables):
            if table is not meta_t:
                conn.execute(table.delete())
    return led


def _incident(led, incident="inc-1", state=L.DIAGNOSED):
    assert led.record_incident(incident_id=incident, asset_key=ASSET, source="dw_check", external_id=None, body="{}",
                               state=state)


# -- change sets -------------------------------------------------------------------------------------

def test_the_sqlite_instance_keeps_its_ledger_beside_its_run_storage(home, module_led):
    led = module_led
    assert led.url.startswith("sqlite:///") and led.url.endswith("/history/dw_ledger.db")
    assert (home / "history" / "dw_ledger.db").exists()
    assert ledger_of(home) is led  # opened once per process


def test_the_same_content_proposed_again_returns_the_first_record_unrenewed(led):
    first, new = led.record_change_set(change_set_id="cs-1", version="v1", content_key="k", target_asset=ASSET,
                                       incident_id="inc-1", domain="orders", expires_at=1000.0, body="{}")
    assert new and (first.state, first.latest, first.expires_at) == (L.PROPOSED, True, 1000.0)
    again, new = led.record_change_set(change_set_id="cs-1", version="v1-later", content_key="k", target_asset=ASSET,
                                       incident_id="inc-1", domain="orders", expires_at=9999.0, body="{}")
    assert not new and again == first  # same version, same expiry: proposing again never renews it
    assert led.change_set_row("cs-1", "v1-later") is None


def test_a_version_recorded_with_other_content_is_refused(led):
    change_set(led, content="k1")
    with pytest.raises(LedgerError, match="cs-1 version v1 is already recorded with other content"):
        change_set(led, content="k2")


def test_a_new_version_supersedes_what_has_not_started(led):
    change_set(led, version="v1")
    change_set(led, version="v2")
    assert (led.change_set_row("cs-1", "v1").state, led.change_set_row("cs-1", "v1").latest) == (L.SUPERSEDED, False)
    assert "superseded by version v2" in led.change_set_row("cs-1", "v1").note
    assert approve(led, version="v2")  # approved, no stage issued: superseded too
    change_set(led, version="v3")
    assert led.change_set_row("cs-1", "v2").state == L.SUPERSEDED
    assert led.change_set_row("cs-1").version == "v3"
    assert [r.version for r in led.change_set_rows()] == ["v3"]
    assert {r.version for r in led.change_set_rows(latest_only=False)} == {"v1", "v2", "v3"}


def test_a_version_under_repair_is_left_to_finish_and_keeps_its_window(led):
    issued(led)  # v1 approved and running: a stage issued
    change_set(led, version="v2")
    v1 = led.change_set_row("cs-1", "v1")
    assert (v1.state, v1.latest) == (L.RUNNING, False)
    assert [r.version for r in led.open_windows(ASSET)] == ["v1"]
    assert led.change_set_row("cs-1").version == "v2"


def test_a_halted_version_is_superseded(led):
    issued(led)
    assert led.set_change_set_state("cs-1", "v1", L.HALTED, from_states=[L.RUNNING])
    change_set(led, version="v2")
    assert led.change_set_row("cs-1", "v1").state == L.SUPERSEDED


def test_a_state_moves_only_from_the_states_named(led):
    change_set(led)
    assert not led.set_change_set_state("cs-1", "v1", L.APPLIED, from_states=[L.RUNNING])
    assert led.change_set_row("cs-1", "v1").state == L.PROPOSED
    assert led.set_change_set_state("cs-1", "v1", L.EXPIRED, from_states=[L.PROPOSED], note="24 h passed")
    row = led.change_set_row("cs-1", "v1")
    assert (row.state, row.note) == (L.EXPIRED, "24 h passed")
    assert not led.set_change_set_state("cs-1", "nope", L.EXPIRED)


@pytest.mark.parametrize("ending", L.ENDED_STATES)
def test_an_ending_releases_the_incident_once_no_version_is_live(led, ending):
    _incident(led)
    change_set(led, version="v1")
    change_set(led, "cs-2", version="w1")  # another change set for the same incident, still live
    assert led.set_change_set_state("cs-1", "v1", ending)
    assert led.incident("inc-1").state == L.DIAGNOSED
    assert led.set_change_set_state("cs-2", "w1", ending, note="why")
    inc = led.incident("inc-1")
    assert inc.state == L.UNREPAIRED and inc.note == f"change set cs-2 {ending}: why"
    (entry,) = led.audit_entries(kind="incident_unrepaired", subject="inc-1")
    assert entry["by"] == "dw-dagster" and entry["body"]["version"] == "w1"


def test_applied_does_not_release_and_release_needs_a_diagnosed_incident(led):
    _incident(led)
    change_set(led)
    assert led.set_change_set_state("cs-1", "v1", L.APPLIED)
    assert led.incident("inc-1").state == L.DIAGNOSED
    assert led.release_incident("cs-1", "v1", "the receipt did not verify")
    assert led.incident("inc-1").note == "the receipt did not verify"
    assert not led.release_incident("cs-1", "v1", "again")  # unrepaired already
    assert not led.release_incident("cs-9", "v1", "unknown change set")


# -- decisions -------------------------------------------------------------------------------------

def test_one_active_decision_per_version(led):
    change_set(led)
    assert approve(led, approval="ap-1")
    assert not approve(led, approval="ap-2", approver="other@example.com")
    assert led.active_decision("cs-1", "v1")[0] == "ap-1"
    assert [d["approval_id"] for d in led.decisions("cs-1")] == ["ap-1"]
    assert led.change_set_row("cs-1", "v1").state == L.APPROVED


def test_a_rejection_ends_the_version_and_releases_its_incident(led):
    _incident(led)
    change_set(led)
    assert approve(led, decision="reject", approver="owner@example.com")
    assert led.change_set_row("cs-1", "v1").state == L.REJECTED
    assert led.incident("inc-1").state == L.UNREPAIRED and "rejected by owner@example.com" in led.incident("inc-1").note


def test_a_halted_version_may_be_decided_again(led):
    issued(led)
    led.set_change_set_state("cs-1", "v1", L.HALTED)
    led.withdraw_decision("ap-cs-1-v1", "stopped")
    assert approve(led, approval="ap-again")
    assert led.change_set_row("cs-1", "v1").state == L.APPROVED


def test_a_credential_is_accepted_once(led):
    change_set(led)
    change_set(led, "cs-2")
    assert approve(led, credential_id="tok-1", credential_purpose="approve cs-1")
    with pytest.raises(LedgerError, match="this credential was already used for a decision; each is accepted once"):
        approve(led, "cs-2", credential_id="tok-1")
    assert led.active_decision("cs-2", "v1") is None and led.change_set_row("cs-2").state == L.PROPOSED
    assert not led.use_credential("tok-1", "resume")
    assert led.use_credential("tok-2", "resume") and not led.use_credential("tok-2", "resume")


def test_a_version_decided_already_answers_false_and_leaves_the_credential_unspent(led):
    """A second decision on a decided version is "not this time" (False), and the second person's ID token is
    not spent by it: they can still use it on the change set they meant (it was spent before this fix)."""
    change_set(led)
    assert approve(led, approval="ap-first", credential_id="tok-first")
    assert not approve(led, approval="ap-second", approver="colleague@example.com", credential_id="tok-second")
    assert [d["approval_id"] for d in led.decisions("cs-1")] == ["ap-first"]
    assert led.use_credential("tok-second", "still unspent") and not led.use_credential("tok-first", "spent")


@pytest.mark.parametrize("ending", [L.SUPERSEDED, L.EXPIRED, L.REJECTED, L.APPLIED, L.FAILED])
def test_a_version_that_ended_is_not_decided(led, ending):
    """The approval job looks at the state before it records; a version that ended in between (superseded by a
    re-diagnosis, expired by the sensor) is refused by the ledger itself, and the credential stays unspent."""
    change_set(led)
    led.set_change_set_state("cs-1", "v1", ending)
    with pytest.raises(LedgerError, match=f"change set cs-1 version v1… is {ending}; a new proposal is needed"):
        approve(led, credential_id="tok-late")
    assert led.decisions("cs-1") == [] and led.use_credential("tok-late", "still unspent")


def test_autonomy_does_not_approve_a_version_superseded_since_the_tick_read_it(led, home):
    """The remediation sensor read the version as proposed; a re-diagnosis superseded it before autonomy recorded
    its approval: no approval, and no failed tick (``record_autonomous_approval`` answers None)."""
    import datetime as dt

    from dw_dagster.core.domains import Domain
    from dw_dagster.core.models import ChangeSet, utcnow
    from dw_dagster.approval.autonomy import record_autonomous_approval
    from dw_dagster_tests.core.ledger_world import open_instance

    now = utcnow()
    cs = ChangeSet.seal(id="cs-auto", incident_id="inc-1", diagnosis_id="dg-1", domain="orders", proposer="dw-dagster",
                        created_at=now, expires_at=now + dt.timedelta(hours=1), approvers=["owner@example.com"],
                        cause_kind="late_rows_behind_watermark", summary="s", target_asset=["shop", "orders"],
                        window=["2026-11-03"], diff="", files=[], rebuild_assets=[], change_classes=["rerun_window"])
    domain = Domain(name="orders", assets=[["shop", "orders"]], approvers=["owner@example.com"], autonomy="L3",
                    allowed_change_classes=["rerun_window"])
    change_set(led, "cs-auto", cs.version)
    change_set(led, "cs-auto", "v-newer")
    assert record_autonomous_approval(open_instance(home), cs, domain) is None and led.decisions("cs-auto") == []
    fresh = ChangeSet.seal(**{**cs.model_dump(exclude={"version"}), "id": "cs-auto2"})
    change_set(led, "cs-auto2", fresh.version)
    made = record_autonomous_approval(open_instance(home), fresh, domain)  # still proposed: approved
    assert made is not None and led.change_set_row("cs-auto2").state == L.APPROVED


def test_a_withdrawn_decision_frees_the_slot_and_unapproves(led):
    change_set(led)
    assert approve(led, approval="ap-auto", approver="dw-dagster")
    assert led.withdraw_decision("ap-auto", "autonomy lowered to L2")
    assert not led.withdraw_decision("ap-auto", "twice")
    d = led.decision("ap-auto")
    assert (d["active"], d["withdrawn_reason"]) == (False, "autonomy lowered to L2")
    assert led.change_set_row("cs-1").state == L.PROPOSED and led.active_decision("cs-1", "v1") is None
    assert approve(led, approval="ap-person")  # a person may decide now
    assert led.active_decisions([("cs-1", "v1"), ("cs-x", "v1")]) == {("cs-1", "v1"): "{}"}


# -- tickets and stages ----------------------------------------------------------------------------

def test_a_ticket_needs_an_approved_version_and_is_issued_once(led):
    change_set(led)
    with pytest.raises(LedgerError, match=r"cs-1 version v1… is not approved or running; no ticket for stage window-1"):
        led.issue_ticket("cs-1", "v1", "window-1", "ap-cs-1-v1", "dw_window")
    approve(led)
    ticket = led.issue_ticket("cs-1", "v1", "window-1", "ap-cs-1-v1", "dw_window")
    assert led.change_set_row("cs-1").state == L.RUNNING
    assert led.issue_ticket("cs-1", "v1", "window-1", "ap-cs-1-v1", "dw_window") is None
    assert led.stage_by_ticket(ticket).state == L.ISSUED and led.stages("cs-1", "v1")["window-1"].ticket == ticket
    change_set(led, version="v2")
    with pytest.raises(LedgerError, match="v2… is not approved or running"):
        led.issue_ticket("cs-1", "v2", "window-1", "ap-cs-1-v1", "dw_window")


def test_a_ticket_binds_the_first_run_and_refuses_every_other(led):
    ticket = issued(led)
    with pytest.raises(LedgerError, match="was not issued by the remediation sensor"):
        led.bind_ticket("forged", "run-a", "dw_window")
    with pytest.raises(LedgerError, match="is for job dw_window, not dw_other"):
        led.bind_ticket(ticket, "run-a", "dw_other")
    row = led.bind_ticket(ticket, "run-a", "dw_window")
    assert (row.state, row.run_id) == (L.STARTED, "run-a") and row.started_at is not None
    assert led.bind_ticket(ticket, "run-a", "dw_window") == row  # idempotent for that run
    with pytest.raises(LedgerError, match="belongs to run run-a; a copied or re-executed run cannot take it"):
        led.bind_ticket(ticket, "run-b", "dw_window")
    assert led.stage_by_run("run-a").ticket == ticket


def test_a_ticket_binds_only_a_run_of_the_shape_it_was_issued_for(led):
    expect = {"partitions": ["2026-11-03"], "assets": ["orders"]}
    ticket = issued(led, expect=expect)
    with pytest.raises(LedgerError, match="is for another run: its partitions differ"):
        led.bind_ticket(ticket, "run-a", "dw_window", shape={**expect, "partitions": ["2026-11-04"]})
    with pytest.raises(LedgerError, match="its assets, partitions differ"):
        led.bind_ticket(ticket, "run-a", "dw_window")
    assert led.bind_ticket(ticket, "run-a", "dw_window", shape=dict(expect)).run_id == "run-a"


def test_a_ticket_under_a_withdrawn_decision_binds_nothing_but_the_halt_receipt(led):
    ticket = issued(led)
    halt = led.issue_ticket("cs-1", "v1", "receipt-halt", "ap-cs-1-v1", "dw_write_receipts")
    led.withdraw_decision("ap-cs-1-v1", "approver removed from the domain")
    with pytest.raises(LedgerError, match=r"under decision ap-cs-1-v1, which no longer counts \(approver removed"):
        led.bind_ticket(ticket, "run-a", "dw_window")
    assert led.bind_ticket(halt, "run-h", "dw_write_receipts").state == L.STARTED


def test_an_ended_stage_cannot_be_bound(led):
    ticket = issued(led)
    assert led.abandon_stage(ticket, "its run vanished")
    with pytest.raises(LedgerError, match="stage window-1 of cs-1 is abandoned"):
        led.bind_ticket(ticket, "run-a", "dw_window")


def test_dispatch_ticks_are_noted_until_a_run_takes_the_ticket(led):
    ticket = issued(led, dispatch={"location": "loc", "repository": "repo", "ticks": ["t1"]})
    for tick in ["t2", "t1", "t3"]:
        assert led.note_dispatch(ticket, tick, keep=2)
    assert led.stage_by_ticket(ticket).dispatch == {"location": "loc", "repository": "repo", "ticks": ["t1", "t3"]}
    led.bind_ticket(ticket, "run-a", "dw_window")
    assert not led.note_dispatch(ticket, "t4")
    in_process = led.issue_ticket("cs-1", "v1", "verify", "ap-cs-1-v1", "dw_verify")
    assert not led.note_dispatch(in_process, "t1")  # issued in process: no tick may take it


def test_only_the_bound_run_completes_its_stage_once(led):
    ticket = issued(led)
    assert not led.complete_stage(ticket, "run-a", success=True)  # not bound yet
    led.bind_ticket(ticket, "run-a", "dw_window")
    assert not led.complete_stage(ticket, "run-b", success=True)
    assert led.complete_stage(ticket, "run-a", success=False, result={"error": "boom"})
    assert not led.complete_stage(ticket, "run-a", success=True)
    row = led.stage_by_ticket(ticket)
    assert (row.state, row.result) == (L.STAGE_FAILED, {"error": "boom"}) and row.finished_at is not None


def test_a_run_that_never_executed_gets_its_stage_a_fresh_ticket(led):
    ticket = issued(led, dispatch={"location": "loc", "repository": "repo", "ticks": ["t1"]})
    led.bind_ticket(ticket, "run-a", "dw_window")
    assert led.reissue_ticket(ticket, "run-x") is None  # not bound to that run
    new = led.reissue_ticket(ticket, "run-a", count=True, why="cancelled while queued")
    row = led.stage_by_ticket(new)
    assert (row.state, row.run_id, row.started_at) == (L.ISSUED, None, None)
    assert row.dispatch["ticks"] == [] and row.result == {"attempts": 2, "earlier": [
        {"run_id": "run-a", "why": "cancelled while queued"}]}
    assert led.stage_by_ticket(ticket) is None  # the old ticket is dead
    led.bind_ticket(new, "run-b", "dw_window")
    assert led.complete_stage(new, "run-b", success=True, result={"rows": 3})
    assert led.stage_by_ticket(new).result == {"rows": 3, "attempts": 2}


def test_an_untaken_ticket_rotates_or_is_revoked_but_a_taken_one_neither(led):
    ticket = issued(led)
    rotated = led.rotate_ticket(ticket)
    assert rotated and rotated != ticket and led.stage_by_ticket(ticket) is None
    assert led.revoke_ticket(rotated) and led.stages("cs-1", "v1") == {}
    again = led.issue_ticket("cs-1", "v1", "window-1", "ap-cs-1-v1", "dw_window")  # a later approval issues it anew
    led.bind_ticket(again, "run-a", "dw_window")
    assert led.rotate_ticket(again) is None and not led.revoke_ticket(again)


def test_a_stage_that_changes_no_data_is_retried_up_to_its_limit(led):
    ticket = issued(led, stage="receipt", job="dw_write_receipts")
    assert led.retry_stage(ticket) is None  # issued: nothing to retry
    tickets = [ticket]
    for run in ("run-1", "run-2", "run-3"):
        led.bind_ticket(tickets[-1], run, "dw_write_receipts")
        led.complete_stage(tickets[-1], run, success=False)
        nxt = led.retry_stage(tickets[-1], max_attempts=3)
        if run == "run-3":
            assert nxt is None
            break
        tickets.append(nxt)
    assert led.stage_by_ticket(tickets[-1]).result["attempts"] == 3
    ok = issued(led, "cs-2", stage="receipt")
    led.bind_ticket(ok, "run-ok", "dw_window")
    led.complete_stage(ok, "run-ok", success=True)
    assert led.retry_stage(ok) is None  # succeeded: never again


def test_retry_counts_attempts_even_when_runs_vanish(led):
    """A receipt stage whose runs keep vanishing (abandoned) is tried ``max_attempts`` times, not for ever."""
    ticket, runs = issued(led, stage="receipt", job="dw_write_receipts"), 0
    while ticket is not None and runs < 10:
        runs += 1
        led.bind_ticket(ticket, f"run-{runs}", "dw_write_receipts")
        assert led.abandon_stage(ticket, "its run vanished")
        ticket = led.retry_stage(ticket, max_attempts=3)
    assert runs == 3


def test_only_an_issued_or_started_stage_is_abandoned(led):
    ticket = issued(led)
    led.bind_ticket(ticket, "run-a", "dw_window")
    assert led.abandon_stage(ticket, "worker killed")
    assert led.stage_by_ticket(ticket).result == {"reason": "worker killed"}
    assert not led.abandon_stage(ticket, "twice")
    assert not led.abandon_stage("unknown", "no such ticket")


def test_stages_of_many_versions_at_once(led):
    a, b = issued(led, "cs-a"), issued(led, "cs-b")
    got = led.stages_of_many([("cs-a", "v1"), ("cs-b", "v1"), ("cs-c", "v1")])
    assert got[("cs-a", "v1")]["window-1"].ticket == a and got[("cs-b", "v1")]["window-1"].ticket == b
    assert got[("cs-c", "v1")] == {}


# -- the receipt chain -----------------------------------------------------------------------------

def _append(led, head, n, asset=ASSET, receipt=None):
    return led.append_receipt(asset_key=asset, expected_head=head, receipt_id=receipt or f"r{n}", hash=f"h{n}",
                              previous_hash=head[1] if head else None, change_set_id=f"cs-{n}", run_id=f"run-{n}")


def test_the_chain_advances_only_from_the_head_it_was_built_on(led):
    assert led.receipt_head(ASSET) is None
    assert _append(led, None, 1)
    assert not _append(led, None, 9)  # a second first receipt: the chain would fork
    assert led.receipt_head(ASSET) == (1, "h1")
    assert _append(led, (1, "h1"), 2)
    assert not _append(led, (1, "h1"), 3)  # stale head
    assert not _append(led, (2, "forged"), 3)  # right seq, wrong hash
    assert not _append(led, (2, "h2"), 3, receipt="r1")  # a receipt id already in a chain
    assert led.receipt_head(ASSET) == (2, "h2")
    assert [(r.seq, r.hash, r.previous_hash) for r in led.receipt_links(ASSET)] == [(1, "h1", None), (2, "h2", "h1")]
    assert _append(led, None, 7, asset="shop/other")
    assert led.receipt_heads() == {ASSET: (2, "h2"), "shop/other": (1, "h7")}
    assert led.receipted_change_sets(ASSET) == {"cs-1", "cs-2"}


# -- control, audit, quarantine, ladder ----------------------------------------------------------

def test_controls_are_set_and_replaced(led):
    assert led.control("stop") is None
    led.set_control("stop", {"by": "a@example.com", "on": True})
    led.set_control("stop", {"by": "b@example.com", "on": False})
    assert led.control("stop") == {"by": "b@example.com", "on": False}


def test_the_audit_is_appended_and_read_newest_first(led):
    led.audit("hold_lifted", "shop/orders", "a@example.com", {"n": 1})
    led.audit("hold_lifted", "shop/orders", "b@example.com", {"n": 2})
    led.audit("stop_resumed", "org", "a@example.com", {})
    assert [e["body"]["n"] for e in led.audit_entries(kind="hold_lifted")] == [2, 1]
    assert [e["kind"] for e in led.audit_entries(subject="org")] == ["stop_resumed"]
    assert len(led.audit_entries()) == 3


def test_a_quarantined_record_is_noted_once(led):
    assert led.quarantine("ev:1", "change_set", ASSET, "hash mismatch")
    assert not led.quarantine("ev:1", "change_set", ASSET, "hash mismatch, seen again")
    (q,) = led.quarantined()
    assert (q["reason"], q["kind"]) == ("hash mismatch, seen again", "change_set") and q["last_seen"] >= q["first_seen"]


def test_a_ladder_step_is_recorded_once(led):
    args = dict(kind="request", change_set_id="cs-1", version="v1", incident_id="inc-1", body={"to": ["a"]})
    assert led.record_ladder_step(step="remind", **args)
    assert not led.record_ladder_step(step="remind", **args)
    (row,) = led.ladder_steps(subject="request:cs-1:v1", shown=False)
    led.mark_ladder_shown(row.subject, "remind")
    assert led.ladder_steps(shown=False) == [] and led.ladder_done(["request:cs-1:v1"]) == {"request:cs-1:v1": {"remind"}}


def test_the_stored_rows_are_json_where_the_dataclasses_say(led):
    ticket = issued(led, expect={"job": "x"})
    raw = led.stage_by_ticket(ticket)
    assert raw.result is None and json.loads(led.change_set_row("cs-1").body) == {"id": "cs-1"}
