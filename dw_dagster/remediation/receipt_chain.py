"""Receipts you can check for tampering: a signed hash chain per asset, anchored in the runs.

Each receipt observation carries (``dw_dagster.remediation.receipts``):

- ``dw/receipt_hash``: SHA-256 of the receipt's canonical JSON (:meth:`Receipt.content_hash`), which
  includes ``previous_hash``, the hash of the previous receipt on the same asset;
- ``dw/receipt_sig``: HMAC-SHA256 of that hash with the deployment's signing key
  (``$DW_APPROVAL_SIGNING_KEY``), so a receipt edited *and* re-hashed by someone without the key
  still fails.

The receipt job also anchors what it wrote in its run's tags (``dw/receipts``: asset, receipt id,
hash, signed), because a chain alone cannot see its newest link removed. :func:`verify_receipts`
recomputes every chain from the event log and checks it against those anchors; it reports

- ``altered``: the stored JSON does not hash to the stored hash, or the signature does not verify;
- ``broken_chain``: a receipt's ``previous_hash`` is not the hash of the receipt before it (one
  was removed or re-ordered);
- ``missing``: a receipt anchored in a run is not in the event log (removed);
- ``unanchored``: a receipt in the event log that no receipt run wrote.
"""

import hashlib
import hmac
import json
from dataclasses import dataclass

import dagster as dg

from dw_dagster import constants as c
from dw_dagster.models import Receipt
from dw_dagster.remediation import records
from dw_dagster.remediation.approval import ApprovalRefused, _key

RECEIPT_SIG_KEY = "dw/receipt_sig"
RECEIPTS_TAG = "dw/receipts"
RECEIPT_JOB_KIND = "receipt"


def sign_hash(content_hash: str) -> str:
    """HMAC-SHA256 (hex) of a receipt hash with the deployment's signing key.

    Raises:
        ApprovalRefused: the signing key is missing or shorter than 16 characters.
    """
    return hmac.new(_key(), content_hash.encode(), hashlib.sha256).hexdigest()


def anchor_tag(entries: list[dict]) -> str:
    """The ``dw/receipts`` run tag: ``[{asset, id, hash}]`` plus an HMAC over them (JSON)."""
    body = json.dumps(entries, sort_keys=True, separators=(",", ":"))
    return json.dumps({"receipts": entries, "sig": hmac.new(_key(), body.encode(), hashlib.sha256).hexdigest()},
                      sort_keys=True, separators=(",", ":"))


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
    run_id: str
    storage_id: int


def stored_receipts(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> list[StoredReceipt]:
    """The receipt observations of one asset, oldest first, as stored (unparseable ones included)."""
    out = []
    for rec in records.iter_observations(instance, asset_key, newest_first=False):
        md = rec.asset_observation.metadata if rec.asset_observation else {}
        data = records.metadata_json(md, c.RECEIPT_KEY)
        if data is None:
            continue
        try:
            r = Receipt.model_validate(data)
        except Exception:  # noqa: BLE001 - an edited receipt may no longer parse; that is a finding
            r = None
        raw_id = str(data.get("id")) if isinstance(data, dict) else "?"
        out.append(StoredReceipt(r, raw_id, records._value(md.get(c.RECEIPT_HASH_KEY)),
                                 records._value(md.get(RECEIPT_SIG_KEY)), rec.run_id, rec.storage_id))
    return out


def _anchors(instance: dg.DagsterInstance) -> tuple[dict[tuple[str, str], tuple[str, str]], list[ReceiptProblem]]:
    """(asset, receipt id) → (hash, run id) from every receipt run's signed tag."""
    out, problems = {}, []
    for run in instance.get_runs(filters=dg.RunsFilter(tags={"dw/kind": RECEIPT_JOB_KIND})):
        raw = run.tags.get(RECEIPTS_TAG)
        if raw is None:
            continue
        try:
            data = json.loads(raw)
            entries = data["receipts"]
            body = json.dumps(entries, sort_keys=True, separators=(",", ":"))
            ok = hmac.compare_digest(hmac.new(_key(), body.encode(), hashlib.sha256).hexdigest(), data["sig"])
        except (ValueError, KeyError, TypeError):
            ok, entries = False, []
        if not ok:  # reported; its entries still serve to spot removed receipts
            problems.append(ReceiptProblem("altered", "(run tags)", run.run_id, "the run's dw/receipts anchor is not signed by this deployment's key"))
        for e in entries if isinstance(entries, list) else []:
            out[(e["asset"], e["id"])] = (e["hash"], run.run_id)
    return out, problems


def verify_receipts(instance: dg.DagsterInstance) -> tuple[int, list[ReceiptProblem]]:
    """Recompute every receipt chain in ``instance``; returns (receipts checked, problems).

    Raises:
        ApprovalRefused: no signing key in ``$DW_APPROVAL_SIGNING_KEY`` (nothing can be checked).
    """
    _key()
    anchors, problems = _anchors(instance)
    seen: set[tuple[str, str]] = set()
    count = 0
    for ak in instance.get_asset_keys():
        asset = ak.to_user_string()
        previous: str | None = None
        for s in stored_receipts(instance, ak):
            count += 1
            seen.add((asset, s.raw_id))
            if s.receipt is None:
                problems.append(ReceiptProblem("altered", asset, s.raw_id, "the stored receipt no longer parses"))
                continue
            actual = s.receipt.content_hash()
            anchored = anchors.get((asset, s.raw_id))
            if s.stored_hash != actual:
                problems.append(ReceiptProblem("altered", asset, s.raw_id,
                                               f"content hashes to {actual[:12]}…, stored hash is {str(s.stored_hash)[:12]}…"))
            elif s.signature is None or not hmac.compare_digest(sign_hash(actual), str(s.signature)):
                problems.append(ReceiptProblem("altered", asset, s.raw_id, "hash signature does not verify with this deployment's key"))
            elif anchored is not None and anchored[0] != actual:
                problems.append(ReceiptProblem("altered", asset, s.raw_id, f"differs from what run {anchored[1][:8]} wrote"))
            if s.receipt.previous_hash != previous:
                problems.append(ReceiptProblem(
                    "broken_chain", asset, s.raw_id,
                    f"previous_hash {str(s.receipt.previous_hash)[:12]}… is not the hash of the receipt before it "
                    f"({str(previous)[:12]}…): a receipt was removed or re-ordered"))
            if anchored is None:
                problems.append(ReceiptProblem("unanchored", asset, s.raw_id, "no receipt run recorded writing it"))
            previous = s.stored_hash or actual  # the link as recorded, so one edit is reported once
    for (asset, rid), (_, run_id) in sorted(anchors.items()):
        if (asset, rid) not in seen:
            problems.append(ReceiptProblem("missing", asset, rid, f"written by run {run_id[:8]} but not in the event log"))
    return count, problems


__all__ = ["ApprovalRefused", "ReceiptProblem", "anchor_tag", "sign_hash", "stored_receipts", "verify_receipts"]
