"""The grant and revoke jobs: the approved statements run under a ticket, checked on the engine, with a receipt.

Both jobs are repair jobs (``dw/kind: access``): a run without the ticket the access sensor issued
is refused by the run coordinator, the guarded executor and the op itself
(:func:`dw_dagster.guard.admission.hold_stage`), so a run launched by hand from the Launchpad, GraphQL
or ``dagster job execute`` grants nothing, and a ticket is good for one run.

- ``dw_access_grant`` (op ``dw_apply_access_grant``): checks again that the request is what the
  owners approved (its recorded body against the change sets' content), that every domain's
  approval still counts (:func:`all_approved`), and that the grant has not ended; runs the
  statements (one transaction on PostgreSQL) and asks the engine whether the grantee now holds
  every newly reachable privilege. An extension takes over what it re-granted from the grant it
  extends.
- ``dw_access_revoke`` (op ``dw_revoke_access_grant``): runs the rollback, ends the grantee's
  sessions when the request asked for it, and verifies on the engine
  (:func:`dw_dagster.access.engines.verify_revoked`). A revoke that fails or does not verify opens
  an incident (source ``access``) and pages once; the access sensor tries again. A verified revoke
  writes the grant's receipt on ``dw_access`` (chained and signed like every receipt) and closes
  the incident.
"""


import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from dw_dagster.access import engines
from dw_dagster.access.models import AccessError, AccessRequest, EngineDryRun
from dw_dagster.access.request import ACCESS_ASSET_KEY, event
from dw_dagster.approval.job import approval_status, is_autonomous_approval
from dw_dagster.core import keys as c
from dw_dagster.core.domains import Domains, DomainsSource, resolve_domains
from dw_dagster.core.ledger import APPLIED, APPROVED, RUNNING, SUCCEEDED, asset_str, ledger_for
from dw_dagster.core.ledger_access import ACTIVE, GRANT_FAILED, GRANTING, REVOKE_FAILED, REVOKED, REVOKING, SUPERSEDED
from dw_dagster.core.models import Approval, CheckOutcome, Incident, Receipt, utcnow
from dw_dagster.core.records import load_change_set
from dw_dagster.databases import Database, DatabaseError

PAGER_KEY = c.ACCESS_PAGER_KEY


class AccessConfig(dg.Config):
    request_id: str = Field(description="the access request (the access sensor fills it in)")


# -- what an op needs ------------------------------------------------------------------------------

def _same_target(url: str, other: str) -> bool:
    import sqlalchemy as sa

    try:
        a, b = sa.engine.make_url(url), sa.engine.make_url(other)
    except Exception:  # noqa: BLE001 - not a SQLAlchemy URL: compare the text without credentials
        return url.split("@")[-1] == other.split("@")[-1]
    return (a.get_backend_name(), a.host, a.port, a.database, a.username) == (
        b.get_backend_name(), b.host, b.port, b.database, b.username)


def resolve_database(resources: Mapping[str, Any], name: str) -> Database:
    """The database a request names: a resource key of this code location, or a URL one of its
    database resources points at (compared without the password).

    Raises:
        AccessError: no resource of the location is that database.
    """
    if name in resources and hasattr(resources[name], "get_database"):
        return resources[name].get_database()
    for key, res in resources.items():
        url = getattr(res, "url", None)
        if isinstance(url, str) and hasattr(res, "get_database") and _same_target(url, name):
            return res.get_database()
    raise AccessError(f"no database resource of this code location is {name!r} (resources: "
                      f"{', '.join(sorted(k for k, r in resources.items() if hasattr(r, 'get_database')))})")


def close(db: Any) -> None:
    """Give a database's pooled connections back to the server (a code location runs for weeks)."""
    dispose = getattr(db, "dispose", None)
    if callable(dispose):
        dispose()


def redact_url(url: str) -> str:
    """A URL without its password (what a request keeps of a typed URL)."""
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True).replace(":***@", "@")
    except Exception:  # noqa: BLE001
        return url.split("://", 1)[0] + "://" + url.split("@")[-1] if "@" in url else url


