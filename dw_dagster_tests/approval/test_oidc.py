"""OIDC ID-token verification and the PKCE login, against the fake provider on loopback (real HTTP)."""

import datetime as dt
import subprocess
import sys
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import jwt
import pytest
from pydantic import ValidationError

from dw_dagster_dev.fakes.oidc_server import start_oidc_server
from dw_dagster.approval.identity import IdentityError, canonical_email, credential_digest, decision_nonce
from dw_dagster.approval.identity.oidc import OidcVerifier, authorization_url, exchange_code, fetch_discovery, login, pkce_pair
from dw_dagster.core.identity import OidcSettings

DANA = "dana.ortiz@grocer.example"
LEE = "lee.chen@grocer.example"
UNVERIFIED = "uma.unverified@grocer.example"
DENIED = "sam.denied@grocer.example"
CLI = "dw-dagster-cli"
WEB = "dw-dagster-web"
WEB_SECRET = "web-client-secret-0123456789"
NONCE = decision_nonce("cs-42", "v3", "approve")

USERS = {
    DANA: {"sub": "00u-dana-ortiz", "email_verified": True, "name": "Dana Ortiz"},
    LEE: {"sub": "00u-lee-chen", "email_verified": True},
    UNVERIFIED: {"sub": "00u-uma", "email_verified": False},
    DENIED: {"sub": "00u-sam", "email_verified": True, "deny": True},
}
CLIENTS = {
    CLI: {"redirect_uris": ["http://127.0.0.1/callback"]},
    WEB: {"redirect_uris": ["http://127.0.0.1/callback"], "secret": WEB_SECRET},
    "other-app": {"redirect_uris": ["https://other.example/cb"]},
}


def _start():
    return start_oidc_server(users=USERS, clients=CLIENTS, default_user=DANA)


@pytest.fixture(scope="module")
def idp():
    server = _start()
    yield server
    server.stop()


@pytest.fixture
def fresh_idp():
    """A provider of its own, for tests that rotate keys or count requests."""
    server = _start()
    yield server
    server.stop()


class Clock:
    """Monotonic seconds the test moves by hand (for the JWKS cache and refetch limit)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _settings(server, **kw) -> OidcSettings:
    return OidcSettings(issuer=server.url, audience=kw.pop("audience", CLI), **kw)


def _issue(server, **spec) -> str:
    """Mint a token through the fake's HTTP control route (as a test in another process would)."""
    response = httpx.post(server.url + "/_fake/issue", json={"email": DANA, "nonce": NONCE, **spec})
    assert response.status_code == 200, response.text
    return response.json()["id_token"]


