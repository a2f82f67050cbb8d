"""Decisions need a verified identity: ID tokens from a real OIDC provider on loopback, through the
approval job, the CLI (``--login`` runs the provider's real login in a "browser"), resume and holds.

The provider is the fake in ``dw_dagster_dev.fakes.oidc_server`` (discovery, JWKS with rotation,
authorization code with PKCE); the verifier's own cases are in ``test_oidc.py``. Here each bad
token is tried where a colleague would try it: in the approval job's config.
"""

import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import httpx
import pytest

from dw_dagster.core import keys as c
from dw_dagster_dev.fakes.oidc_server import start_oidc_server
from dw_dagster.approval.identity import decision_nonce
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import ChangeSet, FileChange, utcnow
from dw_dagster.core import records
from dw_dagster.approval.job import approve_in_process, valid_approval
from dw_dagster.proposals.change_sets import propose
from dw_dagster.guard.stop import active_stop, resume_nonce, set_stop

OWNER = "dana.ortiz@grocer.example"
OTHER = "sam.lee@grocer.example"
CLIENT = "dw-dagster"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def idp():
    server = start_oidc_server(users={OWNER: {"sub": "sub-dana", "email_verified": True},
                                      OTHER: {"sub": "sub-sam", "email_verified": True},
                                      "pat@grocer.example": {"sub": "sub-pat", "email_verified": False}},
                               clients={CLIENT: {"redirect_uris": ["http://127.0.0.1/callback"]}}, default_user=OWNER)
    yield server
    server.stop()


@pytest.fixture
def world(tmp_path, idp, monkeypatch):
    domains = tmp_path / "domains.yaml"
    domains.write_text(textwrap.dedent(f"""\
        domains:
          - name: store_sales
            assets: [[store_sales_line]]
            approvers: [{OWNER}]
        identity:
          oidc:
            issuer: {idp.url}
            audience: {CLIENT}
        """))
    monkeypatch.setenv("DW_DOMAINS_FILE", str(domains))
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        now = utcnow()
        cs, _ = propose(instance, ChangeSet.seal(
            id="cs-ident000001", incident_id="inc-1", diagnosis_id="dg-1", domain="store_sales", proposer=c.PROPOSER,
            created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=[OWNER], cause_kind="late_rows_behind_watermark",
            summary="s", target_asset=["store_sales_line"], window=["2026-11-26"], diff="",
            files=[FileChange(path="p.yaml", before_sha256="a", after_sha256="b")], rebuild_assets=[]))
        yield instance, cs, domains, home


def _issue(idp, cs, **spec) -> str:
    body = {"email": OWNER, "aud": CLIENT, "nonce": decision_nonce(cs.id, cs.version, "approve"), **spec}
    r = httpx.post(idp.url + "/_fake/issue", json=body)
    assert r.status_code == 200, r.text
    return r.json()["id_token"]


def _login(idp, nonce: str, email: str = OWNER) -> str:
    from dw_dagster.approval.identity.oidc import login
    from dw_dagster.core.identity import OidcSettings

    return login(OidcSettings(issuer=idp.url, audience=CLIENT), nonce=nonce, login_hint=email,
                 open_url=lambda url: httpx.get(url, follow_redirects=True, timeout=30))


BAD_TOKENS = {
    "expired": (dict(exp_in=-600), "expired"),
    "wrong audience": (dict(aud="another-app"), "audience"),
    "wrong issuer": (dict(iss="https://login.evil.example"), "issuer"),
    "alg none": (dict(alg="none"), "none"),
    "HS256 with the public key": (dict(alg="HS256-public-key"), "HS256"),
    "unverified email": (dict(email="pat@grocer.example", email_verified=False), "email_verified"),
    "look-alike email (Cyrillic a)": (dict(email="d\u0430na.ortiz@grocer.example"), "ASCII"),
    "look-alike domain": (dict(email="dana.ortiz@grocer.example.evil.test"), "not an approver"),
    "bound to a reject": (dict(nonce="x"), "nonce"),
    "signed with an unpublished key": (dict(sign_with="unpublished"), "signing key"),
}


