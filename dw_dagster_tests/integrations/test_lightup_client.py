"""LightupClient / LightupResource over real HTTP against the fake Lightup, with each of its faults."""

import json
import time

import httpx
import pytest

from dw_dagster.core.http import HttpApiError, RetryPolicy
from dw_dagster.integrations.lightup import (
    LightupClient,
    LightupCredentialError,
    LightupError,
    LightupResource,
    read_credential_file,
)
from dw_dagster_tests.harness.lightup_fixtures import SOUTHWEST_MISSING, fake_lightup

FAST = RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=0.05, timeout_s=2.0)


@pytest.fixture
def lightup(tmp_path):
    with fake_lightup(tmp_path) as env:
        yield env


def fault(server, **body):
    httpx.post(f"{server.url}/_fake/faults", json=body).raise_for_status()


def client(cred, **kw):
    return LightupClient(read_credential_file(cred), policy=kw.pop("policy", FAST), **kw)


def test_compare_incident_to_tables_and_gap(lightup):
    server, state, ids, cred = lightup
    c = client(cred)
    trig = c.trigger(ids["pos_source"], [ids["rows_compare"]], user_defined_id="run-1")
    assert trig["triggerStatus"]["status"] == "completed"
    assert c.wait_for_trigger(ids["pos_source"], trig["triggerUuid"])["userDefinedId"] == "run-1"
    incs = c.list_incidents(start_updated_ts=0, end_updated_ts=time.time() + 1, metric_uuids=[ids["rows_compare"]])
    assert [i["slice"] for i in incs] == [{"region": "Southwest"}]
    ctx = c.compare_context(incs[0])
    assert (ctx.source.source_name, ctx.source.name) == ("pos-informix", "pos.sales_line")
    assert (ctx.target.source_name, ctx.target.name) == ("warehouse", "pos.sales_line")
    (gap,) = c.compare_gaps(ctx, incs[0]["slice"], incs[0]["start_ts"], incs[0]["end_ts"])
    assert (gap.aggregation, gap.source_value - gap.target_value, round(gap.gap_pct, 2)) == ("rowCount", SOUTHWEST_MISSING, 100.0)
    c.add_comment(incs[0]["uuid"], "cause: late rows behind the high-watermark")
    assert [x["comment"] for x in c.comments(incs[0]["uuid"])] == ["cause: late rows behind the high-watermark"]


def test_expired_access_token_is_refreshed_once_and_retried(lightup):
    server, state, ids, cred = lightup
    c = client(cred)
    c.list_monitors()
    assert c.refreshes == 1
    fault(server, expire_tokens=True)  # every token issued so far answers 401 token_not_valid
    assert len(c.list_monitors()) == 1
    assert c.refreshes == 2


def test_access_token_refreshed_ahead_of_expiry(tmp_path):
    with fake_lightup(tmp_path, access_ttl_s=1.0) as (server, state, ids, cred):
        c = client(cred)
        c.list_monitors()
        time.sleep(1.1)
        c.list_monitors()
        assert c.refreshes == 2
        assert not any("401" in r for r in state.requests)


@pytest.mark.parametrize("status", [429, 500])
def test_transient_status_is_retried(lightup, status):
    server, state, ids, cred = lightup
    c = client(cred)
    fault(server, status=status, count=2, path="/monitors/")
    assert len(c.list_monitors()) == 1


def test_persistent_500_names_endpoint_never_token(lightup):
    server, state, ids, cred = lightup
    c = client(cred)
    c.list_monitors()
    fault(server, status=500, count=50)
    with pytest.raises(HttpApiError) as e:
        c.list_monitors()
    msg = str(e.value)
    assert "/monitors/" in msg and "500" in msg and "3 attempts" in msg
    assert state.refresh_token not in msg and c._access not in msg
    assert "Bearer" not in msg


