"""MageClient / MageResource and the Mage evidence (runs_in_window, wait_for_run_after) against the fake Mage.

The fake (``dw_dagster_dev.fakes.mage_server``) is checked against a real Mage server in
``test_mage_real.py``; these tests drive every path of the client quickly, faults included.
"""

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg
import httpx
import pydantic
import pytest

from dw_dagster.core.http import HttpApiError, RetryPolicy
from dw_dagster.errors import DwDagsterError
from dw_dagster.integrations.mage import (
    MageApiError,
    MageClient,
    MageError,
    MageResource,
    MageRun,
    summarize_log,
)
from dw_dagster.integrations.mage_runs import MageTimeline, runs_in_window, wait_for_run_after
from dw_dagster_dev.fakes.mage_server import DEFAULT_EMAIL, DEFAULT_PASSWORD, FakeMage, FakeMageServer
from dw_dagster_tests.harness.mage_server import FAIL_MESSAGE, MageAdmin

FAST = RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=0.05, timeout_s=5.0)
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 3, 2, 8, 0, tzinfo=UTC)  # an incident window: 08:00–12:00
T1 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def mage():
    with FakeMageServer(FakeMage()) as server:
        yield server


@pytest.fixture
def batch(mage):
    """The fake set up as the real-server tests set Mage up (REST): ``(admin, pipeline uuid, trigger id, token)``."""
    admin = MageAdmin(mage.url, DEFAULT_EMAIL, DEFAULT_PASSWORD)
    return (admin, *admin.batch_pipeline())


def client(server, **kw):
    kw.setdefault("email", DEFAULT_EMAIL)
    kw.setdefault("password", DEFAULT_PASSWORD)
    return MageClient(server.url, policy=kw.pop("policy", FAST), **kw)


def fault(server, **body):
    httpx.post(f"{server.url}/_fake/faults", json=body).raise_for_status()


