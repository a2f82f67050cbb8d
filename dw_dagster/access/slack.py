"""A Slack slash command that asks for access: ``/dw-access --database warehouse --who dana@x.example
--grant analyst --for 8h --why "quarter close"``.

Slack posts a slash command to its Request URL as a form (``team_id``, ``user_id``, ``command``,
``text``, ``response_url``; Slack API docs, "Enabling interactivity with Slash Commands"), signed like
an interaction. :func:`slash_command` accepts one only when Slack signed it, it is fresh and new
(:meth:`~dw_dagster.approval.identity.slack.SlackInteractionVerifier.signed`), and the user is a
person with an email (``users.info``): that person is the verified requester. The text takes the
options of ``dw-dagster access request`` (``--dry-run`` files nothing). The answer is ephemeral:
what the grant opens, who must approve, or why it was refused.

Served by ``dw-dagster approvals serve`` at ``POST /slack/commands`` (:func:`access_routes`).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

import dagster as dg

from dw_dagster.access.models import AccessError, AccessSpec
from dw_dagster.access.request import open_database, parse_duration, prepare, submit
from dw_dagster.core.domains import Domains, DomainsSource, resolve_domains
from dw_dagster.core.identity import IdentityError, canonical_email
from dw_dagster.core.ledger import ledger_for
from dw_dagster.databases import DatabaseError

COMMANDS_PATH = "/slack/commands"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="/dw-access", add_help=False, exit_on_error=False)
    p.add_argument("--database", required=True)
    p.add_argument("--who", required=True)
    p.add_argument("--grant", default=None)
    p.add_argument("--tables", default="")
    p.add_argument("--columns", default="")
    p.add_argument("--privilege", default="SELECT")
    p.add_argument("--for", dest="duration", required=True)
    p.add_argument("--why", required=True)
    p.add_argument("--end-sessions", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    return p


class _Refused(Exception):
    pass


def parse_text(text: str) -> argparse.Namespace:
    """The slash command's text as ``access request`` options.

    Raises:
        _Refused: the text does not parse (the reason named).
    """
    parser = _parser()
    try:
        args, rest = parser.parse_known_args(shlex.split(text.replace("“", '"').replace("”", '"')))
    except (argparse.ArgumentError, ValueError) as e:
        raise _Refused(f"cannot read the command: {e}") from None
    except SystemExit:  # a required option missing (argparse exits even with exit_on_error=False there)
        raise _Refused("give --database, --who, --grant or --tables, --for and --why") from None
    if rest:
        raise _Refused(f"unknown words: {' '.join(rest)[:200]}")
    return args


def _ephemeral(text: str) -> dict[str, Any]:
    return {"response_type": "ephemeral", "text": text[:3900]}


def slash_command(body: bytes, headers: Mapping[str, str], *, instance: dg.DagsterInstance, domains: Domains,
                  resources: Mapping[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """``(HTTP status, JSON answer)`` for one slash command request (module docstring)."""
    from dw_dagster.approval.identity.slack import NotFromSlack, SlackInteractionVerifier, SlackNotConfigured

    settings = domains.identity.slack
    if settings is None:
        return 404, {"ok": False, "error": "Slack is not configured (identity.slack in the domains file)"}
    verifier = SlackInteractionVerifier(settings)
    try:
        digest = verifier.signed(body, headers, ledger_for(instance))
    except SlackNotConfigured as e:
        return 500, {"ok": False, "error": str(e)}
    except NotFromSlack as e:
        return 401, {"ok": False, "error": str(e)}
    form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    db = None
    try:
        who = verifier.person(form.get("user_id", ""), form.get("team_id", ""), digest, what="slash command")
        args = parse_text(form.get("text", ""))
        db, recorded = open_database(args.database, resources)
        spec = AccessSpec(database=recorded, grantee_email=canonical_email(args.who), role=args.grant or None,
                          tables=[t.strip() for t in args.tables.split(",") if t.strip()],
                          columns=[x.strip() for x in args.columns.split(",") if x.strip()], privilege=args.privilege,
                          duration_s=parse_duration(args.duration), why=args.why, end_sessions=args.end_sessions)
        req = prepare(instance, spec, db, domains=domains, requester=who.email)
        if not req.dry_run.opens_anything:
            return 200, _ephemeral("Nothing to ask for: the grant opens nothing new ("
                                   + ("; ".join(req.dry_run.engine.already_held) or "everything is reachable already") + ")")
        state = "dry run: nothing filed"
        if not args.dry_run:
            req, state = submit(instance, req, who, domains=domains)
    except (_Refused, AccessError, DatabaseError, IdentityError, ValueError) as e:
        return 200, _ephemeral(f"Refused: {e}")
    finally:
        from dw_dagster.access.jobs import close

        close(db)
    s = req.summary()
    lines = [f"*Access request {req.id}* ({state}) for {s['grantee']} until {s['expires_at']}, asked by {who.email}"]
    lines += [f"• opens {x['privilege']} on {x['table']}" + (f" ({', '.join(x['columns'])})" if not x["table_level"] else "")
              for x in s["newly_reachable"]]
    lines += [f"• sensitive: {x['table']}.{x['column']} ({x['category']})" for x in s["sensitive"]]
    lines += [f"• {d['domain']} must approve: {', '.join(d['approvers'])}" for d in s["domains"]]
    return 200, _ephemeral("\n".join(lines))


def access_routes(instance: dg.DagsterInstance | Callable[[], dg.DagsterInstance], domains: DomainsSource,
                  resources: Mapping[str, Any] | None = None) -> list:
    """The Starlette route of the slash command, for :func:`dw_dagster.approval.server.build_app`'s ``extra_routes``."""
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    holder: dict[str, dg.DagsterInstance] = {}

    def inst() -> dg.DagsterInstance:
        if "i" not in holder:
            holder["i"] = instance if isinstance(instance, dg.DagsterInstance) else instance()
        return holder["i"]

    async def commands(request: Request) -> JSONResponse:
        body = await request.body()
        doms = resolve_domains(domains)
        if doms is None:
            return JSONResponse({"ok": False, "error": "no domains file is configured"}, status_code=500)
        status, answer = await run_in_threadpool(slash_command, body, dict(request.headers), instance=inst(), domains=doms,
                                                 resources=resources)
        return JSONResponse(answer, status_code=status)

    return [Route(COMMANDS_PATH, commands, methods=["POST"])]


__all__ = ["COMMANDS_PATH", "access_routes", "parse_text", "slash_command"]