def test_slow_response_times_out(lightup):
    server, state, ids, cred = lightup
    c = client(cred, policy=RetryPolicy(attempts=2, base_wait_s=0.01, timeout_s=0.3))
    c.list_monitors()
    fault(server, delay_s=1.0, count=2)
    with pytest.raises(HttpApiError, match="no response.*ReadTimeout"):
        c.list_monitors()


def test_malformed_json_is_a_clear_error(lightup):
    server, state, ids, cred = lightup
    c = client(cred)
    fault(server, malformed=1, path="/incidents/")
    with pytest.raises(HttpApiError, match="incidents/: HTTP 200: malformed JSON"):
        c.list_incidents(start_updated_ts=0, end_updated_ts=time.time())


@pytest.mark.parametrize("flag", ["wrap_monitors", "wrap_lists"])
def test_both_list_wrapper_shapes(lightup, flag):
    server, state, ids, cred = lightup
    state.collect()
    c = client(cred)
    bare, points = c.list_monitors(), c.datapoints(ids["rows_source"], 0, time.time(), {"region": "West"})
    assert len(bare) == 1 and len(points) == 5
    fault(server, **{flag: True})
    assert c.list_monitors() == bare
    assert c.datapoints(ids["rows_source"], 0, time.time(), {"region": "West"}) == points


def test_unknown_workspace_is_403_with_a_clear_error(lightup):
    server, state, ids, cred = lightup
    with pytest.raises(LightupError, match="workspace 'nope' not found"):
        client(cred, workspace="nope").list_monitors()
    c = client(cred)
    c._workspace = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(HttpApiError, match="HTTP 403"):
        c.list_monitors()


def test_incident_of_a_plain_metric_is_not_a_compare(lightup):
    server, state, ids, cred = lightup
    mon = state.add_monitor("rows only", ids["rows_target"], 5.0)
    inc = state.add_incident(filter_uuid=mon)
    with pytest.raises(LightupError, match="not a compare metric"):
        client(cred).compare_context(inc)


def test_credential_file_errors(tmp_path):
    with pytest.raises(LightupCredentialError, match="does not exist"):
        read_credential_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LightupCredentialError, match="not readable JSON"):
        read_credential_file(bad)
    bad.write_text(json.dumps({"apiVersion": "v1", "data": {"server": "https://x"}}))
    with pytest.raises(LightupCredentialError, match="no data.server and data.refresh"):
        read_credential_file(bad)
    bad.write_text(json.dumps({"data": {"server": "https://x", "refresh": "secret-refresh", "expiredTs": 1000}}))
    with pytest.raises(LightupCredentialError, match="expired at 1970") as e:
        read_credential_file(bad)
    assert "secret-refresh" not in str(e.value)


def test_resource_credential_order(tmp_path, monkeypatch, lightup):
    server, state, ids, cred = lightup
    monkeypatch.delenv("LIGHTUP_SERVER", raising=False)
    monkeypatch.delenv("LIGHTUP_REFRESH_TOKEN", raising=False)
    monkeypatch.delenv("LIGHTUP_CREDENTIAL_FILE", raising=False)
    with pytest.raises(LightupCredentialError, match="no Lightup credential"):
        LightupResource().credential()
    monkeypatch.setenv("LIGHTUP_CREDENTIAL_FILE", str(cred))
    r = LightupResource(attempts=2, base_wait_s=0.01)
    assert r.credential().server == server.url
    assert r.get_client().workspace == state.workspace_uuid
    assert r.incident_url("abc").endswith(f"/#/ws/{state.workspace_uuid}/incidents/abc")
    monkeypatch.setenv("LIGHTUP_SERVER", "http://127.0.0.1:1")
    monkeypatch.setenv("LIGHTUP_REFRESH_TOKEN", "t")
    assert LightupResource().credential().server == "http://127.0.0.1:1"
    assert LightupResource(server=server.url, refresh_token=state.refresh_token).credential().server == server.url


