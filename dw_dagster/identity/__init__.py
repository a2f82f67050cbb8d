"""Verified identities for decisions: OIDC ID tokens, signed Slack interactions (see :mod:`.base`)."""

from dw_dagster.identity.base import (
    NONCE_PREFIX,
    IdentityError,
    VerifiedIdentity,
    canonical_email,
    credential_digest,
    decision_nonce,
)

__all__ = ["IdentityError", "NONCE_PREFIX", "VerifiedIdentity", "canonical_email", "credential_digest", "decision_nonce"]
