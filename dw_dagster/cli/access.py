"""``dw-dagster access``: ask for time-bound warehouse access, confirm a draft, list grants.

``access request`` runs the dry-run on the engine (what the grant really opens, who must approve),
then files the request as the verified requester (``--login`` binds the ID token to this request's
content; ``--id-token`` takes one so bound), or with ``--dry-run`` files nothing. Without proof of
who asks, the request is a draft (``access confirm`` files it). Exit codes: 0 done (also "opens
nothing new"); 2 usage error; 3 refused (the message says why).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import click

from dw_dagster.cli.decisions import _domains, _instance, _token, _token_opts, domains_option


def _workspace_resources(workspace: str | None):
    """``(resources of every loaded location, asset graph, lineage graph)`` of the workspace file
    (``--workspace``, ``$DW_WORKSPACE`` or ``./workspace.yaml``); empty when there is none."""
    path = workspace or os.environ.get("DW_WORKSPACE") or ("workspace.yaml" if Path("workspace.yaml").is_file() else None)
    if not path:
        return {}, None, None
    from dw_dagster.mcp.workspace import WorkspaceError, load_workspace

    try:
        ws = load_workspace(path)
    except WorkspaceError as e:
        raise click.UsageError(str(e)) from e
    resources, graph, lineage = {}, None, None
    for loc in ws.loaded():
        resources.update({k: v for k, v in (loc.defs.resources or {}).items() if hasattr(v, "get_database")})
        if graph is None and loc.asset_graph is not None:
            graph, lineage = loc.asset_graph, loc.lineage()
    return resources, graph, lineage


def _summary_text(data: dict) -> str:
    lines = [f"access request {data.get('request_id') or '(dry run)'} for {data['grantee']} ({data['grantee_role']}) on "
             f"{data['database']}, until {data['expires_at']}"]
    for x in data["newly_reachable"]:
        cols = f" ({', '.join(x['columns'])})" if x["columns"] and not x["table_level"] else ""
        lines.append(f"  opens {x['privilege']} on {x['table']}{cols}")
    for x in data["also_reachable"]:
        lines.append(f"  also reachable through {x['how']} {x.get('via') or ''}: {x['privilege']} on {x['table']}")
    for f in data["future_tables"]:
        lines.append(f"  and tables created later in {f['schema_name'] or 'every schema'} by {f['creator'] or 'anyone'} "
                     f"({f['privilege']}, through {f['via']})")
    for s in data["sensitive"]:
        lines.append(f"  SENSITIVE {s['table']}.{s['column']}: {s['category']}")
    for d in data["domains"]:
        lines.append(f"  domain {d['domain']} must approve: {', '.join(d['approvers'])}")
    lines += [f"  note: {n}" for n in data["notes"]]
    lines += ["  statements:"] + [f"    {s};" for s in data["statements"]]
    lines += ["  rollback at expiry:"] + [f"    {s};" for s in data["rollback"]]
    return "\n".join(lines)


def register(main: click.Group) -> None:
    """Add ``dw-dagster access`` to the command line."""

    @main.group()
    def access() -> None:
        """Time-bound warehouse access: request (dry-run first), confirm, list."""

    @access.command("request")
    @click.option("--database", required=True, help="A database resource key of a code location, or a database URL.")
    @click.option("--who", required=True, help="Whom the access is for (email).")
    @click.option("--grant", "role", default=None, help="A role to grant (PostgreSQL role; Snowflake role).")
    @click.option("--tables", default=None, help="Tables, comma-separated (schema.table; quote parts to keep their case).")
    @click.option("--columns", default=None, help="Columns of those tables, comma-separated (PostgreSQL).")
    @click.option("--privilege", default="SELECT", show_default=True, help="The table privilege.")
    @click.option("--for", "duration", required=True, help="How long: 8h, 30m, 1h30m, 2d.")
    @click.option("--why", required=True, help="The reason (the owners read it; the receipt keeps it).")
    @click.option("--end-sessions", is_flag=True, help="At the revoke, also end the grantee's live sessions.")
    @click.option("--dry-run", is_flag=True, help="Show what the grant would open; record and ask nothing.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    @click.option("--requester", default=None, help="Your email, typed (a draft, or identity: unverified domains only).")
    @click.option("--workspace", default=None, type=click.Path(dir_okay=False),
                  help="The workspace file whose code locations hold the database resources (default $DW_WORKSPACE "
                       "or ./workspace.yaml).")
    @_token_opts
    @domains_option
    @click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
    def request_cmd(database, who, role, tables, columns, privilege, duration, why, end_sessions, dry_run, as_json,
                    requester, workspace, id_token, id_token_file, login, login_hint, domains_file, dagster_home):
        """Ask for access: the dry-run on the engine, then one approval per domain the grant opens."""
        from dw_dagster.access.models import AccessError, AccessSpec
        from dw_dagster.access.request import open_database, parse_duration, prepare, request_nonce, requester_identity, submit
        from dw_dagster.core.identity import IdentityError, canonical_email
        from dw_dagster.databases import DatabaseError

        domains = _domains(domains_file)
        try:
            grantee = canonical_email(who)
            seconds = parse_duration(duration)
            resources, graph, lineage = _workspace_resources(workspace) if "://" not in database else ({}, None, None)
            db, recorded_as = open_database(database, resources)
            spec = AccessSpec(database=recorded_as, grantee_email=grantee, role=role,
                              tables=[t.strip() for t in (tables or "").split(",") if t.strip()],
                              columns=[c.strip() for c in (columns or "").split(",") if c.strip()], privilege=privilege,
                              duration_s=seconds, why=why, end_sessions=end_sessions)
        except (AccessError, IdentityError, ValueError) as e:
            raise click.UsageError(str(e)) from e
        import contextlib

        no_home = dry_run and not (dagster_home or os.environ.get("DAGSTER_HOME"))
        with (contextlib.nullcontext(None) if no_home else _instance(dagster_home)) as instance:
            identity = None
            try:
                if not dry_run:
                    token = _token(domains, request_nonce(spec), id_token, id_token_file, login, login_hint)
                    identity = requester_identity(domains, spec, id_token=token or None, typed=requester)
                by = identity.email if identity else canonical_email(requester) if requester else grantee
                req = prepare(instance, spec, db, domains=domains, requester=by, asset_graph=graph, lineage=lineage)
                state = "dry-run"
                if not req.dry_run.opens_anything:
                    state = "opens nothing new"
                elif not dry_run:
                    req, state = submit(instance, req, identity, domains=domains)
            except (AccessError, DatabaseError, IdentityError) as e:
                click.echo(f"refused: {e}", err=True)
                sys.exit(3)
            finally:
                from dw_dagster.access.jobs import close

                close(db)
        data = {**req.summary(), "state": state}
        if state in ("dry-run", "opens nothing new"):
            data["request_id"] = None
        if as_json:
            click.echo(json.dumps(data, indent=2, default=str))
            return
        click.echo(_summary_text(data))
        if state == "opens nothing new":
            click.echo("the grant opens nothing new: " + ("; ".join(req.dry_run.engine.already_held) or
                                                          "everything it reaches is reachable already") + "; nothing filed")
        elif state == "draft":
            click.echo(f"filed as a DRAFT: nobody is asked until you confirm who you are: dw-dagster access confirm "
                       f"{req.id} --login")
        elif state == "pending":
            click.echo(f"filed; waiting for {', '.join(req.change_sets)} (all must approve): dw-dagster approve CS --login")

    @access.command("confirm")
    @click.argument("request_id")
    @_token_opts
    @domains_option
    @click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
    def confirm_cmd(request_id, id_token, id_token_file, login, login_hint, domains_file, dagster_home):
        """File a draft request as its verified requester (the owners are asked then)."""
        from dw_dagster.access.models import AccessError
        from dw_dagster.access.request import confirm, load, request_nonce, requester_identity

        domains = _domains(domains_file)
        with _instance(dagster_home) as instance:
            req = load(instance, request_id.strip())
            if req is None:
                raise click.BadParameter(f"no access request {request_id!r}", param_hint="REQUEST_ID")
            token = _token(domains, request_nonce(req.spec), id_token, id_token_file, login, login_hint)
            if not token:
                raise click.UsageError("prove who you are: --login, --id-token or --id-token-file")
            try:
                filed = confirm(instance, req.id, requester_identity(domains, req.spec, id_token=token), domains=domains)
            except AccessError as e:
                click.echo(f"refused: {e}", err=True)
                sys.exit(3)
        click.echo(f"filed {filed.id}; waiting for {', '.join(filed.change_sets)} (all must approve)")

    @access.command("list")
    @click.option("--active", is_flag=True, help="Only grants in force now (and revokes still to verify).")
    @click.option("--json", "as_json", is_flag=True)
    @click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
    def list_cmd(active, as_json, dagster_home):
        """Access requests and grants, newest first, with their expiry."""
        with _instance(dagster_home) as instance:
            rows = access_rows(instance, active=active)
        if as_json:
            click.echo(json.dumps(rows, indent=2, default=str))
            return
        if not rows:
            click.echo("no active grants" if active else "no access requests")
        for r in rows:
            tail = (f"revoked {r['revoked_at']} (verified: {r['revoke_verified']})" if r["revoked_at"]
                    else f"expires {r['expires_at']}")
            click.echo(f"{r['request_id']}  {r['state']:<13} {r['grantee']}  {r['what']} on {r['database']}  {tail}"
                       + (f"  [{r['note']}]" if r["note"] else ""))


def access_rows(instance, *, active: bool = False) -> list[dict]:
    """The rows ``access list`` shows (also what the review page lists)."""
    from dw_dagster.access.models import AccessRequest
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.core.ledger_access import HOLDING

    def at(t):
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat() if t else None

    out = []
    for row in ledger_for(instance).access_rows(states=HOLDING if active else None):
        req = AccessRequest.model_validate_json(row.body)
        e = req.dry_run.engine
        revoke = row.result.get("revoke") or {}
        out.append({"request_id": row.request_id, "state": row.state, "grantee": row.grantee,
                    "grantee_role": e.grantee_role, "requested_by": row.requested_by, "database": req.database_name,
                    "what": f"role {e.role}" if e.role else ", ".join(e.tables), "why": req.spec.why,
                    "approvers": [a["approver"] for a in (row.result.get("grant") or {}).get("approvals", [])],
                    "requested_at": at(row.requested_at), "granted_at": at(row.granted_at), "expires_at": at(row.expires_at),
                    "revoked_at": at(row.revoked_at), "revoke_verified": revoke.get("verified") if revoke else None,
                    "reminded_at": at(row.reminded_at), "incident_id": row.incident_id, "note": row.note,
                    "change_sets": req.change_sets})
    return out


__all__ = ["access_rows", "register"]
