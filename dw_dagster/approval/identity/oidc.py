"""OpenID Connect ID tokens as proof of who made a decision, and a PKCE login for the CLI.

:class:`OidcVerifier` checks an ID token the way OpenID Connect Core 1.0 §3.1.3.7 ("ID Token
Validation") asks, against keys from the issuer's JWK Set (RFC 7517) found through OpenID Connect
Discovery 1.0. It never trusts the token's header to choose the verification method: the header's
``alg`` must be on the asymmetric allow-list and match the key the issuer published under the
token's ``kid``, and the signature is checked with that key's public key object only (which defeats
``alg: none`` and the "HS256 signed with the RSA public key" confusion attack, RFC 8725 §2.1 and
§3.1). The token is bound to one decision by its ``nonce`` (:func:`dw_dagster.core.identity.decision_nonce`).

:func:`login` gets such a token for a person at a terminal: the authorization code flow with PKCE
(RFC 7636) and a one-shot loopback redirect listener (RFC 8252 §7.3). :func:`pkce_pair`,
:func:`authorization_url` and :func:`exchange_code` are the same steps for a server-side web page.

Tokens never appear in log lines or exception messages (only a reason, and for kids and claims
the offending value when it is not secret).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
import webbrowser
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, quote_plus, urlsplit

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from dw_dagster.core.http import HttpApiError, RetryPolicy, json_body, send
from dw_dagster.core.identity import IdentityError, VerifiedIdentity, canonical_email, credential_digest, utcnow
from dw_dagster.core.identity import KEY_TYPES, OidcSettings, _is_loopback

#: the curve an ECDSA algorithm is defined on (RFC 7518 §3.4)
EC_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
_PUBLIC_KEY_CLASSES = {"RSA": (rsa.RSAPublicKey,), "EC": (ec.EllipticCurvePublicKey,),
                       "OKP": (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)}
_MIN_RSA_BITS = 2048  # NIST SP 800-131A; RFC 7518 §3.3 requires at least 2048
_MAX_TOKEN_CHARS = 65536


def _endpoint(settings: "OidcSettings", doc: dict[str, Any], name: str) -> str:
    """``doc[name]`` if it is an https URL (plain http only to loopback, for a loopback issuer)."""
    url = doc.get(name)
    if not isinstance(url, str) or not url:
        raise IdentityError(f"the OIDC discovery document has no {name}")
    parts = urlsplit(url)
    loopback_ok = urlsplit(settings.issuer).scheme == "http" and _is_loopback(parts.hostname)
    if parts.hostname and (parts.scheme == "https" or (parts.scheme == "http" and loopback_ok)):
        return url
    raise IdentityError(f"the OIDC {name} {url!r} is not an https URL")


def _get_json(client: httpx.Client, settings: OidcSettings, url: str, what: str) -> dict[str, Any]:
    """GET ``url`` as a JSON object, retried on 429/5xx/transport errors (:func:`dw_dagster.core.http.send`)."""
    policy = RetryPolicy(attempts=3, base_wait_s=0.25, max_wait_s=2.0, timeout_s=settings.http_timeout_seconds)
    try:
        response = send(client, "oidc", "GET", url, policy=policy, ok=lambda r: r.status_code == 200)
        body = json_body(response, "oidc", "GET")
    except HttpApiError as e:
        raise IdentityError(f"cannot fetch the {what}: {e}") from None
    if not isinstance(body, dict):
        raise IdentityError(f"the {what} at {url} is not a JSON object")
    return body


def fetch_discovery(settings: OidcSettings, client: httpx.Client | None = None) -> dict[str, Any]:
    """The issuer's OpenID Provider Metadata (OpenID Connect Discovery 1.0 §3, §4).

    Returns:
        The discovery document (a dict), its ``jwks_uri`` checked to be https (loopback http for a
        loopback issuer).

    Raises:
        IdentityError: the document cannot be fetched or is not JSON, or its ``issuer`` is not
            exactly the configured issuer (Discovery 1.0 §4.3: "MUST be identical"; a mismatch means
            tokens from it would carry an ``iss`` nobody configured).
    """
    own = client or httpx.Client()
    try:
        doc = _get_json(own, settings, settings.discovery_url, "OIDC discovery document")
    finally:
        if client is None:
            own.close()
    if doc.get("issuer") != settings.issuer:
        raise IdentityError(f"discovery document issuer {doc.get('issuer')!r} is not the configured issuer "
                            f"{settings.issuer!r} (OpenID Connect Discovery 1.0 §4.3)")
    _endpoint(settings, doc, "jwks_uri")
    return doc


def _json_object(raw: bytes | str, what: str) -> dict[str, Any]:
    """``raw`` (bytes, or a base64url segment) as a JSON object without duplicate names (RFC 7519 §4)."""
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise IdentityError(f"malformed token: duplicate member names in the {what}")
        return dict(pairs)

    try:
        data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)) if isinstance(raw, str) else raw
        value = json.loads(data, object_pairs_hook=no_duplicates)
    except (ValueError, TypeError):
        raise IdentityError(f"malformed token: the {what} is not base64url JSON") from None
    if not isinstance(value, dict):
        raise IdentityError(f"malformed token: the {what} is not a JSON object")
    return value


def _number(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise IdentityError(f"claim {name} is not a number of seconds since the epoch")
    return float(value)


class OidcVerifier:
    """Verifies ID tokens from one issuer; caches its discovery document and JWK Set (thread-safe).

    Args:
        settings: the issuer and the checks to apply.
        client: httpx client for the discovery document and JWKS (default: one of its own).
        clock: monotonic seconds, for the JWKS cache and refetch rate limit (tests pass a fake).
    """

    def __init__(self, settings: OidcSettings, *, client: httpx.Client | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._client = client or httpx.Client()
        self._clock = clock
        self._lock = threading.Lock()
        self._discovery: dict[str, Any] | None = None
        self._keys: list[dict[str, Any]] | None = None
        self._keys_fetched_at = 0.0
        self._last_refetch = float("-inf")

    def discovery(self) -> dict[str, Any]:
        """The issuer's discovery document (fetched once, then cached); see :func:`fetch_discovery`."""
        with self._lock:
            if self._discovery is None:
                self._discovery = fetch_discovery(self.settings, self._client)
            return self._discovery

    def _fetch_keys(self, jwks_uri: str) -> list[dict[str, Any]]:
        body = _get_json(self._client, self.settings, jwks_uri, "issuer's JWK Set")
        keys = body.get("keys")
        if not isinstance(keys, list):
            raise IdentityError("the issuer's JWK Set has no 'keys' array (RFC 7517 §5)")
        return [k for k in keys if isinstance(k, dict)]

    def _candidates(self, kid: str | None) -> list[dict[str, Any]]:
        """The published keys a token with ``kid`` may be signed with.

        The JWK Set is fetched when the cached one is older than ``jwks_cache_seconds``; a kid not
        in it triggers one refetch (key rotation, OpenID Connect Core 1.0 §10.1.1), at most one per
        ``jwks_refresh_min_interval_seconds``, and none when the set was fetched for this very call.
        """
        jwks_uri = self.discovery()["jwks_uri"]
        with self._lock:
            now, fetched = self._clock(), False
            if self._keys is None or now - self._keys_fetched_at >= self.settings.jwks_cache_seconds:
                self._keys, self._keys_fetched_at, fetched = self._fetch_keys(jwks_uri), now, True
            found = _select(self._keys, kid)
            if not found and not fetched and now - self._last_refetch >= self.settings.jwks_refresh_min_interval_seconds:
                self._last_refetch = now
                self._keys, self._keys_fetched_at = self._fetch_keys(jwks_uri), now
                found = _select(self._keys, kid)
        return found

    def verify(self, token: str, *, nonce: str | None = None, now: dt.datetime | None = None) -> VerifiedIdentity:
        """Check one ID token; return who it proves made the decision.

        Args:
            token: the compact-serialized JWS ID token.
            nonce: the decision nonce the token must carry (:func:`~dw_dagster.core.identity.decision_nonce`);
                compared in constant time.
            now: the time to check ``exp``/``nbf``/``iat`` against (aware; default: now, UTC).

        Returns:
            A :class:`VerifiedIdentity` with method ``oidc``, the canonical email, the issuer, ``sub``
            and, as ``credential_id``, the ``jti`` (else the token's SHA-256).

        Raises:
            IdentityError: with a one-line reason, following OpenID Connect Core 1.0 §3.1.3.7: a
                malformed token, an algorithm not allowed (``none``; symmetric HS* always), a kid not
                in the JWK Set even after one refetch, a key whose type, curve, ``alg`` or ``use``
                does not fit, a bad signature, wrong ``iss``, an ``aud`` not (only) ours or a wrong
                ``azp``, expired, not yet valid, ``iat`` missing/future/too old, no ``sub``, no email,
                an email not verified, a missing or wrong nonce.
        """
        s = self.settings
        now = (now or utcnow())
        if now.tzinfo is None:
            raise ValueError("now must be timezone-aware")
        now = now.astimezone(dt.timezone.utc)
        if not isinstance(token, str) or not token.strip():
            raise IdentityError("malformed token: empty")
        token = token.strip()
        if len(token) > _MAX_TOKEN_CHARS:
            raise IdentityError(f"malformed token: longer than {_MAX_TOKEN_CHARS} characters")
        segments = token.split(".")
        if len(segments) == 5:
            raise IdentityError("malformed token: an encrypted (JWE) ID token; only signed tokens are supported")
        if len(segments) != 3:
            raise IdentityError("malformed token: not three dot-separated parts (JWS compact serialization)")
        header = _json_object(segments[0], "header")
        alg = header.get("alg")
        if not isinstance(alg, str):
            raise IdentityError("malformed token: the header has no alg")
        if alg.upper().startswith("HS"):
            raise IdentityError(f"symmetric algorithm {alg} refused: ID tokens must be signed with the issuer's "
                                "private key (RFC 8725 §2.1)")
        if alg not in s.algorithms:
            raise IdentityError(f"token algorithm {alg!r} is not allowed (allowed: {', '.join(s.algorithms)})")
        if "crit" in header:
            raise IdentityError(f"token has critical header parameters {header['crit']!r}, none are supported "
                                "(RFC 7515 §4.1.11)")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise IdentityError("malformed token: kid is not a string")

        candidates = self._candidates(kid)
        if not candidates:
            if kid is None:
                raise IdentityError("token has no kid and the issuer publishes several keys "
                                    "(OpenID Connect Core 1.0 §10.1)")
            raise IdentityError(f"unknown signing key {kid!r}: not in the issuer's JWK Set")
        fitting = [k for k in candidates if k.get("kty") == KEY_TYPES[alg]]  # a kid may name keys of several types
        key = _public_key((fitting or candidates)[0], alg)
        try:
            payload_bytes = jwt.PyJWS().decode(token, key=key, algorithms=[alg])
        except jwt.InvalidSignatureError:
            raise IdentityError(f"bad signature: the token does not verify with the issuer's key {kid!r}") from None
        except jwt.PyJWTError as e:
            raise IdentityError(f"malformed token: {e}") from None
        claims = _json_object(payload_bytes, "payload")
        return self._check_claims(claims, token, nonce, now)

    def _check_claims(self, claims: dict[str, Any], token: str, nonce: str | None,
                      now: dt.datetime) -> VerifiedIdentity:
        s, t, leeway = self.settings, now.timestamp(), self.settings.leeway_seconds
        if claims.get("iss") != s.issuer:
            raise IdentityError(f"wrong issuer {claims.get('iss')!r}: expected {s.issuer!r}")
        aud = claims.get("aud")
        auds = [aud] if isinstance(aud, str) else aud
        if not isinstance(auds, list) or not auds or not all(isinstance(a, str) for a in auds):
            raise IdentityError("token has no aud (audience) claim")
        if not set(auds) & set(s.audiences):
            raise IdentityError(f"wrong audience {auds!r}: issued to another client, expected one of {s.audiences!r}")
        untrusted = [a for a in auds if a not in s.audiences]
        if untrusted:
            raise IdentityError(f"wrong audience: token also names untrusted audiences {untrusted!r} "
                                "(OpenID Connect Core 1.0 §3.1.3.7)")
        azp = claims.get("azp")
        if azp is not None:
            if len(auds) > 1 and azp != s.client_id:
                raise IdentityError(f"wrong azp {azp!r}: a token for several audiences must be authorized for "
                                    f"{s.client_id!r} (OpenID Connect Core 1.0 §3.1.3.7)")
            if azp not in s.audiences:
                raise IdentityError(f"wrong azp {azp!r}: not one of {s.audiences!r}")
        exp, nbf, iat = _number(claims, "exp"), _number(claims, "nbf"), _number(claims, "iat")
        if exp is None:
            raise IdentityError("token has no exp claim")
        if t >= exp + leeway:
            raise IdentityError(f"token expired {t - exp:.0f} s ago")
        if nbf is not None and nbf > t + leeway:
            raise IdentityError(f"token not valid yet (nbf is {nbf - t:.0f} s in the future)")
        if iat is None:
            raise IdentityError("token has no iat (issued at) claim")
        if iat > t + leeway:
            raise IdentityError(f"token issued in the future (iat is {iat - t:.0f} s ahead)")
        if t - iat > s.max_token_age_seconds + leeway:
            raise IdentityError(f"token too old: issued {t - iat:.0f} s ago, at most {s.max_token_age_seconds} s "
                                "allowed")
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise IdentityError("token has no sub (subject) claim")
        email = claims.get(s.email_claim)
        if not isinstance(email, str) or not email:
            raise IdentityError(f"token has no {s.email_claim} claim")
        canonical = canonical_email(email)
        if s.require_email_verified:
            if "email_verified" not in claims:
                raise IdentityError("email_verified claim missing: the issuer does not vouch for the email")
            if claims["email_verified"] is not True:
                raise IdentityError(f"email not verified by the issuer (email_verified is "
                                    f"{json.dumps(claims['email_verified'])})")
        if nonce is not None:
            got = claims.get("nonce")
            if not isinstance(got, str):
                raise IdentityError("token has no nonce: it is not bound to this decision")
            if not hmac.compare_digest(got.encode(), nonce.encode()):
                raise IdentityError("nonce mismatch: the token is bound to another decision or login")
        elif s.require_nonce:
            raise IdentityError("this deployment requires tokens bound to the decision: no nonce to check against")
        jti = claims.get("jti")
        return VerifiedIdentity(
            email=canonical, method="oidc", issuer=s.issuer, subject=sub, verified_at=now,
            # without a jti: a digest of the claims, not of the token text (base64 has several
            # spellings of one signature, so the same token could be presented "anew")
            credential_id=credential_digest(f"{s.issuer}|jti|{jti}") if isinstance(jti, str) and jti else credential_digest(
                json.dumps({k: claims.get(k) for k in ("iss", "sub", "aud", "iat", "exp", "nonce", "auth_time")},
                           sort_keys=True, default=str)),
            detail=f"verified by OIDC issuer {s.issuer}")

    def close(self) -> None:
        """Close the httpx client."""
        self._client.close()


