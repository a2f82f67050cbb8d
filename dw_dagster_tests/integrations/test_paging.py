"""PagerDuty and Opsgenie clients against the protocol-accurate fake on loopback (real HTTP).

Also proves the fake rejects what the vendors' published schemas reject, and exercises its
fault switches (429 then success, persistent 500, slow responses) and its own-process mode.
"""

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from urllib.parse import quote

import dagster as dg
import httpx
import pytest

from dw_dagster_dev.fakes.paging_server import (
    DEFAULT_OPSGENIE_KEY,
    DEFAULT_PAGERDUTY_TOKEN,
    DEFAULT_PAGERDUTY_USERS,
    DEFAULT_ROUTING_KEY,
    start_paging_server,
)
from dw_dagster.core.http import HttpApiError
from dw_dagster.core.models import BlastRadius, CauseFinding, Diagnosis, ExposureRef, ImpactedNode, Incident, Receipt
from dw_dagster.integrations.paging import Pager, dedup_key_for, diagnosis_note, page_incident, resolution_note
from dw_dagster.integrations.opsgenie import OpsgenieResource
from dw_dagster.integrations.pagerduty import PagerDutyResource

NOW = dt.datetime(2026, 11, 28, 9, 30, tzinfo=dt.timezone.utc)
USER = DEFAULT_PAGERDUTY_USERS[0]
FAST = dict(timeout_s=2.0, retry_attempts=3, retry_base_wait_s=0.01, retry_max_wait_s=0.05)


@pytest.fixture(scope="module")
def fake():
    server, url = start_paging_server()
    yield server, url
    server.stop()


@pytest.fixture
def state(fake):
    fake[0].state.reset()
    return fake[0].state


@pytest.fixture
def url(fake, state):
    return fake[1]


def pagerduty(url: str, **overrides) -> PagerDutyResource:
    fields = dict(routing_key=DEFAULT_ROUTING_KEY, api_token=DEFAULT_PAGERDUTY_TOKEN, from_email=USER,
                  events_base_url=url, rest_base_url=url, incident_lookup_s=1.0, **FAST)
    fields.update(overrides)
    return PagerDutyResource(**fields)


def opsgenie(url: str, **overrides) -> OpsgenieResource:
    fields = dict(api_key=DEFAULT_OPSGENIE_KEY, base_url=url, responder_teams=["data-ops"], **FAST)
    fields.update(overrides)
    return OpsgenieResource(**fields)


def diagnosis() -> Diagnosis:
    radius = BlastRadius(
        root="model.store.store_sales_line",
        models=[ImpactedNode(unique_id=f"model.store.{n}", name=n, resource_type="model", depth=d)
                for d, n in enumerate(["fct_store_sales_daily", "region_sales_daily", "region_sales_mtd"], 1)],
        tests=[ImpactedNode(unique_id=f"test.store.t{i}", name=f"t{i}", resource_type="test", depth=2) for i in range(6)],
        exposures=[ExposureRef(unique_id="exposure.store.store_pnl", name="store_pnl", label="Store P&L",
                               type="dashboard", owner_name="Priya Raman", owner_email="priya.raman@grocer.example",
                               depth=4)],
        owners=["priya.raman@grocer.example"],
    )
    cause = CauseFinding(kind="late_rows_behind_watermark", summary="2124 source rows arrived after their partition was loaded",
                         confidence=1.0, explained_rows=2124, unexplained_rows=0, window=["2026-11-26", "2026-11-27"])
    return Diagnosis(id="dg-1", incident_id="inc-4f296e71f448", asset_key=["store_sales_line"], created_at=NOW,
                     causes=[cause], blast_radius=radius, gap_rows=2124, unexplained_rows=0)


def receipt() -> Receipt:
    return Receipt(id="rc-1", asset_key=["store_sales_line"], change_set_id="cs-77d7aa500c", change_set_version="v1",
                   incident_id="inc-4f296e71f448", cause_kind="late_rows_behind_watermark", cause_summary="late rows",
                   evidence_summary={}, diff="", approver="dana.ortiz@grocer.example", approved_at=NOW,
                   signature_valid=True, partitions=["2026-11-26", "2026-11-27"], run_ids={}, rows_before={},
                   rows_after={}, checks=[], verified=True, undo="", created_at=NOW, previous_hash=None)


