"""Receipts: what changed on each touched asset, by whose approval, how it was proven, what happened.

The receipt job runs last in a repair, and also when a repair ends otherwise: after a failed or
vanished stage (``receipt``) and when the decision stopped counting mid-way (``receipt-halt``), so
a repair that changed data always ends with a receipt saying what happened (``outcome``). For
every asset the change set touched (the repaired asset and every rebuilt one) it writes an
``AssetObservation`` with ``dw/receipt`` (JSON), ``dw/receipt_md`` (markdown for the UI),
``dw/receipt_hash`` (SHA-256 of both) and ``dw/receipt_sig`` (HMAC of the hash). Each receipt
carries the hash of the previous receipt on the same asset; the chain's head and every link are
appended to the ledger by compare-and-set, so a removed receipt (or a deleted receipt run) is
named by :func:`~dw_dagster.receipts.chain.verify_receipts`.

Everything a receipt says about the stages comes from the ledger (which run held each stage and
how it ended), never from run tags.
"""


import json
import uuid
from collections.abc import Iterable

import dagster as dg
from dagster import DagsterEventType
from pydantic import Field

from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.core.ledger import CLOSED, OPEN_INCIDENT_STATES, QUARANTINED, REDIAGNOSE, SUCCEEDED, asset_str, ledger_for
from dw_dagster.core.models import Approval, ChangeSet, CheckOutcome, Receipt, utcnow
from dw_dagster.core import records
from dw_dagster.core.signing import signature_valid
from dw_dagster.receipts.chain import RECEIPT_SIG_KEY, sign_hash
from dw_dagster.cost.receipt import cost_line, repair_cost, saving_line
from dw_dagster.dagster_private import public

RECEIPT_JOB_NAME = c.RECEIPT_JOB


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
    title = "verified" if r.verified else "NOT verified"
    lines = [
        f"### Receipt {r.id} - {'wave sign-off' if r.kind == 'wave_sign_off' else 'change set'} {r.change_set_id} ({title})",
        f"- **Outcome**: {r.outcome}",
        f"- **Cause** ({r.cause_kind}): {r.cause_summary}",
        f"- **Approved by** {r.approver_identity or r.approver} at {r.approved_at.isoformat()} "
        f"(signature {'valid' if r.signature_valid else 'INVALID'})",
        f"- **Partitions**: {', '.join(r.partitions) or 'none (rebuilt whole, not partitioned)'}",
        "- **Runs**: " + (", ".join(f"{k} `{v}`" for k, v in r.run_ids.items()) or "none"),
    ]
    lines += _undo_lines(r)
    failure = r.evidence_summary.get("failure")
    if failure and failure.get("run_id"):
        lines.append(f"- **Failed run**: [{failure['run_id'][:8]}]({failure.get('run_url') or failure['run_id']}) "
                     f"(stage {failure.get('stage')}, {failure.get('error_class')})")
    not_run = r.partitions_not_run()
    if not_run:
        lines.append(f"- **Not run** ({sum(n.rows for n in not_run)} row(s) of the cause): "
                     + "; ".join(n.words() for n in not_run))
    cost = cost_line(r.evidence_summary.get(c.REPAIR_COST_KEY) or {})
    if cost:
        lines.append(cost)
    lines += [saving_line(o) for o in r.checks if c.SAVING_MEASURED_KEY in o.metadata]
    added = r.evidence_summary.get(c.RECEIPT_NEW_TESTS) or []
    if added:
        lines.append("- **New tests** (added by the fix, run in the verify stage): " + ", ".join(
            f"`{t['test']}` {'passed' if t.get('passed') else 'FAILED' if 'passed' in t else 'did not run'}" for t in added))
    parked = r.evidence_summary.get("parked_rows_by_state") or {}
    if parked:
        lines.append("- **Parked rows**: " + ", ".join(f"{n:,} {st}" for st, n in parked.items()))
    if not r.verified:
        failed = [f"{'/'.join(o.asset_key)}:{o.check_name}" for o in r.checks if not o.passed]
        why = (f"check(s) {', '.join(failed)} did not pass in the verify run (every check on a touched asset must)"
               if failed else r.outcome if r.outcome != "applied" else "no check of the change set ran in the verify run")
        undo = r.evidence_summary.get("undo")
        if undo is not None:  # an undo is held to what it promised, not to the checks
            why = r.outcome if r.outcome != "applied" else (undo.get("why") or "the restore does not match the snapshot")
        lines.insert(2, f"- **Not verified because**: {why}")
    if r.change_set_stages:
        lines.append("- **Stages**: " + ", ".join(f"{k} {v}" for k, v in r.change_set_stages.items()))
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