def _select(keys: list[dict[str, Any]], kid: str | None) -> list[dict[str, Any]]:
    if kid is not None:
        return [k for k in keys if k.get("kid") == kid]
    signing = [k for k in keys if k.get("use", "sig") == "sig"]
    return signing if len(signing) == 1 else []


def _public_key(jwk: dict[str, Any], alg: str) -> Any:
    """The public key object of ``jwk`` for verifying ``alg``, after checking they fit (RFC 7517 §4)."""
    kid = jwk.get("kid")
    kty = KEY_TYPES[alg]
    if "use" in jwk and jwk["use"] != "sig":
        raise IdentityError(f"JWK {kid!r} is not a signing key (use={jwk['use']!r}, RFC 7517 §4.2)")
    if "key_ops" in jwk and (not isinstance(jwk["key_ops"], list) or "verify" not in jwk["key_ops"]):
        raise IdentityError(f"JWK {kid!r} is not for verifying signatures (key_ops={jwk['key_ops']!r})")
    if jwk.get("kty") != kty:
        raise IdentityError(f"token algorithm {alg} does not match JWK {kid!r} of key type {jwk.get('kty')!r}")
    if "alg" in jwk and jwk["alg"] != alg:
        raise IdentityError(f"token algorithm {alg} does not match JWK {kid!r}, published for {jwk['alg']!r}")
    if alg in EC_CURVES and jwk.get("crv") != EC_CURVES[alg]:
        raise IdentityError(f"token algorithm {alg} needs curve {EC_CURVES[alg]}, JWK {kid!r} is {jwk.get('crv')!r}")
    public = {k: v for k, v in jwk.items() if k not in ("d", "p", "q", "dp", "dq", "qi", "oth", "k")}
    try:
        key = jwt.PyJWK(public, algorithm=alg).key
    except (jwt.PyJWTError, ValueError, TypeError) as e:
        raise IdentityError(f"JWK {kid!r} can not be read: {e}") from None
    if not isinstance(key, _PUBLIC_KEY_CLASSES[kty]):
        raise IdentityError(f"JWK {kid!r} is not a {kty} public key")
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < _MIN_RSA_BITS:
        raise IdentityError(f"JWK {kid!r} is a {key.key_size}-bit RSA key, at least {_MIN_RSA_BITS} required")
    return key


