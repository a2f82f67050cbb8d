"""The completion gate: a wave's sign-off goes to its owner through the approval path change sets take.

When every pair of a wave has held for the rule's consecutive evaluations, the gate proposes a
**sign-off change set** (id ``so-<migration>-<wave>``; class ``wave_sign_off``) on the wave's asset.
It changes no data: its one step records the sign-off, and its content — hence its version, which
an approval signs and an ID token's nonce binds — holds the evidence (every holding evaluation's
storage id, values and SQL hash) and its hash. So the sign-off is decided exactly like a repair: a
verified person listed for the wave's domain now (OIDC ID token, Slack buttons, the review page),
never the proposer, before the expiry, once; the escalation of an unanswered request applies to it
as to any change set, and no domain's autonomy ever grants it (the class is never allowed unasked).

- new evidence with other numbers supersedes the request (a new version: a decision or token for
  the old one is refused); a pair that stops holding withdraws it (superseded, never granted);
- once approved, the remediation sensor runs its stages: the ``wave_sign_off`` step re-reads the
  wave and refuses when the evidence changed since the request, else records the sign-off; the
  verify stage runs the checks; the receipt stage writes a ``wave_sign_off`` receipt on the wave's
  asset and every target asset, in their receipt chains;
- a parity failure on a signed-off wave reopens it: the gate's ledger entry moves the sign-off to
  its history, the wave asset shows ``reopened`` with the cause, the failing check opens an incident
  (the incident sensor watches the parity checks) and a new sign-off is needed.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import dagster as dg

from dw_dagster.core import keys as k
from dw_dagster.core.domains import DomainsSource, resolve_domains
from dw_dagster.core.ledger import APPROVED, PROPOSED, RUNNING, SUPERSEDED, ledger_for
from dw_dagster.core.models import ChangeSet, ChangeStep, utcnow
from dw_dagster.migration.checks import wave_check_keys
from dw_dagster.migration.config import MigrationConfig, WaveConfig, wave_asset_key
from dw_dagster.migration.state import WaveState, evidence_values_key, gate_record, read_wave_state, save_gate_record


def sign_off_id(migration: str, wave: str) -> str:
    return f"{k.SIGN_OFF_ID_PREFIX}{migration}-{wave}"


def sign_off_change_set(migration: MigrationConfig, wave: WaveConfig, ws: WaveState, domains: DomainsSource,
                        *, resource_key: str, now: dt.datetime | None = None) -> ChangeSet:
    """The sign-off proposal of a wave whose gate is open (see the module docstring).

    Raises:
        KeyError: the wave's domain is not in the domains file.
    """
    now = now or utcnow()
    domain = resolve_domains(domains).get(wave.domain)
    wave_key = wave_asset_key(migration.name, wave.name)
    targets = [dg.AssetKey.from_user_string(p.target.asset).path for p in wave.pairs]
    rule = ws.rule
    evidence = [{"pair": p.pair, "target": p.target, "evaluations": p.evidence} for p in ws.pairs]
    round_ = int(ws.gate.get("round", 0))
    summary = (f"Sign off wave {wave.name} of migration {migration.name}: all {len(ws.pairs)} table pairs held "
               f"{', '.join(rule.require)} parity for {rule.consecutive} consecutive evaluations "
               f"(evidence {ws.evidence_hash[:12]}…{', after a reopening' if ws.gate.get('reopened') else ''}).")
    step = ChangeStep(kind=k.WAVE_SIGN_OFF, change_class=k.WAVE_SIGN_OFF, resource_key=resource_key,
                      summary=f"record the sign-off of {migration.name}/{wave.name} on evidence {ws.evidence_hash}",
                      spec={"migration": migration.name, "wave": wave.name, "round": round_,
                            "evidence_hash": ws.evidence_hash, "values_key": evidence_values_key(ws.pairs),
                            "evidence": evidence, "receipt_assets": [list(wave_key.path), *map(list, targets)]})
    return ChangeSet.seal(
        id=sign_off_id(migration.name, wave.name), incident_id=f"signoff:{migration.name}/{wave.name}",
        diagnosis_id=f"evidence:{ws.evidence_hash}", domain=domain.name, proposer=k.PROPOSER, created_at=now,
        expires_at=now + dt.timedelta(hours=domain.approval_expiry_hours), approvers=list(domain.approvers),
        cause_kind=k.WAVE_SIGN_OFF, summary=summary, target_asset=list(wave_key.path), window=[], diff="", files=[],
        rebuild_assets=[], new_tests=[],
        verify_checks=[[*key.asset_key.path, key.name] for key in wave_check_keys(wave)],
        expected_recovered_rows=0, change_classes=[k.WAVE_SIGN_OFF],
        undo=("a sign-off changes no data; a later parity failure reopens the wave and a new sign-off is needed"),
        steps=[step])


def _observation(wave_key: dg.AssetKey, text: str, data: dict | None = None) -> dg.AssetObservation:
    md: dict[str, Any] = {k.SUMMARY_KEY: text[:1000]}
    if data is not None:
        md[k.MIGRATION_REOPENED_KEY] = dg.MetadataValue.json(data)
    return dg.AssetObservation(asset_key=wave_key, description=text[:1000], metadata=md)


def gate_step(instance: dg.DagsterInstance, migration: MigrationConfig, wave: WaveConfig, ws: WaveState,
              domains: DomainsSource, *, resource_key: str, run_id: str | None = None) -> list[dg.AssetObservation]:
    """Move the wave's gate after an evaluation (reopen, request, withdraw); returns the events to log."""
    from dw_dagster.proposals.change_sets import change_set_observation, record_proposal

    rec, led = dict(ws.gate), ledger_for(instance)
    wave_key = wave_asset_key(migration.name, wave.name)
    events: list[dg.AssetObservation] = []
    now = utcnow()
    if rec.get("signed_off"):
        bad = [p for p in ws.pairs if p.failing or not p.latest or p.state.startswith(("failing", "not_loaded"))]
        if bad:
            p = bad[0]
            kind = (p.failing or ["not evaluated"])[0]
            why = p.latest[kind].description if kind in p.latest else "no evaluation in the newest run"
            reopened = {"at": now.isoformat(), "run_id": run_id, "round": int(rec.get("round", 0)) + 1,
                        "cause": f"{p.pair}: {kind}: {why}"[:500], "pairs": [x.pair for x in bad],
                        "kind": kind, "signed_off": rec["signed_off"]}
            rec["history"] = [*rec.get("history", []), {**rec["signed_off"], "reopened_at": now.isoformat(),
                                                          "reopened_cause": reopened["cause"]}]
            rec.update(signed_off=None, reopened=reopened, requested=None, round=reopened["round"])
            save_gate_record(instance, migration.name, wave.name, rec)
            events.append(_observation(wave_key, f"wave {wave.name} of {migration.name} REOPENED: {reopened['cause']}; "
                                                 "a new sign-off is needed", reopened))
        return events
    pending = rec.get("requested")
    row = led.change_set_row(pending["change_set_id"], pending["version"]) if pending else None
    if ws.gate_open:
        values = evidence_values_key(ws.pairs)
        if row is not None and row.state in (PROPOSED, APPROVED, RUNNING) and pending.get("values_key") == values:
            return events  # the request stands: the same numbers keep holding
        if row is not None and row.state in (APPROVED, RUNNING):
            return events  # approved: its step checks the evidence itself
        cs = sign_off_change_set(migration, wave, ws, domains, resource_key=resource_key, now=now)
        cs, new = record_proposal(led, cs)
        rec["requested"] = {"change_set_id": cs.id, "version": cs.version, "evidence_hash": ws.evidence_hash,
                            "values_key": values, "at": now.isoformat(), "run_id": run_id}
        save_gate_record(instance, migration.name, wave.name, rec)
        if new:
            events.append(change_set_observation(cs))
        return events
    if row is not None and row.state == PROPOSED:
        failing = [p.pair for p in ws.pairs if p.streak < ws.rule.consecutive]
        note = f"the evidence no longer holds: {', '.join(failing[:5])} below {ws.rule.consecutive} consecutive holds"
        if led.set_change_set_state(row.change_set_id, row.version, SUPERSEDED, from_states=[PROPOSED], note=note):
            rec["requested"] = None
            save_gate_record(instance, migration.name, wave.name, rec)
            events.append(_observation(wave_key, f"sign-off request {row.change_set_id} withdrawn: {note}"))
    return events