def all_approved(instance: dg.DagsterInstance, req: AccessRequest, domains: Domains | None) -> tuple[list[Approval], str | None]:
    """The approval of every domain's change set, checked against the domains as they are now
    (listed, verified, not requester or grantee, signed, in time); ``(approvals, why not)``.

    An autonomous approval counts only for a domain that says ``autonomous_access: non_sensitive``
    and whose part of the grant opens no sensitive column.
    """
    led = ledger_for(instance)
    out = []
    for cs_id in req.change_sets:
        cs = load_change_set(led, cs_id)
        if cs is None:
            return out, f"change set {cs_id} is missing"
        status = approval_status(led, cs, domains)
        if status.approval is None:
            return out, f"{cs.domain}: {status.reason}"
        if is_autonomous_approval(status.approval):
            part = next((d for d in req.dry_run.domains if d.domain == cs.domain), None)
            domain = domains.get(cs.domain) if domains else None
            if domain is None or domain.autonomous_access != "non_sensitive" or part is None or part.sensitive:
                return out, (f"{cs.domain}: an autonomous approval does not count for a grant that opens sensitive "
                             "columns, or in a domain that does not allow autonomous access")
        out.append(status.approval)
    return out, None


def _check_body(instance: dg.DagsterInstance, req: AccessRequest) -> None:
    """Refuse a recorded request that is not what the owners approved (edited in the ledger)."""
    led = ledger_for(instance)
    approved = req.model_dump(mode="json", exclude={"change_sets", "requester_identity"})
    for cs_id in req.change_sets:
        cs = load_change_set(led, cs_id)
        body = dict(cs.steps[0].spec.get("request") or {}) if cs and cs.steps else {}
        body.pop("requester_identity", None)
        if body != approved:
            raise AccessError(f"access request {req.id} as recorded is not what change set {cs_id} approved; "
                              "refused as tampering")


def remaining(run: EngineDryRun, handed: Mapping[str, Any] | None) -> EngineDryRun:
    """``run`` without what an extension took over (``handed``): the revoke leaves those alone."""
    if not handed:
        return run
    st = dict(run.state)

    def keep(key: str) -> list:
        gone = [list(x) if isinstance(x, (list, tuple)) else x for x in handed.get(key, [])]
        return [x for x in st.get(key, []) if x not in gone]

    st.update(added_edges=keep("added_edges"), added_table=keep("added_table"), added_column=keep("added_column"),
              granted_roles=keep("granted_roles"))
    if handed.get("valid_until"):
        st["valid_until"] = None
    rels = st.get("rels") or {}
    gone_t = {(rels.get(str(r)), p) for r, p in handed.get("added_table", [])}
    gone_c = {(rels.get(str(r)), a, p) for r, a, p in handed.get("added_column", [])}
    newly = []
    if not (handed.get("added_edges") or handed.get("granted_roles")) or st.get("added_edges") or st.get("granted_roles"):
        for x in run.newly_reachable:
            if (x.table, x.privilege) in gone_t:
                continue
            cols = [col for col in x.columns if (x.table, col, x.privilege) not in gone_c]
            if cols or x.table_level:
                newly.append(x.model_copy(update={"columns": cols}))
    roles = set(handed.get("granted_roles", []))
    rollback = [s for s in run.rollback if not any(f'"{r}"' in s for r in roles)]
    return run.model_copy(update={"state": st, "newly_reachable": newly, "rollback": rollback})


def nothing_left(run: EngineDryRun) -> bool:
    st = run.state
    return not any(st.get(k) for k in ("added_edges", "added_table", "added_column", "granted_roles", "valid_until"))


