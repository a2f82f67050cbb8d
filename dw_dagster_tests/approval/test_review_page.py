"""The approver's review page: an OIDC login, the pending change set in full, Approve, recorded.

Headless Debian Chromium (``/usr/bin/chromium`` through ``/usr/bin/chromedriver``, Selenium)
opens the approvals server (:mod:`dw_dagster.approval.server`, uvicorn in a thread on loopback)
and is sent through the fake OpenID Connect provider (:mod:`dw_dagster_dev.fakes.oidc_server`, which
logs in the ``login_hint`` user): authorization code with PKCE (RFC 7636), the ID token verified
with the session's nonce. Decisions land in a real Dagster instance's ledger. Forged posts are
tried with httpx: no session, a wrong CSRF token, a foreign Origin, an expired or re-signed cookie.
Screenshots are saved under each test's ``tmp_path``.

Sessions are server-side (:mod:`dw_dagster.approval.sessions`); found in review (issue 23, item 2):
a session was a signed cookie with the CSRF token inside, so a cookie saved before ``POST /logout``
still decided as the owner, and a server on another port of the host (browsers send it the same
cookies) read the cookie and decided alone. Both are kept as tests below, with expiry, a restart
of the server, and the ``__Host-`` / ``Secure`` cookie of an HTTPS deployment.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import textwrap
import time
from pathlib import Path

import dagster as dg
import httpx
import pytest

from dw_dagster_tests.harness.asgi_server import serve

from dw_dagster.core import keys as c
from dw_dagster.approval.server import build_app
from dw_dagster.approval.sessions import COOKIE, SECURE_COOKIE
from dw_dagster_dev.fakes.oidc_server import start_oidc_server
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import (BlastRadius, ChangeSet, ChangeStep, Diagnosis, ExposureRef, FileChange, ImpactedNode,
                               utcnow)
from dw_dagster.core import records
from dw_dagster.core.signing import signature_valid
from dw_dagster.proposals.change_sets import propose

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
OWNER = "dana.ortiz@grocer.example"
OUTSIDER = "sam.lee@grocer.example"  # can log in, is listed nowhere
CLIENT = "dw-dagster-review"
DIFF = """diff --git a/pipelines/store_sales_line.yaml b/pipelines/store_sales_line.yaml
--- a/pipelines/store_sales_line.yaml
+++ b/pipelines/store_sales_line.yaml
@@ -1,3 +1,3 @@
 table: store_sales_line
