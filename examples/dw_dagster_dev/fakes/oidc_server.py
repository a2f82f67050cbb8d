"""A protocol-accurate fake OpenID Connect provider on loopback, in one threaded HTTP server.

Routes (OpenID Connect Core 1.0, OpenID Connect Discovery 1.0, RFC 6749, RFC 7517, RFC 7636):

- ``GET /.well-known/openid-configuration``: the provider metadata (Discovery 1.0 §3): ``issuer``
  (the server's base URL, no trailing slash), ``authorization_endpoint``, ``token_endpoint``,
  ``jwks_uri``, ``response_types_supported: ["code"]``, ``subject_types_supported: ["public"]``,
  ``id_token_signing_alg_values_supported: ["RS256", "ES256"]``,
  ``code_challenge_methods_supported: ["S256"]``, ``grant_types_supported``,
  ``token_endpoint_auth_methods_supported``, ``scopes_supported``, ``claims_supported``,
  ``authorization_response_iss_parameter_supported: true`` (RFC 9207).
- ``GET /jwks``: the JWK Set (RFC 7517 §5): public keys only, each with ``kid`` (its RFC 7638
  thumbprint), ``use: "sig"`` and ``alg``. After a rotation the new key and the previous one are
  both published until the previous one is retired.
- ``GET``/``POST /authorize``: the authorization endpoint (Core 1.0 §3.1.2). An unknown
  ``client_id`` or a ``redirect_uri`` not registered for it is answered 400 and never redirected
  (RFC 6749 §4.1.2.1); a registered loopback redirect URI matches with any port (RFC 8252 §7.3).
  Other errors redirect with ``error`` and ``state``: ``unsupported_response_type`` (only
  ``code``), ``invalid_scope`` (``openid`` missing), ``invalid_request`` (no ``code_challenge``,
  or a method other than ``S256``: RFC 7636 §4.4.1). The fake "logs in" the user named by
  ``login_hint`` if that user exists, else the default user; a user configured with ``deny``
  gets ``error=access_denied``. Success is a 302 to ``redirect_uri`` with ``code``, ``state`` and
  ``iss``.
- ``POST /token``: the token endpoint (RFC 6749 §4.1.3, §5), form-encoded. Codes are single-use,
  expire after 60 s, are bound to the client and the redirect URI, and need the PKCE verifier
  whose S256 challenge the authorization request carried (RFC 7636 §4.6). Errors are 400
  ``{"error": "invalid_grant" | "invalid_request" | "unsupported_grant_type", "error_description"}``,
  or 401 ``invalid_client`` for a confidential client with a wrong secret (§5.2). Success is
  ``{access_token, token_type: "Bearer", expires_in, scope, id_token}`` with ``Cache-Control:
  no-store`` (§5.1); the ID token carries ``iss, sub, aud (the client_id), exp, iat, auth_time,
  nonce (when the request had one), email, email_verified, name, jti, at_hash``.

Test controls under ``/_fake/``: ``POST /_fake/rotate`` (body ``{"alg": "RS256" | "ES256"}``,
default RS256: a new key becomes current, the previous one stays published; optional ``use`` and
``jwk_alg`` misstate the new JWK's ``use``/``alg`` members),
``POST /_fake/retire`` (unpublish all but the current keys), ``POST /_fake/issue`` (mint a token
directly, see :meth:`OidcState.issue`), ``GET /_fake/state`` (request log of method, path and
status, per-path counts, keys, users, clients; never keys' private parts or codes). The same is
available in Python on :class:`OidcState` (``server.state``).

Run on its own: ``python -m dw_dagster_dev.fakes.oidc_server --port 8767 --user dana@x.example
--client dw-dagster-cli`` prints its base URL on one line and serves until SIGTERM or SIGINT.
"""

import argparse
import base64
import hashlib
import hmac
import json
import re
import secrets
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote_plus, urlencode, urlsplit, urlunsplit

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