def _hand_over(instance: dg.DagsterInstance, req: AccessRequest) -> list[dg.AssetObservation]:
    """An extension was granted: the grant it extends gives up what this one re-granted."""
    if not req.extends:
        return []
    led = ledger_for(instance)
    row = led.access_row(req.extends)
    if row is None or row.state != ACTIVE:
        return []
    old = AccessRequest.model_validate_json(row.body)
    o, n = old.dry_run.engine.state, req.dry_run.engine.state
    handed = {k: [x for x in o.get(k, []) if x in n.get(k, [])]
              for k in ("added_edges", "added_table", "added_column", "granted_roles")}
    handed["valid_until"] = bool(o.get("valid_until") and n.get("valid_until"))
    handed["to"] = req.id
    left = remaining(old.dry_run.engine, handed)
    if nothing_left(left):
        led.move_access(old.id, SUPERSEDED, from_states=[ACTIVE], note=f"extended by {req.id}: it holds the grant now",
                        result={"handed_over": handed})
        _close_change_sets(instance, old)
        return [event(old.id, "superseded", f"access grant {old.id} taken over by its extension {req.id}", handed)]
    led.move_access(old.id, ACTIVE, from_states=[ACTIVE], result={"handed_over": handed})
    return [event(old.id, "handed_over", f"access grant {old.id} handed part of itself to {req.id}", handed)]


def _close_change_sets(instance: dg.DagsterInstance, req: AccessRequest) -> None:
    led = ledger_for(instance)
    for cs_id in req.change_sets:
        row = led.change_set_row(cs_id)
        if row is not None:
            led.set_change_set_state(cs_id, row.version, APPLIED, from_states=[RUNNING, APPROVED])


# -- the grant -------------------------------------------------------------------------------------

def _grant(context: dg.OpExecutionContext, config: AccessConfig, domains: DomainsSource) -> None:
    from dw_dagster.guard.admission import hold_stage

    held = hold_stage(context, expect=["grant"])
    led = ledger_for(context.instance)
    row = led.access_row(config.request_id)
    if row is None or held.change_set.incident_id != row.request_id:
        raise dg.Failure(description=f"the run's ticket is not for access request {config.request_id}")
    req = AccessRequest.model_validate_json(row.body)
    started = utcnow()

    def fail(why: str) -> None:
        led.move_access(req.id, GRANT_FAILED, from_states=[GRANTING], note=why, next_revoke_at=utcnow().timestamp(),
                        result={"grant": {"error": why, "at": utcnow().isoformat(), "run_id": context.run_id}})
        held.complete(context.instance, context.run_id, success=False, result={"reason": why})
        context.log_event(event(req.id, "grant_failed", f"access grant {req.id} failed: {why}", {"reason": why}))
        raise dg.Failure(description=f"access grant {req.id} failed: {why} (what ran of it is revoked)")

    if row.state != GRANTING:
        raise dg.Failure(description=f"access request {req.id} is {row.state}, not being granted")
    try:
        _check_body(context.instance, req)
        approvals, why = all_approved(context.instance, req, resolve_domains(domains))
        if why:
            raise AccessError(f"not every domain's approval counts now: {why}")
        if started >= req.expires_at:
            raise AccessError(f"the grant would have ended at {req.expires_at.isoformat()}")
        db = resolve_database(context.resources.original_resource_dict, req.spec.database)
        try:
            result = engines.apply_grant(db, req.dry_run.engine, req.statements)
        finally:
            close(db)
    except (AccessError, DatabaseError) as e:
        fail(str(e))
        return
    now = utcnow()
    grant = {**result, "at": now.isoformat(), "run_id": context.run_id,
             "approvals": [{"approval_id": a.id, "approver": a.approver, "method": a.method, "decided_at": a.decided_at.isoformat(),
                            "identity": a.identity.describe() if a.identity else a.approver, "change_set_id": a.change_set_id}
                           for a in approvals]}
    led.move_access(req.id, ACTIVE, from_states=[GRANTING], granted_at=now.timestamp(), result={"grant": grant})
    events = _hand_over(context.instance, req)
    held.complete(context.instance, context.run_id, success=True, result={"granted_at": now.isoformat()})
    for e in [*events, event(req.id, "granted", f"access {req.id} granted to {req.spec.grantee_email} until "
                             f"{req.expires_at.isoformat()}", {"statements": req.statements, "checks": result["checks"]})]:
        context.log_event(e)


# -- the revoke ------------------------------------------------------------------------------------

