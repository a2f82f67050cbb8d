"""Who may call the MCP server over HTTP: a shared bearer token, or OAuth access tokens from the organisation's IdP.

stdio needs none (the client starts the server as the user). On ``--http`` every request to
``/mcp`` must carry ``Authorization: Bearer <token>``; the SDK's ``RequireAuthMiddleware`` answers
401 (``WWW-Authenticate: Bearer error="invalid_token"``) without one or with one no verifier accepts.

- :class:`StaticTokenVerifier`: the token in ``$DW_MCP_TOKEN`` (at least 32 characters), compared
  with :func:`hmac.compare_digest` (constant time, RFC 6750 bearer usage).
- :class:`OAuthTokenVerifier`: a JWT access token from the identity provider, checked by the same
  :class:`~dw_dagster.approval.identity.oidc.OidcVerifier` the approval path uses: the issuer's JWKS
  found through discovery (keys cached and rotated), an asymmetric algorithm allow-list (no
  ``none``, no HS*), ``iss`` exactly the issuer, ``aud`` naming the configured audience and no other
  party, ``exp``/``nbf``/``iat`` with leeway, and the email claim that says who calls. Access tokens
  carry no decision nonce, so none is required; ``email_verified`` is required only when asked.

Neither logs a token or puts one in an error: a refusal is logged with its reason only
(``OidcVerifier`` never quotes tokens), and the :class:`~mcp.server.auth.provider.AccessToken`
handed to the SDK holds a SHA-256 digest of the token, not the token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from dataclasses import dataclass

import anyio.to_thread
from mcp.server.auth.provider import AccessToken

from dw_dagster.core.identity import IdentityError, OidcSettings

log = logging.getLogger("dw_dagster.mcp.auth")

TOKEN_ENV = "DW_MCP_TOKEN"
MIN_TOKEN_CHARS = 32


def _digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class StaticTokenVerifier:
    """Accepts exactly one shared token (``$DW_MCP_TOKEN``), compared in constant time.

    Args:
        token: the expected token, at least :data:`MIN_TOKEN_CHARS` characters.

    Raises:
        ValueError: the token is shorter than that (a guessable secret on a network endpoint).
    """

    def __init__(self, token: str) -> None:
        if len(token.strip()) < MIN_TOKEN_CHARS:
            raise ValueError(f"${TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 32`)")
        self._expected = token.strip().encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        """The caller's access (client ``dw-mcp-token``) when ``token`` is the shared one, else None."""
        if hmac.compare_digest(token.strip().encode("utf-8", "surrogatepass"), self._expected):
            return AccessToken(token=_digest(token), client_id="dw-mcp-token", scopes=[])
        log.debug("dw-dagster mcp: a bearer token is not the shared token")
        return None


@dataclass(frozen=True)
class OAuthConfig:
    """The identity provider whose access tokens the HTTP endpoint accepts.

    Attributes:
        issuer: the issuer URL exactly as its discovery document and tokens spell it (https;
            http only on loopback).
        audience: the audience the tokens must be issued to (the API / resource identifier).
        email_claim: the claim naming the caller (``email``; ``preferred_username`` or ``upn`` on Entra ID).
        require_email_verified: refuse tokens whose ``email_verified`` is not ``true``.
        algorithms: JWS algorithms allowed (asymmetric only).
    """

    issuer: str
    audience: str
    email_claim: str = "email"
    require_email_verified: bool = False
    algorithms: tuple[str, ...] = ("RS256", "ES256", "PS256", "EdDSA")

    def settings(self) -> OidcSettings:
        """The :class:`~dw_dagster.core.identity.OidcSettings` for the verifier (no nonce; ``exp`` bounds the age).

        Raises:
            pydantic.ValidationError: an issuer that is not https (or loopback http), a bad algorithm.
        """
        return OidcSettings(issuer=self.issuer, audience=self.audience, email_claim=self.email_claim,
                            algorithms=list(self.algorithms), require_email_verified=self.require_email_verified,
                            require_nonce=False, max_token_age_seconds=86400)


class OAuthTokenVerifier:
    """Verifies OAuth access tokens (JWTs) with :class:`~dw_dagster.approval.identity.oidc.OidcVerifier`."""

    def __init__(self, config: OAuthConfig) -> None:
        from dw_dagster.approval.identity.oidc import OidcVerifier

        self.config = config
        self._verifier = OidcVerifier(config.settings())

    def _verify(self, token: str) -> AccessToken | None:
        try:
            who = self._verifier.verify(token)
        except IdentityError as e:  # its messages never quote the token
            log.info(f"dw-dagster mcp: refused an access token: {e}")
            return None
        claims_exp = None
        try:
            import jwt

            claims_exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
        except Exception:  # noqa: BLE001 - verified above; the expiry is only a hint for the SDK
            pass
        return AccessToken(token=_digest(token), client_id=who.email, scopes=[], subject=who.subject,
                           expires_at=int(claims_exp) if isinstance(claims_exp, (int, float)) else int(time.time()) + 60,
                           claims={"iss": who.issuer, "email": who.email})

    async def verify_token(self, token: str) -> AccessToken | None:
        """The caller's access when the token verifies (in a worker thread: the JWKS may be fetched), else None."""
        return await anyio.to_thread.run_sync(self._verify, token)


class AnyOfVerifier:
    """Accepts a token any of ``verifiers`` accepts (the shared token and OAuth side by side)."""

    def __init__(self, *verifiers) -> None:
        self.verifiers = [v for v in verifiers if v is not None]

    async def verify_token(self, token: str) -> AccessToken | None:
        for v in self.verifiers:
            found = await v.verify_token(token)
            if found is not None:
                return found
        return None


__all__ = ["AnyOfVerifier", "MIN_TOKEN_CHARS", "OAuthConfig", "OAuthTokenVerifier", "StaticTokenVerifier", "TOKEN_ENV"]
