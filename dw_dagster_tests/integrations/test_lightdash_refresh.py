"""Issue 31 item 3: after a verified receipt, each Lightdash dashboard in the blast radius is refreshed over
Lightdash's REST API (a protocol-accurate fake on loopback): its results cache invalidated, every chart
tile's query run again, the time the last one was ready judged against the exposure's ``needed_by``.

The failure kind: a dashboard serving results cached before the data was rebuilt —
https://github.com/lightdash/lightdash/issues/15780 (a 7 AM delivery of a "Daily Metrics" dashboard
sent the previous day's cached charts although the dbt models had been rebuilt at 6 AM).
"""

import datetime as dt

import pytest

from dw_dagster.core.http import HttpApiError, RetryPolicy
from dw_dagster.core.models import ExposureRef, Receipt
from dw_dagster.integrations.bi_refresh import BiClients, refresh_dashboards
from dw_dagster.integrations.lightdash import LightdashClient, LightdashRefreshFailed
from dw_dagster_dev.fakes.lightdash_server import FakeLightdash, FakeLightdashServer

FAST = RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=5, timeout_s=5)
TOKEN = "ldpat_dw_dagster"


def _receipt(verified=True):
    now = dt.datetime.now(dt.timezone.utc)
    return Receipt(id="rc-1", asset_key=["orders"], change_set_id="cs-1", change_set_version="v", incident_id="inc-1",
                   cause_kind="required_column_receives_nulls", cause_summary="", evidence_summary={}, diff="",
                   approver="o@x", approved_at=now, signature_valid=True, partitions=[], run_ids={}, rows_before={},
                   rows_after={}, checks=[], verified=verified, undo="", created_at=now, previous_hash=None)


def _exposure(name, needed_by, dashboard):
    return ExposureRef(unique_id=f"exposure.shop.{name}", name=name, depth=3, needed_by=needed_by,
                       bi={"tool": "lightdash", "dashboard": dashboard})


@pytest.fixture(scope="module")
def lightdash():
    state = FakeLightdash(dashboards={"Daily GMV (old)": ["Old"], "Daily GMV": ["GMV by day", "GMV by payment method"],
                                      "Daily GMV by region": ["Regions"], "Payments": ["Broken chart"]},
                          fail={"Broken chart"}, viewer_tokens={"ldpat_viewer"})
    with FakeLightdashServer(state) as srv:
        yield state, srv


def _client(srv, state, token=TOKEN, slept=None, **kw) -> LightdashClient:
    return LightdashClient(srv.url, token, state.project_uuid, policy=FAST,
                           sleep=(slept.append if slept is not None else lambda s: None), **kw)


def test_a_verified_receipt_refreshes_each_dashboard_before_its_deadline(lightdash):
    state, srv = lightdash
    state.requests.clear()
    started = dt.datetime.now(dt.timezone.utc)
    soon = (started + dt.timedelta(hours=2)).strftime("%H:%M UTC")
    with BiClients.of(_client(srv, state, page_size=1)) as clients:  # a content page of one: the name is on page 2
        done = refresh_dashboards(_receipt(), [
            _exposure("daily_gmv", soon, "Daily GMV"), _exposure("payments", soon, "payments"),
            _exposure("gone", None, "no-such-dashboard"),
            ExposureRef(unique_id="exposure.shop.pnl", name="pnl", depth=3, bi={"tool": "tableau", "workbook": "P&L"})],
            tableau=clients.tableau, lightdash=clients.lightdash, repair_started=started, poll_s=0)
        assert refresh_dashboards(_receipt(verified=False), [_exposure("daily_gmv", soon, "Daily GMV")],
                                  lightdash=clients.lightdash, repair_started=started) == []
    by = {r.exposure: r for r in done}
    gmv = by["daily_gmv"]
    assert gmv.tool == "lightdash" and gmv.before_deadline is True and not gmv.escalate
    assert started - dt.timedelta(seconds=2) <= gmv.refreshed_at <= dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2)
    assert gmv.deadline - started <= dt.timedelta(hours=2)
    # a chart whose query fails (found by its slug), a dashboard that is not there, a tool with no client: escalated
    assert by["payments"].escalate and "ended error" in by["payments"].error and "Broken chart" in by["payments"].error
    assert by["gone"].escalate and "404" in by["gone"].error and by["gone"].before_deadline is None
    assert by["pnl"].escalate and "no Tableau client configured" in by["pnl"].error
    # the protocol: the name found on the second content page, the cache invalidated, one query per chart tile
    calls = [f"{m} {p}" for m, p in state.requests]
    pages = [c for c in calls if c.startswith("GET /api/v2/content")]
    assert len(pages) == 3  # "Daily GMV" on page 2 of 2; "no-such-dashboard", not a slug either, on the one page
    gmv_uuid = state.dashboard_uuid("Daily GMV")
    assert f"GET /api/v1/dashboards/{gmv_uuid}" in calls and "GET /api/v1/dashboards/payments" in calls
    assert f"POST /api/v2/dashboards/{gmv_uuid}/results-cache/invalidate" in calls
    assert sum(c.endswith("/query/dashboard-chart") for c in calls) == 3  # two GMV charts, one payments chart; no markdown