# -- authorization code flow with PKCE ----------------------------------------------------------

def pkce_pair() -> tuple[str, str]:
    """A fresh PKCE ``(code_verifier, code_challenge)`` pair for ``code_challenge_method=S256``.

    The verifier is 86 characters of the unreserved alphabet (RFC 7636 §4.1: 43..128, 256 bits of
    entropy or more); the challenge is BASE64URL(SHA256(ASCII(verifier))) without padding (§4.2).
    """
    verifier = secrets.token_urlsafe(64)
    return verifier, _s256(verifier)


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()


def authorization_url(settings: OidcSettings, discovery: dict[str, Any], *, redirect_uri: str, state: str,
                      nonce: str, code_challenge: str, login_hint: str | None = None,
                      scope: str = "openid email") -> str:
    """The authorization request URL (OpenID Connect Core 1.0 §3.1.2.1, RFC 7636 §4.3).

    Args:
        settings: the issuer settings (``client_id`` is used).
        discovery: the issuer's discovery document (:func:`fetch_discovery`).
        redirect_uri: where the provider sends the browser back, registered for the client.
        state: an unguessable value the redirect must carry back (RFC 6749 §10.12, CSRF).
        nonce: the value the ID token must carry (the decision nonce).
        code_challenge: the S256 challenge of :func:`pkce_pair`.
        login_hint: the email to suggest on the provider's login page.
        scope: space-separated scopes; must include ``openid``.

    Raises:
        IdentityError: the discovery document has no usable ``authorization_endpoint``.
    """
    endpoint = _endpoint(settings, discovery, "authorization_endpoint")
    params = {"response_type": "code", "scope": scope, "client_id": settings.client_id,
              "redirect_uri": redirect_uri, "state": state, "nonce": nonce,
              "code_challenge": code_challenge, "code_challenge_method": "S256"}
    if login_hint:
        params["login_hint"] = login_hint
    return str(httpx.URL(endpoint).copy_merge_params(params))


