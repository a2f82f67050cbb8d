"""What a repair's receipt really says, in the words every notification uses.

A receipt (:class:`~dw_dagster.core.models.Receipt`) ends every repair that ran: applied and
verified, applied but not verified, failed at a stage, halted (the decision stopped counting, the
org-wide stop), or an undo. Only the first one *resolves* anything: the page is resolved, the
Opsgenie alert closed, the Lightup incident closed (after its own re-collection), Slack told
"resolved", the Jira issue or ServiceNow incident moved to done. Every other outcome keeps (or
re-triggers) the page with the failing check, its SQL and the values it saw, and says in plain
words what happened — never "repaired, verified".

:func:`repair_verdict` classifies a receipt; :func:`outcome_text` and :func:`failing_checks`
give the words and the evidence (sample values masked by :mod:`dw_dagster.lineage.sensitive`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dw_dagster.core import keys as c
from dw_dagster.core.models import CheckOutcome, Receipt

VerdictKind = Literal["verified", "not_verified", "failed", "halted", "undo"]
#: metadata keys of a check evaluation that hold its SQL (a markdown ```sql block)
QUERY_KEYS = (c.QUERY_KEY, c.QUERIES_KEY)
_HEADLINES: dict[str, str] = {
    "verified": "repaired and verified",
    "not_verified": "repair applied but NOT verified",
    "failed": "repair FAILED",
    "halted": "repair HALTED",
    "undo": "repair UNDONE",
}


@dataclass(frozen=True)
class FailingCheck:
    """One check that did not pass in a repair's verify (or rebuild) run: where, its SQL, what it saw."""

    asset: str
    check: str
    sql: str
    values: dict[str, Any] = field(default_factory=dict)

    def lines(self, sql_limit: int = 1500) -> list[str]:
        """``check region_compare on store_sales_line failed: gap_rows=40, ...`` then the SQL."""
        shown = ", ".join(f"{k}={_short(v)}" for k, v in self.values.items()) or "no values recorded"
        out = [f"check {self.check} on {self.asset} failed: {shown}"]
        if self.sql:
            sql = self.sql if len(self.sql) <= sql_limit else self.sql[: sql_limit - 1] + "…"
            out.append(f"SQL: {sql}")
        return out


@dataclass(frozen=True)
class RepairVerdict:
    """A repair's end as the notifications tell it.

    Attributes:
        kind: ``verified`` (applied, every check passed), ``not_verified`` (applied, a check failed
            or none ran), ``failed`` (a stage failed), ``halted`` (stopped mid-way), ``undo`` (an
            undo ran: the fix was taken back, the incident is open again).
        receipt: the receipt on the incident's asset.
        receipts: every receipt of the same run of the receipt stage (one per touched asset).
        checks: the checks that did not pass, with SQL and values.
    """

    kind: VerdictKind
    receipt: Receipt
    receipts: tuple[Receipt, ...]
    checks: tuple[FailingCheck, ...] = ()

    @property
    def resolves(self) -> bool:
        """Whether this outcome resolves the page, closes alerts and tickets: only a verified repair."""
        return self.kind == "verified"

    @property
    def headline(self) -> str:
        """``repair FAILED``, ``repaired and verified``, ... (no incident id, no punctuation)."""
        return _HEADLINES[self.kind]

    def summary(self, incident_id: str) -> str:
        """One line: ``incident inc-1 on orders: repair FAILED: failed at window-1 (failed: ...)``."""
        r = self.receipt
        what = r.outcome if self.kind != "undo" else f"undo {r.change_set_id} ran ({r.outcome})"
        return f"incident {incident_id} on {'/'.join(r.asset_key)}: {self.headline}: {what}"


def _short(v: Any, limit: int = 200) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sql(md: dict[str, Any]) -> str:
    for key in QUERY_KEYS:
        v = md.get(key)
        if isinstance(v, str) and v.strip():
            return v.strip().removeprefix("```sql").removesuffix("```").strip()
    return ""