-watermark_column: sale_ts
+watermark_column: posted_ts
-lookback_hours: 0
+lookback_hours: 72
"""
STEP_SQL = "ALTER TABLE store_sales_line ADD COLUMN posted_ts TIMESTAMP"


@pytest.fixture(scope="module")
def idp():
    server = start_oidc_server(
        users={OWNER: {"sub": "00u-dana-ortiz", "email_verified": True, "name": "Dana Ortiz"},
               OUTSIDER: {"sub": "00u-sam-lee", "email_verified": True, "name": "Sam Lee"}},
        clients={CLIENT: {"redirect_uris": ["http://127.0.0.1/callback"]}}, default_user=OUTSIDER)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def domains(tmp_path_factory, idp):
    path = tmp_path_factory.mktemp("review") / "domains.yaml"
    path.write_text(textwrap.dedent(f"""\
        domains:
          - name: store_sales
            assets: [[store_sales_line]]
            approvers: [{OWNER}]
            identity: verified
          - name: finance
            assets: [[finance_ledger]]
            approvers: [priya.raman@grocer.example]
        identity:
          oidc:
            issuer: {idp.url}
            audience: {CLIENT}
          slack:
            signing_secret_env: DW_TEST_UNUSED_SLACK_SECRET
            bot_token_env: DW_TEST_UNUSED_SLACK_TOKEN
            api_url: http://127.0.0.1:9/api
        """))
    return path


@pytest.fixture(scope="module")
def instance():
    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture(scope="module")
def base(instance, domains):
    with serve(lambda url: build_app(instance, str(domains), base_url=url)) as url:
        yield url


def diagnosis() -> Diagnosis:
    return Diagnosis(
        id="dg-review0001", incident_id="inc-review1", asset_key=["store_sales_line"], created_at=utcnow(), causes=[],
        gap_rows=2124, unexplained_rows=0,
        blast_radius=BlastRadius(
            root="model.store.store_sales_line",
            models=[ImpactedNode(unique_id=f"model.store.{n}", name=n, resource_type="model", depth=d)
                    for n, d in (("fct_store_sales_daily", 1), ("region_sales_daily", 2))],
            tests=[ImpactedNode(unique_id="test.store.not_null_fct", name="not_null_fct_store_sales_daily_store_id",
                                resource_type="test", depth=2)],
            exposures=[ExposureRef(unique_id="exposure.store.store_pnl", name="store_pnl", label="Store P&L",
                                   type="dashboard", owner_name="Priya Raman", owner_email="priya.raman@grocer.example",
                                   depth=3)],
            owners=["priya.raman@grocer.example"]))


def change_set(cs_id: str, *, domain: str = "store_sales", asset: str = "store_sales_line",
               approvers: tuple[str, ...] = (OWNER,)) -> ChangeSet:
    now = utcnow()
    return ChangeSet.seal(
        id=cs_id, incident_id="inc-review1", diagnosis_id="dg-review0001", domain=domain, proposer=c.PROPOSER,
        created_at=now, expires_at=now + dt.timedelta(hours=20), approvers=list(approvers),
        cause_kind="late_rows_behind_watermark", target_asset=[asset], window=["2026-11-26", "2026-11-27"],
        summary="Read store_sales_line by posted_ts <script>alert('x')</script> with a 72 h lookback",
        diff=DIFF, files=[FileChange(path="pipelines/store_sales_line.yaml", before_sha256="a", after_sha256="b")],
        rebuild_assets=[["fct_store_sales_daily"], ["region_sales_daily"]], expected_recovered_rows=2124,
        steps=[ChangeStep(kind="migration", change_class="schema_migration", summary="Add the posted_ts column",
                          resource_key="warehouse", sql=[STEP_SQL],
                          rollback_sql=["ALTER TABLE store_sales_line DROP COLUMN posted_ts"])],
        change_classes=["pipeline_code", "rerun_window", "schema_migration", "rebuild_models"])


@pytest.fixture(scope="module")
def pending(instance):
    """One change set for the owner to approve in the browser, one for the forgery tests, one in another domain."""
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(["store_sales_line"]),
        metadata={c.DIAGNOSIS_KEY: dg.MetadataValue.json(diagnosis().model_dump(mode="json"))}))
    made = {name: propose(instance, cs)[0] for name, cs in {
        "browser": change_set("cs-review00001"), "forged": change_set("cs-review00002"),
        "finance": change_set("cs-review00003", domain="finance", asset="finance_ledger",
                              approvers=("priya.raman@grocer.example",)),
    }.items()}
    return made


def chrome(log_dir: Path):
    """Headless Chromium through the system chromedriver (no Selenium Manager, no download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    assert not missing, f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver"
    opts = Options()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,2400", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER),
                                              log_output=str(log_dir / "chromedriver.log")), options=opts)
    driver.set_page_load_timeout(60)
    return driver


@pytest.fixture
def browser(tmp_path):
    driver = chrome(tmp_path)
    yield driver
    driver.quit()