@pytest.mark.parametrize("name", list(BAD_TOKENS))
def test_the_approval_job_refuses_every_bad_token(world, idp, name):
    instance, cs, domains, _ = world
    spec, reason = BAD_TOKENS[name]
    if name == "bound to a reject":
        spec = dict(nonce=decision_nonce(cs.id, cs.version, "reject"))
    ok, msg = approve_in_process(instance, cs.id, id_token=_issue(idp, cs, **spec))
    assert not ok and reason.lower() in msg.lower(), msg
    assert records.approvals(instance, cs.id) == [] and valid_approval(instance, cs) is None


def test_the_owners_login_approves_and_the_token_is_single_use(world, idp):
    instance, cs, domains, _ = world
    token = _login(idp, decision_nonce(cs.id, cs.version, "approve"))
    ok, msg = approve_in_process(instance, cs.id, id_token=token)
    assert ok, msg
    (a,) = records.approvals(instance, cs.id)
    assert (a.approver, a.identity.method, a.identity.issuer, a.identity.subject) == (OWNER, "oidc", idp.url, "sub-dana")
    assert "verified by OIDC issuer" in msg
    assert valid_approval(instance, cs) == a
    ok, msg = approve_in_process(instance, cs.id, id_token=token)
    assert not ok and "already" in msg


def test_a_token_bound_to_an_old_version_approves_nothing(world, idp):
    instance, cs, domains, _ = world
    token = _login(idp, decision_nonce(cs.id, cs.version, "approve"))
    edited, _ = propose(instance, cs.model_copy(update={"summary": "edited after the owner logged in"}).__class__.seal(
        **{**cs.model_dump(exclude={"version"}), "summary": "edited after the owner logged in"}))
    assert edited.version != cs.version
    ok, msg = approve_in_process(instance, cs.id, id_token=token)
    assert not ok and "nonce" in msg


def test_a_verified_person_not_listed_is_refused(world, idp):
    instance, cs, domains, _ = world
    ok, msg = approve_in_process(instance, cs.id, id_token=_login(idp, decision_nonce(cs.id, cs.version, "approve"), OTHER))
    assert not ok and f"{OTHER} is not an approver" in msg


def test_key_rotation_at_the_provider_keeps_approvals_working(world, idp):
    """The deployment's verifier has the provider's keys cached; the provider rotates; a token signed
    with the new key still approves (one JWKS refetch). (An unknown key refetches at most once per
    10 s — the earlier unpublished-key test's refetch must be older than that, hence a fresh cache.)"""
    from dw_dagster.approval import job as approval

    instance, cs, domains, _ = world
    approval._verifiers.clear()
    assert not approve_in_process(instance, cs.id, id_token=_issue(idp, cs, exp_in=-600))[0]  # caches the current keys
    httpx.post(idp.url + "/_fake/rotate")
    ok, msg = approve_in_process(instance, cs.id, id_token=_issue(idp, cs))
    assert ok, msg


