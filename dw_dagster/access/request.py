"""Making an access request: who asks (verified), the dry-run, and one change set per domain to approve.

:func:`prepare` runs the engine's dry-run (:mod:`dw_dagster.access.engines`) and the analysis
(:mod:`dw_dagster.access.dry_run`) and returns the :class:`~dw_dagster.access.models.AccessRequest`
without recording anything. :func:`submit` records it: the request in the ledger
(:mod:`dw_dagster.core.ledger_access`) and, for every domain whose tables it opens, a change set of
class ``access_grant`` whose approvers are that domain's (all must approve, any may reject). The
change set carries the whole request (statements, rollback, dry-run, expiry) as its step, so an
approval signs exactly what will run and what the owner read; its proposer is the requester and
the grantee is excluded from deciding, so nobody approves their own request. Change sets go through
the generic approval machinery: the review page, Slack buttons, ``dw-dagster approve``, expiry and
escalation apply to them as to any other.

**Who asks.** The requester proves who they are the way approvers do: an OIDC ID token whose
``nonce`` binds it to this request's content (:func:`request_nonce`), a signed Slack slash command,
or an OAuth access token of the MCP endpoint. A request without such proof is recorded as a
*draft*: nobody is asked until the requester confirms it (``dw-dagster access confirm``). Typed
emails count only when every affected domain is ``identity: unverified``.

A request that opens nothing new is not recorded and proposes nothing; the answer says so.
An **extension** is a new request: while an earlier grant of the same grantee is in force, the
dry-run treats what that grant added as not held, so the owners see what continuing opens; once
the extension is granted it takes over the statements both share, and the earlier grant's revoke
leaves them alone.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

from dw_dagster.dagster_private import public
import dagster as dg

from dw_dagster.access import engines
from dw_dagster.access.dry_run import analyse
from dw_dagster.access.models import AccessError, AccessRequest, AccessSpec, DomainApproval, EngineDryRun
from dw_dagster.core import keys as c
from dw_dagster.core.domains import ACCESS_GRANT, Domains
from dw_dagster.core.identity import IdentityError, VerifiedIdentity, canonical_email, decision_nonce
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.ledger_access import ACTIVE, DRAFT, GRANTING, PENDING
from dw_dagster.core.models import ChangeSet, ChangeStep, utcnow
from dw_dagster.databases import Database

ACCESS_ASSET_KEY = dg.AssetKey([c.ACCESS_ASSET])
CAUSE_KIND = "access_request"


def access_asset_spec() -> dg.AssetSpec:
    """The ``dw_access`` asset: its events show every request, decision, grant, reminder, revoke and receipt."""
    return dg.AssetSpec(ACCESS_ASSET_KEY, group_name="dw", kinds={"dw"},
                        description="dw_dagster access requests: dry-runs, approvals, grants, revokes and receipts "
                                    "(see Events).")


def grantee_role(domains: Domains, email: str) -> str:
    """The database role (user on Snowflake) of a person, from ``access.role_name``."""
    local = email.split("@", 1)[0]
    return domains.access.role_name.format(email=email, local=local, local_snake=re.sub(r"\W+", "_", local).strip("_").lower())


@public
def request_nonce(spec: AccessSpec) -> str:
    """The OIDC ``nonce`` that binds a requester's ID token to this request's content."""
    return decision_nonce("access-request", spec.key(), "request")


def requester_identity(domains: Domains, spec: AccessSpec, *, id_token: str | None = None,
                       typed: str | None = None) -> VerifiedIdentity | None:
    """Who asks: an ID token bound to ``spec`` (verified against the provider's JWKS), or a typed
    email (labelled unverified; accepted later only when every affected domain allows it), or None.

    Raises:
        AccessError: the token is refused (the reason named) or the typed text is not an email.
    """
    if id_token:
        from dw_dagster.core.signing import ApprovalRefused
        from dw_dagster.approval.job import oidc_verifier

        try:
            return oidc_verifier(domains).verify(id_token.strip(), nonce=request_nonce(spec))
        except (IdentityError, ApprovalRefused) as e:
            raise AccessError(f"the requester's ID token is refused: {e}") from e
    if typed:
        try:
            return VerifiedIdentity(email=canonical_email(typed), method="unverified", verified_at=utcnow(),
                                    detail="typed text, not verified")
        except IdentityError as e:
            raise AccessError(str(e)) from e
    return None


def open_database(name: str, resources: Any = None) -> tuple[Database, str]:
    """The database a request names and what the request records of it.

    A URL (``postgresql+psycopg://…``, ``snowflake://…``) is opened as given and recorded without
    its password (the code location that grants finds its own resource pointing there); anything
    else is a database resource key of ``resources`` (a mapping, e.g. a code location's resources).

    Raises:
        AccessError: an unknown resource key (the known ones named).
    """
    from dw_dagster.access.jobs import redact_url, resolve_database
    from dw_dagster.databases import database_from_url

    if "://" in name:
        return database_from_url(name), redact_url(name)
    return resolve_database(dict(resources or {}), name), name


def parse_duration(text: str) -> float:
    """Seconds in ``8h``, ``30m``, ``1h30m``, ``2d``, ``90s`` (or a bare number of seconds).

    Raises:
        AccessError: not a positive duration.
    """
    t = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", t):
        seconds = float(t)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([dhms])", t)
        if not parts or "".join(a + b for a, b in parts) != t:
            raise AccessError(f"not a duration: {text!r} (write 8h, 30m, 1h30m, 2d)")
        seconds = sum(float(n) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise AccessError(f"a grant lasts some time: {text!r}")
    return seconds


def _active_grants(instance: dg.DagsterInstance | None, grantee: str, database: str) -> list[AccessRequest]:
    if instance is None:
        return []
    rows = ledger_for(instance).access_rows(states=[ACTIVE, GRANTING], grantee=grantee)
    return [AccessRequest.model_validate_json(r.body) for r in rows if r.database == database]


def prepare(instance: dg.DagsterInstance | None, spec: AccessSpec, db: Database, *, domains: Domains, requester: str,
            asset_graph: Any = None, lineage: Any = None, now: dt.datetime | None = None) -> AccessRequest:
    """The request with its dry-run, not recorded (module docstring).

    Raises:
        AccessError: a duration over ``access.max_hours``, an unknown grantee role, table, column or
            role, an engine other than PostgreSQL or Snowflake, or a reachable table no domain owns.
    """
    now = now or utcnow()
    hours = spec.duration_s / 3600
    if hours > domains.access.max_hours:
        raise AccessError(f"{hours:g} h is longer than the {domains.access.max_hours:g} h the domains file allows "
                          "(access.max_hours); ask for less, and for an extension later")
    request_id = f"acc-{uuid.uuid4().hex[:10]}"
    expires_at = now + dt.timedelta(seconds=spec.duration_s)
    earlier = _active_grants(instance, spec.grantee_email, spec.database)
    role = grantee_role(domains, spec.grantee_email)
    run = engines.dry_run(db, spec, role, expires_at=expires_at, request_id=request_id,
                          valid_until=domains.access.valid_until, taking_over=[e.dry_run.engine for e in earlier])
    extends = next((e.id for e in earlier if set(e.statements) & set(run.statements)), None)
    dry = analyse(run, domains=domains, requester=requester, grantee=spec.grantee_email, asset_graph=asset_graph,
                  lineage=lineage)
    if dry.unowned and dry.opens_anything:
        raise AccessError(f"no domain owns {', '.join(dry.unowned[:10])}: nobody could approve opening it; add the "
                          "table to a domain (tables:, or an asset it owns) in the domains file")
    return AccessRequest(id=request_id, spec=spec, database_name=db.name, requester=requester, requested_at=now,
                         expires_at=expires_at, statements=run.statements, rollback=run.rollback, dry_run=dry,
                         extends=extends)


def _summary(req: AccessRequest, d: DomainApproval) -> str:
    e = req.dry_run.engine
    what = f"role {e.role}" if e.role else ", ".join(e.tables[:5])
    sens = f"; {d.sensitive} sensitive column(s)" if d.sensitive else ""
    hours = req.spec.duration_s / 3600
    return (f"Access for {req.spec.grantee_email} ({e.grantee_role}): {what} until {req.expires_at:%Y-%m-%d %H:%M} UTC "
            f"({hours:g} h), asked by {req.requester}: {req.spec.why}. Opens {', '.join(d.tables[:8])} of domain "
            f"{d.domain}{sens}")[:2000]


def change_sets_for(req: AccessRequest, domains: Domains, now: dt.datetime) -> list[ChangeSet]:
    """One change set per domain to approve (module docstring); ids ``ar-<request>-<domain>``."""
    body = req.model_dump(mode="json", exclude={"change_sets"})
    out = []
    for d in req.dry_run.domains:
        domain = domains.get(d.domain)
        deadline = min(now + dt.timedelta(hours=domain.approval_expiry_hours), req.expires_at)
        step = ChangeStep(kind=c.ACCESS_STEP_KIND, change_class=ACCESS_GRANT, summary=_summary(req, d),
                          resource_key=req.spec.database, spec={"request": body, "domain": d.domain},
                          sql=list(req.statements), rollback_sql=list(req.rollback))
        excluded = sorted({req.spec.grantee_email} - {req.requester})
        out.append(ChangeSet.seal(
            id=f"{c.ACCESS_CHANGE_SET_PREFIX}{req.id.removeprefix('acc-')}-{d.domain}"[:255], incident_id=req.id,
            diagnosis_id=req.id, domain=d.domain, proposer=req.requester, created_at=now, expires_at=deadline,
            approvers=list(domain.approvers), cause_kind=CAUSE_KIND, summary=step.summary, target_asset=[c.ACCESS_ASSET],
            window=[], diff="", files=[], rebuild_assets=[], steps=[step], change_classes=[ACCESS_GRANT],
            undo=f"revoked at {req.expires_at.isoformat()}: " + "; ".join(req.rollback), excluded_approvers=excluded))
    return out


def _verified_enough(req: AccessRequest, identity: VerifiedIdentity | None, domains: Domains) -> str | None:
    """Why ``identity`` cannot file ``req`` now (None when it can)."""
    if identity is None:
        return "the requester is not verified"
    if identity.email != req.requester:
        return f"the request names {req.requester} as requester, the credential proves {identity.email}"
    if identity.verified:
        return None
    strict = [d.domain for d in req.dry_run.domains if domains.get(d.domain).identity != "unverified"]
    if strict:
        return (f"domain(s) {', '.join(strict)} need a verified requester (an OIDC ID token bound to the request, or "
                f"Slack); {identity.email} was typed")
    return None


def event(request_id: str, kind: str, description: str, data: dict[str, Any] | None = None) -> dg.AssetObservation:
    """An ``dw/access_event`` observation on ``dw_access`` (requested, approved, granted, reminded, revoked ...)."""
    return dg.AssetObservation(asset_key=ACCESS_ASSET_KEY, description=description[:1000],
                               metadata={c.ACCESS_EVENT_KEY: dg.MetadataValue.json({"request_id": request_id, "kind": kind,
                                                                                  "at": utcnow().isoformat(),
                                                                                  **(data or {})}),
                                         c.ACCESS_REQUEST_ID_KEY: request_id})


def submit(instance: dg.DagsterInstance, req: AccessRequest, identity: VerifiedIdentity | None, *,
           domains: Domains) -> tuple[AccessRequest, str]:
    """Record ``req``: pending with its change sets when ``identity`` may file it, else a draft.

    Returns:
        ``(the request as recorded, its state)``; the same request filed again while one of its
        content waits returns that one.

    Raises:
        AccessError: the request opens nothing new (nothing to record).
    """
    from dw_dagster.proposals.change_sets import propose

    if not req.dry_run.opens_anything:
        raise AccessError("the grant opens nothing new: " + ("; ".join(req.dry_run.engine.already_held) or
                                                              "everything it reaches is reachable already"))
    now = req.requested_at
    why = _verified_enough(req, identity, domains)
    state = DRAFT if why else PENDING
    sets = change_sets_for(req, domains, now) if state == PENDING else []
    recorded = req.model_copy(update={"requester_identity": identity, "change_sets": [s.id for s in sets]})
    led = ledger_for(instance)
    if state == PENDING and identity is not None and identity.credential_id and not led.use_credential(
            identity.credential_id, f"access request {req.id}"):
        raise AccessError("this credential was already used; each is accepted once (log in again)")
    row, new = led.record_access(request_id=req.id, state=state, grantee=req.spec.grantee_email, requested_by=req.requester,
                                 database=req.spec.database, content_key=req.content_key(),
                                 requested_at=req.requested_at.timestamp(), expires_at=req.expires_at.timestamp(),
                                 body=recorded.model_dump_json())
    if not new:
        return AccessRequest.model_validate_json(row.body), row.state
    for cs in sets:
        propose(instance, cs)
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=ACCESS_ASSET_KEY, description=f"access request {req.id} ({state}): {req.spec.why}"[:1000],
        metadata={c.ACCESS_REQUEST_KEY: dg.MetadataValue.json(recorded.summary()), c.ACCESS_REQUEST_ID_KEY: req.id}))
    return recorded, state


def confirm(instance: dg.DagsterInstance, request_id: str, identity: VerifiedIdentity, *, domains: Domains) -> AccessRequest:
    """A draft's requester proves who they are: the request is filed (its change sets proposed).

    Raises:
        AccessError: no such draft, or ``identity`` may not file it (the reason named).
    """
    from dw_dagster.proposals.change_sets import propose

    led = ledger_for(instance)
    row = led.access_row(request_id)
    if row is None or row.state != DRAFT:
        raise AccessError(f"no draft access request {request_id!r}" + (f" (it is {row.state})" if row else ""))
    req = AccessRequest.model_validate_json(row.body)
    why = _verified_enough(req, identity, domains)
    if why:
        raise AccessError(why)
    if identity.credential_id and not led.use_credential(identity.credential_id, f"confirm access request {req.id}"):
        raise AccessError("this credential was already used; each is accepted once")
    now = utcnow()
    if now >= req.expires_at:
        raise AccessError(f"access request {req.id} would have ended at {req.expires_at.isoformat()}; ask again")
    sets = change_sets_for(req, domains, now)
    filed = req.model_copy(update={"requester_identity": identity, "change_sets": [s.id for s in sets]})
    if not led.move_access(req.id, PENDING, from_states=[DRAFT], body=filed.model_dump_json()):
        raise AccessError(f"access request {req.id} is no longer a draft")
    for cs in sets:
        propose(instance, cs)
    instance.report_runless_asset_event(event(req.id, "confirmed", f"access request {req.id} confirmed by "
                                              f"{identity.describe()}", {"requester": identity.email}))
    return filed


@public
def request_access(instance: dg.DagsterInstance, spec: AccessSpec, db: Database, *, domains: Domains,
                   id_token: str | None = None, typed: str | None = None, asset_graph: Any = None,
                   lineage: Any = None) -> tuple[AccessRequest, str]:
    """Ask for access in one call: who asks (:func:`requester_identity`), the dry-run (:func:`prepare`)
    and the filing (:func:`submit`).

    Args:
        instance: the Dagster instance (its ledger keeps the request).
        spec: what is asked.
        db: the database (:func:`open_database`).
        domains: the domains as they are now.
        id_token: the requester's ID token, its ``nonce`` :func:`request_nonce` of ``spec``.
        typed: the requester's email, typed (a draft; or accepted by ``identity: unverified`` domains).
        asset_graph, lineage: for owners, downstream assets and exposures (see :func:`prepare`).

    Returns:
        ``(request, state)``: ``pending`` (the owners are asked), ``draft`` (the requester must
        confirm who they are) or ``opens nothing new`` (nothing recorded).

    Raises:
        AccessError: a refused token, an unknown name, a table no domain owns (see :func:`prepare`).
    """
    identity = requester_identity(domains, spec, id_token=id_token, typed=typed)
    by = identity.email if identity is not None else spec.grantee_email
    req = prepare(instance, spec, db, domains=domains, requester=by, asset_graph=asset_graph, lineage=lineage)
    if not req.dry_run.opens_anything:
        return req, "opens nothing new"
    return submit(instance, req, identity, domains=domains)


def load(instance: dg.DagsterInstance, request_id: str) -> AccessRequest | None:
    row = ledger_for(instance).access_row(request_id)
    return AccessRequest.model_validate_json(row.body) if row is not None else None


def engine_run(req: AccessRequest) -> EngineDryRun:
    return req.dry_run.engine


__all__ = ["ACCESS_ASSET_KEY", "access_asset_spec", "open_database", "parse_duration", "change_sets_for", "confirm", "event", "grantee_role", "load",
           "prepare", "request_access", "request_nonce", "requester_identity", "submit"]