# -- dedup key ---------------------------------------------------------------------------------

def test_dedup_key_is_stable_and_bounded():
    assert dedup_key_for("inc-4f296e71f448") == dedup_key_for("inc-4f296e71f448") == "dw-dagster:inc-4f296e71f448"
    a, b = dedup_key_for("x" * 300 + "a"), dedup_key_for("x" * 300 + "b")
    assert a != b and len(a) <= 255 and len(b) <= 255
    assert a == dedup_key_for("x" * 300 + "a")
    with pytest.raises(ValueError):
        dedup_key_for("  ")


# -- PagerDuty ---------------------------------------------------------------------------------

def test_pagerduty_trigger_annotate_resolve_with_receipt(url, state):
    pd = pagerduty(url)
    assert isinstance(pd, Pager)
    key = pd.trigger("inc-4f296e71f448", "store_sales_line is 2,124 rows short in Southwest", severity="critical",
                     details={"gap_rows": 2124}, links=[("http://dagster.local/assets/store_sales_line", "Asset")],
                     component="store_sales_line", group="store_sales", event_class="reconciliation")
    assert key == dedup_key_for("inc-4f296e71f448")
    pd.trigger("inc-4f296e71f448", "again")  # same dedup key: same incident
    [incident] = state.pagerduty_incidents(key)
    assert incident["status"] == "triggered" and incident["alert_counts"]["triggered"] == 2
    assert incident["links"] == [{"href": "http://dagster.local/assets/store_sales_line", "text": "Asset"}]
    assert incident["custom_details"] == {"gap_rows": 2124}

    pd.annotate("inc-4f296e71f448", diagnosis_note(diagnosis()))
    pd.acknowledge("inc-4f296e71f448")
    pd.resolve("inc-4f296e71f448", receipt_url="http://dagster.local/assets/store_sales_line?tab=events")

    [incident] = state.pagerduty_incidents(key)
    assert incident["status"] == "resolved"
    cause_note, receipt_note = (n["content"] for n in incident["notes"])
    assert "late_rows_behind_watermark" in cause_note and "confidence 100%" in cause_note
    assert "fct_store_sales_daily, region_sales_daily, region_sales_mtd" in cause_note
    assert "Store P&L (dashboard, owner Priya Raman <priya.raman@grocer.example>)" in cause_note
    assert "Receipt: http://dagster.local/assets/store_sales_line?tab=events" in receipt_note
    assert all(n["user"]["summary"] == USER for n in incident["notes"])
    # the receipt note is posted before the resolve event
    calls = [(r["method"], r["path"]) for r in state.request_log() if r["method"] == "POST"]
    assert calls[-2:] == [("POST", f"/incidents/{incident['id']}/notes"), ("POST", "/v2/enqueue")]
    # the event bodies kept by the fake never hold the routing key
    assert DEFAULT_ROUTING_KEY not in str(state.snapshot())

    # a new trigger after resolution opens a new incident (Events API v2 de-duplication rules)
    pd.trigger("inc-4f296e71f448", "it is back")
    assert [i["status"] for i in state.pagerduty_incidents(key)] == ["resolved", "triggered"]
    assert pd.find_incident(key, wait_s=0)["status"] == "triggered"


def test_pagerduty_clips_summary_to_the_documented_limit(url, state):
    pagerduty(url).trigger("inc-long", "s" * 5000)
    [incident] = state.pagerduty_incidents(dedup_key_for("inc-long"))
    assert len(incident["title"]) == 1024


def test_pagerduty_annotate_without_incident_is_a_clear_error(url, state):
    with pytest.raises(HttpApiError) as e:
        pagerduty(url, incident_lookup_s=0.0).annotate("inc-never-paged", "text")
    assert e.value.endpoint == "/incidents" and "no incident" in str(e.value)