def _undo_lines(r: Receipt) -> list[str]:
    """The undo's promise and the versions' story, as receipt markdown lines (none for other receipts)."""
    out = []
    undo = r.evidence_summary.get("undo")
    if undo:
        parts = undo.get("partitions") or {}
        same = sum(1 for p in parts.values() if p.get("matches"))
        out.append(f"- **Undo checked against the snapshot**: {same} of {len(parts)} partition(s) hold the rows and checksum "
                   f"kept before {undo.get('of_change_set')} ({undo.get('restored_rows')} of {undo.get('kept_rows')} rows)"
                   + (f"; {undo['why']}" if undo.get("why") else ""))
        taken = undo.get("taken_back") or {}
        if taken:
            out.append(f"- **Rows taken back**: {taken.get('rows', 0)} (kept in `{taken.get('table')}`), per partition: "
                       + (", ".join(f"{k} {v}" for k, v in (taken.get("per_partition") or {}).items()) or "none"))
    versions = r.evidence_summary.get("versions")
    if versions:
        out.append("- **Versions**: " + "; ".join(
            f"{v['version'][:12]}… {v.get('state')}" + (f" ({v['note'][:160]})" if v.get("note") else "")
            + f", diff {v.get('diff')}" for v in versions))
    return out


def receipt_hash(r: Receipt) -> str:
    """The hash stored as ``dw/receipt_hash``: the receipt's JSON and its markdown together."""
    return r.content_hash(receipt_markdown(r))


class ReceiptConfig(dg.Config):
    change_set_id: str = Field(description="the change set whose repair ended")


def _failure(instance: dg.DagsterInstance, stages: dict) -> dict | None:
    """The first failed stage's error, read from its run's failure events (:func:`dw_dagster.core.states.run_error`),
    with the stage's name; the ledger's reason when the run recorded none (a refused or vanished run)."""
    from dw_dagster.core.states import run_error

    bad = [n for n, s in stages.items() if not n.startswith("receipt") and s.state != SUCCEEDED]
    if not bad:
        return None
    st = stages[bad[0]]
    found = run_error(instance, st.run_id)
    if found is not None:
        found["from_run"] = True
    else:
        why = (st.result or {}).get("reason") or f"the stage ended {st.state}"
        found = {"error_class": "StageFailed" if st.state == "failed" else st.state.capitalize(), "message": str(why)[:500],
                 "causes": [], "run_id": st.run_id, "from_run": False}
    return {"stage": bad[0], "state": st.state, **found}


def _undo_evidence(instance: dg.DagsterInstance, cs: ChangeSet, stages: dict) -> dict | None:
    """For an undo change set, what it promised against what it did: its restore's rows and checksums per
    partition against the snapshot the undone change set kept (:func:`dw_dagster.repair.undo.undo_promise`),
    the rows it took back, and whether its steps (a migration's rollback, a replay's deletion) ran; None
    for any other change set."""
    from dw_dagster.repair.undo import recorded_snapshot, undo_promise

    of = cs.undo_plan.of_change_set if cs.undo_plan is not None else None
    if cs.cause_kind != "undo" and not of:
        return None
    out: dict = {"of_change_set": of or cs.id.split("-undo")[0], "verified": True}
    restore = stages.get("restore")
    if of:
        snap = recorded_snapshot(instance, of)
        res = (restore.result or {}) if restore is not None and restore.state == SUCCEEDED else {}
        if snap is None or not res:
            return {**out, "verified": False, "why": "no snapshot to compare with" if snap is None else "the restore did not succeed"}
        promise = undo_promise(snap, res)
        out.update(promise, taken_back=res.get("taken_back") or {}, snapshot_table=snap.get("snapshot_table"))
        if promise["mismatched"]:
            out["why"] = f"partitions {', '.join(promise['mismatched'])} differ from the snapshot"
    steps = [n for n in stages if n not in ("restore", "verify", "rebuild") and not n.startswith(("receipt", "window-"))]
    not_done = [n for n in steps if stages[n].state != SUCCEEDED]
    if not_done:
        out.update(verified=False, why=f"step(s) {', '.join(not_done)} did not succeed")
    return out


