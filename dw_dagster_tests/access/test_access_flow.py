"""An access request end to end on real PostgreSQL roles: request → dry-run → every domain's owner
approves → grant → reminder → revoke at expiry verified → receipt; and what may not happen.

The access sensor runs in a :class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon` on a Dagster
instance on disk; its clock (only its clock) is moved forward instead of waiting for expiry.
Sources for the failure kinds tried here:

- sessions outliving the revoke: a connection that did ``SET ROLE`` keeps the role's privileges
  after the revoke (https://github.com/hashicorp/vault/pull/8668,
  https://github.com/hashicorp/vault/issues/699), and database connections are not ended when the
  access expires (https://github.com/gravitational/teleport/issues/5476);
- a revoke that does not take back everything the grant gave, or fails and is never retried
  (https://github.com/hashicorp/vault/issues/1535, https://github.com/hashicorp/vault/issues/1198);
- a rollback that revokes privileges the tool did not grant (a grant already held, a role made
  anew under the same name): https://github.com/cyrilgdn/terraform-provider-postgresql/pull/135;
- an access window that starts at the request, not at the approval (the owners approve an absolute
  end here, shown in the request): https://github.com/gravitational/teleport/issues/16202.
"""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.access.models import AccessError, AccessRequest
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster.receipts.chain import verify_receipts
from dw_dagster_tests.access.flow import ANA, BO, CY, DANA, SAM, build_world, services, token
from dw_dagster_tests.access.pg_world import pg_world


@pytest.fixture(scope="module")
def outside():
    with services() as s:
        yield s


@pytest.fixture
def w(outside, tmp_path, monkeypatch):
    idp, smtp, pager = outside
    with pg_world() as pg:
        world = build_world(pg, tmp_path, idp, smtp, pager, monkeypatch)
        yield world
        world.instance.dispose()
        world.db.dispose()


def _row(w, req_id):
    return ledger_for(w.instance).access_row(req_id)


def _approved(w, req):
    for cs_id in req.change_sets:
        owner = ANA if cs_id.endswith("finance") else BO
        ok, msg = w.approve(cs_id, owner)
        assert ok, msg
    tick = w.tick()
    assert _row(w, req.id).state == "approved", tick.skip_reason
    return tick


def test_request_to_verified_revoke_with_two_owners_a_reminder_and_a_receipt(w):
    req, state = w.request(w.spec(role=w.pg.role("analyst"), duration_s=3600, end_sessions=True))
    assert state == "pending" and [d.domain for d in req.dry_run.domains] == ["crm", "finance"]
    assert {(s.table.split(".")[-1], s.column, s.category) for s in req.dry_run.sensitive} >= {
        ("customers", "email", "email"), ("customers", "phone", "phone")}
    assert len(req.change_sets) == 2 and req.approvers == sorted([ANA, SAM, BO, DANA])
    assert w.tick().run_ids == [] and _row(w, req.id).state == "pending"  # nobody approved yet
    ok, _ = w.approve(req.change_sets[1], ANA)  # finance (sorted: crm first)
    assert ok and w.tick().run_ids == [] and _row(w, req.id).state == "pending"  # one of two domains is not enough
    assert not w.has("ledger")
    ok, _ = w.approve(req.change_sets[0], BO)
    assert ok
    w.tick()  # approved
    tick = w.tick()  # the grant run
    assert len(tick.run_ids) == 1 and _row(w, req.id).state == "active", (tick.skip_reason, w.daemon.refusals)
    assert w.has("ledger") and w.has("customers")
    assert w.tick().run_ids == []  # granted once
    w.later(3600 - 5 * 60)  # five minutes before the end: the reminder (remind_before 10 min)
    before = len(w.inbox.messages)
    w.tick()
    w.tick()
    mails = w.inbox.messages[before:]
    assert len(mails) == 1 and mails[0]["to"] == [SAM, DANA] and req.id in mails[0]["data"]
    assert _row(w, req.id).reminded_at is not None and _row(w, req.id).state == "active"
    w.later(5 * 60)  # expires_at
    tick = w.tick()
    row = _row(w, req.id)
    assert len(tick.run_ids) == 1 and row.state == "revoked", (row.note, w.daemon.refusals)
    assert not w.has("ledger") and not w.has("customers")
    assert w.tick().run_ids == []  # revoked once
    (receipt,) = records.receipts(w.instance, dg.AssetKey(c.ACCESS_ASSET))
    ev = receipt.evidence_summary
    assert receipt.verified and ev["revoke_verified"] is True and ev["granted_at"] and ev["revoked_at"]
    assert ev["requested_by"] == SAM and "verified by OIDC" in ev["requester_identity"] and ev["why"] == req.spec.why
    assert sorted(a["approver"] for a in ev["approvals"]) == [ANA, BO]
    assert any("has_table_privilege" in x["check"] and x["value"] is False for x in ev["revoke_verification"])
    assert verify_receipts(w.instance, [dg.AssetKey(c.ACCESS_ASSET)])[1] == []
    for cs_id in req.change_sets:
        assert ledger_for(w.instance).change_set_row(cs_id).state == "applied"