DEFAULT_CLIENT_ID = "dw-dagster-cli"
DEFAULT_REDIRECT_URIS = ("http://127.0.0.1/callback",)
DEFAULT_USERS: dict[str, dict[str, Any]] = {
    "dana.ortiz@grocer.example": {"sub": "00u-dana-ortiz", "email_verified": True, "name": "Dana Ortiz"},
}
CODE_LIFETIME_S = 60
ID_TOKEN_LIFETIME_S = 300
_VERIFIER = re.compile(r"^[A-Za-z0-9\-._~]{43,128}$")  # RFC 7636 §4.1
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _s256(verifier: str) -> str:
    return _b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def _thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638 JWK thumbprint (SHA-256 of the required members, sorted, no whitespace)."""
    required = {"RSA": ("e", "kty", "n"), "EC": ("crv", "kty", "x", "y")}[jwk["kty"]]
    canonical = json.dumps({k: jwk[k] for k in required}, separators=(",", ":"), sort_keys=True)
    return _b64url(hashlib.sha256(canonical.encode()).digest())


@dataclass
class SigningKey:
    """One key pair; ``kid`` is the thumbprint of its public JWK."""

    alg: str
    private: Any
    published: bool = True
    kid: str = ""
    jwk: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def generate(cls, alg: str, published: bool = True, use: str = "sig", jwk_alg: str | None = None) -> "SigningKey":
        """A new key pair for ``alg``; ``use``/``jwk_alg`` override the published JWK's members (tests)."""
        if alg == "RS256":
            private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
        elif alg == "ES256":
            private = ec.generate_private_key(ec.SECP256R1())
            jwk = jwt.algorithms.ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
        else:
            raise ValueError(f"unsupported signing algorithm {alg!r}")
        kid = _thumbprint(jwk)
        return cls(alg, private, published, kid, {**jwk, "kid": kid, "use": use, "alg": jwk_alg or alg})

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo)


def _compact(header: dict[str, Any], claims: dict[str, Any], sign: Any) -> str:
    signing_input = _b64url(json.dumps(header, separators=(",", ":")).encode()) + "." + \
        _b64url(json.dumps(claims, separators=(",", ":")).encode())
    return signing_input + "." + _b64url(sign(signing_input.encode()))