def _versions(instance: dg.DagsterInstance, cs: ChangeSet) -> list[dict]:
    """What changed across the versions of ``cs``: each earlier version (its state, what happened, its diff)
    and this one."""
    this = {"version": cs.version, "state": "this receipt",
            "diff": f"merged with version {cs.diff_merged_in[:12]}…" if cs.diff_merged_in else
            ("none" if not cs.diff.strip() else f"{len(cs.diff.splitlines())} lines")}
    return [*cs.earlier_versions, this]


def _outcome(stage: str, stages: dict, halted_reason: str, cs: ChangeSet | None = None,
             failure: dict | None = None) -> str:
    from dw_dagster.core.states import error_words
    from dw_dagster.repair.liveness import finish_or_undo, stale_assets

    ended = {n: s.state for n, s in stages.items() if not n.startswith("receipt")}
    bad = [n for n, s in ended.items() if s not in (SUCCEEDED,)]
    done = [n for n, s in ended.items() if s == SUCCEEDED]
    if stage == "receipt-halt":
        return (f"halted after {', '.join(done) or 'no stage'}: {halted_reason or 'the decision no longer counts'}; "
                "the remaining stages did not run (a listed approver may approve to continue, or undo)")
    if bad:
        st = stages[bad[0]]
        why = (st.result or {}).get("reason") or (st.result or {}).get("reconciled") or ""
        if failure is not None and failure.get("stage") == bad[0] and failure.get("from_run"):
            run = f" (run {failure['run_id']})" if failure.get("run_id") else ""
            said = f"failed at {bad[0]}: {error_words(failure)}{run}; ran: {', '.join(done) or 'nothing'}"
        else:
            said = f"failed at {bad[0]} ({st.state}{': ' + why if why else ''}); ran: {', '.join(done) or 'nothing'}"
        if cs is None:
            return said
        return f"{said}; {finish_or_undo(cs.id, stale_assets(cs.target_asset, cs.rebuild_assets, stages), bad[0])}"
    return "applied"


