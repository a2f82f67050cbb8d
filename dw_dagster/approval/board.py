"""One place both teams read: the review site's read-only pages of incidents and change sets.

Anyone signed in through the review site's OIDC login (the same session as the review page) can
read — nobody decides here; deciding stays on the review page, by the listed approvers (and, once
``escalate_after`` has passed, the escalation approvers):

- ``GET /incidents``: every incident in the ledger, newest first, with its state;
- ``GET /incidents/{id}``: the incident's timeline — detected (gap, failing slices), the diagnosis
  (the sentence with its numbers, the evidence queries with sample values masked by the domains
  file's ``review.sensitive`` rules), every change set version and what happened to it, decisions
  and refusals (a refusal is shown as one, never as a failed run), ladder steps, stages with their
  run links and the repair's progress ("stage 3 of 5: rebuild running"), receipts with their
  verdict and evidence SQL, and what was told where;
- ``GET /change-sets`` and ``GET /change-sets/{id}``: the same for one change set, every version.

Every notification dw_dagster sends links to these pages (:mod:`dw_dagster.core.links`). Every
value is HTML-escaped; the pages carry the review site's Content-Security-Policy and ``no-store``.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Callable
from typing import Any

from dw_dagster.core.extras import missing_extra

try:
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, RedirectResponse, Response
    from starlette.routing import Route
except ImportError as _e:  # an optional surface: its extra
    raise missing_extra("review", _e) from _e

from dw_dagster.approval.story import Story, change_set_story, incident_story
from dw_dagster.core.ledger import ledger_for

esc = html.escape
_CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
_HEADERS = {"Content-Security-Policy": _CSP, "Cache-Control": "no-store", "X-Frame-Options": "DENY",
            "Referrer-Policy": "same-origin", "X-Content-Type-Options": "nosniff"}
_STYLE = """body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f4f5f7}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;gap:18px;align-items:center}header a{color:#fff}
main{max-width:1100px;margin:0 auto;padding:16px 24px}table{border-collapse:collapse;width:100%;background:#fff}
td,th{border:1px solid #d8dbe2;padding:6px 10px;text-align:left;vertical-align:top}
ol.timeline{list-style:none;padding:0}ol.timeline li{background:#fff;border:1px solid #d8dbe2;border-left:5px solid #8c95a6;
border-radius:6px;padding:10px 14px;margin:10px 0}li.ok{border-left-color:#1f883d}li.bad{border-left-color:#cf222e}
li.refused{border-left-color:#bf8700}.when{color:#5b6372;font-size:13px}.kind{font-weight:600;text-transform:uppercase;
font-size:12px;color:#5b6372;margin-right:8px}pre{background:#f6f8fa;border:1px solid #d8dbe2;padding:8px;overflow:auto;
font-size:13px}.progress{font-size:17px;font-weight:600}.note{color:#8a4b00;font-weight:600}"""


def _page(title: str, body: str, who: dict[str, Any], status: int = 200) -> HTMLResponse:
    bar = (f"<strong>dw-dagster</strong><a href=\"/\">Waiting for me</a><a href=\"/incidents\">Incidents</a>"
           f"<a href=\"/change-sets\">Change sets</a><span>Signed in as <b id=who>{esc(who['email'])}</b> (read-only "
           "here)</span>")
    doc = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)}</title><style>{_STYLE}</style>"
           f"</head><body><header>{bar}</header><main>{body}</main></body></html>")
    return HTMLResponse(doc, status_code=status, headers=_HEADERS)


def _when(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _links(links: list[tuple[str, str]]) -> str:
    safe = [(h, t) for h, t in links if h and (h.startswith("/") or h.startswith("http://") or h.startswith("https://"))]
    return " · ".join(f"<a href=\"{esc(h)}\">{esc(t)}</a>" for h, t in safe)


def _timeline_html(story: Story) -> str:
    items = []
    for e in story.timeline:
        lines = "".join(f"<div>{esc(line)}</div>" for line in e.lines if line)
        sql = "".join(f"<pre class=sql>{esc(q)}</pre>" for q in e.sql if q)
        links = f"<div>{_links(e.links)}</div>" if e.links else ""
        items.append(f"<li class=\"{esc(e.css)} {esc(e.kind)}\"><span class=kind>{esc(e.kind)}</span>"
                     f"<b>{esc(e.title)}</b> <span class=when>{esc(_when(e.at))}</span>{lines}{sql}{links}</li>")
    return "<ol class=timeline>" + "".join(items) + "</ol>" if items else "<p>Nothing recorded yet.</p>"


def _versions_html(story: Story) -> str:
    rows = []
    for v in story.versions:
        cs = v.change_set
        decided = "; ".join(f"{d['decision']} by {d['approver']} ({d['method']})" + ("" if d["active"] else " withdrawn")
                            for d in v.decisions) or "none"
        rows.append(f"<tr><td><a href=\"/change-sets/{esc(cs.id)}\">{esc(cs.id)}</a><br><code>{esc(cs.version[:12])}</code>"
                    f"</td><td>{esc(v.state)}</td><td class=progress>{esc(v.progress)}</td><td>{esc(decided)}</td>"
                    f"<td>{esc(cs.summary)}</td></tr>")
    if not rows:
        return "<p>No change set proposed.</p>"
    return ("<table class=versions><tr><th>change set, version</th><th>state</th><th>progress</th><th>decisions</th>"
            "<th>summary</th></tr>" + "".join(rows) + "</table>")


def _unreachable_html(story: Story) -> str:
    if not story.unreachable:
        return ""
    items = "".join(f"<li>{esc(u['email'])} (change set {esc(u['change_set_id'])}, {esc(u['channel'])}): "
                    f"{esc(u['reason'])}</li>" for u in story.unreachable)
    return f"<h2>Could not be reached</h2><ul class=unreachable>{items}</ul>"


def _story_html(story: Story) -> str:
    head = f"<h1>{esc(story.title)}</h1>"
    if story.incident is not None:
        inc = story.incident
        head += (f"<p class=state>Incident <a href=\"/incidents/{esc(inc.id)}\">{esc(inc.id)}</a> on "
                 f"<code>{esc('/'.join(inc.asset_key))}</code>: <b>{esc(story.incident_state)}</b>"
                 + (f" — {esc(story.incident_note)}" if story.incident_note else "") + "</p>")
    if story.diagnosis is not None and story.diagnosis.primary is not None:
        p, d = story.diagnosis.primary, story.diagnosis
        head += (f"<p class=why><b>Why:</b> {esc(p.summary)} (explains {p.explained_rows:,} of {d.gap_rows:,} rows, "
                 f"confidence {p.confidence:.0%}; {d.unexplained_rows:,} unexplained)</p>")
    running = [v for v in story.versions if v.state in ("approved", "running", "halted")]
    if running:
        head += f"<p class=progress>Repair: {esc(running[-1].progress)}</p>"
    return (head + "<h2>Change sets</h2>" + _versions_html(story) + _unreachable_html(story)
            + "<h2>Timeline</h2>" + _timeline_html(story))


def board_routes(service: Any, who_of: Callable[[Request], dict[str, Any] | None], *,
                 dagster_url: str = "http://localhost:3000") -> list[Route]:
    """The read-only routes, for :func:`dw_dagster.approval.server.build_app`.

    Args:
        service: the review app's service (``instance()``, ``domains()``).
        who_of: the signed-in person of a request (the review page's session), or None.
        dagster_url: the Dagster UI, for run and asset links.
    """
    def mask():
        from dw_dagster.lineage.sensitive import masker

        try:
            return masker(service.domains())
        except Exception:  # noqa: BLE001 - no domains file: the built-in rules still mask
            return masker(None)

    def signed_in(request: Request) -> dict[str, Any] | Response:
        who = who_of(request)
        if who is None:
            return RedirectResponse("/login", status_code=303, headers=_HEADERS)
        return who

    async def incidents(request: Request) -> Response:
        who = signed_in(request)
        if isinstance(who, Response):
            return who
        rows = await run_in_threadpool(lambda: ledger_for(service.instance()).incidents(limit=500))
        body = "".join(f"<tr><td><a href=\"/incidents/{esc(r.incident_id)}\">{esc(r.incident_id)}</a></td>"
                       f"<td>{esc(r.asset_key)}</td><td>{esc(r.source)}</td><td>{esc(r.state)}</td>"
                       f"<td>{esc(_when(dt.datetime.fromtimestamp(r.opened_at, dt.timezone.utc)))}</td></tr>"
                       for r in sorted(rows, key=lambda r: r.opened_at, reverse=True))
        return _page("Incidents", "<h1>Incidents</h1><table class=incidents><tr><th>incident</th><th>asset</th>"
                     "<th>source</th><th>state</th><th>opened</th></tr>" + body + "</table>", who)

    async def change_sets(request: Request) -> Response:
        who = signed_in(request)
        if isinstance(who, Response):
            return who
        rows = await run_in_threadpool(lambda: ledger_for(service.instance()).change_set_rows(limit=500))
        body = "".join(f"<tr><td><a href=\"/change-sets/{esc(r.change_set_id)}\">{esc(r.change_set_id)}</a></td>"
                       f"<td>{esc(r.target_asset)}</td><td>{esc(r.state)}</td>"
                       f"<td><a href=\"/incidents/{esc(r.incident_id)}\">{esc(r.incident_id)}</a></td></tr>" for r in rows)
        return _page("Change sets", "<h1>Change sets</h1><table class=change-sets><tr><th>change set</th><th>asset</th>"
                     "<th>state</th><th>incident</th></tr>" + body + "</table>", who)

    async def incident(request: Request) -> Response:
        who = signed_in(request)
        if isinstance(who, Response):
            return who
        iid = request.path_params["incident_id"]
        story = await run_in_threadpool(lambda: incident_story(service.instance(), iid, dagster_url=dagster_url,
                                                               mask=mask()))
        if story is None:
            return _page("Not found", f"<h1>No incident {esc(iid)}</h1>", who, 404)
        return _page(story.title, _story_html(story), who)

    async def change_set(request: Request) -> Response:
        who = signed_in(request)
        if isinstance(who, Response):
            return who
        cid = request.path_params["change_set_id"]
        story = await run_in_threadpool(lambda: change_set_story(service.instance(), cid, dagster_url=dagster_url,
                                                                 mask=mask()))
        if story is None:
            return _page("Not found", f"<h1>No change set {esc(cid)}</h1>", who, 404)
        return _page(story.title, _story_html(story), who)

    return [Route("/incidents", incidents, methods=["GET"]), Route("/incidents/{incident_id}", incident, methods=["GET"]),
            Route("/change-sets", change_sets, methods=["GET"]),
            Route("/change-sets/{change_set_id}", change_set, methods=["GET"])]


__all__ = ["board_routes"]
