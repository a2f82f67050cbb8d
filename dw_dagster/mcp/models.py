"""Result shapes several tools share (pydantic, so every result has a JSON schema), and how they are read.

Times are aware UTC datetimes (ISO 8601 in JSON); counts are rows; asset keys are lists of path
components. Everything is read from the Dagster instance through :mod:`dw_dagster.core.records`,
the ledger (:mod:`dw_dagster.core.ledger`) and :func:`dw_dagster.receipts.chain.verify_receipts`.
"""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

from dw_dagster.core.ledger import Ledger
from dw_dagster.core.models import Approval, ChangeSet, Receipt
from dw_dagster.mcp.state import DwState
from dw_dagster.mcp.untrusted import LEDGER_NOTE, RECORD, TYPED, Untrusted, untrusted


class ChangeSetBrief(BaseModel):
    """A change set as the ledger holds it (latest version unless stated)."""

    id: str
    version: str = Field(description="SHA-256 (32 hex) of the content an approval signs")
    state: str = Field(description="proposed, approved, rejected, expired, superseded, running, halted, applied, failed")
    summary: Untrusted = Field(description="the change set's summary as its diagnosis wrote it (from warehouse data)")
    target_asset: list[str]
    cause_kind: str
    window: list[str] = Field(description="partition keys the repair reruns, sorted")
    domain: str
    approvers: list[str] = Field(description="who may approve, as recorded in the change set (the domains file decides now)")
    proposer: str
    created_at: dt.datetime
    expires_at: dt.datetime
    note: Untrusted | None = Field(default=None, description="the ledger's note on its state, if any (it may quote a "
                                  "person's reason or a run's error)")


class DecisionBrief(BaseModel):
    """A recorded decision (approval or rejection) on one change set version."""

    approval_id: str
    change_set_id: str
    change_set_version: str
    decision: str = Field(description="approve or reject")
    approver: str = Field(description="the canonical email the identity provider or Slack vouched for (or "
                          "dw-dagster/autonomy); 'not verified' when it was only typed (approver_typed has it)")
    approver_typed: Untrusted | None = Field(default=None, description="the email typed for an `identity: unverified` "
                                             "domain's decision")
    method: str = Field(description="how the approver was established: oidc, slack, unverified or autonomy")
    verified_by: str = Field(description="the identity in words, e.g. 'dana@x (verified by OIDC issuer https://…)'")
    decided_at: dt.datetime
    comment: Untrusted | None = None
    run_id: str | None = None
    active: bool = Field(description="False when withdrawn (approver removed, autonomy lowered)")
    withdrawn_reason: str | None = None
    signature_valid: bool | None = Field(description="HMAC checked with this deployment's key now; None without the key")


class ReceiptVerdict(BaseModel):
    """One receipt, as written, and whether its chain and signature verify now."""

    receipt_id: str
    asset_key: list[str]
    change_set_id: str
    incident_id: str
    applied: bool = Field(description="True when the repair was applied as approved")
    outcome: Untrusted = Field(description="applied, or what happened instead, as the receipt says (it may quote a "
                               "run's error)")
    verified_when_written: bool = Field(description="the receipt's own `verified`: window and every named check proven")
    created_at: dt.datetime
    verifies_now: bool | None = Field(description="chain intact, hash signed, recorded in the ledger "
                                      "(verify_receipts, as `dw-dagster receipts verify`); None when not checked")
    problems: list[str] = Field(default_factory=list, description="what verify_receipts found wrong with it")


def change_set_brief(led: Ledger, cs: ChangeSet) -> ChangeSetBrief:
    """The brief of ``cs`` with its ledger state."""
    row = led.change_set_row(cs.id, cs.version)
    return ChangeSetBrief(id=cs.id, version=cs.version, state=row.state if row else "?",
                          summary=Untrusted(untrusted_data=cs.summary, origin=RECORD),
                          target_asset=cs.target_asset, cause_kind=cs.cause_kind, window=cs.window, domain=cs.domain,
                          approvers=cs.approvers, proposer=cs.proposer, created_at=cs.created_at,
                          expires_at=cs.expires_at, note=untrusted(row.note if row else None, LEDGER_NOTE))


def decision_briefs(state: DwState, change_set_id: str) -> list[DecisionBrief]:
    """Every decision recorded on ``change_set_id`` (withdrawn ones too), newest first."""
    from dw_dagster.core.signing import signature_valid

    key = state.signing_key_set()
    out = []
    for d in state.ledger().decisions(change_set_id):
        try:
            a = Approval.model_validate_json(d["body"])
        except ValueError:
            continue  # quarantined by records.approvals; listed by `dw-dagster change-sets`
        verified = a.method in ("oidc", "slack", "autonomy")
        out.append(DecisionBrief(
            approval_id=a.id, change_set_id=a.change_set_id, change_set_version=a.change_set_version, decision=a.decision,
            approver=a.approver if verified else "not verified", approver_typed=None if verified else untrusted(a.approver, TYPED),
            method=a.method, verified_by=(a.identity.describe() if a.identity else a.approver) if verified else
            "not verified (an `identity: unverified` domain: the email was typed)",
            decided_at=a.decided_at, comment=untrusted(a.comment, TYPED if not verified else "written by the approver"),
            run_id=a.run_id, active=bool(d["active"]),
            withdrawn_reason=d.get("withdrawn_reason"), signature_valid=signature_valid(a) if key else None))
    return out


def receipt_check(state: DwState, asset_keys: list | None = None) -> tuple[bool, dict[str, list[str]], str]:
    """Run :func:`~dw_dagster.receipts.chain.verify_receipts` on the instance (the chains of ``asset_keys``, or all).

    Returns:
        ``(checked, problems by receipt id, one sentence)``; ``checked`` is False without the
        deployment's signing key (nothing can be verified then).
    """
    from dw_dagster.core.signing import ApprovalRefused
    from dw_dagster.receipts.chain import verify_receipts

    try:
        count, problems = verify_receipts(state.view(), asset_keys)
    except ApprovalRefused as e:
        return False, {}, (f"not checked: {e} (set DW_APPROVAL_SIGNING_KEY or DW_APPROVAL_SIGNING_KEY_FILE where "
                           "the server runs)")
    found: dict[str, list[str]] = {}
    for p in problems:
        found.setdefault(p.receipt_id, []).append(str(p))
    text = (f"{count} receipt(s) " + ("in the instance" if asset_keys is None else
                                      f"on {', '.join(k.to_user_string() for k in asset_keys)}") + " checked now: " +
            ("every chain intact, every hash signed, every receipt the ledger recorded present" if not problems
             else f"{len(problems)} problem(s)"))
    return True, found, text


def receipt_verdicts(receipts: list[Receipt], checked: bool, problems: dict[str, list[str]]) -> list[ReceiptVerdict]:
    """``receipts`` with the verdict of :func:`receipt_check`."""
    return [ReceiptVerdict(receipt_id=r.id, asset_key=r.asset_key, change_set_id=r.change_set_id, incident_id=r.incident_id,
                           applied=r.outcome == "applied", outcome=Untrusted(untrusted_data=r.outcome, origin=LEDGER_NOTE),
                           verified_when_written=r.verified, created_at=r.created_at,
                           verifies_now=(r.id not in problems) if checked else None, problems=problems.get(r.id, []))
            for r in receipts]


__all__ = ["ChangeSetBrief", "DecisionBrief", "ReceiptVerdict", "change_set_brief", "decision_briefs", "receipt_check",
           "receipt_verdicts"]