def write_receipts(instance: dg.DagsterInstance, cs: ChangeSet, approval: Approval, *, stage: str = "receipt",
                   halted_reason: str = "", run_id: str | None = None,
                   cost=None) -> tuple[list[Receipt], list[dg.AssetObservation]]:
    """Build one receipt per touched asset from the ledger's stages and the runs that held them,
    chain each on its asset's ledger head, and return them with their observations (to log).

    Every receipt says what the repair cost (``evidence_summary["repair_cost"]``,
    :func:`dw_dagster.cost.receipt.repair_cost`): its runs' seconds, and with ``cost`` (a
    :class:`~dw_dagster.cost.sources.CostResource` on the warehouse) the queries they issued, by tag."""
    led = ledger_for(instance)
    stages = {n: s for n, s in led.stages(cs.id, cs.version).items() if not n.startswith("receipt")}
    run_ids = {n: s.run_id for n, s in stages.items() if s.run_id}
    outcomes: list[CheckOutcome] = []
    for name in ("rebuild", "verify"):
        st = stages.get(name)
        if st is not None and st.state == SUCCEEDED and st.run_id:
            outcomes += check_outcomes(instance, st.run_id)
    verify_run = run_ids.get("verify") if stages.get("verify") and stages["verify"].state == SUCCEEDED else None
    verify = [o for o in outcomes if o.run_id == verify_run]
    failure = _failure(instance, stages) if stage != "receipt-halt" else None
    outcome = _outcome(stage, stages, halted_reason, cs, failure)
    # what the window runs really materialized (from their events, not from the change set), and
    # whether every check the change set names ran in the verify run
    windows = [st.run_id for n, st in sorted(stages.items()) if n.startswith("window-") and st.run_id]
    materialized = sorted({e.dagster_event.partition for rid in windows
                           for e in instance.all_logs(rid, of_type=DagsterEventType.ASSET_MATERIALIZATION)
                           if e.dagster_event.asset_key == dg.AssetKey(cs.target_asset) and e.dagster_event.partition})
    ran = {(*o.asset_key, o.check_name) for o in verify}
    not_run = [k for k in cs.verify_checks if tuple(k) not in ran]
    if outcome == "applied" and windows and materialized != sorted(cs.window):
        outcome = (f"applied, but the window runs materialized {', '.join(materialized) or 'nothing'} instead of "
                   f"{', '.join(cs.window)}")
    if outcome == "applied" and not_run:
        outcome = f"applied, but the verify run did not run {', '.join('/'.join(k) for k in not_run)}"
    sign_off = cs.cause_kind == c.WAVE_SIGN_OFF
    if sign_off:  # a wave's sign-off is proven by the wave's own parity checks, not by the location's others
        wanted = {tuple(k) for k in cs.verify_checks}
        outcomes = [o for o in outcomes if (*o.asset_key, o.check_name) in wanted]
        verify = [o for o in verify if (*o.asset_key, o.check_name) in wanted]
    undo = _undo_evidence(instance, cs, stages)
    if undo is not None:  # an undo is proven by what it promised (the snapshot's rows), not by the checks passing
        verified = outcome == "applied" and undo["verified"]
    else:
        verified = outcome == "applied" and bool(verify) and all(o.passed for o in outcomes)
    incident = next((i for i in records.incidents(instance, [dg.AssetKey(cs.target_asset)]) if i.id == cs.incident_id), None)
    before = _slice_rows(s.model_dump() for s in incident.slices) if incident else {}
    after: dict[str, dict] = {}
    for o in verify:
        if c.SLICES_JSON_KEY in o.metadata:
            after.update(_slice_rows(o.metadata[c.SLICES_JSON_KEY]))
    diag = next((d for d in records.diagnoses(instance, [dg.AssetKey(cs.target_asset)]) if d.id == cs.diagnosis_id), None)
    primary = diag.primary if diag else None
    touched = [cs.target_asset] + [k for k in cs.rebuild_assets if k != cs.target_asset]
    for step in cs.steps:  # a sign-off's receipt goes on every asset of its wave
        touched += [list(a) for a in step.spec.get("receipt_assets", []) if list(a) not in touched]
    # the partitions the cause reached that the change set did not run (outside, deferred), with their rows
    not_run_notes = cs.not_run()
    # parked rows of a dead-letter replay, per recorded state (replayed, superseded, duplicate, ...)
    parked: dict[str, int] = {}
    if cs.steps:
        from dw_dagster.changes.steps import step_results

        for res in step_results(instance, cs):
            for state, n in (res.get("states") or {}).items():
                parked[state] = parked.get(state, 0) + int(n)
    if parked:
        not_run_summary_extra = {"parked_rows_by_state": parked}
    else:
        not_run_summary_extra = {}
    not_run_summary = ({"partitions_not_run": [n.model_dump(mode="json") for n in not_run_notes],
                        "rows_not_run": sum(n.rows for n in not_run_notes),
                        "expected_recovered_rows": cs.expected_recovered_rows} if not_run_notes else {})
    not_run_summary = {**not_run_summary, **not_run_summary_extra, c.REPAIR_COST_KEY: repair_cost(instance, run_ids, cost),
                       **({"failure": failure} if failure else {}), **({"undo": undo} if undo is not None else {}),
                       **({"versions": _versions(instance, cs)} if cs.earlier_versions or cs.diff_merged_in else {})}
    if cs.new_tests:  # the tests the fix added, as the verify run ran them (named even when they did not run)
        ran_tests = {t["test"]: t for o in verify if o.check_name == c.NEW_TESTS_CHECK
                     for t in o.metadata.get(c.NEW_TESTS_KEY) or []}
        # a dbt test the fix added runs as the dbt asset check of its name (in the rebuild or the verify run)
        by_check = {o.check_name: o for o in outcomes}
        not_run_summary[c.RECEIPT_NEW_TESTS] = [
            ran_tests.get(t) or ({"test": t, "passed": by_check[stem].passed,
                                  "check": f"{'/'.join(by_check[stem].asset_key)}:{stem}"}
                                 if (stem := t.rsplit("/", 1)[-1].removesuffix(".sql")) in by_check else {"test": t})
            for t in cs.new_tests]
    out_receipts, events = [], []
    for asset in touched:
        for _ in range(20):  # compare-and-set on the asset's chain head; another writer may move it first
            head = led.receipt_head(asset_str(asset))
            r = Receipt(
                id=f"rc-{uuid.uuid4().hex[:12]}", asset_key=asset, change_set_id=cs.id, change_set_version=cs.version,
                incident_id=cs.incident_id, cause_kind=cs.cause_kind,
                cause_summary=primary.summary if primary else cs.summary,
                evidence_summary=({"explained_rows": primary.explained_rows, "unexplained_rows": primary.unexplained_rows,
                                  "confidence": primary.confidence,
                                  **{k: v for k, v in primary.details.items() if not isinstance(v, list)}} if primary else {})
                | not_run_summary,
                diff=cs.diff, approver=approval.approver, approved_at=approval.decided_at,
                signature_valid=signature_valid(approval),
                partitions=(materialized if windows else cs.window) if asset == cs.target_asset else [],
                run_ids=run_ids, rows_before=before if asset == cs.target_asset else {},
                rows_after=after if asset == cs.target_asset else {}, checks=[o for o in outcomes if o.asset_key == asset],
                verified=verified, undo=cs.undo, created_at=utcnow(), previous_hash=head[1] if head else None,
                outcome=outcome, approver_identity=approval.identity.describe() if approval.identity else approval.approver,
                change_set_stages={n: s.state for n, s in stages.items()},
                kind=c.WAVE_SIGN_OFF if sign_off else c.RECEIPT_KIND_REPAIR)
            h = receipt_hash(r)
            if led.append_receipt(asset_key=asset_str(asset), expected_head=head, receipt_id=r.id, hash=h,
                                  previous_hash=r.previous_hash, change_set_id=cs.id, run_id=run_id):
                break
        else:
            raise dg.Failure(description=f"the receipt chain of {'/'.join(asset)} kept moving; try again")
        out_receipts.append(r)
        events.append(receipt_observation(r, f"receipt {r.id} for change set {cs.id}: {outcome} "
                                             f"({'verified' if verified else 'NOT verified'})"))
    return out_receipts, events


