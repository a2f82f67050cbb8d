"""MageClient and the Mage evidence against a REAL Mage server (mage-ai 0.9.80, user authentication on),
and the fake Mage checked against it request by request.

The server runs from its own venv (``dw_dagster_tests/harness/mage_server.py``), built the first time
(measured on the 2-core machine: 45 s with uv from a clean cache, 5.7 min with pip alone) and reused
afterwards; starting it takes 14–25 s and each batch run about 20 s (the whole file: about 2 min 15 s
from a clean machine). These tests are never skipped: a venv that cannot be built or a server that
does not start fails them, with the reason.
"""

import contextlib
import re
import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from dw_dagster.core.http import RetryPolicy
from dw_dagster.integrations.mage import MageApiError, MageClient, MageRun
from dw_dagster.integrations.mage_runs import runs_in_window, wait_for_run_after
from dw_dagster.diagnosis.mage_evidence import GREEN_SENTENCE, PROBLEM_FACTOR, MageSource, read_mage_evidence
from dw_dagster.repair.mage_rerun import wait_for_reruns
from dw_dagster_dev.fakes.mage_server import DEFAULT_EMAIL, DEFAULT_PASSWORD, FakeMage, FakeMageServer
from dw_dagster_tests.harness.mage_server import (
    FAIL_MESSAGE,
    MAGE_API_KEY,
    MAGE_VERSION,
    MageAdmin,
    ensure_mage_venv,
    mage_server,
    mage_venv_path,
)

UTC = dt.timezone.utc
TTL_S = 20  # MAGE_ACCESS_TOKEN_EXPIRY_TIME on the real server: sessions expire during the tests
POLICY = RetryPolicy(attempts=3, base_wait_s=0.2, max_wait_s=1.0, timeout_s=30.0)


@dataclass
class Setup:
    """A Mage server (real or fake) set up through its REST API the same way."""

    url: str
    email: str
    password: str
    admin: MageAdmin
    uuid: str
    trigger_id: int
    token: str
    ok: dict[str, Any]
    bad: dict[str, Any]
    started: dt.datetime
    stale: MageClient  # logged in before the runs; its session has expired since
    stale_login: float

    def client(self, **kw: Any) -> MageClient:
        kw.setdefault("email", self.email)
        kw.setdefault("password", self.password)
        return MageClient(self.url, policy=POLICY, **kw)


def set_up(url: str, email: str, password: str) -> Setup:
    """A batch pipeline with a loader block and an API trigger, and two runs: one completes, one fails."""
    admin = MageAdmin(url, email, password)
    uuid, trigger_id, token = admin.batch_pipeline()
    stale = MageClient(url, email=email, password=password, policy=POLICY)
    stale.pipelines()
    stale_login = time.monotonic()
    started = dt.datetime.now(UTC)
    ok, bad = admin.trigger(trigger_id, token), admin.trigger(trigger_id, token, fail=True)
    ok, bad = admin.wait_finished(ok["id"]), admin.wait_finished(bad["id"])
    return Setup(url, email, password, admin, uuid, trigger_id, token, ok, bad, started, stale, stale_login)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    try:
        build = ensure_mage_venv()
    except RuntimeError as e:
        pytest.fail(f"could not build the venv for the real Mage server (mage-ai=={MAGE_VERSION} from the package "
                    f"index into {mage_venv_path()}; set DW_MAGE_VENV to use another place):\n{e}", pytrace=False)
    if build.built_seconds is not None:
        print(f"\nbuilt the Mage venv in {build.built_seconds:.0f} s")
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(mage_server(build.python, tmp_path_factory.mktemp("mage"), token_ttl_s=TTL_S))
        except RuntimeError as e:
            pytest.fail(f"the real Mage server did not start: {e}", pytrace=False)
        print(f"\nmage start ready in {server.ready_seconds:.1f} s")
        began = time.monotonic()
        setup = set_up(server.url, server.email, server.password)
        print(f"two batch runs finished in {time.monotonic() - began:.1f} s")
        yield setup


@pytest.fixture(scope="module")
def fake():
    with FakeMageServer(FakeMage(token_ttl_s=TTL_S)) as server:
        yield set_up(server.url, DEFAULT_EMAIL, DEFAULT_PASSWORD)


# -- the fake against the real server --------------------------------------------------------------