class OidcState:
    """Everything the fake knows: keys, users, clients, outstanding codes and the request log.

    Args:
        users: ``{email: {"sub", "email_verified"?, "name"?, "deny"?}}`` (default
            :data:`DEFAULT_USERS`). ``deny: true`` makes a login answer ``access_denied``.
        clients: ``{client_id: {"redirect_uris": [...], "secret"?}}`` (default: one public
            client :data:`DEFAULT_CLIENT_ID` with :data:`DEFAULT_REDIRECT_URIS`).
        default_user: the email logged in when ``login_hint`` names nobody (default: the first user).
    """

    def __init__(self, users: dict[str, dict[str, Any]] | None = None,
                 clients: dict[str, dict[str, Any]] | None = None, default_user: str | None = None) -> None:
        self.lock = threading.RLock()
        self.issuer = ""  # set by the server once it knows its port
        self.users = {email: dict(u) for email, u in (users if users is not None else DEFAULT_USERS).items()}
        if clients is None:
            clients = {DEFAULT_CLIENT_ID: {"redirect_uris": list(DEFAULT_REDIRECT_URIS)}}
        self.clients = {cid: dict(c) for cid, c in clients.items()}
        self.default_user = default_user if default_user is not None else next(iter(self.users), None)
        self.keys: list[SigningKey] = [SigningKey.generate("RS256"), SigningKey.generate("ES256")]
        self.unpublished = SigningKey.generate("RS256", published=False)
        self.codes: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []

    # -- keys ----------------------------------------------------------------------------------
    def current(self, alg: str = "RS256") -> SigningKey:
        """The newest published key for ``alg``."""
        with self.lock:
            return [k for k in self.keys if k.alg == alg and k.published][-1]

    def rotate(self, alg: str = "RS256", use: str = "sig", jwk_alg: str | None = None) -> SigningKey:
        """A new key for ``alg`` becomes current; the previous one stays published until :meth:`retire`.

        ``use`` and ``jwk_alg`` misstate the new key's JWK ``use``/``alg`` members, so tests can check
        that a verifier refuses an encryption key or a key published for another algorithm.
        """
        key = SigningKey.generate(alg, use=use, jwk_alg=jwk_alg)
        with self.lock:
            self.keys.append(key)
        return key

    def retire(self) -> list[str]:
        """Unpublish every key that is not its algorithm's current one; return their kids."""
        with self.lock:
            keep = {self.current(a).kid for a in {k.alg for k in self.keys}}
            gone = [k.kid for k in self.keys if k.kid not in keep]
            self.keys = [k for k in self.keys if k.kid in keep]
            return gone

    def jwks(self) -> dict[str, Any]:
        with self.lock:
            return {"keys": [dict(k.jwk) for k in self.keys if k.published]}

    # -- tokens --------------------------------------------------------------------------------
    def issue(self, email: str | None = None, email_verified: Any = True, aud: Any = None, iss: str | None = None,
              exp_in: float = ID_TOKEN_LIFETIME_S, iat_offset: float = 0, nbf_in: float | None = None,
              nonce: str | None = None, alg: str = "RS256", kid: str | None = None,
              extra_claims: dict[str, Any] | None = None, sign_with: str = "current",
              sub: str | None = None, **unknown: Any) -> str:
        """Mint an ID token directly, for crafting good and bad tokens in tests.

        Args:
            email: the ``email`` claim (None: omitted); ``sub``/``name`` come from the user if known.
            email_verified: the claim's value (None: omitted).
            aud: the audience (default: the first client id); a string or a list.
            iss: the issuer (default: this server's).
            exp_in: ``exp = now + exp_in`` (s; negative = already expired).
            iat_offset: ``iat = now + iat_offset`` (s; negative = issued in the past).
            nbf_in: ``nbf = now + nbf_in`` (s; None: no nbf claim).
            nonce: the ``nonce`` claim (None: omitted).
            alg: ``RS256`` | ``ES256`` (signed with the current key), ``none`` (unsigned, empty
                signature), ``HS256-public-key`` (HMAC-SHA256 keyed with the current RSA public
                key's PEM, header ``alg: HS256``: the key-confusion attack of RFC 8725 §2.1).
            kid: the header ``kid`` (default: the signing key's).
            extra_claims: merged last (may override anything).
            sign_with: ``current`` | ``unpublished`` (an RSA key never in the JWKS, kid
                ``unpublished-<thumbprint>`` unless ``kid`` is given).
            sub: the ``sub`` claim (default: the user's, else derived from the email).

        Raises:
            ValueError: an unknown ``alg``/``sign_with`` or an unknown argument.
        """
        if unknown:
            raise ValueError(f"unknown issue arguments: {sorted(unknown)}")
        now = time.time()
        user = next((u for e, u in self.users.items() if email and e.lower() == email.lower()), {})
        claims: dict[str, Any] = {
            "iss": iss if iss is not None else self.issuer,
            "sub": sub or user.get("sub") or "sub-" + hashlib.sha256((email or "").encode()).hexdigest()[:16],
            "aud": aud if aud is not None else next(iter(self.clients), DEFAULT_CLIENT_ID),
            "exp": int(now + exp_in), "iat": int(now + iat_offset), "auth_time": int(now + iat_offset),
            "jti": uuid.uuid4().hex,
        }
        if email is not None:
            claims["email"] = email
        if email_verified is not None:
            claims["email_verified"] = email_verified
        if user.get("name"):
            claims["name"] = user["name"]
        if nbf_in is not None:
            claims["nbf"] = int(now + nbf_in)
        if nonce is not None:
            claims["nonce"] = nonce
        claims.update(extra_claims or {})
        return self._sign(claims, alg, kid, sign_with)

    def _sign(self, claims: dict[str, Any], alg: str, kid: str | None, sign_with: str = "current") -> str:
        if sign_with not in ("current", "unpublished"):
            raise ValueError(f"sign_with must be 'current' or 'unpublished', not {sign_with!r}")
        if alg == "none":
            return _compact({"alg": "none", "typ": "JWT"}, claims, lambda _: b"")
        if alg == "HS256-public-key":
            pem = self.current("RS256").public_pem()
            header = {"alg": "HS256", "typ": "JWT", "kid": kid or self.current("RS256").kid}
            return _compact(header, claims, lambda data: hmac.new(pem, data, hashlib.sha256).digest())
        if alg not in ("RS256", "ES256"):
            raise ValueError(f"alg must be RS256, ES256, none or HS256-public-key, not {alg!r}")
        if sign_with == "unpublished":
            if alg != "RS256":
                raise ValueError("the unpublished key is an RS256 key")
            key, default_kid = self.unpublished, "unpublished-" + self.unpublished.kid
        else:
            key = self.current(alg)
            default_kid = key.kid
        return jwt.encode(claims, key.private, algorithm=alg, headers={"kid": kid or default_kid, "typ": "JWT"})

    # -- log -----------------------------------------------------------------------------------
    def count(self, path: str, method: str | None = None) -> int:
        """How many requests were served for ``path`` (optionally only ``method``)."""
        with self.lock:
            return sum(1 for r in self.requests if r["path"] == path and (method is None or r["method"] == method))

    def snapshot(self) -> dict[str, Any]:
        """The state as JSON-able data (``GET /_fake/state``); no private keys, codes or tokens."""
        with self.lock:
            return {
                "issuer": self.issuer,
                "requests": [dict(r) for r in self.requests],
                "counts": dict(Counter(r["path"] for r in self.requests)),
                "keys": [{"kid": k.kid, "alg": k.alg, "published": k.published,
                          "current": k.kid == self.current(k.alg).kid} for k in self.keys],
                "users": {e: {k: v for k, v in u.items()} for e, u in self.users.items()},
                "clients": {c: {"redirect_uris": list(v.get("redirect_uris", [])), "confidential": bool(v.get("secret"))}
                            for c, v in self.clients.items()},
                "codes_outstanding": sum(1 for c in self.codes.values() if not c["used"]),
            }

    # -- protocol ------------------------------------------------------------------------------
    def discovery(self) -> dict[str, Any]:
        base = self.issuer
        return {
            "issuer": base,
            "authorization_endpoint": base + "/authorize",
            "token_endpoint": base + "/token",
            "jwks_uri": base + "/jwks",
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256", "ES256"],
            "code_challenge_methods_supported": ["S256"],
            "grant_types_supported": ["authorization_code"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
            "scopes_supported": ["openid", "email", "profile"],
            "claims_supported": ["iss", "sub", "aud", "exp", "iat", "auth_time", "nonce", "email",
                                 "email_verified", "name", "jti", "at_hash"],
            "authorization_response_iss_parameter_supported": True,
        }

    def redirect_allowed(self, client_id: str, redirect_uri: str) -> bool:
        """Exact match, except that a registered loopback URI matches any port (RFC 8252 §7.3)."""
        got = urlsplit(redirect_uri)
        for registered in self.clients[client_id].get("redirect_uris", []):
            if redirect_uri == registered:
                return True
            reg = urlsplit(registered)
            if (reg.scheme == got.scheme == "http" and reg.hostname in _LOOPBACK and got.hostname == reg.hostname
                    and (reg.path, reg.query) == (got.path, got.query) and not got.fragment):
                return True
        return False

    def authorize(self, params: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        client_id, redirect_uri = params.get("client_id", ""), params.get("redirect_uri", "")
        if client_id not in self.clients:
            return 400, {"error": "invalid_request", "error_description": "unknown client_id"}, {}
        if not redirect_uri or not self.redirect_allowed(client_id, redirect_uri):
            return 400, {"error": "invalid_request",
                         "error_description": "redirect_uri is not registered for this client"}, {}

        def back(**answer: str) -> tuple[int, Any, dict[str, str]]:
            if "state" in params:
                answer["state"] = params["state"]
            answer["iss"] = self.issuer
            parts = urlsplit(redirect_uri)
            query = "&".join(q for q in (parts.query, urlencode(answer)) if q)
            return 302, b"", {"Location": urlunsplit(parts._replace(query=query))}

        if params.get("response_type") != "code":
            return back(error="unsupported_response_type", error_description="only response_type=code is supported")
        if "openid" not in params.get("scope", "").split():
            return back(error="invalid_scope", error_description="the openid scope is required")
        challenge = params.get("code_challenge")
        if not challenge:
            return back(error="invalid_request", error_description="code challenge required")
        if params.get("code_challenge_method") != "S256":
            return back(error="invalid_request", error_description="transform algorithm not supported")
        if not re.fullmatch(r"[A-Za-z0-9\-_]{43}", challenge):
            return back(error="invalid_request", error_description="code_challenge is not a base64url SHA-256")
        email = params.get("login_hint") if params.get("login_hint") in self.users else self.default_user
        if email is None or email not in self.users:
            return back(error="login_required", error_description="no user to log in")
        if self.users[email].get("deny"):
            return back(error="access_denied", error_description="the user denied the request")
        code = secrets.token_urlsafe(32)
        with self.lock:
            self.codes[code] = {"client_id": client_id, "redirect_uri": redirect_uri, "challenge": challenge,
                                "nonce": params.get("nonce"), "email": email, "scope": params.get("scope", ""),
                                "auth_time": int(time.time()), "expires_at": time.time() + CODE_LIFETIME_S,
                                "used": False}
        return back(code=code)

    def token(self, form: dict[str, str], authorization: str | None) -> tuple[int, Any, dict[str, str]]:
        nostore = {"Cache-Control": "no-store", "Pragma": "no-cache"}

        def error(error: str, description: str, status: int = 400) -> tuple[int, Any, dict[str, str]]:
            extra = {"WWW-Authenticate": 'Basic realm="fake-oidc"'} if status == 401 else {}
            return status, {"error": error, "error_description": description}, {**nostore, **extra}

        client_id, secret = form.get("client_id"), form.get("client_secret")
        if authorization and authorization.lower().startswith("basic "):
            if secret is not None:
                return error("invalid_request", "more than one client authentication method (RFC 6749 §2.3)")
            try:
                basic_id, _, basic_secret = base64.b64decode(authorization[6:]).decode().partition(":")
            except ValueError:
                return error("invalid_client", "malformed Basic credentials", 401)
            basic_id, secret = unquote_plus(basic_id), unquote_plus(basic_secret)
            if client_id is not None and client_id != basic_id:
                return error("invalid_client", "client_id does not match the authenticated client", 401)
            client_id = basic_id
        if client_id not in self.clients:
            return error("invalid_client", "unknown client", 401)
        expected = self.clients[client_id].get("secret")
        if expected and not (secret and hmac.compare_digest(secret.encode(), expected.encode())):
            return error("invalid_client", "client authentication failed", 401)
        if form.get("grant_type") != "authorization_code":
            return error("unsupported_grant_type", "only authorization_code is supported")
        with self.lock:
            grant = self.codes.get(form.get("code", ""))
            if grant is None:
                return error("invalid_grant", "unknown authorization code")
            if grant["used"]:
                return error("invalid_grant", "authorization code already used")
            grant["used"] = True  # consumed by its first presentation, whatever follows
        if time.time() > grant["expires_at"]:
            return error("invalid_grant", "authorization code expired")
        if grant["client_id"] != client_id:
            return error("invalid_grant", "authorization code was issued to another client")
        if form.get("redirect_uri") != grant["redirect_uri"]:
            return error("invalid_grant", "redirect_uri does not match the authorization request")
        verifier = form.get("code_verifier", "")
        if not _VERIFIER.match(verifier):
            return error("invalid_grant", "code_verifier missing or malformed (RFC 7636 §4.1)")
        if not hmac.compare_digest(_s256(verifier), grant["challenge"]):
            return error("invalid_grant", "PKCE verification failed")
        user = self.users[grant["email"]]
        access_token = secrets.token_urlsafe(32)
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer, "sub": user["sub"], "aud": client_id, "exp": now + ID_TOKEN_LIFETIME_S, "iat": now,
            "auth_time": grant["auth_time"], "email": grant["email"],
            "email_verified": bool(user.get("email_verified", True)), "jti": uuid.uuid4().hex,
            "at_hash": _b64url(hashlib.sha256(access_token.encode()).digest()[:16]),
        }
        if user.get("name"):
            claims["name"] = user["name"]
        if grant["nonce"] is not None:
            claims["nonce"] = grant["nonce"]
        body = {"access_token": access_token, "token_type": "Bearer", "expires_in": 3600,
                "scope": grant["scope"], "id_token": self._sign(claims, "RS256", None)}
        return 200, body, nostore


class _Handler(BaseHTTPRequestHandler):
    server: "OidcServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet, and never log codes
        pass

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        with self.server.state.lock:  # logged before the client can see the answer
            self.server.state.requests.append({"method": self.command, "path": urlsplit(self.path).path,
                                               "status": status})
        try:
            self.send_response(status)
            if data or not isinstance(body, bytes):
                self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _handle(self) -> None:
        state = self.server.state
        split = urlsplit(self.path)
        path = split.path
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        form = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()} \
            if ctype == "application/x-www-form-urlencoded" else {}
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        if path.startswith("/_fake/"):
            self._control(path, raw)
        elif path == "/.well-known/openid-configuration" and self.command == "GET":
            self._reply(200, state.discovery())
        elif path == "/jwks" and self.command == "GET":
            self._reply(200, state.jwks())
        elif path == "/authorize" and self.command in ("GET", "POST"):
            self._reply(*state.authorize(query if self.command == "GET" else form))
        elif path == "/token" and self.command == "POST":
            if ctype != "application/x-www-form-urlencoded":
                self._reply(400, {"error": "invalid_request",
                                  "error_description": "the body must be application/x-www-form-urlencoded"})
            else:
                self._reply(*state.token(form, self.headers.get("Authorization")))
        else:
            self._reply(404, {"error": f"no route {self.command} {path}"})

    def _control(self, path: str, raw: bytes) -> None:
        state = self.server.state
        try:
            spec = json.loads(raw) if raw else {}
            if not isinstance(spec, dict):
                raise ValueError("the body must be a JSON object")
            if path == "/_fake/state" and self.command == "GET":
                self._reply(200, state.snapshot())
            elif path == "/_fake/rotate" and self.command == "POST":
                key = state.rotate(**spec)
                self._reply(200, {"kid": key.kid, "alg": key.alg})
            elif path == "/_fake/retire" and self.command == "POST":
                self._reply(200, {"retired": state.retire()})
            elif path == "/_fake/issue" and self.command == "POST":
                self._reply(200, {"id_token": state.issue(**spec)})
            else:
                self._reply(404, {"error": f"no control route {self.command} {path}"})
        except (ValueError, TypeError) as e:
            self._reply(400, {"error": f"bad control request: {e}"})

    do_GET = do_POST = do_DELETE = do_PUT = _handle