def make_sign_off_runner(migrations: dict[str, MigrationConfig], *, lightup: bool = True):
    """The ``wave_sign_off`` step runner: refuse when the evidence changed since the request, else record it."""
    from dw_dagster.approval.job import active_decision
    from dw_dagster.changes.steps import StepRefused

    def run(context: dg.OpExecutionContext, cs: ChangeSet, step: ChangeStep, db) -> dict:
        spec = step.spec
        migration = migrations.get(spec.get("migration"))
        if migration is None:
            raise StepRefused(f"migration {spec.get('migration')!r} is not configured in this code location")
        wave = migration.wave(spec["wave"])
        ws = read_wave_state(context.instance, migration, wave, lightup=lightup)
        if not ws.gate_open or evidence_values_key(ws.pairs) != spec.get("values_key"):
            held = [p.pair for p in ws.pairs if p.streak < ws.rule.consecutive]
            raise StepRefused(
                f"the evidence changed since the sign-off was requested ({spec['evidence_hash'][:12]}…): "
                + (f"{', '.join(held[:5])} no longer hold" if held else "the compared numbers are different now")
                + "; the gate asks again on the new evidence", {"held": held})
        changed = _recheck(context, migration, wave, spec, lightup)
        if changed:
            raise StepRefused("the evidence changed since the sign-off was requested "
                              f"({spec['evidence_hash'][:12]}…): the pairs read now differ: " + "; ".join(changed[:5])
                              + "; the gate asks again on the next evaluations", {"changed": changed})
        led = ledger_for(context.instance)
        approval = active_decision(led, cs)
        rec = gate_record(context.instance, migration.name, wave.name)
        identity = approval.identity if approval is not None else None
        rec["signed_off"] = {"change_set_id": cs.id, "version": cs.version, "approval_id": approval.id if approval else None,
                             "by": approval.approver if approval else None,
                             "method": identity.method if identity else "unverified",
                             "issuer": getattr(identity, "issuer", None), "at": utcnow().isoformat(),
                             "evidence_hash": spec["evidence_hash"], "round": spec.get("round", 0)}
        rec.update(requested=None, reopened=None)
        save_gate_record(context.instance, migration.name, wave.name, rec)
        from dw_dagster.migration.wave import wave_materialization

        context.log_event(wave_materialization(read_wave_state(context.instance, migration, wave, lightup=lightup)))
        return {"signed_off_by": rec["signed_off"]["by"], "method": rec["signed_off"]["method"],
                "evidence_hash": spec["evidence_hash"], "pairs": len(wave.pairs)}

    return run