def shape_differences(real: Any, fake: Any, where: str = "") -> list[str]:
    """Where ``fake`` does not have ``real``'s shape: other keys, or another JSON type where both are set.

    Lists are compared element to element when their items carry an ``id`` or ``uuid`` (those found
    in both), else by their first items; null matches any type (a run may not have ended yet).
    """
    if real is None or fake is None:
        return []
    if isinstance(real, dict) and isinstance(fake, dict):
        out = [f"{where}.{k}: {'missing in the fake' if k in real else 'only in the fake'}"
               for k in sorted(set(real) ^ set(fake))]
        for k in sorted(set(real) & set(fake)):
            out += shape_differences(real[k], fake[k], f"{where}.{k}")
        return out
    if isinstance(real, list) and isinstance(fake, list):
        if not real or not fake:
            return []
        key = next((k for k in ("uuid", "id") if isinstance(real[0], dict) and k in real[0]), None)
        if key:
            mine = {f.get(key): f for f in fake if isinstance(f, dict)}
            pairs = [(r, mine[r.get(key)]) for r in real if isinstance(r, dict) and r.get(key) in mine]
            if pairs:
                return [d for r, f in pairs for d in shape_differences(r, f, f"{where}[{key}={r.get(key)}]")]
        return shape_differences(real[0], fake[0], f"{where}[0]")
    if type(real) is not type(fake):
        return [f"{where}: {type(real).__name__} on the real server, {type(fake).__name__} in the fake"]
    return []


def facts(body: Any) -> dict[str, Any]:
    """What must be equal, not just alike: error code and type, run and block-run statuses, page metadata."""
    out: dict[str, Any] = {}
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            out["error"] = (body["error"].get("code"), body["error"].get("type"), body.get("status"))
        for key in ("pipeline_runs", "block_runs"):
            if isinstance(body.get(key), list):
                out[key] = [(i.get("id"), i.get("status")) for i in body[key]]
        if isinstance(body.get("pipeline_run"), dict):
            run = body["pipeline_run"]
            out["pipeline_run"] = (run.get("status"), [(b.get("block_uuid"), b.get("status")) for b in run.get("block_runs") or []])
        if isinstance(body.get("metadata"), dict) and ("pipeline_runs" in body or "block_runs" in body):
            out["metadata"] = {k: body["metadata"].get(k) for k in ("count", "next")}
    return out


_SESSIONS: dict[str, tuple[float, str, str]] = {}


def _session(setup: Setup) -> tuple[str, str]:
    """``(JWT, inner token)`` of a session of ``setup``'s server, renewed when half its lifetime has passed."""
    at, jwt, inner = _SESSIONS.get(setup.url, (0.0, "", ""))
    if time.monotonic() - at > TTL_S / 2:
        jwt, inner = setup.admin.session()
        _SESSIONS[setup.url] = (time.monotonic(), jwt, inner)
    return jwt, inner


def exchange(setup: Setup, name: str, method: str, path: str, params: dict, auth: str, body: Any) -> httpx.Response:
    jwt, inner = _session(setup)
    headers = {"session": {"X-API-KEY": MAGE_API_KEY, "OAUTH-TOKEN": inner},
               "bearer": {"X-API-KEY": MAGE_API_KEY, "Authorization": f"Bearer {inner}"},
               "cookie": {"X-API-KEY": MAGE_API_KEY, "Cookie": f"oauth_token={jwt}"},
               "query_key": {"OAUTH-TOKEN": inner},
               "key_only": {"X-API-KEY": MAGE_API_KEY},
               "bad_key": {"X-API-KEY": "not-the-key", "OAUTH-TOKEN": inner},
               "bad_token": {"X-API-KEY": MAGE_API_KEY, "OAUTH-TOKEN": "not-a-token"},
               "none": {}}[auth]
    if auth == "query_key":
        params = {**params, "api_key": MAGE_API_KEY}
    fill = {"uuid": setup.uuid, "ok": setup.ok["id"], "bad": setup.bad["id"], "trigger": setup.trigger_id}
    return httpx.request(method, setup.url + path.format(**fill), params={k: str(v).format(**fill) for k, v in params.items()},
                         headers=headers, json=body, timeout=60)