def test_nobody_approves_their_own_request_or_for_someone_else(w):
    req, _ = w.request(w.spec(role=w.pg.role("analyst")))
    fin, crm = (next(x for x in req.change_sets if x.endswith(d)) for d in ("finance", "crm"))
    ok, msg = w.approve(fin, SAM)  # the requester is a finance approver
    assert not ok and "proposed" in msg
    ok, msg = w.approve(crm, DANA)  # the grantee is a crm approver
    assert not ok and "benefits" in msg
    ok, msg = w.approve(crm, CY)  # BO's colleague, listed nowhere, with her own valid token
    assert not ok and "not an approver" in msg
    from dw_dagster.approval.job import approve_in_process

    ok, msg = approve_in_process(w.instance, crm, approver=BO, domains=w.domains_file)  # typing the owner's name
    assert not ok and "verified identity" in msg
    cs = records.find_change_set(w.instance, crm)
    from dw_dagster.core.identity import decision_nonce

    stolen = token(w.idp, BO, decision_nonce(fin, cs.version, "approve"))  # BO's token for another decision
    ok, msg = approve_in_process(w.instance, crm, id_token=stolen, domains=w.domains_file)
    assert not ok and "nonce" in msg
    w.tick()
    assert _row(w, req.id).state == "pending" and not w.has("ledger")


def test_one_rejection_ends_the_request_and_nothing_is_granted(w):
    req, _ = w.request(w.spec(role=w.pg.role("analyst")))
    fin, crm = (next(x for x in req.change_sets if x.endswith(d)) for d in ("finance", "crm"))
    assert w.approve(fin, ANA)[0]
    assert w.approve(crm, BO, "reject")[0]
    w.tick()
    assert _row(w, req.id).state == "rejected" and w.tick().run_ids == [] and not w.has("ledger")
    assert ledger_for(w.instance).change_set_row(fin).state == "superseded"


def test_a_request_that_opens_nothing_new_proposes_nothing(w):
    w.pg.run(f'GRANT SELECT ON {w.pg.t("ledger")} TO "{w.role(DANA)}"')
    with pytest.raises(AccessError, match="opens nothing new"):
        w.request(w.spec(tables=[f"{w.pg.schema}.ledger"]))
    assert ledger_for(w.instance).access_rows() == []
    assert records.change_sets(w.instance) == []


def test_an_unverified_requester_makes_a_draft_that_asks_nobody_until_confirmed(w):
    from dw_dagster.access.request import confirm, request_nonce, requester_identity

    spec = w.spec(tables=[f"{w.pg.schema}.ledger"])
    req, state = w.request(spec, verified=False)
    assert state == "draft" and req.change_sets == [] and records.change_sets(w.instance) == []
    other = w.spec(tables=[f"{w.pg.schema}.ledger"], why="something else")
    with pytest.raises(AccessError, match="nonce"):  # a token bound to other content
        requester_identity(w.domains, spec, id_token=token(w.idp, SAM, request_nonce(other)))
    with pytest.raises(AccessError, match="names sam"):  # someone else confirming
        confirm(w.instance, req.id, requester_identity(w.domains, spec, id_token=token(w.idp, CY, request_nonce(spec))),
                domains=w.domains)
    who = requester_identity(w.domains, spec, id_token=token(w.idp, SAM, request_nonce(spec)))
    filed = confirm(w.instance, req.id, who, domains=w.domains)
    assert _row(w, req.id).state == "pending" and filed.change_sets == [f"ar-{req.id[4:]}-finance"]
    with pytest.raises(AccessError):
        confirm(w.instance, req.id, who, domains=w.domains)