def _recheck(context, migration: MigrationConfig, wave: WaveConfig, spec: dict, lightup: bool) -> list[str]:
    """Evaluate the wave's pairs again now (Lightup aside) and name each kind that no longer passes, or
    whose values differ from the newest evaluation in the evidence: data changed since the request."""
    import json

    from dw_dagster.migration.checks import evaluate_pair
    from dw_dagster.migration.parity import _jsonable
    from dw_dagster.migration.state import required_kinds

    changed = []
    evidence = {e["pair"]: (e["evaluations"][0] if e["evaluations"] else {}) for e in spec.get("evidence", [])}
    names = sorted({x for p in wave.pairs for x in (p.source.database, p.target.database)})
    dbs = {name: getattr(context.resources, name).get_database() for name in names}
    try:
        for p in wave.pairs:
            kinds = [kind for kind in required_kinds(p, migration.gate_of(wave), lightup) if kind != k.PARITY_LIGHTUP]
            for r in evaluate_pair(p, kinds, dbs[p.source.database], dbs[p.target.database],
                                   rule=p.key_diff or migration.key_diff):
                seen = evidence.get(p.label, {}).get(r.kind, {}).get("values")
                if not r.passed or json.loads(json.dumps(_jsonable(r.values), default=str)) != seen:
                    changed.append(f"{p.label}: {r.kind}: {r.description}"[:300])
    finally:
        for db in dbs.values():
            if hasattr(db, "dispose"):
                db.dispose()
    return changed


__all__ = ["gate_step", "make_sign_off_runner", "sign_off_change_set", "sign_off_id"]
