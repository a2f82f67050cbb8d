"""``request_access``: an access request from a coding assistant — proposed, never approved or granted.

It runs the same dry-run as ``dw-dagster access request`` (:func:`dw_dagster.access.request.prepare`)
and files the request the same way (:func:`dw_dagster.access.request.submit`). Who asks is
verified only when the call came through the HTTP endpoint with an OAuth access token from the
organisation's identity provider (:class:`dw_dagster.mcp.auth.OAuthTokenVerifier`, the approval
path's own verifier): then the request is pending and the owners are asked. Over stdio or the
shared token nobody is proven, so the request is a *draft*: nobody is asked until the person
confirms it (``dw-dagster access confirm REQUEST --login``). Nothing here decides or grants: each
affected domain's owners approve through the approval job, and the access sensor grants.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from dw_dagster.core.identity import VerifiedIdentity
from dw_dagster.core.models import utcnow
from dw_dagster.mcp.state import DwState, fail


class AccessProposal(BaseModel):
    """What ``request_access`` did: the dry-run (what the grant opens, who must approve) and the state."""

    state: str = Field(description="pending (owners asked), draft (confirm first), dry-run, or 'opens nothing new'")
    request_id: str | None = None
    requested_by: str | None = Field(default=None, description="the verified caller, when the call proved one")
    grantee: str
    grantee_role: str
    database: str
    statements: list[str]
    rollback: list[str]
    newly_reachable: list[dict[str, Any]]
    also_reachable: list[dict[str, Any]] = Field(default_factory=list)
    future_tables: list[dict[str, Any]] = Field(default_factory=list)
    sensitive: list[dict[str, Any]]
    domains: list[dict[str, Any]]
    approvers: list[str]
    expires_at: str
    notes: list[str] = Field(default_factory=list)
    change_sets: list[str] = Field(default_factory=list)
    next: str = Field(description="what a person does next")


def caller_identity() -> VerifiedIdentity | None:
    """The caller proven by an OAuth access token of the HTTP endpoint, or None (stdio, shared token)."""
    try:
        from mcp.server.auth.middleware.auth_context import get_access_token
    except ImportError:  # pragma: no cover - the SDK moved it
        return None
    token = get_access_token()
    claims = getattr(token, "claims", None) or {}
    if token is None or not claims.get("email") or not claims.get("iss"):
        return None
    return VerifiedIdentity(email=claims["email"], method="oidc", issuer=claims["iss"], subject=getattr(token, "subject", None),
                            verified_at=utcnow(),
                            detail=f"MCP caller verified by an OAuth access token of OIDC issuer {claims['iss']}")


def request_access(state: DwState, *, database: str, who: str, grant: str | None, tables: list[str], columns: list[str],
                   privilege: str, duration: str, why: str, end_sessions: bool, dry_run: bool) -> AccessProposal:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    from dw_dagster.access.models import AccessError, AccessSpec
    from dw_dagster.access.request import open_database, parse_duration, prepare, submit
    from dw_dagster.core.identity import IdentityError, canonical_email
    from dw_dagster.databases import DatabaseError

    domains = state.domains()
    if domains is None:
        raise fail("no domains file: request_access needs the owners and the access settings (--domains or $DW_DOMAINS_FILE)")
    resources, graph, lineage = {}, None, None
    ws = state.workspace_if_loaded() or (state.workspace() if "://" not in database else None)
    for loc in (ws.loaded() if ws is not None else []):
        resources.update({k: v for k, v in (loc.defs.resources or {}).items() if hasattr(v, "get_database")})
        if graph is None:
            graph, lineage = loc.asset_graph, loc.lineage()
    db = None
    try:
        db, recorded = open_database(database, resources)
        spec = AccessSpec(database=recorded, grantee_email=canonical_email(who), role=grant or None, tables=tables,
                          columns=columns, privilege=privilege, duration_s=parse_duration(duration), why=why,
                          end_sessions=end_sessions)
        identity = None if dry_run else caller_identity()
        instance = state.instance()
        req = prepare(instance, spec, db, domains=domains, requester=identity.email if identity else spec.grantee_email,
                      asset_graph=graph, lineage=lineage)
        if not req.dry_run.opens_anything:
            status = "opens nothing new"
        elif dry_run:
            status = "dry-run"
        else:
            req, status = submit(instance, req, identity, domains=domains)
    except (AccessError, DatabaseError, IdentityError, ValueError) as e:
        raise fail(f"request_access refused: {e}") from e
    finally:
        from dw_dagster.access.jobs import close

        close(db)
    s = req.summary()
    nexts = {"pending": f"every domain's owners approve ({', '.join(req.change_sets)}): dw-dagster approve CS --login",
             "draft": f"the person asking confirms who they are: dw-dagster access confirm {req.id} --login",
             "dry-run": "nothing recorded; call again without dry_run to file it",
             "opens nothing new": "nothing to grant: " + ("; ".join(req.dry_run.engine.already_held) or "all reachable already")}
    return AccessProposal(
        state=status, request_id=req.id if status in ("pending", "draft") else None,
        requested_by=identity.email if identity else None, grantee=s["grantee"], grantee_role=s["grantee_role"],
        database=s["database"], statements=s["statements"], rollback=s["rollback"], newly_reachable=s["newly_reachable"],
        also_reachable=s["also_reachable"], future_tables=s["future_tables"], sensitive=s["sensitive"],
        domains=s["domains"], approvers=s["approvers"], expires_at=s["expires_at"], notes=s["notes"],
        change_sets=list(req.change_sets), next=nexts[status])


__all__ = ["AccessProposal", "caller_identity", "request_access"]