CODES = {"_http_error_codes": "true"}
SESSION_OK = {"session": {"email": "{email}", "password": "{password}"}}
REQUESTS = [
    ("status", "GET", "/api/status", {}, "none", None),
    ("login", "POST", "/api/sessions", CODES, "key_only", SESSION_OK),
    ("login, wrong password", "POST", "/api/sessions", CODES, "key_only", {"session": {"email": "{email}", "password": "x"}}),
    ("login, wrong password, HTTP 200", "POST", "/api/sessions", {}, "key_only", {"session": {"email": "{email}", "password": "x"}}),
    ("login, no password", "POST", "/api/sessions", CODES, "key_only", {"session": {"email": "{email}"}}),
    ("login, no key", "POST", "/api/sessions", CODES, "none", SESSION_OK),
    ("pipelines", "GET", "/api/pipelines", CODES, "session", None),
    ("pipeline", "GET", "/api/pipelines/{uuid}", CODES, "session", None),
    ("missing pipeline", "GET", "/api/pipelines/no_such_pipeline", CODES, "session", None),
    ("missing pipeline's logs", "GET", "/api/pipelines/no_such_pipeline/logs", {}, "session", None),
    ("runs, first page", "GET", "/api/pipeline_runs", {**CODES, "pipeline_uuid": "{uuid}", "_limit": 1, "order_by[]": "id asc",
                                                       "disable_retries_grouping": "true"}, "session", None),
    ("runs, second page", "GET", "/api/pipeline_runs", {**CODES, "pipeline_uuid": "{uuid}", "_limit": 1, "_offset": 1,
                                                        "order_by[]": "id asc", "disable_retries_grouping": "true"}, "session", None),
    ("runs, failed", "GET", "/api/pipeline_runs", {**CODES, "pipeline_uuid": "{uuid}", "status": "failed"}, "session", None),
    ("runs, two statuses", "GET", "/api/pipeline_runs", {**CODES, "pipeline_uuid": "{uuid}", "status[]": "completed,failed",
                                                         "order_by[]": "id asc"}, "session", None),
    ("runs, created in a day", "GET", "/api/pipeline_runs", {**CODES, "pipeline_uuid": "{uuid}", "order_by[]": "id asc",
                                                             "start_timestamp": int(time.time()) - 86400,
                                                             "end_timestamp": int(time.time()) + 86400}, "session", None),
    ("runs, bad timestamp", "GET", "/api/pipeline_runs", {**CODES, "start_timestamp": "yesterday"}, "session", None),
    ("runs, bad timestamp, HTTP 200", "GET", "/api/pipeline_runs", {"start_timestamp": "yesterday"}, "session", None),
    ("runs, bad _limit", "GET", "/api/pipeline_runs", {**CODES, "_limit": "many"}, "session", None),
    ("completed run", "GET", "/api/pipeline_runs/{ok}", CODES, "session", None),
    ("failed run", "GET", "/api/pipeline_runs/{bad}", CODES, "session", None),
    ("missing run", "GET", "/api/pipeline_runs/987654", CODES, "session", None),
    ("missing run, HTTP 200", "GET", "/api/pipeline_runs/987654", {}, "session", None),
    ("run's block runs", "GET", "/api/pipeline_runs/{bad}/block_runs", CODES, "session", None),
    ("block runs", "GET", "/api/block_runs", {**CODES, "pipeline_run_id": "{bad}"}, "session", None),
    ("logs", "GET", "/api/pipelines/{uuid}/logs", {**CODES, "pipeline_run_id[]": "{bad}"}, "session", None),
    ("triggers", "GET", "/api/pipelines/{uuid}/pipeline_schedules", CODES, "session", None),
    ("no token, list", "GET", "/api/pipeline_runs", CODES, "key_only", None),
    ("no token, list, HTTP 200", "GET", "/api/pipeline_runs", {}, "key_only", None),
    ("no token, detail", "GET", "/api/pipeline_runs/{ok}", CODES, "key_only", None),
    ("wrong key", "GET", "/api/pipelines", CODES, "bad_key", None),
    ("wrong key, no error codes", "GET", "/api/pipelines", {}, "bad_key", None),
    ("no key", "GET", "/api/pipelines", CODES, "none", None),
    ("wrong token", "GET", "/api/pipelines", CODES, "bad_token", None),
    ("wrong token, no error codes", "GET", "/api/pipelines", {}, "bad_token", None),
    ("bearer token", "GET", "/api/pipeline_runs/{ok}", CODES, "bearer", None),
    ("cookie token", "GET", "/api/pipeline_runs/{ok}", CODES, "cookie", None),
    ("api_key in the query", "GET", "/api/pipeline_runs/{ok}", CODES, "query_key", None),
    ("trigger, wrong token", "POST", "/api/pipeline_schedules/{trigger}/pipeline_runs/not0the0token", CODES, "none",
     {"pipeline_run": {"variables": {}}}),
]


