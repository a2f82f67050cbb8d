"""Issue 31 item 3: after a verified receipt, the Tableau extract of each dashboard in the blast radius is
refreshed over the REST API (a protocol-accurate fake on loopback) and judged against its ``needed_by``.

The failure kind: a dashboard still showing yesterday's extract after the data was repaired, seen
at the morning meeting — https://github.com/dagster-io/dagster/issues/18441 is the upstream half
(a reader ran while its upstream was missing); the refresh is the last step of the repair.
"""

import datetime as dt

import pytest

from dw_dagster.core.models import ExposureRef, Receipt
from dw_dagster.core.http import HttpApiError, RetryPolicy
from dw_dagster.integrations.bi_refresh import refresh_dashboards
from dw_dagster.integrations.tableau import TableauClient, TableauRefreshFailed
from dw_dagster_dev.fakes.tableau_server import FakeTableau, FakeTableauServer

FAST = RetryPolicy(attempts=2, base_wait_s=0.01, max_wait_s=0.02, timeout_s=5)


def _receipt(verified=True):
    now = dt.datetime.now(dt.timezone.utc)
    return Receipt(id="rc-1", asset_key=["orders"], change_set_id="cs-1", change_set_version="v", incident_id="inc-1",
                   cause_kind="duplicate_load", cause_summary="", evidence_summary={}, diff="", approver="o@x",
                   approved_at=now, signature_valid=True, partitions=[], run_ids={}, rows_before={}, rows_after={},
                   checks=[], verified=verified, undo="", created_at=now, previous_hash=None)


def _exposure(name, needed_by, workbook):
    return ExposureRef(unique_id=f"exposure.shop.{name}", name=name, depth=2, needed_by=needed_by,
                       bi={"tool": "tableau", "workbook": workbook})


def test_a_verified_receipt_refreshes_each_workbook_and_judges_it_against_its_deadline():
    state = FakeTableau(workbooks={"Store P&L": True, "Regional": True, "Live ops": False}, fail={"Regional"})
    with FakeTableauServer(state) as srv:
        client = TableauClient(srv.url, "grocer", "dw-dagster", "s3cret", policy=FAST, sleep=lambda s: None)
        with client:
            started = dt.datetime.now(dt.timezone.utc)
            soon = (started + dt.timedelta(hours=2)).strftime("%H:%M UTC")
            done = refresh_dashboards(_receipt(), [
                _exposure("store_pnl", soon, "Store P&L"), _exposure("regional", soon, "Regional"),
                _exposure("live_ops", None, "Live ops"),
                ExposureRef(unique_id="exposure.shop.adhoc", name="adhoc", depth=2)],
                tableau=client, repair_started=started, poll_s=0)
            assert refresh_dashboards(_receipt(verified=False), [_exposure("store_pnl", soon, "Store P&L")],
                                      tableau=client, repair_started=started) == []
        by = {r.exposure: r for r in done}
        assert set(by) == {"store_pnl", "regional", "live_ops"}  # adhoc names no BI object
        pnl = by["store_pnl"]
        assert pnl.refreshed_at is not None and pnl.before_deadline is True and not pnl.escalate
        assert pnl.deadline - started <= dt.timedelta(hours=2)
        assert by["regional"].escalate and "finishCode 1 (failed)" in by["regional"].error
        # a live-connection workbook has no extract: the refresh error escalates, with no deadline to judge
        assert by["live_ops"].escalate and "400093" in by["live_ops"].error and by["live_ops"].before_deadline is None
        # the protocol: PAT sign-in, lookups, one refresh POST per workbook, job polls, sign-out
        calls = [f"{m} {p.split('/api/3.22')[1]}" for m, p in state.requests]
        assert calls[0] == "POST /auth/signin" and calls[-1] == "POST /auth/signout"
        assert sum(c.endswith("/refresh") for c in calls) == 3 and any("/jobs/" in c for c in calls)
        assert not state.tokens  # signed out


def test_a_wrong_token_or_a_stuck_job_is_a_clear_error():
    state = FakeTableau(polls_to_finish=10_000)
    with FakeTableauServer(state) as srv:
        with pytest.raises(HttpApiError, match="401"):
            TableauClient(srv.url, "grocer", "dw-dagster", "wrong", policy=FAST, sleep=lambda s: None).sign_in()
        with TableauClient(srv.url, "grocer", "dw-dagster", "s3cret", policy=FAST, sleep=lambda s: None) as client:
            wid = client.workbook_id("Store P&L")
            with pytest.raises(TableauRefreshFailed, match="did not end within 0 s"):
                client.wait(wid, client.refresh(wid), timeout_s=0, poll_s=0)
            with pytest.raises(HttpApiError, match="no workbook named 'Nope'"):
                client.workbook_id("Nope")