def _slices(md: dict[str, Any]) -> list[str]:
    from dw_dagster.core.models import gap_words

    out = []
    for s in md.get(c.SLICES_JSON_KEY) or []:
        if isinstance(s, dict) and not s.get("passed", True):
            label = ", ".join(f"{k}={v}" for k, v in (s.get("slice") or {}).items()) or "all rows"
            out.append(f"{label}: {gap_words(int(s.get('gap_rows') or 0), s.get('gap_pct'))}")
    return out


def failing_check(o: CheckOutcome, mask: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> FailingCheck:
    """A :class:`FailingCheck` from a check outcome: its SQL, its scalar values and failing slices.

    ``mask`` (e.g. :func:`dw_dagster.lineage.sensitive.mask_values`) is applied to the values
    before they leave the warehouse.
    """
    md = dict(o.metadata)
    values: dict[str, Any] = {k.removeprefix(c.DW_PREFIX): v for k, v in md.items()
                              if k not in QUERY_KEYS and not k.endswith("_json") and not isinstance(v, (list, dict))}
    slices = _slices(md)
    if slices:
        values["failing_slices"] = slices
    for k, v in md.items():
        if k.endswith("_json") and k != c.SLICES_JSON_KEY:
            values[k.removeprefix(c.DW_PREFIX).removesuffix("_json")] = v
    if mask is not None:
        values = mask(values)
    return FailingCheck(asset="/".join(o.asset_key), check=o.check_name, sql=_sql(md), values=values)


def classify(receipt: Receipt) -> VerdictKind:
    """The kind of a receipt's outcome (see :class:`RepairVerdict`)."""
    if receipt.cause_kind == "undo":
        return "undo"
    outcome = receipt.outcome or ""
    if outcome.startswith("failed"):
        return "failed"
    if outcome.startswith("halted"):
        return "halted"
    if receipt.verified and outcome == "applied":
        return "verified"
    return "not_verified"


def repair_verdict(receipt: Receipt, siblings: Sequence[Receipt] = (),
                   mask: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> RepairVerdict:
    """Classify ``receipt`` and gather the failing checks of its batch.

    Args:
        receipt: the receipt on the incident's asset.
        siblings: receipts of the same change set (any version, any run); those of the same
            version and outcome form the batch (the receipt job writes one per touched asset).
        mask: applied to each failing check's values (sensitive columns masked).
    """
    batch = [s for s in siblings if s.change_set_version == receipt.change_set_version
             and s.outcome == receipt.outcome and s.verified == receipt.verified]
    if not any(s.id == receipt.id for s in batch):
        batch.insert(0, receipt)
    kind = classify(receipt)
    checks = tuple(failing_check(o, mask) for s in batch for o in s.checks if not o.passed)
    return RepairVerdict(kind=kind, receipt=receipt, receipts=tuple(batch), checks=checks)


def outcome_lines(verdict: RepairVerdict, incident_id: str, *, next_steps: Sequence[str] = ()) -> list[str]:
    """The text every outcome message carries: the headline with the receipt's outcome, per receipt
    its change set, approver, partitions and verdict, the failing checks with SQL and values, and
    (for anything but a verified repair) what happens next."""
    r = verdict.receipt
    lines = [f"dw_dagster: {verdict.summary(incident_id)}."]
    lines.append(f"Change set {r.change_set_id} (version {r.change_set_version[:12]}), approved by "
                 f"{r.approver_identity or r.approver}; receipt {r.id}: "
                 f"{'verified' if r.verified else 'NOT verified'}.")
    for x in verdict.receipts:
        lines.append(f"- {'/'.join(x.asset_key)}: partitions {', '.join(x.partitions) or 'none'}; "
                     f"verified={x.verified}; outcome: {x.outcome}")
    for fc in verdict.checks:
        lines += fc.lines()
    if not verdict.resolves:
        lines.append("The page stays open" + (": " + "; ".join(next_steps) if next_steps else "."))
    return lines


__all__ = ["FailingCheck", "RepairVerdict", "VerdictKind", "classify", "failing_check", "outcome_lines",
           "repair_verdict"]