def test_pagerduty_rest_errors_name_endpoint_not_token(url, state):
    pd = pagerduty(url)
    pd.trigger("inc-1", "x")
    bad = pagerduty(url, api_token="u+WRONG-secret-token-123")
    with pytest.raises(HttpApiError) as e:
        bad.annotate("inc-1", "x")
    assert e.value.status == 401 and "Authentication failed" in str(e.value)
    assert "u+WRONG-secret-token-123" not in str(e.value)
    stranger = pagerduty(url, from_email="someone@else.example")
    with pytest.raises(HttpApiError) as e:
        stranger.annotate("inc-1", "x")
    assert e.value.status == 400 and e.value.endpoint.endswith("/notes")
    with pytest.raises(ValueError, match="from_email"):
        pagerduty(url, from_email=None).add_note("Q1", "x")


# -- Opsgenie ----------------------------------------------------------------------------------

def test_opsgenie_trigger_annotate_resolve_with_receipt(url, state):
    og = opsgenie(url)
    assert isinstance(og, Pager)
    long_summary = "store_sales_line is 2,124 rows short in Southwest " + "x" * 200
    alias = og.trigger("inc-4f296e71f448", long_summary, severity="critical",
                       details={"gap_rows": 2124}, links=[("http://dagster.local/a", "Asset")])
    assert alias == dedup_key_for("inc-4f296e71f448")
    og.trigger("inc-4f296e71f448", "again")  # same alias, alert open: de-duplicated
    [alert] = state.opsgenie_alerts(alias)
    assert alert["status"] == "open" and alert["count"] == 2 and alert["priority"] == "P1"
    assert len(alert["message"]) == 130 and long_summary in alert["description"]
    assert "Asset: http://dagster.local/a" in alert["description"]
    assert alert["details"] == {"dw_incident_id": "inc-4f296e71f448", "gap_rows": "2124"}
    assert alert["responders"] == [{"type": "team", "name": "data-ops"}] and "dw_dagster" in alert["tags"]

    og.annotate("inc-4f296e71f448", diagnosis_note(diagnosis()))
    og.resolve("inc-4f296e71f448", receipt_url="http://dagster.local/receipt/rc-1")
    [alert] = state.opsgenie_alerts(alias)
    assert alert["status"] == "closed"
    assert "region_sales_mtd" in alert["notes"][0]["note"]
    assert "Receipt: http://dagster.local/receipt/rc-1" in alert["notes"][1]["note"]
    assert og.get_alert(alias)["status"] == "closed"
    assert og.get_alert("dw-dagster:unknown") is None


def test_opsgenie_is_asynchronous_and_reports_through_request_status(url, state):
    og = opsgenie(url)
    rid = og.add_note("dw-dagster:no-such-alert", "hello")  # 202 even so
    status = og.request_status(rid)
    assert status["isSuccess"] is False and status["status"] == "Alert does not exist"
    rid = og.create_alert("dw-dagster:a", "m")
    assert og.request_status(rid)["status"] == "Created alert"


def test_page_incident_through_the_pager_protocol(url, state):
    incident = Incident(id="inc-9", asset_key=["store_sales_line"], source="dw_check", check_name="region_compare",
                        detected_at=NOW, summary="2,124 rows short", gap_rows=2124, gap_pct=1.8)
    for pager in (pagerduty(url), opsgenie(url)):
        assert page_incident(pager, incident, severity="warning") == dedup_key_for("inc-9")
        pager.resolve("inc-9", receipt_url="http://r", note=resolution_note(None, [receipt()]))
    [pd_incident] = state.pagerduty_incidents(dedup_key_for("inc-9"))
    assert pd_incident["title"] == "[dw_dagster] store_sales_line: 2,124 rows short"
    assert pd_incident["status"] == "resolved" and "approved by dana.ortiz@grocer.example" in pd_incident["notes"][0]["content"]
    [alert] = state.opsgenie_alerts(dedup_key_for("inc-9"))
    assert alert["priority"] == "P3" and alert["status"] == "closed"


# -- the fake rejects what the real APIs reject ------------------------------------------------

def _event(**changes):
    body = {"routing_key": DEFAULT_ROUTING_KEY, "event_action": "trigger", "dedup_key": "k",
            "payload": {"summary": "s", "source": "dw", "severity": "error"}}
    body.update(changes)
    return body