def receipt_observation(r: Receipt, description: str) -> dg.AssetObservation:
    """The observation that stores one receipt: JSON, markdown, hash and the hash's signature."""
    md = receipt_markdown(r)
    h = r.content_hash(md)
    return dg.AssetObservation(
        asset_key=dg.AssetKey(r.asset_key), description=describe(description, change_set_id=r.change_set_id),
        metadata={c.RECEIPT_KEY: dg.MetadataValue.json(r.model_dump(mode="json")),
                  c.RECEIPT_MD_KEY: dg.MetadataValue.md(md),
                  c.RECEIPT_HASH_KEY: h,
                  RECEIPT_SIG_KEY: sign_hash(h),
                  c.CHANGE_SET_ID_KEY: r.change_set_id})


def close_incident(instance: dg.DagsterInstance, incident_id: str, by: str, reason: str) -> bool:
    """Close an incident in the ledger; incidents linked to it become incidents of their own (to be
    diagnosed). True when it was open."""
    led = ledger_for(instance)
    closed = led.set_incident_state(incident_id, CLOSED, from_states=(*OPEN_INCIDENT_STATES, QUARANTINED), note=reason)
    if closed:
        led.audit("incident_closed", incident_id, by, {"reason": reason})
        for linked in led.incidents(linked_to=incident_id):
            led.set_incident_state(linked.incident_id, REDIAGNOSE, linked_to=None,
                                   note=f"its own incident now: {incident_id} closed")
    return closed