def test_the_fake_answers_like_the_real_server(real, fake):
    """The same requests against both: the same HTTP status, the same shape, the same errors and statuses.

    First in this file: it reads the two runs of the setup, before the rerun test adds more.
    """
    problems = []
    for name, method, path, params, auth, body in REQUESTS:
        answers = []
        for setup in (real, fake):
            filled = None if body is None else {"session": {k: v.format(email=setup.email, password=setup.password)
                                                            for k, v in body["session"].items()}} if "session" in body else body
            r = exchange(setup, name, method, path, params, auth, filled)
            answers.append((r.status_code, r.json()))
        (real_status, real_body), (fake_status, fake_body) = answers
        if real_status != fake_status:
            problems.append(f"{name}: HTTP {real_status} on the real server, {fake_status} in the fake")
        problems += [f"{name}: {d}" for d in shape_differences(real_body, fake_body)]
        if facts(real_body) != facts(fake_body):
            problems.append(f"{name}: {facts(real_body)} on the real server, {facts(fake_body)} in the fake")
    assert problems == []


# -- the client and the evidence on the real server ----------------------------------------------

def test_client_reads_the_real_server(real):
    c = real.client()
    status = c.status()
    assert (status.require_user_authentication, status.scheduler_status) == (True, "running")
    assert [(b.uuid, b.type) for b in c.pipeline(real.uuid).blocks] == [("load_orders", "data_loader")]
    assert real.uuid in [p.uuid for p in c.pipelines()]
    trigger = c.find_trigger(real.uuid, schedule_type="api")
    assert (trigger.id, trigger.name, trigger.status) == (real.trigger_id, "dw_api_trigger", "active")
    runs = c.pipeline_runs(real.uuid, page_size=1)
    assert [(r.id, r.status) for r in runs] == [(real.ok["id"], "completed"), (real.bad["id"], "failed")]
    assert [r.id for r in c.pipeline_runs(real.uuid, status="failed")] == [real.bad["id"]]
    assert len(c.pipeline_runs(real.uuid, status=("completed", "failed"), created_after=real.started - dt.timedelta(days=1),
                               created_before=dt.datetime.now(UTC) + dt.timedelta(days=1))) == 2
    ok, bad = runs
    assert ok.completed_at and ok.started_at and ok.started_at >= ok.created_at - dt.timedelta(seconds=1)
    assert bad.completed_at is None and bad.ended_at == bad.updated_at
    assert [(b.block_uuid, b.status, b.error) for b in c.pipeline_run(bad.id).block_runs] == [
        ("load_orders", "failed", FAIL_MESSAGE)]
    assert [(b.block_uuid, b.status) for b in c.block_runs(ok.id)] == [("load_orders", "completed")]
    logs = c.run_logs(bad)
    assert logs.last_error == f"ValueError: {FAIL_MESSAGE}" and logs.errors >= 1
    assert c.run_logs(ok).errors == 0 and c.run_logs(ok).files
    assert c.latest_run(real.uuid).id == bad.id


def test_errors_from_the_real_server(real):
    with pytest.raises(MageApiError) as e:
        MageClient(real.url, policy=POLICY).pipeline_runs(real.uuid)
    assert (e.value.status, e.value.type) == (403, "unauthorized_access") and "MAGE_EMAIL" in str(e.value)
    with pytest.raises(MageApiError) as e:
        real.client(password="wrong-password").pipelines()
    assert (e.value.status, e.value.type, e.value.endpoint) == (404, "record_not_found", "/api/sessions")
    assert "wrong-password" not in str(e.value)
    with pytest.raises(MageApiError) as e:
        real.client(api_key="not-the-key").pipelines()
    assert (e.value.status, e.value.type) == (401, "invalid_api_key")
    c = real.client()
    with pytest.raises(MageApiError) as e:
        c.pipeline("no_such_pipeline")
    assert (e.value.status, e.value.code) == (200, 500) and "Pipeline no_such_pipeline does not exist." in str(e.value)
    with pytest.raises(MageApiError) as e:
        c.pipeline_run(987654)
    assert (e.value.status, e.value.type) == (404, "record_not_found") and "pipeline run 987654: not found" in str(e.value)


def test_runs_in_window_on_the_real_server(real):
    c = real.client()
    tl = runs_in_window(c, real.uuid, real.started - dt.timedelta(minutes=1), dt.datetime.now(UTC))
    assert [(r.id, r.status) for r in tl.runs] == [(real.ok["id"], "completed"), (real.bad["id"], "failed")]
    assert not tl.ran_green and [r.id for r in tl.problems] == [real.bad["id"]]
    assert [b.error for b in tl.runs[1].block_runs] == [FAIL_MESSAGE]
    assert f"run {real.bad['id']} failed" in tl.lines(c)[1] and "load_orders failed (dw test: asked to fail)" in tl.lines()[1]
    before = runs_in_window(c, real.uuid, real.started - dt.timedelta(hours=2), real.started - dt.timedelta(hours=1))
    assert before.runs == () and not before.ran_green


