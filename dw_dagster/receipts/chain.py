"""Receipts you can check for tampering: a signed hash chain per asset whose head lives in the ledger.

Each receipt observation carries (:mod:`dw_dagster.receipts.job`):

- ``dw/receipt_hash``: SHA-256 of the receipt's canonical JSON *and* its markdown
  (:meth:`Receipt.content_hash`); the JSON includes ``previous_hash``, the hash of the previous
  receipt on the same asset;
- ``dw/receipt_sig``: HMAC-SHA256 of that hash with the deployment's signing key, so a receipt
  edited *and* re-hashed by someone without the key still fails.

The receipt job appends every receipt to the ledger (:mod:`dw_dagster.core.ledger`): asset, position,
receipt id, hash, previous hash, the run that wrote it; the newest link is the asset's chain head.
Deleting runs does not touch the ledger, so :func:`verify_receipts` compares the event log against
it and reports

- ``altered``: the stored JSON and markdown do not hash to the stored hash, the signature does not
  verify, or the hash differs from the one the ledger recorded;
- ``broken_chain``: a receipt's ``previous_hash`` is not the hash of the receipt before it;
- ``missing``: a receipt the ledger recorded is not in the event log (its run, or the receipt, was
  deleted) — the newest one and the first one included;
- ``unanchored``: a receipt in the event log that the ledger never recorded.
"""

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.ledger import asset_str, ledger_for
from dw_dagster.core.models import Receipt
from dw_dagster.core import records
from dw_dagster.core.signing import ApprovalRefused, signing_key
from dw_dagster.dagster_private import public

RECEIPT_SIG_KEY = c.RECEIPT_SIG_KEY


def sign_hash(content_hash: str) -> str:
    """HMAC-SHA256 (hex) of a receipt hash with the deployment's signing key.

    Raises:
        ApprovalRefused: the signing key is missing or shorter than 16 characters.
    """
    return hmac.new(signing_key(), content_hash.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class ReceiptProblem:
    """One finding of :func:`verify_receipts`; ``kind`` is altered, broken_chain, missing or unanchored."""

    kind: str
    asset: str
    receipt_id: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.asset} receipt {self.receipt_id}: {self.detail}"


@dataclass(frozen=True)
class StoredReceipt:
    receipt: Receipt | None
    raw_id: str
    stored_hash: str | None
    signature: str | None
    markdown: str | None
    run_id: str
    storage_id: int


def stored_receipts(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> list[StoredReceipt]:
    """The receipt observations of one asset, oldest first, as stored (unparseable ones included)."""
    out = []
    for rec in records.iter_observations(instance, asset_key, newest_first=False):
        md = rec.asset_observation.metadata if rec.asset_observation else {}
        if c.RECEIPT_KEY not in md:
            continue
        data = records.metadata_json(md, c.RECEIPT_KEY)
        try:
            r = Receipt.model_validate(data)
        except Exception:  # noqa: BLE001 - an edited receipt may no longer parse; that is a finding
            r = None
        raw_id = str(data.get("id")) if isinstance(data, dict) else f"event {rec.storage_id}"
        markdown = records._value(md.get(c.RECEIPT_MD_KEY))
        out.append(StoredReceipt(r, raw_id, records._value(md.get(c.RECEIPT_HASH_KEY)),
                                 records._value(md.get(RECEIPT_SIG_KEY)), markdown if isinstance(markdown, str) else None,
                                 rec.run_id, rec.storage_id))
    return out


@public
def verify_receipts(instance: dg.DagsterInstance,
                    asset_keys: Sequence[dg.AssetKey] | None = None) -> tuple[int, list[ReceiptProblem]]:
    """Check every receipt chain of ``instance`` against its ledger; returns (receipts checked, problems).

    ``receipts checked`` counts the receipts the ledger recorded plus those only in the event log;
    zero means there are none anywhere.

    Args:
        instance: the Dagster instance.
        asset_keys: check only these assets' chains (each whole: every link the ledger recorded for
            it and every receipt its event log holds); default every asset.

    Raises:
        ApprovalRefused: no signing key (nothing can be checked).
    """
    signing_key()
    led = ledger_for(instance)
    wanted = None if asset_keys is None else {asset_str(ak) for ak in asset_keys}
    links = [link for link in led.receipt_links() if wanted is None or link.asset_key in wanted]
    by_asset: dict[str, list] = {}
    for link in links:
        by_asset.setdefault(link.asset_key, []).append(link)
    heads = led.receipt_heads()
    problems: list[ReceiptProblem] = []
    count = 0
    assets = ({asset_str(ak): ak for ak in instance.get_asset_keys()} if asset_keys is None
              else {asset_str(ak): ak for ak in asset_keys})
    for asset in sorted(set(by_asset) | set(assets)):
        ak = assets.get(asset) or dg.AssetKey(asset.split("/"))
        stored = {s.raw_id: s for s in stored_receipts(instance, ak)} if asset in assets else {}
        chain = by_asset.get(asset, [])
        previous: str | None = None
        for link in chain:
            count += 1
            s = stored.pop(link.receipt_id, None)
            if link.previous_hash != previous:
                problems.append(ReceiptProblem("broken_chain", asset, link.receipt_id,
                                               f"the ledger's link {link.seq} does not follow link {link.seq - 1}"))
            previous = link.hash
            if s is None:
                problems.append(ReceiptProblem(
                    "missing", asset, link.receipt_id,
                    f"receipt {link.seq} of {len(chain)} (change set {link.change_set_id}, written by run "
                    f"{(link.run_id or '?')[:8]}) is not in the event log: it, or its run, was deleted"))
                continue
            if s.receipt is None:
                problems.append(ReceiptProblem("altered", asset, s.raw_id, "the stored receipt no longer parses"))
                continue
            actual = s.receipt.content_hash(s.markdown or "")
            if s.stored_hash != actual:
                problems.append(ReceiptProblem("altered", asset, s.raw_id,
                                               f"content and markdown hash to {actual[:12]}…, stored hash is {str(s.stored_hash)[:12]}…"))
            elif s.signature is None or not hmac.compare_digest(sign_hash(actual), str(s.signature)):
                problems.append(ReceiptProblem("altered", asset, s.raw_id, "hash signature does not verify with this deployment's key"))
            elif actual != link.hash:
                problems.append(ReceiptProblem("altered", asset, s.raw_id, f"differs from what the ledger recorded ({link.hash[:12]}…)"))
            if s.receipt.previous_hash != link.previous_hash:
                problems.append(ReceiptProblem("broken_chain", asset, s.raw_id,
                                               "its previous_hash is not the hash of the receipt before it in the ledger"))
        if chain and heads.get(asset) != (chain[-1].seq, chain[-1].hash):
            problems.append(ReceiptProblem("broken_chain", asset, chain[-1].receipt_id,
                                           "the ledger's chain head is not its newest link"))
        for rid in sorted(stored):
            count += 1
            problems.append(ReceiptProblem("unanchored", asset, rid, "no receipt job recorded writing it in the ledger"))
    return count, problems


__all__ = ["ApprovalRefused", "ReceiptProblem", "sign_hash", "stored_receipts", "verify_receipts"]