def test_hand_launched_and_replayed_apply_runs_are_refused(w):
    """The Launchpad / GraphQL / `dagster job execute` door: a run of the grant job without the
    sensor's ticket, or with a ticket copied from a run that already used it, grants nothing."""
    from dw_dagster.guard.admission import RunFacts, RunRefused, admit_run

    req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=600))
    grant = w.defs.resolve_job_def(c.ACCESS_GRANT_JOB)
    config = {"ops": {c.ACCESS_GRANT_OP: {"config": {"request_id": req.id}}}}
    assert not grant.execute_in_process(instance=w.instance, run_config=config, raise_on_error=False).success
    with pytest.raises(RunRefused, match="ticket"):  # what the run coordinator does at submission
        admit_run(w.instance, RunFacts("r-hand", c.ACCESS_GRANT_JOB, {"dw/kind": "access"}, job_tags={"dw/kind": "access"}))
    _approved(w, req)
    tick = w.tick()
    (run_id,) = tick.run_ids
    assert w.has("ledger")
    tags = w.instance.get_run_by_id(run_id).tags
    w.later(601)
    w.tick()
    assert _row(w, req.id).state == "revoked" and not w.has("ledger")
    replay = grant.execute_in_process(instance=w.instance, run_config=config, raise_on_error=False,
                                      tags={k: v for k, v in tags.items() if k.startswith("dw/")})
    assert not replay.success and not w.has("ledger")  # a ticket replayed after expiry grants nothing
    revoke = w.defs.resolve_job_def(c.ACCESS_REVOKE_JOB)
    assert not revoke.execute_in_process(instance=w.instance, raise_on_error=False,
                                         run_config={"ops": {c.ACCESS_REVOKE_OP: {"config": {"request_id": req.id}}}}).success


def test_a_failed_revoke_opens_an_incident_pages_and_is_tried_again(w):
    req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=600))
    _approved(w, req)
    w.tick()
    w.pg.run(f'GRANT SELECT ON {w.pg.t("ledger")} TO PUBLIC')  # someone opens the table to everyone meanwhile
    w.later(601)
    w.tick()
    row = _row(w, req.id)
    assert row.state == "revoke_failed" and "still shows access" in row.note and row.incident_id
    assert ledger_for(w.instance).incident(row.incident_id).source == "access"
    state = w.pager.state.snapshot()
    assert any(req.id in str(i) for i in state["pagerduty"]["incidents"]), "paged"
    w.tick()
    assert _row(w, req.id).state == "revoke_failed"  # the retry waits for revoke_retry_minutes
    w.pg.run(f'REVOKE SELECT ON {w.pg.t("ledger")} FROM PUBLIC')
    w.later(61)
    w.tick()
    row = _row(w, req.id)
    assert row.state == "revoked" and row.revoke_attempts == 2 and not w.has("ledger")
    assert ledger_for(w.instance).incident(row.incident_id).state == "closed"


def test_role_dropped_while_the_grant_is_active(w):
    req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=600))
    _approved(w, req)
    w.tick()
    dana = w.role(DANA)
    w.pg.run(f'DROP OWNED BY "{dana}"', f'DROP ROLE "{dana}"')
    w.pg.create_role("dana", "LOGIN")  # and someone makes a new role of that name
    w.pg.run(f'GRANT SELECT ON {w.pg.t("ledger")} TO "{dana}"')  # with its own, legitimate grant
    w.later(601)
    w.tick()
    row = _row(w, req.id)
    assert row.state == "revoked"
    assert any("no longer exists" in n for n in row.result["revoke"]["notes"])
    assert w.has("ledger")  # the new role's own grant is left alone


def test_extension_is_a_new_request_that_takes_over(w):
    req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=600))
    _approved(w, req)
    w.tick()
    ext, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=1200, why="extension: still reconciling"))
    assert ext.extends == req.id and ext.statements[0] == req.statements[0]  # what continuing opens is shown again
    assert [x.table for x in ext.dry_run.engine.newly_reachable] == [f"{w.pg.schema}.ledger"]
    _approved(w, ext)
    w.tick()
    assert _row(w, req.id).state == "superseded" and _row(w, ext.id).state == "active"
    w.later(601)
    assert w.tick().run_ids == [] and w.has("ledger")  # the first grant's end revokes nothing now
    w.later(600)
    w.tick()
    assert _row(w, ext.id).state == "revoked" and not w.has("ledger")