def test_rate_limits_are_waited_out_and_auth_errors_named(lightdash):
    state, srv = lightdash
    slept: list[float] = []
    state.rate_limit = 2
    with _client(srv, state, slept=slept) as client:
        done = client.refresh("daily-gmv", poll_s=0)
    assert done.name == "Daily GMV" and len(done.query_uuids) == 2 and state.rate_limit == 0
    assert slept[:2] == [1.0, 1.0]  # Retry-After: 1, twice
    with pytest.raises(HttpApiError, match="401"):
        _client(srv, state, token="ldpat_wrong").refresh("daily-gmv", poll_s=0)
    # a viewer may not invalidate the cache (403): the charts' own queries skip the cache, the refresh goes on
    with _client(srv, state, token="ldpat_viewer") as viewer:
        assert len(viewer.refresh("daily-gmv", poll_s=0).query_uuids) == 2
    state.polls_to_ready = 10_000
    try:
        with pytest.raises(LightdashRefreshFailed, match="still (queued|executing) after 0 s"):
            _client(srv, state).refresh("daily-gmv", poll_s=0, timeout_s=0)
    finally:
        state.polls_to_ready = 2
    with pytest.raises(HttpApiError, match="no dashboard named 'Nope Board'"):
        _client(srv, state).refresh("Nope Board", poll_s=0)


def test_the_documented_configuration_and_exposure(monkeypatch):
    """docs/snippets/causes/dataops_bi.yaml (the integrations that switch the refresh on) and
    docs/snippets/causes/exposure_deadline.yml (an exposure's needed_by and BI object) as the code reads them."""
    from pathlib import Path

    import yaml

    from dw_dagster.config import IntegrationsConfig
    from dw_dagster.lineage.deadlines import exposure_dw_meta
    from dw_dagster.wiring.bi import bi_refresh_factory

    docs = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "causes"
    (node,) = yaml.safe_load((docs / "exposure_deadline.yml").read_text())["exposures"]
    assert exposure_dw_meta(node) == ("07:30 America/New_York", {"tool": "lightdash", "dashboard": "Daily GMV"})
    integ = IntegrationsConfig.model_validate(yaml.safe_load((docs / "dataops_bi.yaml").read_text())["integrations"])
    for var in ("TABLEAU_TOKEN_NAME", "TABLEAU_TOKEN_SECRET", "LIGHTDASH_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert bi_refresh_factory(integ) is None  # optional, and no credentials in the environment: left out
    monkeypatch.setenv("LIGHTDASH_API_KEY", TOKEN)
    with bi_refresh_factory(integ)() as clients:  # Lightdash on, Tableau still out
        assert clients.tableau is None and clients.lightdash.project_uuid == integ.lightdash.project_uuid
