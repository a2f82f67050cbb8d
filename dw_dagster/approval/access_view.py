"""The review page's view of access requests (:mod:`dw_dagster.access`): what an access change set
asks the owner to approve, and the grants in force in the owner's domains with their expiry.

Read from the change set's own content (the request it carries) and from the ledger's access rows,
as plain JSON: the approval layer shows access requests without depending on the package that
makes and grants them. Every value is HTML-escaped.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import Any

from dw_dagster.core import keys as c
from dw_dagster.core.domains import Domains
from dw_dagster.core.ledger import Ledger
from dw_dagster.core.ledger_access import HOLDING as IN_FORCE
from dw_dagster.core.models import ChangeSet

esc = html.escape


def access_request_of(cs: ChangeSet) -> dict[str, Any] | None:
    """The access request a change set carries (its ``access_grant`` step's ``request``), or None."""
    step = next((s for s in cs.steps if s.kind == c.ACCESS_STEP_KIND), None)
    return (step.spec or {}).get("request") if step is not None else None


def _when(iso: str | None) -> str:
    if not iso:
        return "-"
    t = dt.datetime.fromisoformat(iso)
    left = (t - dt.datetime.now(dt.timezone.utc)).total_seconds()
    rel = f"in {int(left // 3600)} h {int(left % 3600 // 60):02d} min" if left > 0 else "passed"
    return f"{t:%Y-%m-%d %H:%M:%S} UTC ({rel})"


def access_request_html(cs: ChangeSet, req: dict[str, Any]) -> str:
    """What the owner approves: who asks for whom and why, until when, what the dry-run found."""
    e = req["dry_run"]["engine"]
    spec = req["spec"]
    mine = next((d for d in req["dry_run"]["domains"] if d["domain"] == cs.domain), {"tables": []})
    reach = [f"{esc(x['privilege'])} on {esc(x['table'])}"
             + (f" ({esc(', '.join(x['columns']))})" if x.get("columns") and not x.get("table_level") else "")
             for x in e["newly_reachable"]]
    also = [f"{esc(x['privilege'])} on {esc(x['table'])} through {esc(x['how'])} {esc(x.get('via') or '')}"
            for x in e.get("also_reachable", [])]
    future = [f"tables created later in {esc(f['schema_name'] or 'every schema')} ({esc(f['privilege'])}, via "
              f"{esc(f['via'])})" for f in e.get("future_tables", [])]
    sensitive = [f"<b>{esc(s['table'])}.{esc(s['column'])}</b> ({esc(s['category'])})" for s in req["dry_run"]["sensitive"]]
    others = [d["domain"] for d in req["dry_run"]["domains"] if d["domain"] != cs.domain]
    items = "".join(f"<li>{x}</li>" for x in reach + also + future) or "<li>nothing</li>"
    return (f"<div class=access><dl>"
            f"<dt>Access for</dt><dd class=grantee>{esc(spec['grantee_email'])} (role {esc(e['grantee_role'])})</dd>"
            f"<dt>Asked by</dt><dd>{esc(req['requester'])}</dd><dt>Why</dt><dd>{esc(spec['why'])}</dd>"
            f"<dt>Database</dt><dd>{esc(req['database_name'])}</dd>"
            f"<dt>Until</dt><dd class=grant-expiry>{esc(_when(req['expires_at']))}; revoked then"
            f"{' and live sessions ended' if spec.get('end_sessions') else ''}</dd>"
            f"<dt>Your domain's tables</dt><dd>{esc(', '.join(mine['tables']))}</dd>"
            f"<dt>Also approving</dt><dd>{esc(', '.join(others)) or 'nobody else: your approval is the only one'}</dd></dl>"
            f"<h3>What the grant opens (dry-run on the engine)</h3><ul class=reach>{items}</ul>"
            f"<h3>Sensitive columns</h3>{'<ul>' + ''.join(f'<li>{s}</li>' for s in sensitive) + '</ul>' if sensitive else '<p class=muted>none</p>'}"
            + "".join(f"<p class=note>{esc(n)}</p>" for n in e.get("notes", [])) + "</div>")


def grants_in_force(led: Ledger, email: str, domains: Domains) -> list[dict[str, Any]]:
    """The grants in force in the domains where ``email`` is an approver now: request id, grantee,
    what, state, granted and expiry times."""
    mine = {d.name for d in domains.domains if d.may_approve(email)}
    out = []
    for row in led.access_rows(states=IN_FORCE):
        try:
            req = json.loads(row.body)
        except ValueError:
            continue
        touched = {d["domain"] for d in req["dry_run"]["domains"]}
        if not touched & mine:
            continue
        e = req["dry_run"]["engine"]
        out.append({"request_id": row.request_id, "grantee": row.grantee, "state": row.state,
                    "what": f"role {e['role']}" if e.get("role") else ", ".join(e.get("tables", [])),
                    "database": req["database_name"], "domains": sorted(touched & mine),
                    "granted_at": dt.datetime.fromtimestamp(row.granted_at, dt.timezone.utc).isoformat() if row.granted_at else None,
                    "expires_at": req["expires_at"]})
    return out


def grants_html(grants: list[dict[str, Any]]) -> str:
    if not grants:
        return "<h2>Access grants in force</h2><p class=muted id=no-grants>None in your domains.</p>"
    rows = "".join(f"<tr class=grant><td>{esc(g['request_id'])}</td><td>{esc(g['grantee'])}</td><td>{esc(g['what'])}</td>"
                   f"<td>{esc(g['state'])}</td><td>{esc(g['granted_at'] or '-')}</td>"
                   f"<td class=grant-expiry>{esc(_when(g['expires_at']))}</td></tr>" for g in grants)
    return ("<h2>Access grants in force</h2><table id=grants><tr><th>request</th><th>for</th><th>what</th><th>state</th>"
            f"<th>granted</th><th>expires</th></tr>{rows}</table>")


__all__ = ["IN_FORCE", "access_request_html", "access_request_of", "grants_html", "grants_in_force"]