def test_refused_refresh_token(lightup):
    server, state, ids, cred = lightup
    from dw_dagster.integrations.lightup import LightupCredential

    c = LightupClient(LightupCredential(server.url, "not-a-token"), policy=FAST)
    with pytest.raises(HttpApiError, match="token/refresh.*401") as e:
        c.list_monitors()
    assert "not-a-token" not in str(e.value)


def test_fake_runs_as_its_own_process(tmp_path):
    """``dw-dagster fake-lightup``: one JSON line, a working credential file, a clean exit on SIGTERM."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from dw_dagster_tests.harness.lightup_fixtures import make_tables

    src, wh = make_tables(tmp_path)
    cred = tmp_path / "cred.json"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "dw-dagster"), "fake-lightup", "--port", "0",
                             "--credential-file", str(cred), "--source-url", f"duckdb:///{src.path}",
                             "--warehouse-url", f"duckdb:///{wh.path}"], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        c = client(cred)
        assert c.workspace == info["workspace_uuid"] and info["url"].startswith("http://127.0.0.1:")
        httpx.post(f"{info['url']}/_fake/collect", json={}, timeout=60).raise_for_status()
        (inc,) = c.list_incidents(start_updated_ts=0, end_updated_ts=time.time() + 1)
        assert inc["slice"] == {"region": "Southwest"} and inc["ongoing"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


# -- exactly once: a comment carries a marker, is never re-sent blindly, and is looked up first --

REF = "dw:0123456789abcdef:comment"


def _comment_posts(state, uuid: str) -> int:
    return sum(1 for r in state.requests if r == f"POST /api/v0/ws/{state.workspace_uuid}/incidents/{uuid}/comments")


def test_comment_applied_but_timed_out_is_posted_once(lightup):
    server, state, ids, cred = lightup
    inc = state.add_incident(filter_uuid=ids["rows_monitor"])
    fault(server, after_apply=True, delay_s=0.8, method="POST", path="/comments$")
    c = client(cred, policy=RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=0.05, timeout_s=0.25))
    found = c.add_comment(inc["uuid"], "cause: late rows", ref=REF)
    assert [x["comment"] for x in state.comments[inc["uuid"]]] == [f"cause: late rows\n[dw-dagster ref {REF}]"]
    assert found["id"] == state.comments[inc["uuid"]][0]["id"] and _comment_posts(state, inc["uuid"]) == 1
    # the next attempt looks first and posts nothing
    client(cred).add_comment(inc["uuid"], "cause: late rows", ref=REF)
    assert len(state.comments[inc["uuid"]]) == 1 and _comment_posts(state, inc["uuid"]) == 1
    assert client(cred).find_comment(inc["uuid"], REF)["id"] == found["id"]


def test_comment_500_after_apply_is_found_not_reposted(lightup):
    server, state, ids, cred = lightup
    inc = state.add_incident(filter_uuid=ids["rows_monitor"])
    fault(server, after_apply=True, status=500, method="POST", path="/comments$")
    client(cred).add_comment(inc["uuid"], "cause", ref=REF)
    assert len(state.comments[inc["uuid"]]) == 1 and _comment_posts(state, inc["uuid"]) == 1


def test_comment_without_marker_is_not_resent_after_a_500(lightup):
    server, state, ids, cred = lightup
    inc = state.add_incident(filter_uuid=ids["rows_monitor"])
    fault(server, after_apply=True, status=500, method="POST", path="/comments$")
    with pytest.raises(HttpApiError) as e:
        client(cred).add_comment(inc["uuid"], "cause")
    assert e.value.maybe_applied and e.value.status == 500
    assert len(state.comments[inc["uuid"]]) == 1 and _comment_posts(state, inc["uuid"]) == 1
    # a comment refused before it was handled (a plain 500 fault) has no effect; with a ref it is retried
    fault(server, status=500, count=1, path="/comments$")
    client(cred).add_comment(inc["uuid"], "second", ref=REF)
    assert [x["comment"].split("\n")[0] for x in state.comments[inc["uuid"]]] == ["cause", "second"]