def reopen_after_undo(instance: dg.DagsterInstance, cs: ChangeSet, receipt: Receipt) -> bool:
    """After a verified undo the incident is open again (ledger state ``open``, which later failing checks
    attach to and ``dw-dagster incidents rediagnose`` diagnoses again), its note naming the undo, its
    receipt and the rows it took back; an ``incident_reopened`` audit entry by ``dw-dagster``. True when it moved."""
    from dw_dagster.core.ledger import OPEN

    led = ledger_for(instance)
    undo = receipt.evidence_summary.get("undo") or {}
    taken = (undo.get("taken_back") or {}).get("rows", 0)
    note = (f"undone, open again: {cs.id} put back what {undo.get('of_change_set')} changed (receipt {receipt.id}, "
            f"verified against the snapshot; {taken} row(s) taken back)")
    moved = led.set_incident_state(cs.incident_id, OPEN, from_states=(CLOSED, *OPEN_INCIDENT_STATES), note=note)
    if moved:
        led.audit("incident_reopened", cs.incident_id, "dw-dagster",
                  {"reason": note, "undo": cs.id, "receipt": receipt.id, "taken_back": undo.get("taken_back") or {}})
    return moved


_receipt_jobs: dict[str, dg.JobDefinition] = {}


@public
def build_receipt_job(name: str = RECEIPT_JOB_NAME, executor: dg.ExecutorDefinition | None = None,
                      cost=None, bi_refresh=None) -> dg.JobDefinition:
    """The receipt job (one op, config: ``change_set_id``; dispatched by the remediation sensor only).

    Without ``executor`` (the guarded in-process one) and ``cost``, the same object for the same
    name, so it can be passed to the sensor and to ``Definitions``; with one (e.g.
    ``guarded_executor(celery_executor)``) a new job each call. ``cost``: a
    :class:`~dw_dagster.cost.sources.CostResource` whose warehouse the repair's queries ran on (the
    receipt then counts them by tag; without it, the runs' seconds). ``bi_refresh``: returns a
    :class:`~dw_dagster.integrations.bi_refresh.BiClients` (or one Tableau or Lightdash client; a
    context manager); after a verified receipt the BI objects of the diagnosis's blast radius are
    refreshed and recorded, a late or failed one paged and escalated (:func:`record_bi_refresh`)."""
    if executor is not None or cost is not None or bi_refresh is not None:
        return _build_receipt_job(name, executor, cost, bi_refresh)
    if name not in _receipt_jobs:
        _receipt_jobs[name] = _build_receipt_job(name)
    return _receipt_jobs[name]


def bi_escalation_record(cs: ChangeSet, receipt: Receipt, rows: list[dict]) -> dict:
    """The ``dw/bi_escalation`` record of a receipt whose BI refreshes failed or landed late: what the
    notification sensor pages and escalates (:mod:`dw_dagster.integrations.notify_bi`)."""
    return {"receipt_id": receipt.id, "change_set_id": cs.id, "incident_id": cs.incident_id, "domain": cs.domain,
            "target_asset": list(cs.target_asset), "rows": rows}


def write_bi_escalation(instance: dg.DagsterInstance, cs: ChangeSet, receipt: Receipt, rows: list[dict]) -> bool:
    """Record the escalation of ``receipt``'s late or failed refreshes on the target asset, unless one is
    recorded already (a retried receipt run pages nobody twice). True when it was written."""
    key = dg.AssetKey(cs.target_asset)
    for rec in instance.fetch_observations(key, limit=500).records:
        data = records.metadata_json(rec.asset_observation.metadata if rec.asset_observation else {}, c.BI_ESCALATION_KEY)
        if isinstance(data, dict) and data.get("receipt_id") == receipt.id:
            return False
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=key, description=describe(f"BI refreshes after receipt {receipt.id} need a person", change_set_id=cs.id),
        metadata={c.BI_ESCALATION_KEY: dg.MetadataValue.json(bi_escalation_record(cs, receipt, rows)),
                  c.CHANGE_SET_ID_KEY: cs.id, c.RECEIPT_ID_KEY: receipt.id}))
    return True