def test_end_sessions_terminates_a_session_that_set_role_before_the_revoke(w):
    import psycopg

    req, _ = w.request(w.spec(role=w.pg.role("analyst"), duration_s=600, end_sessions=True))
    _approved(w, req)
    w.tick()
    url = w.db._engine.url
    with psycopg.connect(host=url.host, port=url.port, dbname=url.database, user=w.role(DANA), autocommit=True) as s:
        s.execute(f'SET ROLE "{w.pg.role("analyst")}"')
        assert s.execute(f"SELECT count(*) FROM {w.pg.t('ledger')}").fetchone() == (0,)
        w.later(601)
        w.tick()
        assert _row(w, req.id).result["revoke"]["sessions_ended"] == 1
        with pytest.raises(psycopg.OperationalError):
            s.execute(f"SELECT count(*) FROM {w.pg.t('ledger')}")
    assert _row(w, req.id).state == "revoked"
    AccessRequest.model_validate_json(_row(w, req.id).body)


def test_review_page_shows_what_the_owner_approves_and_the_grants_in_force(w):
    """The approvers' review page (OIDC login): the request as the owner reads it, a decision
    recorded from the page, the grantee told she cannot approve, the grant in force with its expiry."""
    import re

    import httpx

    from dw_dagster.approval.server import build_app
    from dw_dagster_tests.harness.asgi_server import serve

    def login(base: str, who: str):
        client = httpx.Client(follow_redirects=True, timeout=30)
        page = client.get(f"{base}/login", params={"login_hint": who})
        assert page.status_code == 200, page.text
        return client, page

    req, _ = w.request(w.spec(role=w.pg.role("analyst"), duration_s=600))
    crm = next(x for x in req.change_sets if x.endswith("crm"))
    secret = "access-review-page-secret-0123456789abcdef"
    with serve(lambda url: build_app(w.instance, str(w.domains_file), base_url=url)) as base:
        _, dana_page = login(base, DANA)
        assert "it is for you, so you cannot approve it" in dana_page.text
        client, page = login(base, BO)
        assert f"Access for</dt><dd class=grantee>{DANA}" in page.text and "What the grant opens" in page.text
        assert "customers.email</b> (email)" in page.text and "finance" in page.text  # the other domain approving too
        cs = records.find_change_set(w.instance, crm)
        csrf = re.search(r'name=csrf value="([^"]+)"', page.text).group(1)
        done = client.post(f"{base}/decide", data={"csrf": csrf, "cs": cs.id, "v": cs.version, "decision": "approve"})
        assert done.status_code == 200 and "Recorded" in done.text
        assert w.approve(next(x for x in req.change_sets if x.endswith("finance")), ANA)[0]
        w.tick()
        w.tick()
        assert _row(w, req.id).state == "active"
        page = client.get(f"{base}/")
        assert "Access grants in force" in page.text and f"<td>{req.id}</td><td>{DANA}</td>" in page.text
        assert "grant-expiry" in page.text