def _wait(driver, css: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def test_owner_logs_in_reviews_and_approves(browser, base, idp, instance, pending, tmp_path):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    cs = pending["browser"]
    browser.get(f"{base}/?login_hint={OWNER}")  # → /login → the provider → /callback → /
    article = _wait(browser, f"article[id='{cs.id}']")
    assert browser.current_url == f"{base}/"
    assert browser.find_element(By.ID, "who").text == OWNER
    browser.save_screenshot(str(tmp_path / "review_page.png"))
    text = article.text
    assert "Read store_sales_line by posted_ts <script>alert('x')</script> with a 72 h lookback" in text
    assert browser.find_elements(By.TAG_NAME, "script") == []  # shown as text, never parsed as markup
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - the summary's script did not run
    diff = article.find_element(By.CSS_SELECTOR, "pre.diff").text
    assert "-watermark_column: sale_ts\n+watermark_column: posted_ts" in diff and "+lookback_hours: 72" in diff
    assert article.find_element(By.CSS_SELECTOR, "dd.window").text == "2026-11-26, 2026-11-27"
    expires = article.find_element(By.CSS_SELECTOR, "dd.expires").text
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC \(in 19 h 5\d min\)", expires), expires
    assert cs.expires_at.strftime("%Y-%m-%d %H:%M UTC") in text
    assert STEP_SQL + ";" in [p.text for p in article.find_elements(By.CSS_SELECTOR, "pre.sql")]
    blast = article.find_element(By.CSS_SELECTOR, "div.blast").text
    assert "fct_store_sales_daily (model, depth 1)" in blast and "region_sales_daily (model, depth 2)" in blast
    assert "not_null_fct_store_sales_daily_store_id (test, depth 2)" in blast
    assert "Store P&L (dashboard) — owner Priya Raman <priya.raman@grocer.example>" in blast
    assert "Approvers\ndana.ortiz@grocer.example" in text and "2,124" in text
    assert pending["finance"].id not in browser.page_source  # another domain's change set is not shown
    assert records.approvals(instance, cs.id) == []

    article.find_element(By.CSS_SELECTOR, f"button.approve[data-cs='{cs.id}']").click()
    result = _wait(browser, "#result")
    browser.save_screenshot(str(tmp_path / "approved.png"))
    assert result.text == f"Recorded: change set {cs.id} approved by {OWNER} (verified by OIDC issuer {idp.url})."
    (row,) = ledger_for(instance).decisions(cs.id)
    assert (row["decision"], row["approver"], row["method"], row["version"]) == ("approve", OWNER, "oidc", cs.version)
    (approval,) = records.approvals(instance, cs.id)
    assert approval.identity.issuer == idp.url and approval.identity.subject == "00u-dana-ortiz"
    assert approval.identity.credential_id.endswith(f":{cs.id}:{cs.version}:approve") and signature_valid(approval)
    assert ledger_for(instance).change_set_row(cs.id).state == "approved"
    browser.get(f"{base}/")
    _wait(browser, "h1")
    assert cs.id not in browser.page_source and pending["forged"].id in browser.page_source


def test_a_person_listed_nowhere_sees_nothing(browser, base, pending, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(f"{base}/?login_hint={OUTSIDER}")
    empty = _wait(browser, "#empty")
    browser.save_screenshot(str(tmp_path / "outsider.png"))
    assert empty.text == f"No pending change set in a domain where {OUTSIDER} is listed as an approver."
    assert browser.find_element(By.ID, "who").text == OUTSIDER
    assert browser.find_elements(By.CSS_SELECTOR, "article") == []
    assert all(cs.id not in browser.page_source for cs in pending.values())


def login(base: str, who: str) -> tuple[httpx.Client, str]:
    """Log in through the fake provider with httpx; return the client (holding the cookie) and the page's CSRF token."""
    client = httpx.Client(follow_redirects=True, timeout=30)
    page = client.get(f"{base}/login", params={"login_hint": who})
    assert page.status_code == 200 and str(page.url) == f"{base}/"
    cookie_header = page.history[-1].headers["set-cookie"]  # the callback's: a new session id
    assert re.fullmatch(rf"{COOKIE}=[A-Za-z0-9_-]{{43}}; HttpOnly; Max-Age=900; Path=/; SameSite=lax", cookie_header), \
        cookie_header
    return client, re.search(r'name=csrf value="([^"]+)"', page.text).group(1)


def test_forged_decisions_are_refused(base, instance, pending):
    cs = pending["forged"]
    form = {"cs": cs.id, "v": cs.version, "decision": "approve", "csrf": "guessed"}
    led = ledger_for(instance)

    # no session at all: back to the login, nothing decided
    r = httpx.post(f"{base}/decide", data=form)
    assert (r.status_code, r.headers["location"]) == (303, "/login")

    client, csrf = login(base, OWNER)
    try:
        page = client.get(f"{base}/").text  # every value escaped in the HTML as sent
        assert "posted_ts &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; with" in page and "<script" not in page
        r = client.post(f"{base}/decide", data=form)  # the owner's session, a forged form
        assert r.status_code == 403 and "CSRF token or origin does not match your session" in r.text
        r = client.post(f"{base}/decide", data={**form, "csrf": csrf}, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        stale = {**form, "csrf": csrf, "v": "0" * 32}
        r = client.post(f"{base}/decide", data=stale)
        assert r.status_code == 409 and (f"Refused: change set {cs.id} changed since you read it (version 000000000000… "
                                         f"is now {cs.version[:12]}…)") in r.text
        assert client.post(f"{base}/logout", data={"csrf": "guessed"}).status_code == 403
        out = client.post(f"{base}/logout", data={"csrf": csrf})
        assert out.status_code == 200 and "Logged out" in out.text
        assert out.headers["set-cookie"].startswith(f'{COOKIE}=""; expires=') and "Max-Age=0" in out.headers["set-cookie"]
        r = client.get(f"{base}/", follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (303, "/login")
    finally:
        client.close()
    assert led.decisions(cs.id) == []

    client, csrf = login(base, OUTSIDER)
    try:
        r = client.post(f"{base}/decide", data={**form, "csrf": csrf})
        assert r.status_code == 409
        assert f"{OUTSIDER} is not an approver of domain &#x27;store_sales&#x27; (listed now: {OWNER})" in r.text
    finally:
        client.close()
    assert led.decisions(cs.id) == []
    # the refused decisions of logged-in people are shown on the asset (the forged forms are not: no decision was tried)
    assert [(r["approver"], r["reason"].split(" (")[0]) for r in records.refusals(instance, cs.id)] == [
        (OUTSIDER, f"{OUTSIDER} is not an approver of domain 'store_sales'"),
        (OWNER, f"change set {cs.id} changed since you read it")]
    # a made-up session id: back to the login
    for cookie in ("x" * 43, base64.urlsafe_b64encode(json.dumps({"who": {"email": OWNER}}).encode()).decode()):
        r = httpx.post(f"{base}/decide", data={**form, "csrf": "c" * 20}, cookies={COOKIE: cookie})
        assert (r.status_code, r.headers["location"]) == (303, "/login")
    assert led.decisions(cs.id) == [] and led.change_set_row(cs.id).state == "proposed"


def _saved(client: httpx.Client) -> str:
    return client.cookies[COOKIE]


def test_a_session_saved_before_logout_decides_nothing(base, instance, pending):
    """Issue 23, item 2: the cookie and the page's CSRF token kept from before ``POST /logout``, replayed."""
    cs = pending["forged"]
    client, csrf = login(base, OWNER)
    cookie = _saved(client)
    try:
        assert client.post(f"{base}/logout", data={"csrf": csrf}).status_code == 200
    finally:
        client.close()
    form = {"cs": cs.id, "v": cs.version, "decision": "approve", "csrf": csrf}
    r = httpx.post(f"{base}/decide", data=form, cookies={COOKIE: cookie})
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    r = httpx.get(f"{base}/", cookies={COOKIE: cookie})
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    assert ledger_for(instance).decisions(cs.id) == []


def test_a_cookie_read_by_a_server_on_another_port_decides_nothing(base, instance, domains, pending):
    """Issue 23, item 2: browsers send a host's cookies to every port; a server on another port (here an
    approvals server of the same deployment, same instance and signing key) receives the owner's cookie."""
    cs = pending["forged"]
    client, csrf = login(base, OWNER)
    cookie = _saved(client)
    assert csrf not in cookie and len(cookie) == 43  # an opaque id: the CSRF token is not in it
    form = {"cs": cs.id, "v": cs.version, "decision": "approve"}
    with serve(lambda url: build_app(instance, str(domains), base_url=url)) as other:
        assert other != base
        for sent in (form, {**form, "csrf": csrf}):  # the cookie alone, and with the page's token too
            r = httpx.post(f"{other}/decide", data=sent, cookies={COOKIE: cookie})
            assert (r.status_code, r.headers["location"]) == (303, "/login")
        r = httpx.post(f"{base}/decide", data=form, cookies={COOKIE: cookie})  # the cookie alone at the real server
        assert r.status_code == 403 and "CSRF token or origin does not match" in r.text
        assert client.get(f"{base}/").status_code == 200  # the owner's session is still theirs
    client.close()
    assert ledger_for(instance).decisions(cs.id) == []


def test_sessions_live_on_the_server_restart_and_expire(base, instance, domains, pending):
    from starlette.testclient import TestClient

    client, csrf = login(base, OWNER)
    cookie = _saved(client)
    client.close()
    restarted = build_app(instance, str(domains), base_url=base)  # a new server process on the same URL
    with TestClient(restarted, base_url=base, follow_redirects=False) as tc:
        tc.cookies.set(COOKIE, cookie)
        page = tc.get("/")
        assert page.status_code == 200 and f'name=csrf value="{csrf}"' in page.text
        from dw_dagster.core.ledger_tables import sessions_t

        with ledger_for(instance).engine.begin() as conn:  # 16 minutes later
            conn.execute(sessions_t.update().values(expires_at=time.time() - 60))
        assert (tc.get("/").status_code, tc.get("/").headers["location"]) == (303, "/login")


def test_an_https_deployment_gets_a_host_prefixed_secure_cookie(instance, domains, idp):
    from starlette.testclient import TestClient

    app = build_app(instance, str(domains), base_url="https://approvals.grocer.example")
    with TestClient(app, base_url="https://approvals.grocer.example", follow_redirects=False) as tc:
        r = tc.get("/login", params={"login_hint": OWNER})
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert re.fullmatch(rf"{re.escape(SECURE_COOKIE)}=[A-Za-z0-9_-]{{43}}; HttpOnly; Max-Age=600; Path=/; SameSite=lax; "
                        r"Secure", cookie), cookie
    assert "domain=" not in cookie.lower()


def test_login_callbacks_not_started_here_are_refused(base):
    r = httpx.get(f"{base}/callback", params={"code": "x", "state": "y"})
    assert r.status_code == 400 and "This login was not started here" in r.text
    page = httpx.get(f"{base}/login", params={"login_hint": OWNER})
    assert page.status_code == 303 and "code_challenge_method=S256" in page.headers["location"]
    r = httpx.get(f"{base}/callback", params={"code": "x", "state": "forged"}, cookies=page.cookies)
    assert r.status_code == 400 and "state mismatch" in r.text
    h = httpx.get(f"{base}/healthz")
    assert h.json() == {"ok": True}
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"] and r.headers["cache-control"] == "no-store"


def test_the_page_shows_each_domain_and_class_s_autonomy_record(base, instance, pending):
    """Issue 31 item 5: the owner's page shows, for the domain of the change set they decide, the record per
    change class from the receipts (applied, verified, undone, failed, clean streak, the last failure)."""
    from dw_dagster.core.ledger import APPLIED, FAILED
    from dw_dagster.core.models import Receipt
    from dw_dagster.receipts.job import receipt_observation

    led = ledger_for(instance)
    client, _ = login(base, OWNER)
    try:
        before = client.get(f"{base}/").text
        assert 'id=no-autonomy' in before and "Autonomy record" in before
        for cs_id, state in (("cs-review00011", APPLIED), ("cs-review00012", APPLIED), ("cs-review00013", FAILED)):
            cs = propose(instance, change_set(cs_id))[0]
            led.set_change_set_state(cs.id, cs.version, state,
                                     note="stage migration-1 failed: lock timeout" if state == FAILED else None)
            if state == APPLIED:
                now = utcnow()
                instance.report_runless_asset_event(receipt_observation(Receipt(
                    id=f"rc-{cs_id}", asset_key=cs.target_asset, change_set_id=cs.id, change_set_version=cs.version,
                    incident_id=cs.incident_id, cause_kind=cs.cause_kind, cause_summary="", evidence_summary={}, diff="",
                    approver=OWNER, approved_at=now, signature_valid=True, partitions=[], run_ids={}, rows_before={},
                    rows_after={}, checks=[], verified=True, undo="", created_at=now, previous_hash=None), "receipt"))
        page = client.get(f"{base}/").text
    finally:
        client.close()
    rows = re.findall(r'<tr class=autonomy-row data-domain="([^"]+)" data-class="([^"]+)">'
                      r'<td>[^<]*</td><td>[^<]*</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td>'
                      r'<td>([^<]*)</td><td>([^<]*)</td>', page)
    by = {r[1]: r for r in rows}
    assert {r[0] for r in rows} == {"store_sales"}  # the finance domain's record is not this approver's
    assert set(by) == {"pipeline_code", "rerun_window", "schema_migration", "rebuild_models"}
    # two verified repairs, then a failure: the streak is broken and the failure is named
    assert by["rerun_window"][2:8] == ("2", "2", "0", "1", "0", "L2")
    assert by["rerun_window"][8].endswith("stage migration-1 failed: lock timeout")
    outsider, _ = login(base, OUTSIDER)  # listed in no domain: no record is shown
    try:
        assert "Autonomy record" not in outsider.get(f"{base}/").text
    finally:
        outsider.close()