class OidcServer(ThreadingHTTPServer):
    """The fake's HTTP server; ``state`` is its :class:`OidcState`, ``url`` (= ``base_url``) its issuer."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: OidcState | None = None) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.state = state or OidcState()
        host, port = self.server_address[:2]
        self.url = self.base_url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self.state.issuer = self.url

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.shutdown()
        self.server_close()


def start_oidc_server(port: int = 0, host: str = "127.0.0.1", users: dict[str, dict[str, Any]] | None = None,
                      clients: dict[str, dict[str, Any]] | None = None,
                      default_user: str | None = None) -> OidcServer:
    """Start the fake in a daemon thread; return the server (``.url``, ``.state``, ``.stop()``).

    Args:
        port: TCP port (0 = a free one).
        host: interface, loopback by default.
        users: see :class:`OidcState`.
        clients: see :class:`OidcState`.
        default_user: see :class:`OidcState`.
    """
    server = OidcServer((host, port), OidcState(users, clients, default_user))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="oidc-fake", daemon=True).start()
    return server


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m dw_dagster_dev.fakes.oidc_server [--port N] [--user EMAIL ...] [--client ID ...]``."""
    ap = argparse.ArgumentParser(description="Fake OpenID Connect provider on loopback.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--user", action="append", default=[], help="a user with a verified email (repeatable)")
    ap.add_argument("--unverified-user", action="append", default=[], help="a user whose email_verified is false")
    ap.add_argument("--deny-user", action="append", default=[], help="a user whose logins answer access_denied")
    ap.add_argument("--default-user", default=None, help="logged in when login_hint names nobody")
    ap.add_argument("--client", action="append", default=[], help="a public client id (repeatable)")
    ap.add_argument("--redirect-uri", action="append", default=[],
                    help=f"registered for every client (default {DEFAULT_REDIRECT_URIS[0]}, any port)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    users: dict[str, dict[str, Any]] = {}
    for emails, extra in ((args.user, {}), (args.unverified_user, {"email_verified": False}),
                          (args.deny_user, {"deny": True})):
        for email in emails:
            users[email] = {"sub": "sub-" + hashlib.sha256(email.encode()).hexdigest()[:16],
                            "email_verified": True, **extra}
    uris = args.redirect_uri or list(DEFAULT_REDIRECT_URIS)
    clients = {c: {"redirect_uris": uris} for c in (args.client or [DEFAULT_CLIENT_ID])}
    server = start_oidc_server(args.port, args.host, users or None, clients, args.default_user)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(server.url, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