def _open_incident(context: dg.OpExecutionContext, req: AccessRequest, why: str) -> str:
    """Record (once) and page an incident for a revoke that failed; returns its id."""
    from dw_dagster.integrations.paging import page_incident

    led = ledger_for(context.instance)
    inc = Incident(id=f"inc-{req.id}", asset_key=[c.ACCESS_ASSET], source="access", detected_at=utcnow(),
                   summary=f"access grant {req.id} of {req.spec.grantee_email} on {req.database_name} was not revoked "
                           f"at {req.expires_at.isoformat()}: {why}"[:2000], external_id=req.id)
    if led.record_incident(incident_id=inc.id, asset_key=asset_str(inc.asset_key), source="access", external_id=req.id,
                           body=inc.model_dump_json()):
        context.log_event(dg.AssetObservation(asset_key=ACCESS_ASSET_KEY, description=inc.summary[:1000],
                                              metadata={c.INCIDENT_KEY: dg.MetadataValue.json(inc.model_dump(mode="json")),
                                                        c.INCIDENT_ID_KEY: inc.id, c.ACCESS_REQUEST_ID_KEY: req.id}))
        pager = context.resources.original_resource_dict.get(PAGER_KEY)
        if pager is not None:
            try:
                page_incident(pager, inc)
                context.log_event(event(req.id, "paged", f"paged for access grant {req.id}: {why}"[:1000]))
            except Exception as e:  # noqa: BLE001 - the incident stands; the page is retried with the next failure
                context.log.warning(f"could not page for {inc.id}: {type(e).__name__}: {e}")
    return inc.id


def _retry_minutes(domains: DomainsSource) -> float:
    try:
        doms = resolve_domains(domains)
    except Exception:  # noqa: BLE001 - an unreadable domains file never stops a revoke from being retried
        doms = None
    return doms.access.revoke_retry_minutes if doms is not None else 5.0


def _revoke(context: dg.OpExecutionContext, config: AccessConfig, domains: DomainsSource) -> None:
    from dw_dagster.guard.admission import hold_stage

    held = hold_stage(context)
    if not held.stage.startswith("revoke-"):
        raise dg.Failure(description=f"the run's ticket is for stage {held.stage}, not a revoke")
    led = ledger_for(context.instance)
    row = led.access_row(config.request_id)
    if row is None or held.change_set.incident_id != row.request_id:
        raise dg.Failure(description=f"the run's ticket is not for access request {config.request_id}")
    if row.state != REVOKING:
        raise dg.Failure(description=f"access request {row.request_id} is {row.state}, not being revoked")
    req = AccessRequest.model_validate_json(row.body)
    run = remaining(req.dry_run.engine, row.result.get("handed_over"))
    try:
        db = resolve_database(context.resources.original_resource_dict, req.spec.database)
        try:
            result = engines.apply_revoke(db, run, end_sessions=req.spec.end_sessions)
        finally:
            close(db)
        if not result["verified"]:
            bad = [ch["check"] for ch in result["checks"] if ch["value"] not in (False, None)]
            raise AccessError(f"the engine still shows access after the revoke: {'; '.join(bad[:5])}")
    except (AccessError, DatabaseError) as e:
        why = str(e)
        incident = _open_incident(context, req, why)
        led.move_access(req.id, REVOKE_FAILED, from_states=[REVOKING], note=why, incident_id=incident,
                        next_revoke_at=(utcnow() + dt.timedelta(minutes=_retry_minutes(domains))).timestamp(),
                        result={f"revoke_attempt_{row.revoke_attempts}": {"error": why, "at": utcnow().isoformat(),
                                                                          "run_id": context.run_id}})
        held.complete(context.instance, context.run_id, success=False, result={"reason": why})
        context.log_event(event(req.id, "revoke_failed", f"revoke of access {req.id} failed: {why}", {"reason": why}))
        raise dg.Failure(description=f"revoke of access {req.id} failed: {why}; an incident is open and the access "
                                     "sensor tries again") from e
    now = utcnow()
    revoke = {**result, "at": now.isoformat(), "run_id": context.run_id, "stage": held.stage}
    led.move_access(req.id, REVOKED, from_states=[REVOKING], revoked_at=now.timestamp(), result={"revoke": revoke})
    held.complete(context.instance, context.run_id, success=True, result={"revoked_at": now.isoformat(),
                                                                          "verified": result["verified"]})
    receipt_events = write_access_receipt(context.instance, req.id, run_id=context.run_id)
    _close_change_sets(context.instance, req)
    if row.incident_id:
        from dw_dagster.receipts.job import close_incident

        close_incident(context.instance, row.incident_id, "dw-dagster", f"access {req.id} revoked and verified")
    for e in [event(req.id, "revoked", f"access {req.id} of {req.spec.grantee_email} revoked and verified "
                    f"({len(result['checks'])} checks)", {"checks": result["checks"],
                                                          "sessions_ended": result.get("sessions_ended", 0)}),
              *receipt_events]:
        context.log_event(e)


