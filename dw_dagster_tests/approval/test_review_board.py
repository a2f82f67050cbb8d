"""One place both teams read: the review site's read-only incident and change set pages, for anyone
signed in through the same OIDC login — the timeline from detection to receipt, the diagnosis sentence
and its numbers, every version and decision, a refusal shown as a refusal, ladder steps, stages with
run links and the repair's progress, receipts with their verdict and evidence SQL, sample values masked.

One fake identity provider, one instance and one review server for the file (httpx logs in through
the provider, as the review page's own tests do).
"""

from __future__ import annotations

import datetime as dt
import textwrap

import dagster as dg
import httpx
import pytest

from dw_dagster.approval.job import decide, refusal_observation
from dw_dagster.approval.ladder import climb
from dw_dagster.approval.server import build_app
from dw_dagster.core import keys as c
from dw_dagster.core.domains import load_domains
from dw_dagster.core.identity import VerifiedIdentity
from dw_dagster.core.ledger import asset_str, ledger_for
from dw_dagster.core.models import (BlastRadius, CauseFinding, ChangeSet, CheckOutcome, Diagnosis, Evidence, Incident,
                                    Receipt, utcnow)
from dw_dagster.proposals.change_sets import propose
from dw_dagster_dev.fakes.oidc_server import start_oidc_server
from dw_dagster_tests.harness.asgi_server import serve

