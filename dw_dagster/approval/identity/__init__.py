"""Verified identities for decisions: OIDC ID tokens (:mod:`.oidc`), signed Slack interactions (:mod:`.slack`); the identity itself is :class:`~dw_dagster.core.identity.VerifiedIdentity`."""

from dw_dagster.core.identity import (
    NONCE_PREFIX,
    IdentityError,
    VerifiedIdentity,
    canonical_email,
    credential_digest,
    decision_nonce,
)

__all__ = ["IdentityError", "NONCE_PREFIX", "VerifiedIdentity", "canonical_email", "credential_digest", "decision_nonce"]
