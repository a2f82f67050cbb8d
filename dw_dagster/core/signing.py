"""The deployment's signing key, and the HMAC that signs decisions and receipts with it.

Decisions (:mod:`dw_dagster.approval.job`, :mod:`dw_dagster.approval.autonomy`) and the receipt chain
(:mod:`dw_dagster.receipts.chain`) sign with the same key: ``$DW_APPROVAL_SIGNING_KEY``, else the
content of the file named by ``$DW_APPROVAL_SIGNING_KEY_FILE``.
"""

import hashlib
import hmac
import json
import os
from pathlib import Path

from dw_dagster.core import keys as c
from dw_dagster.core.models import Approval
from dw_dagster.errors import DwDagsterError

SIGNING_KEY_FILE_ENV = "DW_APPROVAL_SIGNING_KEY_FILE"


class ApprovalRefused(DwDagsterError):
    """The decision breaks a rule; the message names the rule. Nothing was recorded."""


def signing_key() -> bytes:
    """The HMAC key that signs decisions and receipts: ``$DW_APPROVAL_SIGNING_KEY``, else the
    content of the file named by ``$DW_APPROVAL_SIGNING_KEY_FILE`` (a mounted secret).

    Raises:
        ApprovalRefused: neither is set, the file cannot be read, or the key is shorter than 16 characters.
    """
    key = os.environ.get(c.SIGNING_KEY_ENV, "")
    if not key and os.environ.get(SIGNING_KEY_FILE_ENV):
        try:
            key = Path(os.environ[SIGNING_KEY_FILE_ENV]).read_text().strip()
        except OSError as e:
            raise ApprovalRefused(f"${SIGNING_KEY_FILE_ENV} names {os.environ[SIGNING_KEY_FILE_ENV]}, which cannot be "
                                  f"read: {e.strerror}") from e
    if len(key) < 16:
        raise ApprovalRefused(f"${c.SIGNING_KEY_ENV} (or the file in ${SIGNING_KEY_FILE_ENV}) must hold a signing key "
                              "of at least 16 characters")
    return key.encode()


def sign(approval_payload: dict) -> str:
    """HMAC-SHA256 (hex) of the canonical JSON of an approval's signed fields."""
    msg = json.dumps(approval_payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hmac.new(signing_key(), msg, hashlib.sha256).hexdigest()


def signature_valid(approval: Approval) -> bool:
    """Whether ``approval.signature`` matches its content under the current signing key."""
    try:
        expected = sign(approval.signing_payload())
    except ApprovalRefused:
        return False
    return hmac.compare_digest(expected, approval.signature)


def signed(fields: dict) -> Approval:
    """An :class:`~dw_dagster.core.models.Approval` of ``fields`` with its signature."""
    unsigned = Approval(**fields, signature="")
    return Approval(**fields, signature=sign(unsigned.signing_payload()))


__all__ = ["SIGNING_KEY_FILE_ENV", "ApprovalRefused", "sign", "signature_valid", "signed", "signing_key"]