OWNER, READER = "dana.ortiz@grocer.example", "priya.raman@grocer.example"  # the reader is listed nowhere
CLIENT, SECRET = "dw-dagster-review", "review-board-test-session-secret-0123456789"
ASSET = ["store_sales_line"]
EVIDENCE_SQL = "SELECT customer_email, store_id, count(*) FROM pos.sales_line WHERE posted_ts > :watermark GROUP BY 1, 2"
CHECK_SQL = "SELECT region, count(*) FROM pos.sales_line GROUP BY region"
H = dt.timedelta(hours=1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    idp = start_oidc_server(users={OWNER: {"sub": "00u-dana", "email_verified": True},
                                   READER: {"sub": "00u-priya", "email_verified": True}},
                            clients={CLIENT: {"redirect_uris": ["http://127.0.0.1/callback"]}}, default_user=READER)
    domains = tmp_path_factory.mktemp("board") / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: store_sales
            assets: [[store_sales_line]]
            approvers: [{OWNER}]
            remind_after: 2h
        identity:
          oidc:
            issuer: {idp.url}
            audience: {CLIENT}
        """))
    with pytest.MonkeyPatch.context() as mp, dg.instance_for_test() as instance:
        mp.setenv(c.SIGNING_KEY_ENV, "review-board-test-signing-key-0123456789")
        story = _story(instance, domains)
        with serve(lambda url: build_app(instance, str(domains), base_url=url,
                                         dagster_url="https://dagster.grocer.example")) as base:
            yield base, instance, story
    idp.stop()


def _observe(instance, key: str, model) -> None:
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(ASSET), metadata={key: dg.MetadataValue.json(model.model_dump(mode="json"))}))


def _story(instance, domains) -> dict:
    """A real story in the ledger and event log: incident, diagnosis, two versions (the first
    superseded), a refused and an accepted decision, a ladder step, stages, a receipt that did not verify."""
    led = ledger_for(instance)
    t0 = utcnow() - 3 * H
    inc = Incident(id="inc-board", asset_key=ASSET, source="dw_check", check_name="region_compare", detected_at=t0,
                   summary="Southwest 1.80 % short", gap_rows=40, gap_pct=1.8)
    led.record_incident(incident_id=inc.id, asset_key=asset_str(ASSET), source="dw_check", external_id=None,
                        body=inc.model_dump_json())
    _observe(instance, c.INCIDENT_KEY, inc)
    cause = CauseFinding(kind="late_rows_behind_watermark", summary="40 lines posted after the load, behind its watermark.",
                         confidence=1.0, explained_rows=40, unexplained_rows=0, window=["2026-11-26"],
                         evidence=[Evidence(description="late lines by store", database="pos_source", sql=EVIDENCE_SQL,
                                            values=[{"customer_email": "jo@shopper.example", "store_id": 7, "count": 40}])])
    diag = Diagnosis(id="dg-board", incident_id=inc.id, asset_key=ASSET, created_at=t0 + dt.timedelta(minutes=5),
                     causes=[cause], blast_radius=BlastRadius(root="store_sales_line"), gap_rows=40, unexplained_rows=0)
    _observe(instance, c.DIAGNOSIS_KEY, diag)
    versions = []
    for i, summary in enumerate(["rerun 2026-11-26", "read by posted_ts; rerun 2026-11-26"]):
        created = t0 + (10 + i) * dt.timedelta(minutes=1)
        cs = ChangeSet.seal(id="cs-board", incident_id=inc.id, diagnosis_id=diag.id, domain="store_sales",
                            proposer=c.PROPOSER, created_at=created, expires_at=created + 24 * H, approvers=[OWNER],
                            cause_kind=cause.kind, summary=summary, target_asset=ASSET, window=["2026-11-26"], diff="",
                            files=[], rebuild_assets=[["fct_store_sales_daily"]])
        versions.append(propose(instance, cs)[0])
    cs = versions[-1]
    instance.report_runless_asset_event(refusal_observation(
        cs.id, ASSET, c.PROPOSER, "approve", f"{c.PROPOSER} proposed change set {cs.id} and cannot approve it", None))
    climb(instance, load_domains(domains), cs.created_at + 2 * H)  # the reminder
    who = VerifiedIdentity(email=OWNER, method="oidc", issuer="https://idp", subject="00u-dana", verified_at=utcnow())
    approval, obs = decide(instance, cs.id, "approve", who, domains=load_domains(domains), version=cs.version)
    instance.report_runless_asset_event(obs)
    for stage, ok in (("window-1", True), ("rebuild", None)):
        ticket = led.issue_ticket(cs.id, cs.version, stage, approval.id, "job")
        led.bind_ticket(ticket, f"run-{stage}-0000000000", "job")
        if ok is not None:
            led.complete_stage(ticket, f"run-{stage}-0000000000", success=ok)
    check = CheckOutcome(asset_key=ASSET, check_name="region_compare", passed=False, severity="ERROR",
                         metadata={"dw/gap_rows": 40, "dw/queries": f"```sql\n{CHECK_SQL}\n```"})
    receipt = Receipt(id="rc-board", asset_key=ASSET, change_set_id=cs.id, change_set_version=cs.version,
                      incident_id=inc.id, cause_kind=cause.kind, cause_summary=cause.summary, evidence_summary={},
                      diff="", approver=OWNER, approved_at=utcnow(), signature_valid=True, partitions=["2026-11-26"],
                      run_ids={}, rows_before={}, rows_after={}, checks=[check], verified=False, undo="",
                      created_at=utcnow(), previous_hash=None, outcome="applied")
    led.append_receipt(asset_key=asset_str(ASSET), expected_head=None, receipt_id=receipt.id, hash="h" * 64,
                       previous_hash=None, change_set_id=cs.id, run_id=None)
    _observe(instance, c.RECEIPT_KEY, receipt)
    led.audit("approver_unreachable", cs.id, "dw-dagster", {"email": "gone@grocer.example", "channel": "slack",
                                                              "reason": "no Slack member has this email",
                                                              "change_set_id": cs.id, "version": cs.version})
    return {"incident": inc, "versions": versions}


def _login(base: str, who: str) -> httpx.Client:
    client = httpx.Client(follow_redirects=True, timeout=30)
    page = client.get(f"{base}/login", params={"login_hint": who})
    assert page.status_code == 200 and str(page.url) == f"{base}/", page.text[:300]
    return client


def test_not_signed_in_reads_nothing(world):
    base, _, _ = world
    for path in ("/incidents", "/incidents/inc-board", "/change-sets/cs-board"):
        r = httpx.get(f"{base}{path}", follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (303, "/login")


def test_anyone_signed_in_reads_the_incidents_whole_story(world):
    base, _, story = world
    client = _login(base, READER)  # listed nowhere: reads, cannot decide
    try:
        listing = client.get(f"{base}/incidents")
        assert listing.status_code == 200 and 'href="/incidents/inc-board"' in listing.text
        page = client.get(f"{base}/incidents/inc-board").text
    finally:
        client.close()
    cs = story["versions"][-1]
    assert "Southwest 1.80 % short" in page
    assert "40 lines posted after the load, behind its watermark." in page and "explains 40 of 40 rows" in page
    assert EVIDENCE_SQL.replace("'", "&#x27;").replace(">", "&gt;") in page
    assert "[masked: email]" in page and "jo@shopper.example" not in page  # evidence masked before it leaves
    assert page.count(f'href="/change-sets/{cs.id}"') >= 1 and cs.version[:12] in page
    assert story["versions"][0].version[:12] in page and "superseded" in page  # every version
    assert "Refused: approve of cs-board by dw-dagster" in page and "cannot approve it" in page
    assert "Ladder: request remind of cs-board" in page
    assert f"cs-board approved by {OWNER} (oidc)" in page
    assert "stage 2 of 4: rebuild running" in page  # window-1, rebuild, verify, receipt
    assert 'href="https://dagster.grocer.example/runs/run-window-1-0000000000"' in page
    assert "Receipt rc-board for cs-board: NOT verified" in page and CHECK_SQL in page
    assert "gone@grocer.example" in page and "<form" not in page.split("</header>")[1]  # read-only


def test_the_change_set_page_shows_every_version_and_links_back(world):
    base, _, story = world
    client = _login(base, OWNER)
    try:
        page = client.get(f"{base}/change-sets/cs-board").text
        missing = client.get(f"{base}/change-sets/cs-nope")
    finally:
        client.close()
    assert missing.status_code == 404
    for v in story["versions"]:
        assert v.version[:12] in page
    assert 'href="/incidents/inc-board"' in page and "Receipt rc-board" in page


def test_observation_descriptions_link_to_the_review_site(monkeypatch):
    from dw_dagster.core.links import REVIEW_URL_ENV
    from dw_dagster.proposals.change_sets import change_set_observation

    monkeypatch.setenv(REVIEW_URL_ENV, "https://review.grocer.example/")
    cs = ChangeSet.seal(id="cs-link", incident_id="inc-link", diagnosis_id="dg-link", domain="store_sales",
                        proposer=c.PROPOSER, created_at=utcnow(), expires_at=utcnow() + H, approvers=[OWNER],
                        cause_kind="x", summary="s", target_asset=ASSET, window=[], diff="", files=[], rebuild_assets=[])
    desc = change_set_observation(cs).description
    assert desc.endswith(" — https://review.grocer.example/change-sets/cs-link")
    refused = refusal_observation("cs-link", ASSET, "x@grocer.example", "approve", "r" * 2000, None).description
    assert len(refused) <= 1000 and refused.endswith("/change-sets/cs-link")  # the link survives the cut