def record_bi_refresh(context: dg.OpExecutionContext, cs: ChangeSet, receipt: Receipt, approval: Approval,
                      client_factory) -> list:
    """Refresh the BI objects of the repair's blast radius after a verified ``receipt`` and record them
    as ``dw/bi_refreshed`` on the target asset (``[{exposure, tool, refreshed_at, deadline,
    before_deadline, error}]``); a refresh that failed or landed after its deadline is logged as an
    error, marked ``escalate`` and recorded once as ``dw/bi_escalation`` (:func:`write_bi_escalation`),
    which the notification sensor pages and escalates. ``client_factory`` returns a
    :class:`~dw_dagster.integrations.bi_refresh.BiClients` (or one Tableau or Lightdash client).
    Returns the results (empty unless verified)."""
    from dw_dagster.integrations.bi_refresh import BiClients, refresh_dashboards

    if not receipt.verified:
        return []
    diag = next((d for d in records.diagnoses(context.instance, [dg.AssetKey(cs.target_asset)]) if d.id == cs.diagnosis_id), None)
    exposures = [e for e in (diag.blast_radius.exposures if diag else []) if e.bi]
    if not exposures:
        return []
    try:
        with BiClients.of(client_factory()) as clients:
            results = refresh_dashboards(receipt, exposures, tableau=clients.tableau, lightdash=clients.lightdash,
                                         repair_started=approval.decided_at)
    except Exception as e:  # noqa: BLE001 - the BI tool unreachable: every refresh escalates, the receipt stands
        results = refresh_dashboards(receipt, exposures, repair_started=approval.decided_at)
        for r in results:
            r.error = f"{type(e).__name__}: {str(e)[:300]}"
    rows = [{**r.model_dump(mode="json"), "escalate": r.escalate} for r in results]
    for r in results:
        if r.escalate:
            context.log.error(f"BI refresh of {r.exposure} needs a person: "
                              + (r.error or f"it landed at {r.refreshed_at} after its deadline {r.deadline}"))
    context.log_event(dg.AssetObservation(
        asset_key=dg.AssetKey(cs.target_asset),
        description=describe(f"BI refresh after receipt {receipt.id}: {sum(1 for r in results if not r.escalate)} of "
                             f"{len(results)} refreshed before their deadline", change_set_id=cs.id),
        metadata={c.BI_REFRESHED_KEY: dg.MetadataValue.json(rows), c.CHANGE_SET_ID_KEY: cs.id,
                  c.RECEIPT_ID_KEY: receipt.id}))
    if any(r.escalate for r in results):
        write_bi_escalation(context.instance, cs, receipt, rows)
    return results


def _build_receipt_job(name: str, executor: dg.ExecutorDefinition | None = None, cost=None,
                       bi_refresh=None) -> dg.JobDefinition:
    from dw_dagster.guard.admission import guarded_executor, hold_stage

    @dg.op(name=c.RECEIPT_OP, tags={"kind": "dw"})
    def write_receipts_op(context: dg.OpExecutionContext, config: ReceiptConfig) -> None:
        """Write the receipts of a repair that ended (fails without the ticket the sensor issued)."""
        held = hold_stage(context, expect=["receipt", "receipt-halt"], change_set_id=config.change_set_id)
        cs = held.change_set
        row = ledger_for(context.instance).change_set_row(cs.id, cs.version)
        halted = ""
        if held.stage == "receipt-halt":
            d = ledger_for(context.instance).decision(held.approval.id)
            halted = (d or {}).get("withdrawn_reason") or row.note
        receipts, events = write_receipts(context.instance, cs, held.approval, stage=held.stage, halted_reason=halted,
                                          run_id=context.run_id, cost=cost)
        for e in events:
            context.log_event(e)
        held.complete(context.instance, context.run_id, success=True,
                      result={"receipts": [r.id for r in receipts], "outcome": receipts[0].outcome,
                              "verified": receipts[0].verified})
        if receipts[0].verified and "undo" in receipts[0].evidence_summary:
            reopen_after_undo(context.instance, cs, receipts[0])
        elif receipts[0].verified:
            close_incident(context.instance, cs.incident_id, "dw-dagster", f"verified receipt {receipts[0].id}")
            if bi_refresh is not None:
                record_bi_refresh(context, cs, receipts[0], held.approval, bi_refresh)
        context.log.info(f"Wrote {len(receipts)} receipts for change set {cs.id}: {receipts[0].outcome}, "
                         f"verified={receipts[0].verified}")

    @dg.job(name=name, tags={c.KIND_KEY: c.RECEIPT_KIND}, executor_def=executor or guarded_executor(dg.in_process_executor),
            description="Write dw_dagster receipts on every asset a repair touched.")
    def receipt_job():
        write_receipts_op()

    return receipt_job


receipt_job = build_receipt_job()