def test_slack_slash_command_files_a_request_as_the_verified_slack_user(w, monkeypatch):
    """``/dw-access`` through ``dw-dagster approvals serve``: a signed, fresh slash command from a
    person files a pending request with that person as the verified requester; a replay, an unsigned
    post and unreadable text are refused."""
    import hashlib
    import hmac
    import time
    from urllib.parse import urlencode

    import httpx

    from dw_dagster.access.slack import access_routes
    from dw_dagster.approval.server import build_app
    from dw_dagster.databases import DatabaseResource
    from dw_dagster_dev.fakes.paging_server import DEFAULT_SLACK_TOKEN
    from dw_dagster_tests.conftest import POSTGRES_URL
    from dw_dagster_tests.harness.asgi_server import serve

    secret = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d"
    monkeypatch.setenv("DW_TEST_ACCESS_SLACK_SECRET", secret)
    monkeypatch.setenv("DW_TEST_ACCESS_SLACK_TOKEN", DEFAULT_SLACK_TOKEN)
    w.pager.state.configure_slack(signing_secret=secret, team_id="T0ACCESS01",
                                  users={"U0SAMLEE01": {"email": SAM, "name": "sam"}, "U0BOT00001": {"email": SAM, "is_bot": True}})
    text = w.domains_file.read_text().replace("identity:\n  oidc:", f"""identity:
  slack:
    signing_secret_env: DW_TEST_ACCESS_SLACK_SECRET
    bot_token_env: DW_TEST_ACCESS_SLACK_TOKEN
    team_id: T0ACCESS01
    api_url: {w.pager.base_url}/api
  oidc:""")
    w.domains_file.write_text(text)

    def signed(form: dict) -> tuple[bytes, dict]:
        body = urlencode(form).encode()
        ts = str(int(time.time()))
        sig = "v0=" + hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
        return body, {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig,
                      "Content-Type": "application/x-www-form-urlencoded"}

    command = (f'--database warehouse --who {DANA} --tables {w.pg.schema}.ledger --for 2h '
               '--why “month end: reconcile”')  # Slack turns typed quotes into curly ones
    form = {"team_id": "T0ACCESS01", "user_id": "U0SAMLEE01", "command": "/dw-access", "text": command}
    app = lambda url: build_app(w.instance, str(w.domains_file), base_url=url,  # noqa: E731
                                extra_routes=access_routes(w.instance, str(w.domains_file),
                                                           {"warehouse": DatabaseResource(url=POSTGRES_URL)}))
    with serve(app) as base:
        body, headers = signed(form)
        r = httpx.post(f"{base}/slack/commands", content=body, headers=headers)
        assert r.status_code == 200 and r.json()["response_type"] == "ephemeral", r.text
        assert "(pending)" in r.json()["text"] and "finance must approve" in r.json()["text"]
        assert httpx.post(f"{base}/slack/commands", content=body, headers=headers).status_code == 401  # replayed
        assert httpx.post(f"{base}/slack/commands", content=body).status_code == 401  # unsigned
        body, headers = signed({**form, "user_id": "U0BOT00001"})
        assert "is a bot" in httpx.post(f"{base}/slack/commands", content=body, headers=headers).json()["text"]
        body, headers = signed({**form, "text": "--who nobody"})
        assert httpx.post(f"{base}/slack/commands", content=body, headers=headers).json()["text"].startswith("Refused")
    (row,) = ledger_for(w.instance).access_rows()
    req = AccessRequest.model_validate_json(row.body)
    assert row.state == "pending" and row.requested_by == SAM and req.requester_identity.method == "slack"
    assert req.spec.why == "month end: reconcile"


def test_autonomous_access_only_for_a_part_that_opens_no_sensitive_column(w):
    """crm at L3 with access_grant allowed and autonomous_access: non_sensitive: dw_dagster approves
    a grant of a table without sensitive columns; one opening customers.email waits for Bo."""
    w.pg.run(f"CREATE TABLE {w.pg.t('regions')} (id int, region text)")
    text = w.domains_file.read_text().replace(
        f'    tables: ["{w.pg.schema}.customers"]\n',
        f'    tables: ["{w.pg.schema}.customers", "{w.pg.schema}.regions"]\n    autonomy: L3\n'
        '    allowed_change_classes: [access_grant]\n    autonomous_access: non_sensitive\n')
    w.domains_file.write_text(text)
    plain, _ = w.request(w.spec(tables=[f"{w.pg.schema}.regions"], duration_s=600))
    sensitive, _ = w.request(w.spec(tables=[f"{w.pg.schema}.customers"], duration_s=600))
    w.tick()
    assert _row(w, plain.id).state == "approved" and _row(w, sensitive.id).state == "pending"
    (a,) = records.approvals(w.instance, plain.change_sets[0], active_only=True)
    assert a.approver == "dw-dagster/autonomy:L3"
    w.tick()
    assert _row(w, plain.id).state == "active" and not w.has("customers")
    assert records.approvals(w.instance, sensitive.change_sets[0]) == []  # only a person decides that one