@pytest.mark.parametrize("body, needle", [
    (_event(payload={"summary": "s" * 1025, "source": "dw", "severity": "error"}), "payload.summary"),
    (_event(payload={"summary": "s", "source": "dw", "severity": "high"}), "payload.severity"),
    (_event(payload={"summary": "s", "severity": "error"}), "payload.source"),
    (_event(payload=None), "'payload' is required"),
    (_event(event_action="resolve", dedup_key=None, payload=None), "'dedup_key' is required"),
    (_event(dedup_key="k" * 256), "dedup_key"),
    (_event(event_action="escalate"), "event_action"),
    (_event(routing_key="not-a-key"), "Invalid routing key"),
    (_event(payload={"summary": "s", "source": "dw", "severity": "info", "timestamp": "yesterday"}), "timestamp"),
])
def test_fake_pagerduty_rejects_invalid_events(url, body, needle):
    r = httpx.post(f"{url}/v2/enqueue", json=body)
    assert r.status_code == 400
    data = r.json()
    assert data["status"] == "invalid event" and data["message"] == "Event object is invalid"
    assert any(needle in e for e in data["errors"]), data


def test_fake_pagerduty_accepts_the_documented_maximum(url, state):
    r = httpx.post(f"{url}/v2/enqueue", json=_event(payload={"summary": "s" * 1024, "source": "dw", "severity": "info",
                                                             "timestamp": "2015-07-17T08:42:58.315+0000", "class": "c"}))
    assert r.status_code == 202
    assert r.json() == {"status": "success", "message": "Event processed", "dedup_key": "k"}


@pytest.mark.parametrize("body, needle", [
    ({"message": "m" * 131}, "Message can not be longer than 130"),
    ({"alias": "a"}, "Message can not be empty"),
    ({"message": "m", "priority": "P6"}, "Priority"),
    ({"message": "m", "details": {"rows": 5}}, "Details"),
    ({"message": "m", "tags": ["t"] * 21}, "Tags"),
    ({"message": "m", "description": "d" * 15001}, "Description can not be longer than 15000"),
    ({"message": "m", "responders": [{"type": "squad", "name": "x"}]}, "Responders"),
])
def test_fake_opsgenie_rejects_invalid_alerts(url, body, needle):
    r = httpx.post(f"{url}/v2/alerts", json=body, headers={"Authorization": f"GenieKey {DEFAULT_OPSGENIE_KEY}"})
    assert r.status_code == 422
    data = r.json()
    assert set(data) == {"message", "took", "requestId"} and needle in data["message"], data


def test_fake_opsgenie_checks_the_key_and_note_schema(url):
    r = httpx.post(f"{url}/v2/alerts", json={"message": "m"}, headers={"Authorization": "GenieKey wrong"})
    assert r.status_code == 401 and "requestId" in r.json()
    auth = {"Authorization": f"GenieKey {DEFAULT_OPSGENIE_KEY}"}
    r = httpx.post(f"{url}/v2/alerts/x/notes", params={"identifierType": "alias"}, json={"user": "u"}, headers=auth)
    assert r.status_code == 422 and "Note can not be empty" in r.json()["message"]
    r = httpx.post(f"{url}/v2/alerts/x/notes", params={"identifierType": "alias"}, json={"note": "n" * 25001}, headers=auth)
    assert r.status_code == 422


