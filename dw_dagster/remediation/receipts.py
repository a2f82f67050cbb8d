"""Receipts: what changed on each touched asset, by whose approval, and how it was proven.

The receipt job runs last in a repair. For every asset the change set touched (the repaired
asset and every rebuilt one) it writes an ``AssetObservation`` with ``dw/receipt`` (JSON),
``dw/receipt_md`` (markdown for the UI), ``dw/receipt_hash`` and ``dw/receipt_sig``. Each receipt
includes the hash of the previous receipt on the same asset, so a removed or altered receipt
breaks the chain; :mod:`dw_dagster.remediation.receipt_chain` verifies it.
"""


import json
import uuid
from collections.abc import Iterable

import dagster as dg
from dagster import DagsterEventType
from pydantic import Field

from dw_dagster import constants as c
from dw_dagster.models import Approval, ChangeSet, CheckOutcome, Receipt, utcnow
from dw_dagster.remediation import records
from dw_dagster.remediation.approval import approved_change_set, signature_valid
from dw_dagster.remediation.receipt_chain import RECEIPT_SIG_KEY, RECEIPTS_TAG, anchor_tag, sign_hash

RECEIPT_JOB_NAME = "dw_receipts"


def check_outcomes(instance: dg.DagsterInstance, run_id: str) -> list[CheckOutcome]:
    """Every asset check evaluation recorded by one run."""
    out = []
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
        ev = entry.dagster_event.event_specific_data
        md = {}
        for k, v in (ev.metadata or {}).items():
            val = getattr(v, "value", v)
            if isinstance(val, (int, float, str, bool)) or (k.endswith("_json") and isinstance(val, (list, dict))):
                md[k] = val  # numbers, text and the JSON tables; rendered tables stay on the check
        out.append(CheckOutcome(asset_key=list(ev.asset_key.path), check_name=ev.check_name, passed=ev.passed,
                                severity=ev.severity.value, run_id=run_id, metadata=md))
    return out


def _slice_rows(slices: Iterable[dict]) -> dict[str, dict]:
    return {json.dumps(s["slice"], sort_keys=True): {"source_rows": s["source_rows"], "target_rows": s["target_rows"],
                                                      "gap_rows": s["gap_rows"], "gap_pct": s["gap_pct"]} for s in slices}


def receipt_markdown(r: Receipt) -> str:
    """A receipt as markdown, for the asset's page in the Dagster UI and for the CLI."""
    lines = [
        f"### Receipt {r.id} - change set {r.change_set_id} ({'verified' if r.verified else 'NOT verified'})",
        f"- **Cause** ({r.cause_kind}): {r.cause_summary}",
        f"- **Approved by** {r.approver} at {r.approved_at.isoformat()} (signature {'valid' if r.signature_valid else 'INVALID'})",
        f"- **Partitions**: {', '.join(r.partitions) or 'none (rebuilt whole, not partitioned)'}",
        "- **Runs**: " + ", ".join(f"{k} `{v}`" for k, v in r.run_ids.items()),
    ]
    if r.rows_before or r.rows_after:
        lines += ["", "| slice | before (gap rows / %) | after (gap rows / %) |", "|---|---|---|"]
        for s in sorted(set(r.rows_before) | set(r.rows_after)):
            b, a = r.rows_before.get(s, {}), r.rows_after.get(s, {})
            lines.append(f"| {s} | {b.get('gap_rows', '-')} / {b.get('gap_pct', '-')} | {a.get('gap_rows', '-')} / {a.get('gap_pct', '-')} |")
    lines += ["", "| check | asset | passed |", "|---|---|---|"]
    lines += [f"| {o.check_name} | {'/'.join(o.asset_key)} | {o.passed} |" for o in r.checks]
    lines += ["", f"**Undo**: {r.undo}", "", "<details><summary>diff</summary>", "", "```diff", r.diff.rstrip(), "```", "</details>",
              "", f"previous receipt hash: `{r.previous_hash}`" if r.previous_hash else "previous receipt hash: none (first receipt on this asset)"]
    return "\n".join(lines)


class ReceiptConfig(dg.Config):
    change_set_id: str = Field(description="the change set whose repair finished")