def _claims(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def _header(token: str) -> dict:
    return jwt.get_unverified_header(token)


def _refused(verifier: OidcVerifier, token: str, **kw) -> str:
    with pytest.raises(IdentityError) as e:
        verifier.verify(token, **kw)
    message = str(e.value)
    assert "\n" not in message
    assert all(part not in message for part in token.split(".") if len(part) > 8)  # the credential never leaks
    return message


# -- the good path --------------------------------------------------------------------------


def test_a_bound_token_verifies_with_canonical_email_issuer_subject_and_jti(idp):
    verifier = OidcVerifier(_settings(idp))
    token = _issue(idp, email="Dana.Ortiz@Grocer.Example")
    now = dt.datetime.now(dt.timezone.utc)
    identity = verifier.verify(token, nonce=NONCE, now=now)
    assert identity.email == DANA
    assert identity.method == "oidc" and identity.verified
    assert identity.issuer == idp.url
    assert identity.subject == "00u-dana-ortiz"
    # the issuer's jti, scoped by the issuer (two providers may mint the same jti)
    assert identity.credential_id == credential_digest(f"{idp.url}|jti|{_claims(token)['jti']}")
    assert identity.verified_at == now
    assert identity.detail == f"verified by OIDC issuer {idp.url}"
    assert identity.describe() == f"{DANA} (verified by OIDC issuer {idp.url})"


def test_without_jti_the_credential_id_is_a_digest_of_the_claims_not_of_the_text(idp):
    """Base64 has several spellings of one signature (trailing padding PyJWT accepts): a digest of
    the token text would let the same token count as new. The claims' digest is the same for all."""
    token = _issue(idp, extra_claims={"jti": None})
    verifier = OidcVerifier(_settings(idp))
    identity = verifier.verify(token, nonce=NONCE)
    assert identity.credential_id != credential_digest(token)
    respelled = token + "=="
    try:
        again = verifier.verify(respelled, nonce=NONCE)
    except IdentityError:
        return  # refused outright: as good
    assert again.credential_id == identity.credential_id


def test_an_es256_token_verifies(idp):
    token = _issue(idp, alg="ES256")
    assert _header(token)["alg"] == "ES256"
    assert OidcVerifier(_settings(idp)).verify(token, nonce=NONCE).email == DANA


def test_leeway_accepts_a_token_expired_30_s_ago_but_not_61_s(idp):
    verifier = OidcVerifier(_settings(idp, leeway_seconds=60))
    assert verifier.verify(_issue(idp, exp_in=-30), nonce=NONCE).email == DANA
    assert "expired" in _refused(verifier, _issue(idp, exp_in=-61), nonce=NONCE)
    strict = OidcVerifier(_settings(idp, leeway_seconds=0))
    assert "expired" in _refused(strict, _issue(idp, exp_in=-30), nonce=NONCE)


def test_nonce_not_required_when_the_deployment_says_so(idp):
    verifier = OidcVerifier(_settings(idp, require_nonce=False))
    assert verifier.verify(_issue(idp, nonce=None)).email == DANA


def test_several_audiences_need_azp_equal_to_our_client_id(idp):
    verifier = OidcVerifier(_settings(idp, audience=[CLI, WEB]))
    assert verifier.settings.client_id == CLI
    good = _issue(idp, aud=[CLI, WEB], extra_claims={"azp": CLI})
    assert verifier.verify(good, nonce=NONCE).email == DANA
    bad = _issue(idp, aud=[CLI, WEB], extra_claims={"azp": WEB})
    assert "wrong azp 'dw-dagster-web'" in _refused(verifier, bad, nonce=NONCE)


# -- refusals ---------------------------------------------------------------------------------

REFUSALS = [
    ("expired", {"exp_in": -600}, {}, "token expired"),
    ("wrong-audience", {"aud": "other-app"}, {}, "wrong audience ['other-app']"),
    ("extra-untrusted-audience", {"aud": [CLI, "other-app"]}, {}, "untrusted audiences ['other-app']"),
    ("wrong-issuer", {"iss": "https://login.evil.test"}, {}, "wrong issuer 'https://login.evil.test'"),
    ("alg-none", {"alg": "none"}, {}, "algorithm 'none' is not allowed"),
    ("hs256-with-public-key-pem", {"alg": "HS256-public-key"}, {}, "symmetric algorithm HS256 refused"),
    ("unverified-email", {"email_verified": False}, {}, "email not verified by the issuer (email_verified is false)"),
    ("email-verified-as-string", {"email_verified": "true"}, {}, 'email_verified is "true"'),
    ("email-verified-missing", {"email_verified": None}, {}, "email_verified claim missing"),
    ("no-email", {"email": None}, {}, "no email claim"),
    ("wrong-nonce", {"nonce": decision_nonce("cs-42", "v3", "reject")}, {}, "nonce mismatch"),
    ("token-without-nonce", {"nonce": None}, {}, "token has no nonce"),
    ("too-old", {"iat_offset": -3600}, {}, "token too old"),
    ("iat-in-future", {"iat_offset": 600, "exp_in": 900}, {}, "issued in the future"),
    ("iat-missing", {"extra_claims": {"iat": None}}, {}, "no iat"),
    ("iat-not-a-number", {"extra_claims": {"iat": "yesterday"}}, {}, "claim iat is not a number"),
    ("nbf-in-future", {"nbf_in": 600}, {}, "not valid yet"),
    ("no-sub", {"extra_claims": {"sub": None}}, {}, "no sub"),
    ("unknown-kid-unpublished-key", {"sign_with": "unpublished"}, {}, "unknown signing key 'unpublished-"),
]


@pytest.mark.parametrize("spec,verify_kw,reason", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refused_with_the_reason(idp, spec, verify_kw, reason):
    verifier = OidcVerifier(_settings(idp))
    token = _issue(idp, **spec)
    assert reason in _refused(verifier, token, nonce=NONCE, **verify_kw)


def test_missing_nonce_argument_refused_when_required(idp):
    verifier = OidcVerifier(_settings(idp))
    message = _refused(verifier, _issue(idp))
    assert "this deployment requires tokens bound to the decision" in message


def test_unpublished_key_under_a_published_kid_is_a_bad_signature(idp):
    current_kid = _header(_issue(idp))["kid"]
    token = _issue(idp, sign_with="unpublished", kid=current_kid)
    assert _header(token)["kid"] == current_kid
    assert "bad signature" in _refused(OidcVerifier(_settings(idp)), token, nonce=NONCE)


def test_tampered_payload_is_a_bad_signature(idp):
    verifier = OidcVerifier(_settings(idp))
    token = _issue(idp, email=LEE)
    assert verifier.verify(token, nonce=NONCE).email == LEE  # the untouched token is good
    header, payload, signature = token.split(".")
    claims = _claims(token) | {"email": DANA, "sub": "00u-dana-ortiz"}
    forged_payload = jwt.utils.base64url_encode(jwt.api_jwt.json.dumps(claims).encode()).decode()
    assert forged_payload != payload
    assert "bad signature" in _refused(verifier, f"{header}.{forged_payload}.{signature}", nonce=NONCE)


def test_rs256_header_on_the_ec_key_is_refused_as_a_key_mismatch(idp):
    ec_kid = _header(_issue(idp, alg="ES256"))["kid"]
    token = _issue(idp, alg="RS256", kid=ec_kid)
    message = _refused(OidcVerifier(_settings(idp)), token, nonce=NONCE)
    assert f"token algorithm RS256 does not match JWK {ec_kid!r} of key type 'EC'" in message


def test_a_key_published_for_encryption_or_another_algorithm_is_refused(fresh_idp):
    clock = Clock()
    verifier = OidcVerifier(_settings(fresh_idp), clock=clock)
    assert verifier.verify(_issue(fresh_idp), nonce=NONCE).email == DANA
    enc = httpx.post(fresh_idp.url + "/_fake/rotate", json={"use": "enc"}).json()
    token = _issue(fresh_idp)
    assert _header(token)["kid"] == enc["kid"]
    assert f"JWK {enc['kid']!r} is not a signing key (use='enc'" in _refused(verifier, token, nonce=NONCE)
    clock.t += 10
    ps = httpx.post(fresh_idp.url + "/_fake/rotate", json={"jwk_alg": "PS256"}).json()
    message = _refused(verifier, _issue(fresh_idp), nonce=NONCE)
    assert f"token algorithm RS256 does not match JWK {ps['kid']!r}, published for 'PS256'" in message


def test_an_algorithm_outside_the_allow_list_is_refused(idp):
    verifier = OidcVerifier(_settings(idp, algorithms=["RS256"]))
    message = _refused(verifier, _issue(idp, alg="ES256"), nonce=NONCE)
    assert "token algorithm 'ES256' is not allowed (allowed: RS256)" in message


@pytest.mark.parametrize("token", ["", "not-a-token", "a.b", "e30.e30.sig", "x.y.z", "a.b.c.d.e"])
def test_malformed_tokens(idp, token):
    with pytest.raises(IdentityError, match="^malformed token"):
        OidcVerifier(_settings(idp)).verify(token, nonce=NONCE)


LOOKALIKES = ["dana.ortiz@grocer.example.evil.test",
              "dana.ortiz@grocer-example.test",
              "dana.ortiz@grocer.examp1e"]
#: non-ASCII look-alikes: Cyrillic a (U+0430), full-width d (U+FF44, which NFKC folds into 'd'),
#: a full-width full stop in the domain (U+FF0E, folded into '.')
UNICODE_LOOKALIKES = ["d\u0430na.ortiz@grocer.example", "\uff44ana.ortiz@grocer.example", "dana.ortiz@grocer\uff0eexample"]


@pytest.mark.parametrize("email", LOOKALIKES)
def test_lookalike_emails_verify_but_are_not_the_approver(idp, email):
    identity = OidcVerifier(_settings(idp)).verify(_issue(idp, email=email), nonce=NONCE)
    assert identity.email == canonical_email(email)
    assert canonical_email(identity.email) != DANA


@pytest.mark.parametrize("email", UNICODE_LOOKALIKES)
def test_non_ascii_lookalike_emails_are_refused(idp, email):
    """Unicode normalization would fold two of these into the listed address: they are refused outright."""
    with pytest.raises(IdentityError, match="not an ASCII email address"):
        OidcVerifier(_settings(idp)).verify(_issue(idp, email=email), nonce=NONCE)


# -- JWKS caching and key rotation ------------------------------------------------------------


def test_rotation_costs_one_refetch_and_retired_keys_stop_verifying(fresh_idp):
    clock = Clock()
    verifier = OidcVerifier(_settings(fresh_idp, jwks_cache_seconds=300), clock=clock)
    old = _issue(fresh_idp)
    assert verifier.verify(old, nonce=NONCE).email == DANA
    assert fresh_idp.state.count("/jwks") == 1
    assert verifier.verify(_issue(fresh_idp), nonce=NONCE).email == DANA
    assert fresh_idp.state.count("/jwks") == 1  # cached

    rotated = httpx.post(fresh_idp.url + "/_fake/rotate").json()
    jwks_kids = [k["kid"] for k in httpx.get(fresh_idp.url + "/jwks").json()["keys"]]
    assert rotated["kid"] in jwks_kids and _header(old)["kid"] in jwks_kids  # both published
    new = _issue(fresh_idp)
    assert _header(new)["kid"] == rotated["kid"] != _header(old)["kid"]
    before = fresh_idp.state.count("/jwks")
    assert verifier.verify(new, nonce=NONCE).email == DANA
    assert fresh_idp.state.count("/jwks") == before + 1  # exactly one extra fetch
    assert verifier.verify(_issue(fresh_idp), nonce=NONCE).email == DANA
    assert verifier.verify(old, nonce=NONCE).email == DANA  # the previous key is still published
    assert fresh_idp.state.count("/jwks") == before + 1

    retired = httpx.post(fresh_idp.url + "/_fake/retire").json()["retired"]
    assert retired == [_header(old)["kid"]]
    clock.t += 301  # the cached set expires
    message = _refused(verifier, old, nonce=NONCE)
    assert f"unknown signing key {_header(old)['kid']!r}" in message
    assert fresh_idp.state.count("/jwks") == before + 2  # the expiry refetch; no second one right after
    assert verifier.verify(new, nonce=NONCE).email == DANA


def test_a_flood_of_unknown_kids_refetches_at_most_once_per_interval(fresh_idp):
    clock = Clock()
    verifier = OidcVerifier(_settings(fresh_idp, jwks_refresh_min_interval_seconds=10), clock=clock)
    assert verifier.verify(_issue(fresh_idp), nonce=NONCE).email == DANA
    assert fresh_idp.state.count("/jwks") == 1
    forged = [_issue(fresh_idp, sign_with="unpublished", kid=f"forged-{i}") for i in range(25)]
    for token in forged:
        assert "unknown signing key 'forged-" in _refused(verifier, token, nonce=NONCE)
    assert fresh_idp.state.count("/jwks") == 2
    clock.t += 5
    _refused(verifier, forged[0], nonce=NONCE)
    assert fresh_idp.state.count("/jwks") == 2
    clock.t += 6
    _refused(verifier, forged[0], nonce=NONCE)
    assert fresh_idp.state.count("/jwks") == 3
    assert httpx.get(fresh_idp.url + "/_fake/state").json()["counts"]["/jwks"] == 3


# -- discovery --------------------------------------------------------------------------------


def test_discovery_issuer_mismatch_is_refused(fresh_idp):
    port = urlsplit(fresh_idp.url).port
    for configured in (f"http://localhost:{port}", fresh_idp.url + "/"):
        verifier = OidcVerifier(OidcSettings(issuer=configured, audience=CLI))
        with pytest.raises(IdentityError, match="is not the configured issuer") as e:
            verifier.discovery()
        assert repr(fresh_idp.url) in str(e.value) and repr(configured) in str(e.value)
        with pytest.raises(IdentityError, match="is not the configured issuer"):
            verifier.verify(_issue(fresh_idp), nonce=NONCE)
    assert fresh_idp.state.count("/.well-known/openid-configuration") == 4
    assert fresh_idp.state.count("/jwks") == 0  # no key was ever fetched from the mismatched issuer


def test_discovery_document_is_cached(fresh_idp):
    verifier = OidcVerifier(_settings(fresh_idp))
    doc = verifier.discovery()
    assert doc["jwks_uri"] == fresh_idp.url + "/jwks"
    for _ in range(3):
        verifier.verify(_issue(fresh_idp), nonce=NONCE)
    assert fresh_idp.state.count("/.well-known/openid-configuration") == 1


def test_the_fake_publishes_accurate_metadata_and_public_keys_only(idp):
    doc = httpx.get(idp.url + "/.well-known/openid-configuration").json()
    assert doc["issuer"] == idp.url
    assert doc["authorization_endpoint"] == idp.url + "/authorize"
    assert doc["token_endpoint"] == idp.url + "/token"
    assert doc["response_types_supported"] == ["code"]
    assert doc["code_challenge_methods_supported"] == ["S256"]
    assert doc["id_token_signing_alg_values_supported"] == ["RS256", "ES256"]
    keys = httpx.get(doc["jwks_uri"]).json()["keys"]
    assert {(k["kty"], k["alg"], k["use"]) for k in keys} == {("RSA", "RS256", "sig"), ("EC", "ES256", "sig")}
    assert all("d" not in k and k["kid"] for k in keys)


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("issuer,reason", [
    ("http://login.acme.example", "plain http"),
    ("http://10.0.0.5:8080", "plain http"),
    ("ftp://login.acme.example", "must be an https URL"),
    ("https://login.acme.example?tenant=1", "no query or fragment"),
])
def test_settings_refuse_untrustworthy_issuers(issuer, reason):
    with pytest.raises(ValidationError, match=reason):
        OidcSettings(issuer=issuer, audience=CLI)


@pytest.mark.parametrize("issuer", ["https://login.acme.example", "http://127.0.0.1:8080", "http://localhost:9000",
                                    "http://[::1]:9000"])
def test_settings_accept_https_and_loopback_http(issuer):
    assert OidcSettings(issuer=issuer, audience=[CLI, WEB]).client_id == CLI


@pytest.mark.parametrize("algorithms,reason", [
    (["none"], "'none'"),
    (["RS256", "HS256"], "symmetric algorithm HS256"),
    (["hs512"], "symmetric algorithm hs512"),
    (["RS1"], "unknown algorithm 'RS1'"),
    ([], "at least one"),
])
def test_settings_refuse_unsafe_algorithms(algorithms, reason):
    with pytest.raises(ValidationError, match=reason):
        OidcSettings(issuer="https://login.acme.example", audience=CLI, algorithms=algorithms)


@pytest.mark.parametrize("field,value", [("leeway_seconds", 301), ("leeway_seconds", -1),
                                         ("max_token_age_seconds", 59), ("max_token_age_seconds", 86401),
                                         ("audience", []), ("audience", ""), ("colour", "blue")])
def test_settings_refuse_out_of_range_values(field, value):
    kwargs = {"issuer": "https://login.acme.example", "audience": CLI, field: value}
    with pytest.raises(ValidationError):
        OidcSettings(**kwargs)


# -- the PKCE login ---------------------------------------------------------------------------


def _follow(seen: list[str] | None = None):
    def open_url(url: str) -> None:
        if seen is not None:
            seen.append(url)
        response = httpx.get(url, follow_redirects=True)
        assert response.status_code == 200
    return open_url


def test_login_returns_a_token_that_verifies_with_the_nonce(fresh_idp):
    settings = _settings(fresh_idp)
    seen: list[str] = []
    token = login(settings, nonce=NONCE, open_url=_follow(seen), login_hint=DANA, timeout_seconds=10)
    identity = OidcVerifier(settings).verify(token, nonce=NONCE)
    assert (identity.email, identity.subject) == (DANA, "00u-dana-ortiz")
    claims = _claims(token)
    assert claims["nonce"] == NONCE and claims["aud"] == CLI and claims["name"] == "Dana Ortiz"
    query = parse_qs(urlsplit(seen[0]).query)
    assert {k: v[0] for k, v in query.items() if k not in ("state", "code_challenge", "redirect_uri")} == {
        "response_type": "code", "scope": "openid email", "client_id": CLI, "nonce": NONCE,
        "code_challenge_method": "S256", "login_hint": DANA}
    redirect = urlsplit(query["redirect_uri"][0])
    assert (redirect.scheme, redirect.hostname, redirect.path) == ("http", "127.0.0.1", "/callback")
    assert len(query["code_challenge"][0]) == 43 and len(query["state"][0]) >= 32
    assert fresh_idp.state.count("/token", "POST") == 1


def test_login_hint_picks_the_user(idp):
    token = login(_settings(idp), nonce=NONCE, open_url=_follow(), login_hint=LEE, timeout_seconds=10)
    assert OidcVerifier(_settings(idp)).verify(token, nonce=NONCE).email == LEE


def test_login_of_an_unverified_user_gives_a_token_the_verifier_refuses(idp):
    token = login(_settings(idp), nonce=NONCE, open_url=_follow(), login_hint=UNVERIFIED, timeout_seconds=10)
    assert "email not verified" in _refused(OidcVerifier(_settings(idp)), token, nonce=NONCE)


def test_login_access_denied_is_refused(fresh_idp):
    with pytest.raises(IdentityError, match="refused the login: access_denied"):
        login(_settings(fresh_idp), nonce=NONCE, open_url=_follow(), login_hint=DENIED, timeout_seconds=10)
    assert fresh_idp.state.count("/token") == 0


def test_login_state_mismatch_is_refused_and_the_code_never_redeemed(fresh_idp):
    def tamper(url: str) -> None:
        location = httpx.get(url).headers["Location"]
        parts = urlsplit(location)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        assert query["code"] and query["iss"] == fresh_idp.url
        query["state"] = "attacker-chosen-state"
        httpx.get(urlunsplit(parts._replace(query=urlencode(query))))

    with pytest.raises(IdentityError, match="state mismatch"):
        login(_settings(fresh_idp), nonce=NONCE, open_url=tamper, timeout_seconds=10)
    assert fresh_idp.state.count("/token") == 0
    assert fresh_idp.state.snapshot()["codes_outstanding"] == 1


def test_login_times_out_without_a_redirect(idp):
    with pytest.raises(IdentityError, match="no login redirect arrived within 0.3 s"):
        login(_settings(idp), nonce=NONCE, open_url=lambda url: None, timeout_seconds=0.3)


def test_login_as_a_confidential_client(fresh_idp, monkeypatch):
    settings = _settings(fresh_idp, audience=WEB, client_secret_env="DW_TEST_OIDC_SECRET")
    monkeypatch.delenv("DW_TEST_OIDC_SECRET", raising=False)
    with pytest.raises(IdentityError, match="DW_TEST_OIDC_SECRET .* is not set"):
        login(settings, nonce=NONCE, open_url=_follow(), timeout_seconds=10)
    monkeypatch.setenv("DW_TEST_OIDC_SECRET", "wrong-secret")
    with pytest.raises(IdentityError, match="refused the code: invalid_client"):
        login(settings, nonce=NONCE, open_url=_follow(), timeout_seconds=10)
    monkeypatch.setenv("DW_TEST_OIDC_SECRET", WEB_SECRET)
    token = login(settings, nonce=NONCE, open_url=_follow(), timeout_seconds=10)
    identity = OidcVerifier(settings).verify(token, nonce=NONCE)
    assert identity.email == DANA and _claims(token)["aud"] == WEB


def _authorize(server, settings, verifier_challenge, redirect_uri="http://127.0.0.1:5555/callback"):
    """Run the authorization request by hand; return the code from the redirect."""
    doc = fetch_discovery(settings)
    url = authorization_url(settings, doc, redirect_uri=redirect_uri, state="st-1", nonce=NONCE,
                            code_challenge=verifier_challenge)
    response = httpx.get(url)
    assert response.status_code == 302
    query = parse_qs(urlsplit(response.headers["Location"]).query)
    assert query["state"] == ["st-1"]
    return query["code"][0]


def test_a_code_is_single_use(fresh_idp):
    settings = _settings(fresh_idp)
    verifier, challenge = pkce_pair()
    redirect = "http://127.0.0.1:5555/callback"
    code = _authorize(fresh_idp, settings, challenge, redirect)
    body = exchange_code(settings, code, redirect, verifier)
    assert body["token_type"] == "Bearer" and body["expires_in"] == 3600
    assert OidcVerifier(settings).verify(body["id_token"], nonce=NONCE).email == DANA
    with pytest.raises(IdentityError, match="refused the code: invalid_grant .*already used"):
        exchange_code(settings, code, redirect, verifier)


def test_a_wrong_code_verifier_is_refused(fresh_idp):
    settings = _settings(fresh_idp)
    verifier, challenge = pkce_pair()
    other, _ = pkce_pair()
    redirect = "http://127.0.0.1:5555/callback"
    code = _authorize(fresh_idp, settings, challenge, redirect)
    with pytest.raises(IdentityError, match="refused the code: invalid_grant .*PKCE verification failed"):
        exchange_code(settings, code, redirect, other)
    with pytest.raises(IdentityError, match="invalid_grant"):  # the code was consumed by that attempt
        exchange_code(settings, code, redirect, verifier)


def test_a_different_redirect_uri_at_the_token_endpoint_is_refused(fresh_idp):
    settings = _settings(fresh_idp)
    verifier, challenge = pkce_pair()
    code = _authorize(fresh_idp, settings, challenge, "http://127.0.0.1:5555/callback")
    with pytest.raises(IdentityError, match="invalid_grant .*redirect_uri does not match"):
        exchange_code(settings, code, "http://127.0.0.1:6666/callback", verifier)


def test_pkce_pair_follows_rfc_7636():
    verifier, challenge = pkce_pair()
    assert 43 <= len(verifier) <= 128 and set(verifier) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
    # RFC 7636 Appendix B test vector, through the same transform
    from dw_dagster.approval.identity.oidc import _s256
    assert _s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk") == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    assert challenge == _s256(verifier) and pkce_pair()[0] != verifier


# -- the fake's authorization endpoint ----------------------------------------------------------


def _authz(server, **overrides):
    params = {"response_type": "code", "scope": "openid email", "client_id": CLI, "state": "s1",
              "redirect_uri": "http://127.0.0.1:4321/callback", "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
              "code_challenge_method": "S256"}
    params.update(overrides)
    return httpx.get(server.url + "/authorize", params={k: v for k, v in params.items() if v is not None})


def test_the_fake_never_redirects_to_an_unregistered_uri(idp):
    for override in ({"redirect_uri": "http://127.0.0.1:4321/other"}, {"redirect_uri": "https://evil.test/callback"},
                     {"client_id": "unknown-client"}):
        response = _authz(idp, **override)
        assert response.status_code == 400 and "Location" not in response.headers
        assert response.json()["error"] == "invalid_request"


@pytest.mark.parametrize("override,error", [
    ({"code_challenge": None}, "invalid_request"),
    ({"code_challenge_method": "plain"}, "invalid_request"),
    ({"response_type": "token"}, "unsupported_response_type"),
    ({"scope": "email"}, "invalid_scope"),
])
def test_the_fake_redirects_request_errors_with_state(idp, override, error):
    response = _authz(idp, **override)
    assert response.status_code == 302
    query = parse_qs(urlsplit(response.headers["Location"]).query)
    assert query["error"] == [error] and query["state"] == ["s1"] and "code" not in query


def test_the_fake_token_endpoint_wants_a_form(idp):
    response = httpx.post(idp.url + "/token", json={"grant_type": "authorization_code"})
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"
    response = httpx.post(idp.url + "/token", data={"grant_type": "password", "client_id": CLI})
    assert response.status_code == 400 and response.json()["error"] == "unsupported_grant_type"
    assert response.headers["Cache-Control"] == "no-store"


def test_the_fake_runs_as_a_module_and_prints_its_url():
    proc = subprocess.Popen([sys.executable, "-m", "dw_dagster_dev.fakes.oidc_server", "--port", "0", "--user", LEE,
                             "--client", "cli-x"], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        doc = httpx.get(url + "/.well-known/openid-configuration", timeout=10).json()
        assert doc["issuer"] == url
        state = httpx.get(url + "/_fake/state").json()
        assert list(state["users"]) == [LEE] and list(state["clients"]) == ["cli-x"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