# -- the receipt -----------------------------------------------------------------------------------

def access_receipt(instance: dg.DagsterInstance, req: AccessRequest, result: Mapping[str, Any], *, previous_hash: str | None,
                   granted_at: float | None, revoked_at: float | None, outcome: str) -> Receipt:
    """The receipt of one grant: who asked and why, the dry-run, who approved, when granted and
    revoked, how the revoke was verified (its checks, one per line)."""
    grant, revoke = result.get("grant") or {}, result.get("revoke") or {}
    approvals = grant.get("approvals") or []
    led = ledger_for(instance)
    first = load_change_set(led, req.change_sets[0]) if req.change_sets else None
    checks = [CheckOutcome(asset_key=[c.ACCESS_ASSET], check_name=str(ch["check"])[:250],
                           passed=ch["value"] == ch["expected"] or (ch["expected"] is False and ch["value"] is None),
                           severity="ERROR", metadata={"value": str(ch["value"]), "expected": str(ch["expected"])})
              for ch in revoke.get("checks") or []]
    utc = (lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat() if t else None)
    e = req.dry_run.engine
    evidence = {
        "request_id": req.id, "requested_by": req.requester,
        "requester_identity": req.requester_identity.describe() if req.requester_identity else "(not verified)",
        "why": req.spec.why, "grantee": req.spec.grantee_email, "grantee_role": e.grantee_role,
        "database": req.database_name, "asked": req.spec.model_dump(mode="json"),
        "newly_reachable": [x.model_dump(mode="json") for x in e.newly_reachable],
        "also_reachable": [x.model_dump(mode="json") for x in e.also_reachable],
        "future_tables": [x.model_dump(mode="json") for x in e.future_tables],
        "sensitive": [s.model_dump(mode="json") for s in req.dry_run.sensitive],
        "domains": [d.model_dump(mode="json") for d in req.dry_run.domains],
        "approvals": approvals, "requested_at": req.requested_at.isoformat(), "expires_at": req.expires_at.isoformat(),
        "granted_at": utc(granted_at), "revoked_at": utc(revoked_at), "revoke_verified": bool(revoke.get("verified")),
        "revoke_verification": revoke.get("checks") or [], "sessions_ended": revoke.get("sessions_ended", 0),
        "revoke_notes": revoke.get("notes") or [], "valid_until": e.state.get("valid_until"), "extends": req.extends,
        "handed_over": result.get("handed_over"),
    }
    return Receipt(
        id=f"rc-{uuid.uuid4().hex[:12]}", asset_key=[c.ACCESS_ASSET], change_set_id=first.id if first else req.id,
        change_set_version=first.version if first else "", incident_id=req.id, cause_kind="access_grant",
        cause_summary=req.spec.why, evidence_summary=evidence, diff="\n".join(f"{s};" for s in req.statements),
        approver=", ".join(a["approver"] for a in approvals) or "(none)",
        approved_at=max((dt.datetime.fromisoformat(a["decided_at"]) for a in approvals), default=req.requested_at),
        signature_valid=True, partitions=[], run_ids={k: v for k, v in (("grant", grant.get("run_id")),
                                                                        ("revoke", revoke.get("run_id"))) if v},
        rows_before={}, rows_after={}, checks=checks, verified=bool(revoke.get("verified")),
        undo="\n".join(f"{s};" for s in req.rollback), created_at=utcnow(), previous_hash=previous_hash, outcome=outcome,
        approver_identity="; ".join(a.get("identity", a["approver"]) for a in approvals))