def write_receipts(instance: dg.DagsterInstance, cs: ChangeSet, approval: Approval) -> tuple[list[Receipt], list[dg.AssetObservation]]:
    """Build one receipt per touched asset from the event log (runs, check evaluations, incident)."""
    stage_runs = instance.get_runs(filters=dg.RunsFilter(tags={c.CHANGE_SET_TAG: cs.id, c.APPROVAL_TAG: approval.id}))
    run_ids = {r.tags[c.STAGE_TAG]: r.run_id for r in stage_runs if c.STAGE_TAG in r.tags and r.tags[c.STAGE_TAG] != "receipt"}
    outcomes: list[CheckOutcome] = []
    for stage in sorted(run_ids):
        if stage == "verify" or stage == "rebuild":
            outcomes += check_outcomes(instance, run_ids[stage])
    verify = [o for o in outcomes if o.run_id == run_ids.get("verify")]
    verified = bool(verify) and all(o.passed for o in outcomes)
    incident = next((i for i in records.incidents(instance, [dg.AssetKey(cs.target_asset)]) if i.id == cs.incident_id), None)
    before = _slice_rows(s.model_dump() for s in incident.slices) if incident else {}
    after: dict[str, dict] = {}
    for o in verify:
        if "dw/slices_json" in o.metadata:
            after.update(_slice_rows(o.metadata["dw/slices_json"]))
    diag = next((d for d in records.diagnoses(instance, [dg.AssetKey(cs.target_asset)]) if d.id == cs.diagnosis_id), None)
    primary = diag.primary if diag else None
    touched = [cs.target_asset] + [k for k in cs.rebuild_assets if k != cs.target_asset]
    out_receipts, events = [], []
    for asset in touched:
        prev = records.receipts(instance, dg.AssetKey(asset))
        r = Receipt(
            id=f"rc-{uuid.uuid4().hex[:12]}",
            asset_key=asset,
            change_set_id=cs.id,
            change_set_version=cs.version,
            incident_id=cs.incident_id,
            cause_kind=cs.cause_kind,
            cause_summary=primary.summary if primary else cs.summary,
            evidence_summary={"explained_rows": primary.explained_rows, "unexplained_rows": primary.unexplained_rows,
                              "confidence": primary.confidence, **{k: v for k, v in primary.details.items() if not isinstance(v, list)}}
            if primary else {},
            diff=cs.diff,
            approver=approval.approver,
            approved_at=approval.decided_at,
            signature_valid=signature_valid(approval),
            partitions=cs.window if asset == cs.target_asset else [],
            run_ids=run_ids,
            rows_before=before if asset == cs.target_asset else {},
            rows_after=after if asset == cs.target_asset else {},
            checks=[o for o in outcomes if o.asset_key == asset],
            verified=verified,
            undo=cs.undo,
            created_at=utcnow(),
            previous_hash=prev[0].content_hash() if prev else None,
        )
        out_receipts.append(r)
        events.append(receipt_observation(r, f"receipt {r.id} for change set {cs.id} ({'verified' if verified else 'NOT verified'})"))
    return out_receipts, events


def receipt_observation(r: Receipt, description: str) -> dg.AssetObservation:
    """The observation that stores one receipt: JSON, markdown, hash and the hash's signature."""
    return dg.AssetObservation(
        asset_key=dg.AssetKey(r.asset_key), description=description,
        metadata={c.RECEIPT_KEY: dg.MetadataValue.json(r.model_dump(mode="json")),
                  c.RECEIPT_MD_KEY: dg.MetadataValue.md(receipt_markdown(r)),
                  c.RECEIPT_HASH_KEY: r.content_hash(),
                  RECEIPT_SIG_KEY: sign_hash(r.content_hash()),
                  c.CHANGE_SET_ID_KEY: r.change_set_id})


def log_receipts(context: dg.OpExecutionContext, receipts: list[Receipt], events: list[dg.AssetObservation]) -> None:
    """Log the receipt observations and anchor them in the run's ``dw/receipts`` tag (signed), so a
    removed newest receipt is still noticed by :func:`~dw_dagster.remediation.receipt_chain.verify_receipts`."""
    for e in events:
        context.log_event(e)
    context.instance.add_run_tags(context.run_id, {RECEIPTS_TAG: anchor_tag(
        [{"asset": dg.AssetKey(r.asset_key).to_user_string(), "id": r.id, "hash": r.content_hash()} for r in receipts])})


@dg.op(name="dw_write_receipts", tags={"kind": "dw"})
def write_receipts_op(context: dg.OpExecutionContext, config: ReceiptConfig) -> None:
    """Write the receipts of a finished repair (fails when the change set has no valid approval)."""
    cs, approval = approved_change_set(context.instance, config.change_set_id, "no receipt without one")
    receipts, events = write_receipts(context.instance, cs, approval)
    log_receipts(context, receipts, events)
    context.log.info(f"Wrote {len(receipts)} receipts for change set {cs.id}: verified={receipts[0].verified}")


@dg.job(name=RECEIPT_JOB_NAME, tags={"dw/kind": "receipt"}, description="Write dw_dagster receipts on every asset a repair touched.")
def receipt_job():
    write_receipts_op()


def build_receipt_job() -> dg.JobDefinition:
    """The receipt job (one op, config: ``change_set_id``)."""
    return receipt_job