def test_wait_for_a_rerun_that_completes_and_one_that_fails(real):
    """Two pipelines rerun at once (Mage runs them side by side): one rerun completes, the other fails."""
    c = real.client()
    other, other_trigger, other_token = real.admin.batch_pipeline("dw_rerun")
    after = dt.datetime.now(UTC)
    time.sleep(1.0)  # Mage's created_at has whole seconds
    assert wait_for_run_after(c, real.uuid, after, timeout_s=2, poll_s=1) is None  # nobody reran it yet
    began = time.monotonic()
    rerun = real.admin.trigger(real.trigger_id, real.token)
    failing = real.admin.trigger(other_trigger, other_token, fail="rerun refused: duplicate keys")
    got = wait_for_run_after(c, real.uuid, after, timeout_s=480, poll_s=2)
    print(f"\nrerun completed after {time.monotonic() - began:.1f} s")
    assert (got.id, got.status) == (rerun["id"], "completed")
    green = runs_in_window(c, real.uuid, after, dt.datetime.now(UTC))
    assert [r.id for r in green.runs] == [rerun["id"]] and green.ran_green and green.ran_throughout is False
    got = wait_for_run_after(c, other, after, timeout_s=480, poll_s=2)
    assert (got.id, got.status) == (failing["id"], "failed")
    assert got.failed_blocks[0].error == "rerun refused: duplicate keys"
    assert c.run_logs(got).last_error == "ValueError: rerun refused: duplicate keys"
    assert not runs_in_window(c, other, after, dt.datetime.now(UTC)).ran_green


def test_an_expired_session_is_renewed_on_the_real_server(real):
    time.sleep(max(0.0, real.stale_login + TTL_S + 1 - time.monotonic()))
    real.stale._renew_at = None  # do not renew ahead: the server must answer 401 expired_oauth_token first
    assert real.uuid in [p.uuid for p in real.stale.pipelines()]
    assert real.stale.logins == 2


def test_diagnosis_evidence_and_the_verify_wait_on_the_real_server(real):
    """The diagnosis's Mage evidence over the two set-up runs, then the verify stage's wait for a rerun
    that fails (run after the other tests: it adds a run to the pipeline)."""
    c = real.client()
    ended = max(MageRun.model_validate(r).ended_at for r in (real.ok, real.bad))  # later tests rerun the pipeline
    window = (real.started - dt.timedelta(minutes=1), ended + dt.timedelta(seconds=1))
    ev = read_mage_evidence(c, MageSource(writes=real.uuid), window)
    assert ev.details["statuses"] == {real.uuid: ["completed", "failed"]}
    assert ev.details["green_throughout"] is False and ev.confidence_factor == PROBLEM_FACTOR
    assert GREEN_SENTENCE not in ev.sentence and f"run {real.bad['id']} failed" in ev.sentence
    assert ev.details["problems"] == [{"pipeline": real.uuid, "run_id": real.bad["id"], "status": "failed",
                                       "blocks": [{"block": "load_orders", "status": "failed", "error": FAIL_MESSAGE}]}]
    assert [re.match(r"Mage \S+ run \d+ \w+", line).group(0) for line in ev.details["timeline"]] == [
        f"Mage {real.uuid} run {real.ok['id']} completed", f"Mage {real.uuid} run {real.bad['id']} failed"]
    empty = read_mage_evidence(c, MageSource(writes=real.uuid), (real.started - dt.timedelta(minutes=1),
                                                                    real.started - dt.timedelta(seconds=30)))
    assert empty.details["statuses"] == {real.uuid: []} and empty.details["green_throughout"] is False

    after = dt.datetime.now(UTC)
    time.sleep(1.0)  # Mage's created_at has whole seconds
    rerun = real.admin.trigger(real.trigger_id, real.token, fail="rerun: finance totals do not add up")
    (o,) = wait_for_reruns(c, [real.uuid], after, timeout_s=480, poll_s=2)
    assert (o["passed"], o["run_id"], o["status"]) == (False, rerun["id"], "failed")
    assert o["reason"] == f"run {rerun['id']} failed (block load_orders failed: rerun: finance totals do not add up)"
