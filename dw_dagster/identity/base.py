"""Who made a decision, as proven by something other than typed text.

Every decision dw_dagster records (approve, reject, resume after an org-wide stop, lift a hold)
carries a :class:`VerifiedIdentity`: the approver's email as an identity provider vouched for it,
never a string from a Launchpad form. The ways to get one:

- ``oidc``: an ID token from the organisation's identity provider (Okta, Entra ID, Google,
  Keycloak ...), verified against its JWKS (:mod:`dw_dagster.identity.oidc`);
- ``slack``: a Slack interaction (button click) whose request signature verifies with the app's
  signing secret, the user's email read with ``users.info`` (:mod:`dw_dagster.identity.slack`);
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

from pydantic import BaseModel, ConfigDict, Field

Method = Literal["oidc", "slack", "unverified", "autonomy"]

#: prefix of the OIDC ``nonce`` that binds an ID token to one decision (see :func:`decision_nonce`)
NONCE_PREFIX = "dw1."


class IdentityError(Exception):
    """A credential does not prove who made a decision; the message says why (one line)."""


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


def decision_nonce(change_set_id: str, version: str, decision: str) -> str:
    """The OIDC ``nonce`` that binds an ID token to one decision on one change set version.

    ``dw1.`` + 32 hex digits of SHA-256(``change_set_id|version|decision``). A token carrying it
    is good for that decision only: copied from a run's config (which every Dagster viewer can
    read), it approves nothing else.
    """
    digest = hashlib.sha256(f"{change_set_id}|{version}|{decision}".encode()).hexdigest()[:32]
    return NONCE_PREFIX + digest


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