def test_an_owner_who_never_answers_expires_the_request_and_escalates(w):
    """The escalation ladder of every change set: crm's part expires unanswered, the expiry sensor
    marks it and escalates; the access request ends expired and nothing is granted."""
    import time

    import datetime as dt

    req, _ = w.request(w.spec(role=w.pg.role("analyst"), duration_s=15))  # approvals due by the grant's end
    ok, msg = w.approve(next(x for x in req.change_sets if x.endswith("finance")), ANA)
    assert ok, msg
    time.sleep(max(0.0, (req.expires_at - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.5)
    w.daemon.tick("dw_expiry_sensor")  # the ladder records its steps in the ledger and shows them at once
    from dw_dagster.core.ledger import ledger_for

    crm = next(x for x in req.change_sets if x.endswith("crm"))
    ledger = ledger_for(w.instance)
    assert [r.change_set_id for r in ledger.change_set_rows(states=["expired"])] == [crm]
    steps = ledger.ladder_steps(change_set_id=crm)
    assert [s.step for s in steps] == ["deny"] and steps[0].shown  # denied once, shown to the people
    w.tick()
    assert _row(w, req.id).state == "expired" and w.tick().run_ids == [] and not w.has("ledger")


def test_dagster_job_execute_of_the_grant_job_grants_nothing(w, tmp_path):
    """`dagster job execute` on the access example's location: the guarded executor refuses the run."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from dw_dagster_tests.conftest import POSTGRES_URL

    req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=600))
    _approved(w, req)  # approved: only the sensor's ticketed run may grant
    home = tmp_path / "access_home"
    home.mkdir()
    shutil.copy(w.domains_file, home / "domains.yaml")
    config = tmp_path / "run.yaml"
    config.write_text(f"ops:\n  dw_apply_access_grant:\n    config:\n      request_id: {req.id}\n")
    env = {**os.environ, "DAGSTER_HOME": str(w.home), "DW_ACCESS_HOME": str(home), "DW_ACCESS_DEMO_URL": POSTGRES_URL}
    proc = subprocess.run([str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m",
                           "dw_dagster_examples.access.definitions", "-j", "dw_access_grant", "-c", str(config)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "ticket" in (proc.stdout + proc.stderr)
    assert not w.has("ledger") and _row(w, req.id).state == "approved"


def test_a_grantee_dropped_before_the_grant_fails_the_grant_and_closes_with_a_receipt(w):
    req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=600))
    _approved(w, req)
    dana = w.role(DANA)
    w.pg.run(f'DROP ROLE "{dana}"')
    w.pg.create_role("dana", "LOGIN")  # re-created: another role, the approval was not for it
    tick = w.tick()
    assert tick.failed_run_ids and _row(w, req.id).state == "grant_failed" and not w.has("ledger")
    assert "not the role the dry-run saw" in _row(w, req.id).note
    w.tick()  # what ran of the grant (nothing) is revoked, and the grant ends with its receipt
    row = _row(w, req.id)
    assert row.state == "revoked" and row.granted_at is None
    (receipt,) = records.receipts(w.instance, dg.AssetKey(c.ACCESS_ASSET))
    assert receipt.evidence_summary["granted_at"] is None and receipt.evidence_summary["revoke_verified"] is True


def test_a_request_edited_in_the_ledger_after_approval_is_refused_as_tampering(w):
    """Someone with write access to the Dagster storage swaps the approved table for another in the
    recorded request: the grant op compares it with what the owners approved and grants nothing."""
    import sqlalchemy as sa

    from dw_dagster.core.ledger_tables import access_t

    req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=600))
    _approved(w, req)
    led = ledger_for(w.instance)
    body = led.access_row(req.id).body.replace(f'\\"{w.pg.schema}\\".\\"ledger\\"', f'\\"{w.pg.schema}\\".\\"customers\\"')
    assert body != led.access_row(req.id).body
    with led.engine.begin() as conn:
        conn.execute(access_t.update().where(access_t.c.request_id == req.id).values(body=body))
    tick = w.tick()
    row = _row(w, req.id)
    assert tick.failed_run_ids and row.state == "grant_failed" and "tampering" in row.note
    assert not w.has("customers") and not w.has("ledger")


def test_the_slack_approval_request_of_an_access_change_set_says_what_it_opens(w):
    from dw_dagster.integrations.slack import approval_request_message

    req, _ = w.request(w.spec(role=w.pg.role("analyst"), duration_s=600))
    cs = records.find_change_set(w.instance, next(x for x in req.change_sets if x.endswith("crm")))
    msg = approval_request_message(cs, None, dagster_url="http://dagster.example", location="access")
    body = "\n".join(b["text"]["text"] for b in msg.blocks if b.get("type") == "section")
    assert f"*Access for:* {DANA}" in body and "*Why:* quarter close" in body and "customers.email (email)" in body
    assert "Rows to recover" not in body and any(b.get("type") == "actions" for b in msg.blocks)  # the buttons stay