def h(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


# -- reads -------------------------------------------------------------------------------------

def test_status_pipelines_and_trigger_lookup(mage, batch):
    admin, uuid, trigger_id, token = batch
    c = client(mage)
    status = c.status()
    assert (status.require_user_authentication, status.scheduler_status) == (True, "running")
    assert [p.uuid for p in c.pipelines()] == ["dw_batch"]
    pipeline = c.pipeline(uuid)
    assert (pipeline.type, [(b.uuid, b.type, b.language) for b in pipeline.blocks]) == (
        "python", [("load_orders", "data_loader", "python")])
    trigger = c.find_trigger(uuid, schedule_type="api")
    assert (trigger.id, trigger.name, trigger.status) == (trigger_id, "dw_api_trigger", "active")
    assert token not in repr(trigger) and not hasattr(trigger, "token")  # a trigger token starts runs: not kept
    assert c.find_trigger(uuid, name="nightly") is None
    assert c.pipeline_url(uuid) == f"{mage.url}/pipelines/dw_batch/triggers"


def test_runs_block_runs_and_logs_of_a_completed_and_a_failed_run(mage, batch):
    admin, uuid, trigger_id, token = batch
    ok = admin.trigger(trigger_id, token)
    bad = admin.trigger(trigger_id, token, fail=True)
    assert (ok["status"], bad["status"]) == ("initial", "initial")
    admin.wait_finished(bad["id"])
    c = client(mage)
    runs = c.pipeline_runs(uuid)
    assert [(r.id, r.status, r.pipeline_schedule_name) for r in runs] == [
        (ok["id"], "completed", "dw_api_trigger"), (bad["id"], "failed", "dw_api_trigger")]
    done, failed = runs
    assert done.completed_at is not None and done.ended_at == done.completed_at and done.started_at.tzinfo == UTC
    assert failed.completed_at is None and failed.ended_at == failed.updated_at  # Mage leaves completed_at empty
    assert [(b.block_uuid, b.status, b.error) for b in failed.block_runs] == [("load_orders", "failed", FAIL_MESSAGE)]
    assert failed.failed_blocks == failed.block_runs and done.failed_blocks == ()
    detail = c.pipeline_run(bad["id"])
    assert (detail.status, detail.block_runs[0].error) == ("failed", FAIL_MESSAGE)
    assert [(b.block_uuid, b.status) for b in c.block_runs(bad["id"])] == [("load_orders", "failed")]
    logs = c.run_logs(failed)
    assert logs.last_error == f"ValueError: {FAIL_MESSAGE}" and logs.errors == 2  # block log and scheduler log
    assert {f.name for f in logs.files} == {"load_orders.log", "pipeline.log", "scheduler.log"}
    assert c.run_logs(done).errors == 0
    assert c.run_url(failed) == f"{mage.url}/pipelines/dw_batch/runs/{bad['id']}"


def test_runs_are_paged_filtered_by_status_and_creation_time(mage):
    state = mage.state
    state.add_pipeline("finance_daily")
    state.add_block("finance_daily", "load")
    for i, status in enumerate(["completed", "completed", "failed", "completed", "cancelled"]):
        state.add_run("finance_daily", status, h(i), h(i + 0.5))
    c = client(mage)
    c.pipeline_runs("finance_daily", page_size=2)  # log in before counting requests
    before = len(state.requests)
    runs = c.pipeline_runs("finance_daily", page_size=2)
    assert [r.status for r in runs] == ["completed", "completed", "failed", "completed", "cancelled"]
    assert [r.id for r in runs] == sorted(r.id for r in runs)
    assert len(state.requests) - before == 3  # 2 + 2 + 1 with _limit=2 / _offset
    assert [r.status for r in c.pipeline_runs("finance_daily", status="failed")] == ["failed"]
    assert [r.status for r in c.pipeline_runs("finance_daily", status=("failed", "cancelled"))] == ["failed", "cancelled"]
    # created one second before they started
    window = c.pipeline_runs("finance_daily", created_after=h(1) - dt.timedelta(seconds=1),
                             created_before=h(3) - dt.timedelta(seconds=2))
    assert [r.started_at for r in window] == [h(1), h(2)]
    naive = c.pipeline_runs("finance_daily", created_after=(h(1) - dt.timedelta(seconds=1)).replace(tzinfo=None),
                            created_before=(h(3) - dt.timedelta(seconds=2)).replace(tzinfo=None))
    assert naive == window  # naive datetimes are UTC
    assert c.latest_run("finance_daily").status == "cancelled"
    assert c.latest_run("nothing_ran") is None
    with pytest.raises(MageError, match="more than 3 items"):
        c.pipeline_runs("finance_daily", max_runs=3)


def test_block_runs_are_paged(mage):
    state = mage.state
    state.add_pipeline("wide")
    for i in range(5):
        state.add_block("wide", f"b{i}", upstream_blocks=[f"b{i - 1}"] if i else None)
    run = state.add_run("wide", "completed", h(0), h(1))
    assert [b.block_uuid for b in client(mage).block_runs(run["id"], page_size=2)] == [f"b{i}" for i in range(5)]


def test_logs_of_one_run_leave_out_other_runs_files(mage, batch):
    admin, uuid, trigger_id, token = batch
    first = admin.wait_finished(admin.trigger(trigger_id, token, fail="first failure")["id"])
    second = admin.wait_finished(admin.trigger(trigger_id, token, fail="second failure")["id"])
    c = client(mage)
    assert c.run_logs(c.pipeline_run(first["id"])).last_error == "ValueError: first failure"
    assert c.run_logs(c.pipeline_run(second["id"])).last_error == "ValueError: second failure"


def test_summarize_log_counts_levels_and_keeps_the_exception_line():
    lines = [
        '2026-12-02T04:57:21 {"level": "INFO", "message": "Start executing block with BlockExecutor."}',
        '2026-12-02T04:57:21 {"level": "WARNING", "message": "attempt 1 of 1", "error": "Traceback...\\nKeyError: x\\n"}',
        '2026-12-02T04:57:21 {"level": "EXCEPTION", "message": "Failed to execute block load", '
        '"error": "Traceback\\nValueError: boom\\n"}',
        "Traceback (most recent call last):",
        '  File "<string>", line 8, in load_data',
        '2026-12-02T04:57:29 {"level": "ERROR", "message": "no error field"}',
    ]
    f = summarize_log("load.log", "\n".join(lines) + "\n\n")
    assert (f.lines, f.errors, f.warnings, f.last_error) == (6, 2, 1, "no error field")
    assert summarize_log("a.log", "\n".join(lines[:3])).last_error == "ValueError: boom"
    assert summarize_log("empty.log", "").lines == 0


# -- auth --------------------------------------------------------------------------------------

def test_session_token_is_renewed_before_it_expires(mage, batch):
    now = [time.time()]
    mage.state.token_ttl_s = 100
    c = client(mage, clock=lambda: now[0])
    c.pipelines()
    c.pipelines()
    assert c.logins == 1
    now[0] += 75  # within 30 s of expiry: renewed ahead, no 401 on the way
    c.pipelines()
    assert c.logins == 2


def test_expired_session_is_renewed_once_and_the_request_retried(mage, batch):
    c = client(mage)
    c.pipelines()
    fault(mage, expire_tokens=True)  # every session so far answers 401 expired_oauth_token
    assert [p.uuid for p in c.pipelines()] == ["dw_batch"]
    assert c.logins == 2


def test_a_session_refused_right_after_login_is_an_error_naming_the_clock(mage, batch):
    c = client(mage)
    mage.state.token_ttl_s = -5  # every new session is already expired (a server clock far ahead)
    with pytest.raises(MageApiError) as e:
        c.pipelines()
    assert e.value.type == "expired_oauth_token" and "clock" in str(e.value) and c.logins == 2


def test_wrong_password_names_the_user_and_never_the_password(mage):
    c = client(mage, password="not-the-password")
    assert c.status().require_user_authentication  # no login for /api/status
    with pytest.raises(MageApiError) as e:
        c.pipelines()
    err = e.value
    assert (err.status, err.code, err.type, err.endpoint) == (404, 404, "record_not_found", "/api/sessions")
    assert DEFAULT_EMAIL in str(err) and "MAGE_PASSWORD" in str(err) and "not-the-password" not in str(err)
    assert isinstance(err, DwDagsterError) and isinstance(err, HttpApiError)
    assert "not-the-password" not in repr(c)


def test_no_credentials_on_an_instance_with_user_authentication(mage, batch):
    c = MageClient(mage.url, policy=FAST)
    assert c.status().require_user_authentication  # /api/status needs no auth
    with pytest.raises(MageApiError) as e:
        c.pipeline_runs("dw_batch")
    assert (e.value.status, e.value.type) == (403, "unauthorized_access")
    assert "runs of pipeline 'dw_batch'" in str(e.value) and "MAGE_EMAIL" in str(e.value)


def test_an_instance_without_user_authentication_needs_no_login(mage, batch):
    mage.state.require_user_authentication = False
    c = MageClient(mage.url, policy=FAST)
    assert [p.uuid for p in c.pipelines()] == ["dw_batch"] and c.logins == 0


def test_wrong_api_key(mage):
    c = client(mage, api_key="not-mage-oss")
    with pytest.raises(MageApiError) as e:
        c.pipelines()
    assert (e.value.status, e.value.type) == (401, "invalid_api_key") and "MAGE_API_KEY" in str(e.value)


def test_token_never_reaches_an_error(mage, batch):
    c = client(mage)
    c.pipelines()
    token = c._token
    fault(mage, exception="database is locked", path="/api/pipeline_runs")
    with pytest.raises(MageApiError) as e:
        c.pipeline_runs("dw_batch")
    assert token not in str(e.value) and token not in repr(e.value.__dict__)
    assert "Mage raised: database is locked" in str(e.value)


def test_email_without_password_is_refused():
    with pytest.raises(MageError, match="both an email and a password"):
        MageClient("http://127.0.0.1:9", email="a@b.c")


# -- errors: HTTP-200 bodies, HTTP statuses, retries, transport ---------------------------------

def test_missing_pipeline_is_an_http_200_exception_body(mage, batch):
    c = client(mage)
    with pytest.raises(MageApiError) as e:
        c.pipeline("nope")
    err = e.value
    assert (err.status, err.code) == (200, 500)  # Mage rewrites the exception to HTTP 200
    assert "pipeline 'nope'" in str(err) and "Pipeline nope does not exist." in str(err) and "GET /api/pipelines" in str(err)
    with pytest.raises(MageApiError, match="logs of pipeline run 1 of 'nope'"):
        c.run_logs(MageRun(id=1, pipeline_uuid="nope", status="completed"))


def test_missing_run_is_404_naming_the_run(mage, batch):
    with pytest.raises(MageApiError) as e:
        client(mage).pipeline_run(999)
    assert (e.value.status, e.value.type) == (404, "record_not_found")
    assert str(e.value).startswith("mage GET /api/pipeline_runs/999: HTTP 404: pipeline run 999: not found; check")


def test_error_body_with_http_200_is_an_error_even_without_error_codes():
    """What Mage answers when ``_http_error_codes`` is not honoured: ``{"error": ..., "status": 200}`` at HTTP 200."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.url.params))
        return httpx.Response(200, json={"error": {"code": 403, "message": "Private access for list only, invalid scope.",
                                                   "type": "unauthorized_access"}, "status": 200})

    c = MageClient("http://mage.test", policy=FAST, transport=httpx.MockTransport(handler))
    with pytest.raises(MageApiError) as e:
        c.pipeline_runs("finance_daily")
    assert (e.value.status, e.value.code, e.value.type) == (200, 403, "unauthorized_access")
    assert seen[0]["_http_error_codes"] == "true" and seen[0]["disable_retries_grouping"] == "true"


def test_invalid_timestamp_is_400_record_invalid(mage, batch):
    c = client(mage)
    with pytest.raises(MageApiError) as e:
        c.request("GET", "/api/pipeline_runs", what="runs", params={"start_timestamp": "yesterday"})
    assert (e.value.status, e.value.type) == (400, "record_invalid")


def test_5xx_and_429_are_retried(mage, batch):
    c = client(mage)
    fault(mage, status=503, count=2, path="/api/pipelines$")
    assert [p.uuid for p in c.pipelines()] == ["dw_batch"]
    fault(mage, status=429, count=2, path="/api/pipelines$")
    assert [p.uuid for p in c.pipelines()] == ["dw_batch"]
    fault(mage, status=502, count=10, path="/api/pipelines$")
    with pytest.raises(MageApiError) as e:
        c.pipelines()
    assert e.value.status == 502 and "still failing after 3 attempts" in str(e.value) and "server log" in str(e.value)


def test_unreachable_server_names_the_url():
    c = MageClient("http://127.0.0.1:9", policy=RetryPolicy(attempts=2, base_wait_s=0.01, timeout_s=1.0))
    with pytest.raises(MageApiError) as e:
        c.status()
    assert e.value.status is None and "running and reachable at http://127.0.0.1:9" in str(e.value)


def test_a_server_that_ignores_offset_stops_the_paging():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"pipeline_runs": [{"id": 1, "pipeline_uuid": "p", "status": "completed"}],
                                         "metadata": {"count": 9, "next": True}})

    c = MageClient("http://mage.test", policy=FAST, transport=httpx.MockTransport(handler))
    with pytest.raises(MageApiError, match="repeats the previous one"):
        c.pipeline_runs("p", page_size=1)


def test_malformed_answers_are_errors():
    answers = iter([httpx.Response(200, text="<html>proxy</html>"), httpx.Response(200, json=[1, 2]),
                    httpx.Response(200, json={"statuses": []})])
    c = MageClient("http://mage.test", policy=FAST, transport=httpx.MockTransport(lambda r: next(answers)))
    for match in ("not JSON", "expected a JSON object", "no 'statuses'"):
        with pytest.raises(MageApiError, match=match):
            c.status()


# -- evidence: runs in a window ------------------------------------------------------------------

def seeded(mage):
    s = mage.state
    s.add_pipeline("orders_stream", type="streaming")
    s.add_pipeline("finance_daily")
    s.add_block("finance_daily", "load_orders")
    s.add_block("finance_daily", "aggregate", "transformer", upstream_blocks=["load_orders"])
    return s


def test_a_stream_running_through_the_window_ran_throughout_but_is_not_green(mage):
    s = seeded(mage)
    s.add_run("orders_stream", "cancelled", h(-30), h(-20))  # long before: not in the window
    stream = s.add_run("orders_stream", "running", h(-3))  # started before the window, still running
    c = client(mage)
    tl = runs_in_window(c, "orders_stream", T0, T1, now=h(6))
    assert [r.id for r in tl.runs] == [stream["id"]] and tl.statuses == ["running"]
    assert tl.ran_throughout and tl.covered and not tl.ran_green and tl.in_progress == tl.runs
    assert tl.lines() == [f"Mage orders_stream run {stream['id']} running 2026-03-02 05:00:00Z → still running at "
                          "2026-03-02 14:00:00Z; no block runs"]


def test_a_stream_created_days_before_the_lookback_is_still_found_while_running(mage):
    s = seeded(mage)
    s.add_run("orders_stream", "running", h(-24 * 9))
    tl = runs_in_window(client(mage), "orders_stream", T0, T1, lookback=dt.timedelta(hours=1))
    assert tl.statuses == ["running"] and tl.ran_throughout


def test_a_cancelled_stream_run_in_the_window_is_its_own_evidence(mage):
    s = seeded(mage)
    s.add_run("orders_stream", "cancelled", h(-3), h(2))
    s.add_run("orders_stream", "running", h(2.1))
    tl = runs_in_window(client(mage), "orders_stream", T0, T1, now=h(5))
    assert tl.statuses == ["cancelled", "running"] and [r.status for r in tl.problems] == ["cancelled"]
    assert not tl.ran_throughout and not tl.ran_green


def test_a_gap_between_stream_runs_is_not_throughout(mage):
    s = seeded(mage)
    s.add_run("orders_stream", "completed", h(-1), h(1))
    s.add_run("orders_stream", "running", h(2))  # nothing ran 09:00–10:00
    tl = runs_in_window(client(mage), "orders_stream", T0, T1, now=h(5))
    assert tl.statuses == ["completed", "running"] and not tl.problems and not tl.covered and not tl.ran_throughout


def test_batch_runs_all_completed_ran_green(mage):
    s = seeded(mage)
    s.add_run("finance_daily", "completed", h(-2), h(-1.5))  # ended before the window
    s.add_run("finance_daily", "completed", h(-0.5), h(0.5))  # started before, ended inside
    s.add_run("finance_daily", "completed", h(2), h(2.5))
    s.add_run("finance_daily", "failed", h(4.5), h(5))  # after the window
    c = client(mage)
    tl = runs_in_window(c, "finance_daily", T0, T1, now=h(6))
    assert tl.statuses == ["completed", "completed"] and tl.ran_green and not tl.problems
    assert [[(b.block_uuid, b.status) for b in r.block_runs] for r in tl.runs] == [
        [("load_orders", "completed"), ("aggregate", "completed")]] * 2
    assert not tl.ran_throughout  # a daily batch does not cover the window; ran_green is its verdict
    evidence = tl.to_dict()
    assert json.loads(json.dumps(evidence)) == evidence
    assert (evidence["pipeline"], evidence["ran_green"], evidence["statuses"], evidence["start"]) == (
        "finance_daily", True, ["completed", "completed"], "2026-03-02T08:00:00+00:00")
    assert evidence["runs"][0]["block_runs"] == [{"block": "load_orders", "status": "completed", "error": None},
                                                 {"block": "aggregate", "status": "completed", "error": None}]
    assert tl.lines(c)[1].endswith(f"<{mage.url}/pipelines/finance_daily/runs/{tl.runs[1].id}>")


def test_a_failed_batch_run_is_not_green_and_names_its_block(mage):
    s = seeded(mage)
    s.add_run("finance_daily", "completed", h(1), h(1.5))
    bad = s.add_run("finance_daily", "failed", h(2), h(2.5))
    tl = runs_in_window(client(mage), "finance_daily", T0.replace(tzinfo=None), T1.replace(tzinfo=None))
    assert tl.statuses == ["completed", "failed"] and not tl.ran_green and [r.id for r in tl.problems] == [bad["id"]]
    assert [(b.block_uuid, b.status, b.error) for b in tl.runs[1].block_runs] == [
        ("load_orders", "failed", "seeded failure"), ("aggregate", "upstream_failed", None)]
    assert "load_orders failed (seeded failure), aggregate upstream_failed" in tl.lines()[1]


def test_an_empty_window_is_no_evidence(mage):
    seeded(mage)
    tl = runs_in_window(client(mage), "finance_daily", T0, T1)
    assert tl.runs == () and not tl.ran_green and not tl.ran_throughout and not tl.covered


def test_window_end_before_start_is_refused(mage):
    with pytest.raises(ValueError, match="before its start"):
        runs_in_window(client(mage), "finance_daily", T1, T0)


def test_missing_nested_block_runs_are_read_from_the_block_runs_endpoint():
    """When a run reports more block runs than it nests, they are read with GET /api/block_runs."""
    run = {"id": 7, "pipeline_uuid": "p", "status": "completed", "created_at": "2026-03-02 09:00:00",
           "started_at": "2026-03-02 09:00:01", "completed_at": "2026-03-02 09:10:00", "block_runs": [],
           "block_runs_count": 2}
    block = {"pipeline_run_id": 7, "status": "completed", "created_at": "2026-03-02T09:00:00"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/block_runs":
            assert request.url.params["pipeline_run_id"] == "7"
            return httpx.Response(200, json={"block_runs": [{**block, "id": 1, "block_uuid": "a"},
                                                            {**block, "id": 2, "block_uuid": "b"}],
                                             "metadata": {"count": 2, "next": False}})
        runs = [] if request.url.params.get("status[]") else [run]
        return httpx.Response(200, json={"pipeline_runs": runs, "metadata": {"count": len(runs), "next": False}})

    c = MageClient("http://mage.test", policy=FAST, transport=httpx.MockTransport(handler))
    tl = runs_in_window(c, "p", T0, T1)
    assert [b.block_uuid for b in tl.runs[0].block_runs] == ["a", "b"] and tl.ran_green


def test_the_timeline_is_a_frozen_model():
    tl = MageTimeline(pipeline_uuid="p", start=T0, end=T1, read_at=T1)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        tl.runs = ()


# -- evidence: waiting for the rerun -------------------------------------------------------------

class Clock:
    """A monotonic clock that sleeps by moving forward; counts the sleeps."""

    def __init__(self) -> None:
        self.t, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_no_rerun_within_the_timeout_is_none_after_a_bounded_number_of_polls(mage, batch):
    clock = Clock()
    got = wait_for_run_after(client(mage), "dw_batch", dt.datetime.now(UTC), timeout_s=30, poll_s=10,
                             sleep=clock.sleep, monotonic=clock.monotonic)
    assert got is None and clock.sleeps == [10, 10, 10]


def test_an_older_run_is_not_the_rerun(mage, batch):
    admin, uuid, trigger_id, token = batch
    admin.wait_finished(admin.trigger(trigger_id, token)["id"])
    time.sleep(1.1)  # created_at has whole seconds
    clock = Clock()
    assert wait_for_run_after(client(mage), uuid, dt.datetime.now(UTC), timeout_s=1, poll_s=1, sleep=clock.sleep,
                              monotonic=clock.monotonic) is None


def test_the_rerun_is_waited_for_until_it_finished(mage, batch):
    admin, uuid, trigger_id, token = batch
    after = dt.datetime.now(UTC)
    mage.state.pickup_s = 0.6
    run = admin.trigger(trigger_id, token)
    got = wait_for_run_after(client(mage), uuid, after, timeout_s=20, poll_s=0.2)
    assert (got.id, got.status) == (run["id"], "completed") and got.created_at >= after.replace(microsecond=0)


def test_a_failed_rerun_is_returned_with_its_reason(mage, batch):
    admin, uuid, trigger_id, token = batch
    after = dt.datetime.now(UTC)
    admin.trigger(trigger_id, token, fail="duplicate key in orders")
    c = client(mage)
    got = wait_for_run_after(c, uuid, after, timeout_s=20, poll_s=0.2)
    assert got.status == "failed" and got.failed_blocks[0].error == "duplicate key in orders"
    assert c.run_logs(got).last_error == "ValueError: duplicate key in orders"


def test_a_newer_rerun_is_followed(mage, batch):
    admin, uuid, trigger_id, token = batch
    after = dt.datetime.now(UTC)
    mage.state.pickup_s = 1.0
    admin.trigger(trigger_id, token, fail=True)
    second = admin.trigger(trigger_id, token)
    assert wait_for_run_after(client(mage), uuid, after, timeout_s=20, poll_s=0.2).id == second["id"]


def test_a_rerun_still_running_at_the_timeout_is_returned_as_running(mage):
    s = seeded(mage)
    trigger = s.add_trigger("orders_stream", "api")
    after = dt.datetime.now(UTC)
    s.start_run(trigger["id"])  # a stream run never finishes by itself
    clock = Clock()
    got = wait_for_run_after(client(mage), "orders_stream", after, timeout_s=5, poll_s=2, sleep=clock.sleep,
                             monotonic=clock.monotonic)
    assert got.status in ("initial", "running") and clock.sleeps == [2, 2, 1]


@pytest.mark.parametrize("timeout_s,poll_s", [(0, 1), (-1, 1), (float("inf"), 1), (10, 0), (10, float("nan"))])
def test_wait_is_bounded(timeout_s, poll_s):
    with pytest.raises(ValueError, match="positive and finite"):
        wait_for_run_after(MageClient("http://127.0.0.1:9"), "p", T0, timeout_s=timeout_s, poll_s=poll_s)


# -- Dagster resource and the fake as its own process --------------------------------------------

def test_resource_reads_secrets_from_env_vars(mage, batch, monkeypatch):
    monkeypatch.setenv("DW_TEST_MAGE_PASSWORD", DEFAULT_PASSWORD)

    @dg.asset
    def mage_pipelines(mage: MageResource) -> list[str]:
        return [p.uuid for p in mage.get_client().pipelines()]

    result = dg.materialize([mage_pipelines], resources={"mage": MageResource(
        url=mage.url, email=DEFAULT_EMAIL, password=dg.EnvVar("DW_TEST_MAGE_PASSWORD"), attempts=2)})
    assert result.success and result.output_for_node("mage_pipelines") == ["dw_batch"]


def test_resource_falls_back_to_the_mage_variables(mage, batch, monkeypatch):
    monkeypatch.setenv("MAGE_URL", mage.url)
    monkeypatch.setenv("MAGE_EMAIL", DEFAULT_EMAIL)
    monkeypatch.setenv("MAGE_PASSWORD", DEFAULT_PASSWORD)
    c = MageResource(ui_url="https://mage.example").get_client()
    assert [p.uuid for p in c.pipelines()] == ["dw_batch"] and c.logins == 1
    assert c.pipeline_url("dw_batch") == "https://mage.example/pipelines/dw_batch/triggers"


def test_resource_without_url_or_with_half_the_credentials(monkeypatch):
    for var in ("MAGE_URL", "MAGE_EMAIL", "MAGE_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(MageError, match="MAGE_URL"):
        MageResource().get_client()
    with pytest.raises(MageError, match="MAGE_PASSWORD"):
        MageResource(url="http://127.0.0.1:9", email="a@b.c").get_client()


def test_fake_runs_as_its_own_process():
    proc = subprocess.Popen([sys.executable, "-m", "dw_dagster_dev.fakes.mage_server", "--port", "0"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        info = json.loads(proc.stdout.readline())
        assert info["url"].startswith("http://127.0.0.1:")
        c = MageClient(info["url"], email=info["email"], password=info["password"], policy=FAST)
        assert c.status().require_user_authentication and c.pipelines() == [] and c.logins == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