def exchange_code(settings: OidcSettings, code: str, redirect_uri: str, code_verifier: str,
                  client: httpx.Client | None = None, *, discovery: dict[str, Any] | None = None) -> dict[str, Any]:
    """Redeem an authorization code at the token endpoint (RFC 6749 §4.1.3, RFC 7636 §4.5).

    Sent once, never retried: a code is single-use, so a retry after a lost answer would only be
    refused. A confidential client (``client_secret_env``) authenticates with HTTP Basic, or with
    ``client_secret`` in the form when the provider supports only ``client_secret_post``.

    Args:
        settings: the issuer settings.
        code: the ``code`` from the redirect.
        redirect_uri: exactly the ``redirect_uri`` of the authorization request.
        code_verifier: the PKCE verifier whose challenge the request carried.
        client: httpx client (default: a short-lived one).
        discovery: the discovery document, if already fetched.

    Returns:
        The token response (``access_token``, ``token_type``, ``expires_in``, ``id_token`` ...).
        The caller verifies ``id_token`` with :meth:`OidcVerifier.verify`.

    Raises:
        IdentityError: the endpoint is unreachable or refuses the code (the message names the
            RFC 6749 §5.2 ``error``, e.g. ``invalid_grant``), or the answer has no ``id_token``.
    """
    own = client or httpx.Client()
    try:
        doc = discovery or fetch_discovery(settings, own)
        endpoint = _endpoint(settings, doc, "token_endpoint")
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                "client_id": settings.client_id, "code_verifier": code_verifier}
        headers = {"Accept": "application/json"}
        secret = os.environ.get(settings.client_secret_env) if settings.client_secret_env else None
        if settings.client_secret_env and not secret:
            raise IdentityError(f"environment variable {settings.client_secret_env} (the OIDC client secret) is not set")
        if secret:
            methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
            if "client_secret_basic" in methods:
                pair = f"{quote_plus(settings.client_id or '')}:{quote_plus(secret)}".encode()
                headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
            elif "client_secret_post" in methods:
                form["client_secret"] = secret
            else:
                raise IdentityError(f"the token endpoint supports neither client_secret_basic nor client_secret_post "
                                    f"({methods!r})")
        try:
            response = own.post(endpoint, data=form, headers=headers, timeout=settings.http_timeout_seconds)
        except httpx.HTTPError as e:
            raise IdentityError(f"cannot reach the token endpoint {urlsplit(endpoint).path}: "
                                f"{type(e).__name__}") from None
    finally:
        if client is None:
            own.close()
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200:
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            desc = body.get("error_description")
            raise IdentityError(f"token endpoint refused the code: {body['error']}"
                                + (f" ({desc})" if isinstance(desc, str) else ""))
        raise IdentityError(f"token endpoint answered HTTP {response.status_code}")
    if not isinstance(body, dict) or not isinstance(body.get("id_token"), str):
        raise IdentityError("token response has no id_token (was the openid scope granted?)")
    return body