def write_access_receipt(instance: dg.DagsterInstance, request_id: str, *, run_id: str | None = None,
                         outcome: str | None = None) -> list[dg.AssetObservation]:
    """Chain the grant's receipt on ``dw_access`` (compare-and-set on its head) and return its observation."""
    from dw_dagster.receipts.job import receipt_hash, receipt_observation

    led = ledger_for(instance)
    row = led.access_row(request_id)
    req = AccessRequest.model_validate_json(row.body)
    if outcome is None and row.state == REVOKED and row.granted_at is None:
        outcome = f"the grant failed ({row.result.get('grant', {}).get('error', 'see the grant run')}); what ran of it " \
                  "was revoked and verified"
    done = outcome or ("revoked and verified" if row.state == REVOKED else row.state)
    for _ in range(20):
        head = led.receipt_head(c.ACCESS_ASSET)
        r = access_receipt(instance, req, row.result, previous_hash=head[1] if head else None, granted_at=row.granted_at,
                           revoked_at=row.revoked_at, outcome=done)
        if led.append_receipt(asset_key=c.ACCESS_ASSET, expected_head=head, receipt_id=r.id, hash=receipt_hash(r),
                              previous_hash=r.previous_hash, change_set_id=r.change_set_id, run_id=run_id):
            break
    else:
        raise dg.Failure(description="the receipt chain of dw_access kept moving; try again")
    return [receipt_observation(r, f"receipt {r.id} of access {req.id}: {done}")]


# -- the jobs --------------------------------------------------------------------------------------

def build_access_jobs(resource_keys: Sequence[str], *, domains: DomainsSource = None, pager: bool = False,
                      executor: dg.ExecutorDefinition | None = None) -> tuple[dg.JobDefinition, dg.JobDefinition]:
    """``(grant job, revoke job)`` needing the database resources ``resource_keys`` (and
    :data:`PAGER_KEY` when ``pager``); each runs only under the access sensor's ticket."""
    from dw_dagster.guard.admission import guarded_executor

    keys = set(resource_keys) | ({PAGER_KEY} if pager else set())

    @dg.op(name=c.ACCESS_GRANT_OP, required_resource_keys=keys, tags={"kind": "dw"},
           description="Grant one approved access request and check it on the engine.")
    def grant_op(context: dg.OpExecutionContext, config: AccessConfig) -> None:
        _grant(context, config, domains)

    @dg.op(name=c.ACCESS_REVOKE_OP, required_resource_keys=keys, tags={"kind": "dw"},
           description="Revoke one access grant at its expiry and verify the revoke on the engine.")
    def revoke_op(context: dg.OpExecutionContext, config: AccessConfig) -> None:
        _revoke(context, config, domains)

    run_on = executor or guarded_executor(dg.in_process_executor)

    from dw_dagster.core.keys import KIND_KEY as KIND_TAG

    @dg.job(name=c.ACCESS_GRANT_JOB, tags={KIND_TAG: c.ACCESS_KIND}, executor_def=run_on,
            description="Grant an approved dw_dagster access request (dispatched by the access sensor only).")
    def grant_job():
        grant_op()

    @dg.job(name=c.ACCESS_REVOKE_JOB, tags={KIND_TAG: c.ACCESS_KIND}, executor_def=run_on,
            description="Revoke a dw_dagster access grant at its expiry (dispatched by the access sensor only).")
    def revoke_job():
        revoke_op()

    return grant_job, revoke_job


__all__ = ["AccessConfig", "PAGER_KEY", "access_receipt", "all_approved", "build_access_jobs", "close", "nothing_left", "redact_url",
           "remaining", "resolve_database", "write_access_receipt"]
