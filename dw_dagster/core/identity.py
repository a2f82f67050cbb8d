"""Who made a decision, as proven by something other than typed text.

Every decision dw_dagster records (approve, reject, resume after an org-wide stop, lift a hold)
carries a :class:`VerifiedIdentity`: the approver's email as an identity provider vouched for it,
never a string from a Launchpad form. The ways to get one:

- ``oidc``: an ID token from the organisation's identity provider (Okta, Entra ID, Google,
  Keycloak ...), verified against its JWKS (:mod:`dw_dagster.approval.identity.oidc`);
- ``slack``: a Slack interaction (button click) whose request signature verifies with the app's
  signing secret, the user's email read with ``users.info`` (:mod:`dw_dagster.approval.identity.slack`);
- ``unverified``: typed text, accepted only by a domain that opted into ``identity: unverified``
  (a scratch sandbox), and labelled as such everywhere;
- ``autonomy``: dw_dagster itself, for L3/L4 domains (no person).

Emails are compared in one canonical form everywhere (:func:`canonical_email`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import unicodedata
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from dw_dagster.errors import DwDagsterError
from dw_dagster.dagster_private import public

Method = Literal["oidc", "slack", "unverified", "autonomy"]

#: prefix of the OIDC ``nonce`` that binds an ID token to one decision (see :func:`decision_nonce`)
NONCE_PREFIX = "dw1."


@public
class IdentityError(DwDagsterError):
    """A credential does not prove who made a decision; the message says why (one line)."""


@public
def canonical_email(value: str) -> str:
    """The one form in which approver emails are compared: trimmed, lower case, ASCII only.

    Raises:
        IdentityError: not an email address (no single ``@``, whitespace or control characters
            inside, an empty local part or domain), or not ASCII (a look-alike character such as
            Cyrillic ``а`` or a full-width letter, which Unicode normalization could fold into a
            listed address).
    """
    if not isinstance(value, str):
        raise IdentityError(f"an email address is text, got {type(value).__name__}")
    s = value.strip().lower()
    if not s.isascii():
        # look-alikes (Cyrillic 'а', full-width 'ｄ', which NFKC would even fold into the ASCII
        # address) never equal a listed approver: approver addresses are ASCII
        raise IdentityError(f"not an ASCII email address: {value!r} (approver addresses are compared as ASCII; "
                            "look-alike characters are refused)")
    if s.count("@") != 1:
        raise IdentityError(f"not an email address: {value!r}")
    local, domain = s.split("@")
    if not local or not domain or any(ch.isspace() or unicodedata.category(ch).startswith("C") for ch in s):
        raise IdentityError(f"not an email address: {value!r}")
    return s


@public
def decision_nonce(change_set_id: str, version: str, decision: str) -> str:
    """The OIDC ``nonce`` that binds an ID token to one decision on one change set version.

    ``dw1.`` + 32 hex digits of SHA-256(``change_set_id|version|decision``). A token carrying it
    is good for that decision only: copied from a run's config (which every Dagster viewer can
    read), it approves nothing else.
    """
    digest = hashlib.sha256(f"{change_set_id}|{version}|{decision}".encode()).hexdigest()[:32]
    return NONCE_PREFIX + digest


@public
class VerifiedIdentity(BaseModel):
    """The person (or dw_dagster itself) behind one decision, and how that was established.

    Attributes:
        email: canonical email (:func:`canonical_email`); for ``autonomy`` the pseudo-address
            ``dw-dagster/autonomy:L3`` (or L4).
        method: ``oidc``, ``slack``, ``unverified`` or ``autonomy``.
        issuer: the OIDC issuer URL, or ``slack:<team id>``; None for unverified and autonomy.
        subject: the OIDC ``sub`` claim, or the Slack user id.
        verified_at: when the credential was checked (aware UTC).
        credential_id: a digest of the credential used (an ID token's ``jti``, else the SHA-256 of
            the token; a Slack request's signature): each is accepted for one decision only.
        detail: one sentence for people, e.g. "verified by OIDC issuer https://login.acme.example".
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    email: str
    method: Method
    issuer: str | None = None
    subject: str | None = None
    verified_at: dt.datetime
    credential_id: str | None = Field(default=None, description="single-use credential digest")
    detail: str = ""

    @property
    def verified(self) -> bool:
        """True for an identity an identity provider or Slack vouched for."""
        return self.method in ("oidc", "slack")

    def describe(self) -> str:
        """``dana@x (verified by OIDC issuer https://...)``, or ``(UNVERIFIED: typed text)``."""
        if self.method == "oidc":
            return f"{self.email} (verified by OIDC issuer {self.issuer})"
        if self.method == "slack":
            return f"{self.email} (verified by a signed Slack interaction, {self.issuer})"
        if self.method == "autonomy":
            return f"{self.email} (autonomy: no person)"
        return f"{self.email} (UNVERIFIED: typed text, accepted only by an identity: unverified domain)"


def credential_digest(credential: str) -> str:
    """SHA-256 hex of a credential, for single-use bookkeeping (the credential itself is never stored)."""
    return hashlib.sha256(credential.encode()).hexdigest()


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


__all__ = ["IdentityError", "Method", "NONCE_PREFIX", "VerifiedIdentity", "canonical_email", "credential_digest",
           "decision_nonce"]


#: asymmetric JWS algorithms (RFC 7518 §3.1, RFC 8037 §3.1) and the JWK key type each needs
KEY_TYPES: dict[str, str] = {
    "RS256": "RSA", "RS384": "RSA", "RS512": "RSA", "PS256": "RSA", "PS384": "RSA", "PS512": "RSA",
    "ES256": "EC", "ES384": "EC", "ES512": "EC", "EdDSA": "OKP",
}


def _is_loopback(host: str | None) -> bool:
    return (host or "").strip("[]").lower() in ("127.0.0.1", "::1", "localhost")


class OidcSettings(BaseModel):
    """How to verify ID tokens from one OpenID Connect issuer, and how to log in there.

    Attributes:
        issuer: the issuer identifier, exactly as the provider's discovery document and the tokens'
            ``iss`` claim spell it (e.g. ``https://login.acme.example`` or
            ``https://login.microsoftonline.com/<tenant>/v2.0``). https, or plain http only for
            127.0.0.1, ::1 or localhost (a fake provider on loopback); no query or fragment
            (OpenID Connect Discovery 1.0 §2).
        audience: the client id(s) tokens must be issued to; a token is refused unless its ``aud``
            names one of them and names no other party (OpenID Connect Core 1.0 §3.1.3.7 step 3).
        client_id: the client id :func:`login` uses; defaults to the first audience.
        client_secret_env: name of an environment variable holding a confidential client's secret
            for the token endpoint (RFC 6749 §2.3.1); None for a public client (PKCE only).
        algorithms: JWS algorithms accepted in a token's header. Asymmetric only: ``none`` and
            HS256/HS384/HS512 are refused (RFC 8725 §3.1), as is any name not in :data:`KEY_TYPES`.
        email_claim: the claim holding the approver's email (``email``; some Entra ID setups use
            ``preferred_username`` or ``upn``).
        require_email_verified: refuse tokens whose ``email_verified`` is not literally ``true``.
        require_nonce: refuse to verify a token without a decision nonce to compare with, so every
            accepted token is bound to one decision.
        leeway_seconds: clock skew allowed on ``exp``, ``nbf``, ``iat`` (seconds, 0..300).
        max_token_age_seconds: a token issued (``iat``) longer ago than this is refused (seconds,
            60..86400), however long its ``exp``.
        jwks_cache_seconds: how long a fetched JWK Set is used before fetching it again (seconds).
            A key the issuer retires stays trusted for up to this long.
        jwks_refresh_min_interval_seconds: an unknown ``kid`` triggers at most one JWK Set refetch
            per this interval (seconds), so a flood of forged kids cannot hammer the issuer.
        http_timeout_seconds: timeout per HTTP request to the issuer (seconds).
    """

    model_config = ConfigDict(extra="forbid")

    issuer: str
    audience: str | list[str]
    client_id: str | None = None
    client_secret_env: str | None = None
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256", "PS256", "EdDSA"])
    email_claim: str = "email"
    require_email_verified: bool = True
    require_nonce: bool = True
    leeway_seconds: int = Field(default=60, ge=0, le=300)
    max_token_age_seconds: int = Field(default=600, ge=60, le=86400)
    jwks_cache_seconds: int = Field(default=300, ge=0)
    jwks_refresh_min_interval_seconds: int = Field(default=10, ge=0)
    http_timeout_seconds: float = Field(default=10, gt=0)

    @field_validator("issuer")
    @classmethod
    def _issuer_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.query or parts.fragment or not parts.hostname:
            raise ValueError(f"issuer {v!r} must be a URL with a host and no query or fragment")
        if parts.scheme == "https" or (parts.scheme == "http" and _is_loopback(parts.hostname)):
            return v
        if parts.scheme == "http":
            raise ValueError(f"issuer {v!r} uses plain http: only https issuers are trusted "
                             "(plain http only on 127.0.0.1, ::1 or localhost)")
        raise ValueError(f"issuer {v!r} must be an https URL")

    @field_validator("audience")
    @classmethod
    def _audience(cls, v: str | list[str]) -> str | list[str]:
        values = [v] if isinstance(v, str) else v
        if not values or any(not isinstance(a, str) or not a.strip() for a in values):
            raise ValueError("audience must be one or more non-empty client ids")
        return v

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("algorithms must name at least one algorithm")
        for alg in v:
            if alg.lower() == "none":
                raise ValueError("algorithm 'none' (unsigned tokens) can not be allowed")
            if alg.upper().startswith("HS"):
                raise ValueError(f"symmetric algorithm {alg} can not be allowed: ID tokens are verified with "
                                 "the issuer's public key (RFC 8725 §3.1)")
            if alg not in KEY_TYPES:
                raise ValueError(f"unknown algorithm {alg!r} (known: {', '.join(KEY_TYPES)})")
        return v

    @model_validator(mode="after")
    def _default_client(self) -> "OidcSettings":
        if self.client_id is None:
            self.client_id = self.audiences[0]
        return self

    @property
    def audiences(self) -> list[str]:
        """``audience`` as a list."""
        return [self.audience] if isinstance(self.audience, str) else list(self.audience)

    @property
    def discovery_url(self) -> str:
        """``{issuer}/.well-known/openid-configuration``, a trailing ``/`` of the issuer removed first
        (OpenID Connect Discovery 1.0 §4)."""
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"