class _Callback(BaseHTTPRequestHandler):
    """The loopback redirect target: the first ``GET /callback`` is the answer, nothing is logged."""

    server: "_CallbackServer"

    def log_message(self, format: str, *args: Any) -> None:  # never log the code
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        split = urlsplit(self.path)
        if split.path != "/callback" or self.server.result is not None:
            return self._page(404, "Not found.")
        self.server.result = {k: v[0] for k, v in parse_qs(split.query).items()}
        self._page(200, "Login refused by the identity provider." if "error" in self.server.result
                   else "Login complete. You can close this tab and return to the terminal.")
        self.server.done.set()

    def _page(self, status: int, text: str) -> None:
        data = f"<!doctype html><title>dw-dagster login</title><p>{text}</p>".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


class _CallbackServer(HTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Callback)
        self.result: dict[str, str] | None = None
        self.done = threading.Event()


def login(settings: OidcSettings, *, nonce: str, open_url: Callable[[str], Any] = webbrowser.open,
          timeout_seconds: float = 300, client: httpx.Client | None = None, login_hint: str | None = None) -> str:
    """Log a person in at the issuer from a terminal; return the ID token.

    The authorization code flow (OpenID Connect Core 1.0 §3.1) with PKCE S256 (RFC 7636) and a
    loopback redirect: a one-shot listener on ``http://127.0.0.1:<random port>/callback`` (RFC 8252
    §7.3, §8.3). The caller then checks the token with ``OidcVerifier.verify(token, nonce=nonce)``.

    Args:
        settings: the issuer and client.
        nonce: the decision nonce the token is to carry.
        open_url: shows the authorization URL to the person (default: the web browser).
        timeout_seconds: how long to wait for the redirect (seconds).
        client: httpx client for discovery and the token endpoint.
        login_hint: the email to suggest on the login page.

    Returns:
        The ``id_token`` string (not yet verified).

    Raises:
        IdentityError: the provider redirected with an ``error`` (e.g. ``access_denied``), the
            ``state`` did not come back unchanged, the ``iss`` parameter names another issuer
            (RFC 9207 §2.4), no redirect arrived in time, or the code exchange failed.
    """
    own = client or httpx.Client()
    listener = _CallbackServer()
    thread = threading.Thread(target=listener.serve_forever, kwargs={"poll_interval": 0.1},
                              name="oidc-login-callback", daemon=True)
    try:
        doc = fetch_discovery(settings, own)
        verifier, challenge = pkce_pair()
        state = secrets.token_urlsafe(32)
        redirect_uri = f"http://127.0.0.1:{listener.server_address[1]}/callback"
        url = authorization_url(settings, doc, redirect_uri=redirect_uri, state=state, nonce=nonce,
                                code_challenge=challenge, login_hint=login_hint)
        thread.start()
        open_url(url)
        if not listener.done.wait(timeout_seconds):
            raise IdentityError(f"no login redirect arrived within {timeout_seconds:g} s")
        result = listener.result or {}
        if not hmac.compare_digest(result.get("state", "").encode(), state.encode()):
            raise IdentityError("state mismatch: the redirect does not answer this login (RFC 6749 §10.12)")
        if "iss" in result and result["iss"] != settings.issuer:
            raise IdentityError(f"the redirect came from issuer {result['iss']!r}, not {settings.issuer!r} (RFC 9207)")
        if "error" in result:
            desc = result.get("error_description")
            raise IdentityError(f"the identity provider refused the login: {result['error']}"
                                + (f" ({desc})" if desc else ""))
        if not result.get("code"):
            raise IdentityError("the redirect carries no authorization code")
        body = exchange_code(settings, result["code"], redirect_uri, verifier, own, discovery=doc)
        return body["id_token"]
    finally:
        if thread.is_alive():
            listener.shutdown()
        listener.server_close()
        if client is None:
            own.close()


__all__ = ["EC_CURVES", "KEY_TYPES", "OidcSettings", "OidcVerifier", "authorization_url", "exchange_code",
           "fetch_discovery", "login", "pkce_pair"]