def _cli(home, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dw-dagster"), *args, "--dagster-home", str(home)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_cli_login_runs_the_providers_login_and_approves(world, idp, tmp_path):
    """``dw-dagster approve CS --login``: the CLI opens the authorization URL in the "browser" ($BROWSER
    here follows the redirects like a browser would, to the CLI's loopback listener), exchanges the
    code with PKCE, verifies the token bound to this decision, and the approval job records it."""
    instance, cs, domains, home = world
    browser = tmp_path / "browser.py"
    browser.write_text("import sys, httpx\nhttpx.get(sys.argv[1] + '&login_hint=dana.ortiz%40grocer.example', "
                       "follow_redirects=True, timeout=30)\n")
    typed = _cli(home, "approve", cs.id, "--approver", OWNER, "--domains", str(domains))
    assert typed.returncode == 3 and "needs a verified identity" in typed.stderr
    nothing = _cli(home, "approve", cs.id, "--domains", str(domains))
    assert nothing.returncode == 2 and "prove who you are" in nothing.stderr
    out = _cli(home, "approve", cs.id, "--login", "--domains", str(domains),
               env={"BROWSER": f"{sys.executable} {browser} %s"})
    assert out.returncode == 0, out.stderr
    assert f"approved by {OWNER} (verified by OIDC issuer {idp.url})" in out.stdout
    assert "Log in to decide: http://127.0.0.1" in out.stderr  # the URL is printed for a machine without a browser
    (a,) = records.approvals(instance, cs.id)
    assert a.identity.method == "oidc"


def test_cli_id_token_file(world, idp, tmp_path):
    instance, cs, domains, home = world
    f = tmp_path / "token"
    f.write_text(_issue(idp, cs, exp_in=-600))
    bad = _cli(home, "approve", cs.id, "--id-token-file", str(f), "--domains", str(domains))
    assert bad.returncode == 3 and "expired" in bad.stderr
    f.write_text(_issue(idp, cs))
    ok = _cli(home, "approve", cs.id, "--id-token-file", str(f), "--domains", str(domains))
    assert ok.returncode == 0, ok.stderr


def test_only_a_verified_operator_lifts_the_stop(world, idp):
    instance, cs, domains, home = world
    set_stop(instance, True, "intern@grocer.example", "incident review")  # anyone may stop
    typed = _cli(home, "resume", "--by", OWNER, "--domains", str(domains))
    assert typed.returncode == 3 and "verified identity" in typed.stderr
    other = _cli(home, "resume", "--id-token", _login(idp, resume_nonce(instance), OTHER), "--domains", str(domains))
    assert other.returncode == 3 and "not an operator" in other.stderr
    stale = _cli(home, "resume", "--id-token", _issue(idp, cs), "--domains", str(domains))  # a token for an approval
    assert stale.returncode == 3 and "nonce" in stale.stderr
    assert active_stop(instance) is not None
    ok = _cli(home, "resume", "--id-token", _login(idp, resume_nonce(instance)), "--domains", str(domains))
    assert ok.returncode == 0 and f"resumed by {OWNER} (verified by OIDC issuer" in ok.stdout, ok.stderr
    assert active_stop(instance) is None


def test_the_launchpad_resume_job_needs_a_token(world, idp):
    from dw_dagster.guard.stop import build_control_jobs

    instance, cs, domains, _ = world
    set_stop(instance, True, "cto@grocer.example")
    _, resume = build_control_jobs(domains)
    typed = resume.execute_in_process(instance=instance, raise_on_error=False,
                                      run_config={"ops": {"dw_lift_stop": {"config": {"by": OWNER}}}})
    assert not typed.success and active_stop(instance) is not None
    token = _login(idp, resume_nonce(instance))
    ok = resume.execute_in_process(instance=instance, run_config={"ops": {"dw_lift_stop": {"config": {"id_token": token}}}})
    assert ok.success and active_stop(instance) is None


def test_lifting_a_hold_needs_a_verified_approver(world, idp):
    from dw_dagster.guard.admission import RunFacts, RunRefused, admit_run

    instance, cs, domains, home = world
    assert approve_in_process(instance, cs.id, id_token=_issue(idp, cs))[0]
    facts = RunFacts("r-1", "nightly", {"dagster/partition": "2026-11-26"}, ("store_sales_line",))
    with pytest.raises(RunRefused, match="held by change set"):
        admit_run(instance, facts)
    nonce = decision_nonce(cs.id, cs.version, "lift-hold:store_sales_line")
    refused = _cli(home, "holds", "lift", cs.id, "--asset", "store_sales_line", "--reason", "month end",
                   "--id-token", _login(idp, nonce, OTHER), "--domains", str(domains))
    assert refused.returncode == 3 and "not an approver" in refused.stderr
    ok = _cli(home, "holds", "lift", cs.id, "--asset", "store_sales_line", "--reason", "month end",
              "--id-token", _login(idp, nonce), "--domains", str(domains))
    assert ok.returncode == 0, ok.stderr
    admit_run(instance, facts)  # the hold is lifted, recorded
    (entry,) = ledger_for(instance).audit_entries("hold_lifted")
    assert entry["by"] == OWNER and entry["body"]["reason"] == "month end"
    admit_run(instance, RunFacts("r-2", "nightly", {"dagster/partition": "2026-11-25"}, ("store_sales_line",)))