def test_fake_pagerduty_rest_requires_token_and_from(url, state):
    pagerduty(url).trigger("inc-1", "x")
    r = httpx.get(f"{url}/incidents", params={"incident_key": dedup_key_for("inc-1")})
    assert r.status_code == 401 and r.json()["error"]["code"] == 2006
    headers = {"Authorization": f"Token token={DEFAULT_PAGERDUTY_TOKEN}",
               "Accept": "application/vnd.pagerduty+json;version=2"}
    body = httpx.get(f"{url}/incidents", params={"incident_key": dedup_key_for("inc-1")}, headers=headers).json()
    assert set(body) == {"incidents", "limit", "offset", "more", "total"} and len(body["incidents"]) == 1
    pid = body["incidents"][0]["id"]
    r = httpx.post(f"{url}/incidents/{pid}/notes", json={"note": {"content": "x"}}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == 2001  # no From header
    r = httpx.post(f"{url}/incidents/{pid}/notes", json={"note": {}}, headers={**headers, "From": USER})
    assert r.status_code == 400
    r = httpx.post(f"{url}/incidents/QNOPE/notes", json={"note": {"content": "x"}}, headers={**headers, "From": USER})
    assert r.status_code == 404 and r.json() == {"error": {"message": "Not Found", "code": 2100}}


# -- faults: retries, persistent failures, timeouts --------------------------------------------

def test_429_then_success_is_retried(url, state):
    state.add_fault(status=429, count=2, path="/v2/enqueue", retry_after=0.01)
    pagerduty(url).trigger("inc-1", "x")
    assert [r["status"] for r in state.request_log("/v2/enqueue")] == [429, 429, 202]
    state.add_fault(status=503, count=1, path="/v2/alerts")
    opsgenie(url).trigger("inc-1", "x")
    assert [r["status"] for r in state.request_log("/v2/alerts")] == [503, 202]


def test_persistent_500_names_endpoint_and_not_the_secret(url, state):
    state.add_fault(status=500, count=-1)
    with pytest.raises(HttpApiError) as e:
        pagerduty(url).trigger("inc-1", "x")
    assert e.value.service == "pagerduty" and e.value.endpoint == "/v2/enqueue" and e.value.status == 500
    assert "pagerduty POST /v2/enqueue: HTTP 500" in str(e.value) and "3 attempts" in str(e.value)
    assert DEFAULT_ROUTING_KEY not in str(e.value)
    assert len(state.request_log("/v2/enqueue")) == 3
    with pytest.raises(HttpApiError) as e:
        opsgenie(url).annotate("inc-1", "x")
    assert e.value.endpoint == "/v2/alerts/dw-dagster:inc-1/notes" and e.value.status == 500
    assert DEFAULT_OPSGENIE_KEY not in str(e.value)


def test_a_secret_echoed_by_the_server_is_redacted(url, state):
    state.add_fault(status=400, count=1, body={"status": "invalid event", "errors": [f"bad key {DEFAULT_ROUTING_KEY}"]})
    with pytest.raises(HttpApiError) as e:
        pagerduty(url).trigger("inc-1", "x")
    assert DEFAULT_ROUTING_KEY not in str(e.value) and "[redacted]" in str(e.value)


def test_timeout_via_delay_fault(url, state):
    state.add_fault(delay_s=0.6, count=1, path="/v2/alerts")
    with pytest.raises(HttpApiError) as e:
        opsgenie(url, timeout_s=0.15, retry_attempts=1).trigger("inc-slow", "x")
    assert e.value.status is None and "Timeout" in str(e.value) and e.value.endpoint == "/v2/alerts"
    # the slow request still lands afterwards, as it would on the real service
    deadline = time.monotonic() + 3
    while not state.opsgenie_alerts() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(state.opsgenie_alerts(dedup_key_for("inc-slow"))) == 1
    # with a retry the second try succeeds and the alias keeps it to one alert
    state.add_fault(delay_s=0.4, count=1, path="/v2/alerts")
    opsgenie(url, timeout_s=0.15, retry_attempts=2).trigger("inc-slow2", "x")
    assert len(state.opsgenie_alerts(dedup_key_for("inc-slow2"))) == 1


def test_fake_control_endpoints(url, state):
    assert httpx.post(f"{url}/_fake/faults", json={"status": 429, "count": 1, "path": "/incidents"}).status_code == 200
    r = httpx.get(f"{url}/incidents", headers={"Authorization": f"Token token={DEFAULT_PAGERDUTY_TOKEN}"})
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    httpx.post(f"{url}/_fake/faults", json={"status": 500, "count": -1})
    assert httpx.delete(f"{url}/_fake/faults").status_code == 200
    pagerduty(url).trigger("inc-1", "x")
    snap = httpx.get(f"{url}/_fake/state").json()
    assert [i["incident_key"] for i in snap["pagerduty"]["incidents"]] == ["dw-dagster:inc-1"]
    assert set(snap) >= {"pagerduty", "opsgenie", "slack", "requests", "faults"}
    httpx.post(f"{url}/_fake/reset")
    assert state.pagerduty_incidents() == []


# -- Dagster wiring and the fake as its own process --------------------------------------------

def test_resources_take_credentials_from_env_vars(url, state, monkeypatch):
    monkeypatch.setenv("PAGERDUTY_ROUTING_KEY", DEFAULT_ROUTING_KEY)
    monkeypatch.setenv("OPSGENIE_API_KEY", DEFAULT_OPSGENIE_KEY)

    @dg.asset
    def paged(pagerduty: PagerDutyResource, opsgenie: OpsgenieResource) -> None:
        pagerduty.trigger("inc-env", "from an asset")
        opsgenie.trigger("inc-env", "from an asset")

    result = dg.materialize([paged], resources={
        "pagerduty": PagerDutyResource(routing_key=dg.EnvVar("PAGERDUTY_ROUTING_KEY"), events_base_url=url, **FAST),
        "opsgenie": OpsgenieResource(api_key=dg.EnvVar("OPSGENIE_API_KEY"), base_url=url, **FAST),
    })
    assert result.success
    assert len(state.pagerduty_incidents(dedup_key_for("inc-env"))) == 1
    assert len(state.opsgenie_alerts(dedup_key_for("inc-env"))) == 1


def test_fake_runs_as_its_own_process():
    proc = subprocess.Popen([sys.executable, "-m", "dw_dagster_dev.fakes.paging_server", "--port", "0"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        base = proc.stdout.readline().strip()
        assert base.startswith("http://127.0.0.1:")
        assert httpx.get(f"{base}/_fake/state", timeout=5).json()["pagerduty"]["incidents"] == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_resolve_note_that_already_holds_the_link_is_posted_once(url, state):
    pd = pagerduty(url)
    pd.trigger("inc-r", "x")
    text = resolution_note("http://d/receipt", [receipt()])
    pd.resolve("inc-r", receipt_url="http://d/receipt", note=text)
    [incident] = state.pagerduty_incidents(dedup_key_for("inc-r"))
    assert [n["content"] for n in incident["notes"]] == [text] and incident["status"] == "resolved"


def test_resolve_without_rest_settings_still_resolves(url, state):
    pd = pagerduty(url, api_token=None, from_email=None)
    pd.trigger("inc-norest", "x")
    pd.resolve("inc-norest", receipt_url="http://d/receipt")
    [incident] = state.pagerduty_incidents(dedup_key_for("inc-norest"))
    assert incident["status"] == "resolved" and incident["notes"] == []


# -- exactly once: notes carry a marker, are never re-sent blindly, and are looked up first ----

REF = "dw:0123456789abcdef:note"
SLOW = 0.8  # the fake's after-apply delay, seconds (longer than the client timeouts below)


def _settle(state, path: str, method: str, n: int, wait_s: float = 3.0) -> list[dict]:
    """The request log for ``method path``, once ``n`` entries are in (a delayed answer is logged late)."""
    deadline = time.monotonic() + wait_s
    while True:
        log = [r for r in state.request_log(path) if r["method"] == method]
        if len(log) >= n or time.monotonic() > deadline:
            return log
        time.sleep(0.02)


def test_marker_line_survives_the_length_limit():
    from dw_dagster.core.http import has_marker, marker_line, with_marker

    assert marker_line(REF) == f"[dw-dagster ref {REF}]"
    text = with_marker("x" * 30000, REF, 25000)
    assert len(text) == 25000 and text.endswith("\n" + marker_line(REF)) and has_marker(text, REF)
    assert not has_marker(with_marker("note", "dw:0123456789abcdef:note2"), REF)  # no prefix match
    assert with_marker("note", None) == "note"
    with pytest.raises(ValueError):
        marker_line("not a ref")


def test_pagerduty_note_applied_but_timed_out_is_posted_once(url, state):
    pagerduty(url).trigger("inc-1", "x")
    state.add_fault(delay_s=SLOW, after_apply=True, method="POST", path="/incidents/")
    pd = pagerduty(url, timeout_s=0.2)
    pd.annotate("inc-1", "cause: late rows", ref=REF)  # the POST landed, its answer timed out: found, not re-sent
    [incident] = state.pagerduty_incidents(dedup_key_for("inc-1"))
    assert [n["content"] for n in incident["notes"]] == [f"cause: late rows\n[dw-dagster ref {REF}]"]
    pid = incident["id"]
    assert len(_settle(state, f"/incidents/{pid}/notes", "POST", 1)) == 1
    # the next attempt (a later tick) looks first and posts nothing
    pagerduty(url).annotate("inc-1", "cause: late rows", ref=REF)
    assert len(state.pagerduty_incidents(dedup_key_for("inc-1"))[0]["notes"]) == 1
    assert len(_settle(state, f"/incidents/{pid}/notes", "POST", 1)) == 1
    assert pagerduty(url).find_note(pid, REF)["content"].endswith(REF + "]")


def test_pagerduty_note_500_after_apply_is_found_not_reposted(url, state):
    pagerduty(url).trigger("inc-1", "x")
    state.add_fault(status=500, after_apply=True, method="POST", path="/incidents/")
    pagerduty(url, retry_attempts=1).annotate("inc-1", "cause", ref=REF)
    [incident] = state.pagerduty_incidents(dedup_key_for("inc-1"))
    assert len(incident["notes"]) == 1
    assert [r["status"] for r in state.request_log(f"/incidents/{incident['id']}/notes") if r["method"] == "POST"] == [500]


def test_a_note_without_marker_is_never_resent_blindly(url, state):
    pagerduty(url).trigger("inc-1", "x")
    state.add_fault(status=500, after_apply=True, method="POST", path="/incidents/")
    with pytest.raises(HttpApiError) as e:
        pagerduty(url).annotate("inc-1", "cause")  # no ref: nothing to look up, so not sent again
    assert e.value.maybe_applied and e.value.status == 500 and "may have applied" in str(e.value)
    [incident] = state.pagerduty_incidents(dedup_key_for("inc-1"))
    assert len(incident["notes"]) == 1
    assert len([r for r in state.request_log(f"/incidents/{incident['id']}/notes") if r["method"] == "POST"]) == 1


def test_pagerduty_resolution_steps_are_note_then_resolve(url, state):
    pd = pagerduty(url)
    pd.trigger("inc-r", "x")
    steps = pd.resolution_steps("inc-r", receipt_url="http://d/receipt")
    assert [name for name, _ in steps] == ["note", "resolve"]
    steps[0][1](REF, None)
    steps[0][1](REF, None)  # a repeat of the note step finds its marker
    [incident] = state.pagerduty_incidents(dedup_key_for("inc-r"))
    assert len(incident["notes"]) == 1 and incident["status"] == "triggered"
    steps[1][1](None, None)
    steps[1][1](None, None)  # a repeated resolve event is dropped (Events API v2), still one incident
    assert [i["status"] for i in state.pagerduty_incidents(dedup_key_for("inc-r"))] == ["resolved"]
    assert [n for n, _ in pagerduty(url, api_token=None, from_email=None).resolution_steps("inc-r", note="x")] == ["resolve"]


def test_opsgenie_note_applied_but_timed_out_is_posted_once(url, state):
    og = opsgenie(url)
    alias = og.trigger("inc-1", "x")
    state.add_fault(delay_s=SLOW, after_apply=True, method="POST", path="/v2/alerts/")
    assert opsgenie(url, timeout_s=0.2).add_note(alias, "cause", ref=REF) == ""  # found after the timeout
    assert [n["note"] for n in state.opsgenie_notes(alias)] == [f"cause\n[dw-dagster ref {REF}]"]
    path = f"/v2/alerts/{quote(alias, safe='')}/notes"  # as sent on the wire
    assert len(_settle(state, path, "POST", 1)) == 1
    # the retry on a later tick checks first (Opsgenie's default is not to)
    assert opsgenie(url).add_note(alias, "cause", ref=REF, check_first=True) == ""
    assert len(state.opsgenie_notes(alias)) == 1 and len(_settle(state, path, "POST", 1)) == 1
    # without check_first a new ref is posted
    rid = og.add_note(alias, "more", ref="dw:0123456789abcdef:other")
    assert og.request_status(rid)["isSuccess"] is True and len(state.opsgenie_notes(alias)) == 2


def test_opsgenie_note_text_is_cut_so_the_marker_fits(url, state):
    og = opsgenie(url)
    alias = og.trigger("inc-1", "x")
    og.add_note(alias, "n" * 30000, ref=REF)
    [note] = state.opsgenie_notes(alias)
    assert len(note["note"]) == 25000 and note["note"].endswith(f"[dw-dagster ref {REF}]")


def test_fake_opsgenie_lists_alert_notes_in_pages(url, state):
    og = opsgenie(url)
    alias = og.trigger("inc-1", "x")
    for i in range(150):
        og.add_note(alias, f"note {i}")
    auth = {"Authorization": f"GenieKey {DEFAULT_OPSGENIE_KEY}"}
    r = httpx.get(f"{url}/v2/alerts/{alias}/notes", params={"identifierType": "alias", "limit": 100}, headers=auth)
    body = r.json()
    assert r.status_code == 200 and set(body) == {"data", "paging", "took", "requestId"}
    assert len(body["data"]) == 100 and body["data"][0]["note"] == "note 149"  # newest first by default
    assert set(body["data"][0]) == {"note", "owner", "createdAt", "offset"} and "next" in body["paging"]
    assert [n["note"] for n in og.list_notes(alias)] == [f"note {i}" for i in reversed(range(150))]
    asc = httpx.get(f"{url}/v2/alerts/{alias}/notes", headers=auth,
                    params={"identifierType": "alias", "order": "asc", "limit": 2}).json()
    assert [n["note"] for n in asc["data"]] == ["note 0", "note 1"]
    assert httpx.get(f"{url}/v2/alerts/nope/notes", params={"identifierType": "alias"}, headers=auth).status_code == 404
    assert httpx.get(f"{url}/v2/alerts/{alias}/notes", params={"identifierType": "alias", "limit": 101},
                     headers=auth).status_code == 422
    og.add_note(alias, "the one", ref=REF)
    assert og.find_note(alias, REF)["note"].startswith("the one")


def test_opsgenie_close_is_idempotent_so_its_note_lands_once(url, state):
    og = opsgenie(url)
    alias = og.trigger("inc-1", "x")
    state.add_fault(delay_s=SLOW, after_apply=True, method="POST", path=f"/v2/alerts/{alias}/close")
    og_slow = opsgenie(url, timeout_s=0.2, retry_attempts=2)
    og_slow.resolve("inc-1", receipt_url="http://d/receipt")  # timed out once, re-sent: already closed
    [alert] = state.opsgenie_alerts(alias)
    assert alert["status"] == "closed" and len(alert["notes"]) == 1


def test_non_idempotent_send_retries_only_what_was_not_applied(url, state):
    from dw_dagster.core.http import RetryPolicy, send

    policy = RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=0.02, timeout_s=2.0)
    headers = {"Authorization": f"GenieKey {DEFAULT_OPSGENIE_KEY}"}
    alias = opsgenie(url).trigger("inc-1", "x")
    path = f"/v2/alerts/{quote(alias, safe='')}/notes"
    with httpx.Client(headers=headers) as client:
        state.add_fault(status=429, count=2, path="/v2/alerts/", retry_after=0.01)  # refused, not applied: retried
        send(client, "opsgenie", "POST", f"{url}{path}?identifierType=alias", policy=policy,
             idempotent=False, json={"note": "a"})
        assert [r["status"] for r in state.request_log(path)] == [429, 429, 202]
        state.add_fault(status=503, count=1, path="/v2/alerts/")  # may have been applied: not re-sent
        with pytest.raises(HttpApiError) as e:
            send(client, "opsgenie", "POST", f"{url}{path}?identifierType=alias", policy=policy,
                 idempotent=False, json={"note": "b"})
        assert e.value.maybe_applied and e.value.status == 503
        assert [r["status"] for r in state.request_log(path)][3:] == [503]
    # nothing listens: refused before anything was sent, so retried (all attempts), not maybe_applied
    with httpx.Client() as client:
        with pytest.raises(HttpApiError) as e:
            send(client, "x", "POST", "http://127.0.0.1:9/nothing", policy=policy, idempotent=False, json={})
    assert not e.value.maybe_applied and "3 attempts" in str(e.value)
