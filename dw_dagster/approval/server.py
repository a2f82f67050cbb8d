"""The approver's endpoint: Slack button clicks and a review page (``dw-dagster approvals serve``).

One small Starlette app; every decision goes through :func:`dw_dagster.approval.job.decide`
(the rules of ``shared/design/DESIGN.md`` §4), with an identity proven by:

- ``POST /slack/interactions``: Slack's interactivity Request URL. A click on the Approve /
  Reject buttons of an approval request (:func:`dw_dagster.integrations.slack.decision_buttons`) is verified by
  :class:`dw_dagster.approval.identity.slack.SlackInteractionVerifier` (Slack's v0 request signature, a
  5-minute timestamp window, each signed request accepted once, the user's email from
  ``users.info``) and decided on the version the button carries. The answer is HTTP 200 at once
  with ``{"response_type": "ephemeral", "replace_original": false, "text"}`` (what was recorded,
  or why it was refused); the same reply is posted to the click's ``response_url`` after the
  answer, which is where Slack takes replies to ``block_actions`` from (Slack API docs, "Handling
  user interaction in your Slack apps"). A request that is not a fresh one signed by Slack gets
  401 and changes nothing. Refusals of signed requests are shown as ``dw/approval_refused``.
- the **review page** ``GET /``: the change sets waiting (ledger state proposed or halted, not
  expired) in the domains where the logged-in person is listed as an approver now, each with its
  summary, diff, window, steps with their SQL, blast radius (models, tests, exposures with their
  owners, from the diagnosis the change set names), expiry and approvers, and Approve / Reject
  forms carrying the version shown. ``GET /login`` starts the OpenID Connect authorization code
  flow with PKCE (OpenID Connect Core 1.0 §3.1, RFC 7636): ``state``, ``nonce`` and the
  ``code_verifier`` wait on the server, under the login's cookie; ``GET /callback`` checks ``state`` (RFC 6749
  §10.12) and ``iss`` (RFC 9207), redeems the code and verifies the ID token with the session's
  nonce (:meth:`~dw_dagster.approval.identity.oidc.OidcVerifier.verify`). ``POST /decide`` decides as
  that person (the form's CSRF token must be the session's; each decision consumes its own
  credential, ``<token credential>:<change set>:<version>:<decision>``). ``POST /logout``.
- ``GET /healthz``.

Sessions are server-side (:mod:`dw_dagster.approval.sessions`): the cookie holds an opaque id, the
state (who, until when, the CSRF token) lives in the ledger's database; logout deletes it, so a
cookie saved before logging out, or read by a server on another port of the host, decides nothing.
The CSRF token is written only into the pages, never into the cookie. A login lasts 15 minutes,
then the page goes back to the identity provider. Every value on a page is HTML-escaped; pages are
sent with a restrictive Content-Security-Policy and ``no-store``.
"""

from __future__ import annotations

import datetime as dt
import hmac
import html
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import dagster as dg
import httpx
from dw_dagster.core.extras import missing_extra

try:
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
    from starlette.routing import Route
except ImportError as _e:  # an optional surface: its extra
    raise missing_extra("review", _e) from _e

from dw_dagster.core.domains import ACCESS_GRANT, Domains, DomainsFileError, DomainsSource, resolve_domains
from dw_dagster.core.identity import IdentityError, VerifiedIdentity, canonical_email, credential_digest
from dw_dagster.approval.identity.slack import NotFromSlack, SlackInteractionVerifier, SlackNotConfigured, parse_block_actions
from dw_dagster.core.ledger import FAILED, HALTED, PROPOSED, ledger_for
from dw_dagster.core.models import ChangeSet, Diagnosis, TamperedRecord
from dw_dagster.core import records
from dw_dagster.approval.job import PAST, active_decision, decide, load_change_set, oidc_verifier, refusal_observation
from dw_dagster.core.signing import ApprovalRefused
from dw_dagster.core.records import parse_change_set
from dw_dagster.approval.sessions import LOGIN_SECONDS, SESSION_SECONDS, ReviewSessions, Session

log = logging.getLogger("dw_dagster.approvals")

_MAX_FORM = 16 * 1024
_CREDENTIAL_MAX = 128  # the ledger's credential_id column
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": _CSP, "Cache-Control": "no-store", "X-Frame-Options": "DENY",
            "Referrer-Policy": "same-origin", "X-Content-Type-Options": "nosniff"}


def decision_credential(credential: str, change_set_id: str, version: str, decision: str) -> str:
    """``<credential>:<change set>:<version>:<decision>`` (its SHA-256 when longer than the ledger keeps)."""
    cid = f"{credential}:{change_set_id}:{version}:{decision}"
    return cid if len(cid) <= _CREDENTIAL_MAX else "review:" + credential_digest(cid)


def _ephemeral(text: str) -> dict[str, Any]:
    return {"response_type": "ephemeral", "replace_original": False, "text": text}


def _post_reply(url: str, answer: dict[str, Any]) -> None:
    try:
        httpx.post(url, json=answer, timeout=10)
    except httpx.HTTPError as err:
        log.warning("could not post the reply to the click's response_url: %s", type(err).__name__)


class _Service:
    """What the routes share: the instance (opened once), the domains (read at each request), a write lock."""

    def __init__(self, instance: dg.DagsterInstance | Callable[[], dg.DagsterInstance], domains: DomainsSource,
                 base_url: str) -> None:
        self._instance = instance if isinstance(instance, dg.DagsterInstance) else None
        self._factory = None if self._instance is not None else instance
        self.domains_source = domains
        self.base_url = base_url.rstrip("/")
        self.redirect_uri = self.base_url + "/callback"
        self.lock = threading.Lock()

    def instance(self) -> dg.DagsterInstance:
        with self.lock:
            if self._instance is None:
                self._instance = self._factory()
            return self._instance

    def domains(self) -> Domains:
        doms = resolve_domains(self.domains_source)
        if doms is None:
            raise DomainsFileError("no domains file is configured (set $DW_DOMAINS_FILE or pass --domains)")
        return doms

    def refused(self, change_set_id: str | None, who: str, decision: str, reason: str) -> None:
        """Show a refusal on the change set's target asset (when the change set is known)."""
        if not change_set_id:
            return
        inst = self.instance()
        try:
            cs = load_change_set(ledger_for(inst), change_set_id)
        except TamperedRecord:
            cs = None
        if cs is not None:
            observation = refusal_observation(cs.id, cs.target_asset, who, decision, reason, run_id=None)
            with self.lock:
                inst.report_runless_asset_event(observation)

    def decide(self, identity: VerifiedIdentity, change_set_id: str, version: str, decision: str, comment: str,
               domains: Domains) -> str:
        """Record one decision and log its observation; return its description.

        Raises:
            ApprovalRefused: a rule is broken (also recorded as a refusal).
        """
        inst = self.instance()
        try:
            with self.lock:
                _, observation = decide(inst, change_set_id, decision, identity, domains=domains, comment=comment,
                                        version=version)
                inst.report_runless_asset_event(observation)
        except ApprovalRefused as err:
            self.refused(change_set_id, identity.email, decision, str(err))
            raise
        return observation.description or f"{PAST[decision]} change set {change_set_id}"

    # -- Slack ---------------------------------------------------------------------------------

    def slack_click(self, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any], str | None]:
        """``(status, JSON answer, response_url to post the answer to or None)`` for one interaction request."""
        try:
            doms = self.domains()
        except DomainsFileError as err:
            log.error("Slack click not handled: %s", err)
            return 500, {"ok": False, "error": "the domains file cannot be read"}, None
        settings = doms.identity.slack
        if settings is None:
            return 404, {"ok": False, "error": "Slack interactivity is not configured (identity.slack in the domains "
                                               "file)"}, None
        try:
            identity, action = SlackInteractionVerifier(settings).verify(body, headers, ledger_for(self.instance()))
        except SlackNotConfigured as err:
            log.error("Slack click not handled: %s", err)
            return 500, {"ok": False, "error": str(err)}, None
        except NotFromSlack as err:
            log.warning("refused a request to /slack/interactions: %s", err)
            return 401, {"ok": False, "error": str(err)}, None
        except IdentityError as err:  # signed by Slack: tell the person, and show the refusal
            try:
                _, act = parse_block_actions(body)
            except IdentityError:
                act = None
            if act is not None:
                self.refused(act.change_set_id, f"slack:{act.user_id}", act.decision, str(err))
            return 200, _ephemeral(f"Refused: {err}"), self._reply_url(settings, act.response_url if act else None)
        reply_to = self._reply_url(settings, action.response_url)
        where = f"Slack channel {action.channel_id}, message {action.message_ts}" if action.channel_id else "Slack"
        try:
            what = self.decide(identity, action.change_set_id, action.version, action.decision,
                               f"{action.decision} button in {where}", doms)
        except ApprovalRefused as err:
            return 200, _ephemeral(f"Refused: {err}"), reply_to
        return 200, _ephemeral(f"Recorded: {what}."), reply_to

    @staticmethod
    def _reply_url(settings: Any, url: str | None) -> str | None:
        """``url`` if replies may be posted there: Slack's https hooks host, or the configured API's host (a fake)."""
        if not url:
            return None
        got, api = urlsplit(url), urlsplit(settings.api_url)
        if got.scheme == "https" and got.hostname == "hooks.slack.com":
            return url
        return url if (got.scheme, got.netloc) == (api.scheme, api.netloc) else None

    # -- the review page -----------------------------------------------------------------------

    def pending(self, email: str, domains: Domains) -> list[tuple[ChangeSet, Diagnosis | None, str]]:
        """Change sets waiting for ``email`` now: ``(change set, its diagnosis, a note or "")``, newest first."""
        inst = self.instance()
        led = ledger_for(inst)
        out = []
        for row in led.change_set_rows(states=[PROPOSED, HALTED, FAILED]):  # a failed repair may be finished
            if row.expires_at <= time.time():
                continue
            try:
                cs = parse_change_set(row.body)
                domain = domains.get(cs.domain)
            except TamperedRecord as err:
                records.quarantine(inst, f"change_set:{row.change_set_id}:{row.version}", "change_set",
                                   row.target_asset, str(err))
                continue
            except KeyError:
                continue
            if not domain.may_decide(email, cs.created_at, dt.datetime.now(dt.timezone.utc)):
                continue  # a listed approver, or an escalation approver once escalate_after has passed
            note = ""
            decided = active_decision(led, cs) if row.state != FAILED else None
            if decided is not None:
                note = f"already {PAST[decided.decision]} by {decided.approver}"
            elif email == cs.proposer.strip().lower():
                note = "you proposed it, so you cannot approve it"
            elif email in {e.strip().lower() for e in cs.excluded_approvers}:
                note = "it is for you, so you cannot approve it"
            diag = None if ACCESS_GRANT in cs.change_classes else next((
                d for d in records.diagnoses(inst, [dg.AssetKey(cs.target_asset)]) if d.id == cs.diagnosis_id),
                        None)
            out.append((cs, diag, note))
        return out


# -- HTML --------------------------------------------------------------------------------------

esc = html.escape  # every value on a page goes through it (quotes too: attributes are quoted)
_STYLE = """body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f4f5f7}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;gap:16px;align-items:center}
header form{margin-left:auto}main{max-width:1100px;margin:0 auto;padding:16px 24px}
article{background:#fff;border:1px solid #d8dbe2;border-radius:8px;padding:16px 20px;margin:16px 0}
h2{margin:0 0 4px}dl{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px}dt{font-weight:600}
dd{margin:0}pre{background:#f6f8fa;border:1px solid #d8dbe2;padding:8px;overflow:auto;font-size:13px}
.add{color:#116329}.del{color:#82071e}.note{color:#8a4b00;font-weight:600}.muted{color:#5b6372}
button{font-size:15px;padding:6px 18px;border-radius:6px;border:1px solid #888;cursor:pointer;margin-right:8px}
button.approve{background:#1f883d;color:#fff;border-color:#1a7f37}button.reject{background:#cf222e;color:#fff}
.result{font-size:17px;padding:12px 16px;border-radius:8px}.ok{background:#dafbe1}.refused{background:#ffebe9}"""


def _page(title: str, body: str, who: Session | None = None, status: int = 200) -> HTMLResponse:
    bar = "<strong>dw-dagster approvals</strong>"
    if who:
        until = dt.datetime.fromtimestamp(who["until"], dt.timezone.utc).strftime("%H:%M UTC")
        bar += (f"<span>Signed in as <b id=who>{esc(who['email'])}</b> (verified by OIDC issuer "
                f"{esc(who['iss'])}), until {until}</span>"
                f"<form method=post action=/logout><input type=hidden name=csrf value=\"{esc(who['csrf'])}\">"
                f"<button type=submit>Log out</button></form>")
    doc = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)}</title>"
           f"<style>{_STYLE}</style></head><body><header>{bar}</header><main>{body}</main></body></html>")
    return HTMLResponse(doc, status_code=status, headers=_HEADERS)


def _message(title: str, text: str, status: int, who: Session | None = None, ok: bool = False) -> HTMLResponse:
    return _page(title, f"<h1>{esc(title)}</h1><p class=\"result {'ok' if ok else 'refused'}\" id=result>{esc(text)}</p>"
                        "<p><a href=\"/\">Back to the change sets waiting for you</a></p>", who, status)


def _diff_html(diff: str) -> str:
    lines = []
    for line in diff.splitlines():
        cls = "add" if line.startswith("+") and not line.startswith("+++") else (
            "del" if line.startswith("-") and not line.startswith("---") else "")
        lines.append(f"<span class={cls}>{esc(line)}</span>" if cls else esc(line))
    return "<pre class=diff>" + ("\n".join(lines) or "(no code change)") + "</pre>"


def _list(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else "<p class=muted>none</p>"


def _needed_by_html(x: Any) -> str:
    """`` — needed by 08:00 America/Chicago (next: 2026-12-07 08:00 CST)`` for an exposure with ``meta.dw.needed_by``."""
    if not getattr(x, "needed_by", None):
        return ""
    from dw_dagster.lineage.deadlines import NeededByError, parse_needed_by

    try:
        nxt = parse_needed_by(x.needed_by, after=dt.datetime.now(dt.timezone.utc))
        when = f" (next: {nxt:%Y-%m-%d %H:%M %Z})"
    except NeededByError as e:
        when = f" ({e})"
    return f" — <strong>needed by {esc(x.needed_by)}</strong>{esc(when)}"


def _blast_html(diag: Diagnosis | None, cs: ChangeSet) -> str:
    if diag is None:
        return f"<p class=note>Diagnosis {esc(cs.diagnosis_id)} is not in the event log: the blast radius is unknown.</p>"
    br = diag.blast_radius

    def node(n: Any) -> str:
        owners = f" — owners {esc(', '.join(n.owners))}" if n.owners else ""
        return f"{esc(n.name)} <span class=muted>({esc(n.resource_type)}, depth {n.depth})</span>{owners}"

    def exposure(x: Any) -> str:
        owner = " — owner " + esc(" ".join(p for p in (x.owner_name or "", f"<{x.owner_email}>" if x.owner_email else "")
                                         if p)) if (x.owner_name or x.owner_email) else ""
        kind = f" ({esc(x.type)})" if x.type else ""
        return f"{esc(x.label or x.name)}{kind}{owner}{_needed_by_html(x)}"

    return (f"<div class=blast><h4>Models ({len(br.models)})</h4>{_list([node(m) for m in br.models])}"
            f"<h4>Tests ({len(br.tests)})</h4>{_list([node(t) for t in br.tests])}"
            f"<h4>Exposures ({len(br.exposures)})</h4>{_list([exposure(x) for x in br.exposures])}"
            f"<h4>Owners</h4><p>{esc(', '.join(br.owners)) or 'none'}</p></div>")


def _steps_html(cs: ChangeSet) -> str:
    if not cs.steps:
        return "<p class=muted>none (no warehouse change besides the window rerun and the rebuild)</p>"
    items = []
    for s in cs.steps:
        rows = f", {s.expected_rows:,} rows" if s.expected_rows is not None else ""
        sql = "<pre class=sql>" + esc(";\n".join(s.sql) + (";" if s.sql else "")) + "</pre>" if s.sql else ""
        back = ("<p>Rollback:</p><pre class=sql>" + esc(";\n".join(s.rollback_sql) + ";") + "</pre>"
                if s.rollback_sql else "")
        items.append(f"<li><b>{esc(s.summary)}</b> <span class=muted>({esc(s.kind)}, {esc(s.change_class)}, "
                     f"resource {esc(s.resource_key)}{rows})</span>{sql}{back}</li>")
    return "<ol>" + "".join(items) + "</ol>"


def _when(t: dt.datetime) -> str:
    left = t - dt.datetime.now(dt.timezone.utc)
    hours, rest = divmod(max(0, int(left.total_seconds())), 3600)
    return f"{t.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M UTC} (in {hours} h {rest // 60:02d} min)"


def _change_set_html(cs: ChangeSet, diag: Diagnosis | None, note: str, csrf: str) -> str:
    from dw_dagster.approval.access_view import access_request_html, access_request_of

    access = access_request_of(cs)
    window = ", ".join(cs.window) + "".join(f" ({line})" for line in cs.not_run_lines())
    if note:
        form = f"<p class=note>{esc(note)}</p>"
    else:
        hidden = (f"<input type=hidden name=csrf value=\"{esc(csrf)}\"><input type=hidden name=cs value=\"{esc(cs.id)}\">"
                  f"<input type=hidden name=v value=\"{esc(cs.version)}\">")
        form = (f"<form method=post action=/decide class=decide>{hidden}"
                f"<p><label>Comment <input name=comment size=60 maxlength=500></label></p>"
                f"<button type=submit class=approve name=decision value=approve data-cs=\"{esc(cs.id)}\">Approve</button>"
                f"<button type=submit class=reject name=decision value=reject data-cs=\"{esc(cs.id)}\">Reject</button>"
                f"<span class=muted>deciding on version {esc(cs.version[:12])}…; "
                "a changed change set needs a new look</span>"
                "</form>")
    return (f"<article class=cs id=\"{esc(cs.id)}\"><h2>Change set {esc(cs.id)}</h2>"
            f"<p class=muted>version {esc(cs.version)} · proposed by {esc(cs.proposer)} at "
            f"{cs.created_at:%Y-%m-%d %H:%M UTC}</p>"
            f"<p class=summary>{esc(cs.summary)}</p><dl>"
            f"<dt>Asset</dt><dd>{esc('/'.join(cs.target_asset))}</dd>"
            f"<dt>Domain</dt><dd>{esc(cs.domain)}</dd>"
            f"<dt>Cause</dt><dd>{esc(cs.cause_kind)} (incident {esc(cs.incident_id)}, diagnosis {esc(cs.diagnosis_id)})</dd>"
            f"<dt>Window</dt><dd class=window>{esc(window)}</dd>"
            f"<dt>Rows to recover</dt><dd>{cs.expected_recovered_rows:,}</dd>"
            f"<dt>Rebuild</dt><dd>{esc(', '.join('/'.join(k) for k in cs.rebuild_assets)) or 'nothing'}</dd>"
            f"<dt>New tests</dt><dd>{esc(', '.join(cs.new_tests)) or 'none'}</dd>"
            f"<dt>Expires</dt><dd class=expires>{esc(_when(cs.expires_at))}</dd>"
            f"<dt>Approvers</dt><dd>{esc(', '.join(cs.approvers))} (the domain's list as it is now decides)</dd>"
            f"<dt>Undo</dt><dd>{esc(cs.undo) or 'n/a'}</dd></dl>"
            + (f"<h3>Access request</h3>{access_request_html(cs, access)}<h3>Statements</h3>{_steps_html(cs)}"
               if access is not None else
               f"<h3>Diff</h3>{_diff_html(cs.diff)}<h3>Steps</h3>{_steps_html(cs)}<h3>Blast radius</h3>{_blast_html(diag, cs)}")
            + f"{form}</article>")


# -- the app -----------------------------------------------------------------------------------

def _redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers=_HEADERS)


def build_app(instance: dg.DagsterInstance | Callable[[], dg.DagsterInstance], domains: DomainsSource, *,
              base_url: str, dagster_url: str = "http://localhost:3000", extra_routes: "list | tuple" = ()) -> Starlette:
    """The approvals app (see the module docstring).

    Args:
        instance: the Dagster instance holding the ledger, or a callable opening it (called once).
        domains: where the domains come from (a path, read at every request so the approvers
            listed *now* count; or a :class:`~dw_dagster.core.domains.Domains`).
        base_url: the public URL of this server (``/callback`` under it is the OIDC redirect URI,
            ``/slack/interactions`` Slack's Request URL); its origin binds the sessions this server
            makes; https makes the cookie ``Secure`` and ``__Host-`` prefixed.
        dagster_url: the Dagster UI, for run and asset links on the read-only pages
            (:mod:`dw_dagster.approval.board`: incidents and change sets, for anyone signed in).
        extra_routes: more Starlette routes served beside these (the access request slash command,
            :func:`dw_dagster.access.slack.access_routes`).

    ``app.state.sessions`` is the :class:`~dw_dagster.approval.sessions.ReviewSessions` of the app,
    for pages added to it.
    """
    svc = _Service(instance, domains, base_url)
    sessions = ReviewSessions(lambda: ledger_for(svc.instance()), svc.base_url)
    app = Starlette(routes=_ReviewRoutes(svc, sessions).routes(extra_routes, dagster_url))
    app.state.service = svc
    app.state.sessions = sessions
    return app


class _ReviewRoutes:
    """The app's routes over one service and its sessions: the review page, its login (OIDC with
    PKCE), decisions and logout, Slack's interactions, and the read-only board."""

    def __init__(self, svc: _Service, sessions: ReviewSessions) -> None:
        self.svc, self.sessions, self.origin = svc, sessions, sessions.origin

    def routes(self, extra_routes, dagster_url: str) -> list:
        from dw_dagster.approval.board import board_routes

        routes = [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/slack/interactions", self.slack_interactions, methods=["POST"]),
            Route("/", self.review, methods=["GET"]),
            Route("/login", self.login, methods=["GET"]),
            Route("/callback", self.callback, methods=["GET"]),
            Route("/decide", self.decide_route, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            *extra_routes,
        ]
        return routes + board_routes(self.svc, self._reader, dagster_url=dagster_url)  # read-only, for anyone signed in

    def _reader(self, request: Request) -> dict[str, Any] | None:  # the board reads the signed-in person as a mapping
        who = self._who(request)
        return None if who is None else {"email": who.email, "iss": who.iss, "sub": who.sub}

    def _who(self, request: Request) -> Session | None:
        return self.sessions.current(request)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def slack_interactions(self, request: Request) -> Response:
        body = await request.body()
        status, answer, reply_to = await run_in_threadpool(self.svc.slack_click, body, dict(request.headers))
        task = BackgroundTask(_post_reply, reply_to, answer) if reply_to else None
        return JSONResponse(answer, status_code=status, background=task)

    async def review(self, request: Request) -> Response:
        who = await run_in_threadpool(self._who, request)
        if who is None:
            hint = request.query_params.get("login_hint")
            return _redirect("/login" + (f"?login_hint={quote(hint, safe='@')}" if hint else ""))
        try:
            doms = self.svc.domains()
            found = await run_in_threadpool(self.svc.pending, who["email"], doms)
        except DomainsFileError as err:
            return _message("Cannot read the domains file", str(err), 500, who)
        if not found:
            body = ("<p><a href=\"/incidents\">Incidents</a> · <a href=\"/change-sets\">Change sets</a> "
                    "(read-only, for everyone signed in)</p>"
                    f"<h1>Nothing waits for you</h1><p id=empty>No pending change set in a domain where "
                    f"{esc(who['email'])} is listed as an approver.</p>")
        else:
            body = (f"<h1>{len(found)} change set{'s' if len(found) > 1 else ''} waiting for your decision</h1>"
                    + "".join(_change_set_html(cs, diag, note, who["csrf"]) for cs, diag, note in found))
        from dw_dagster.approval.access_view import grants_html, grants_in_force

        body += grants_html(await run_in_threadpool(grants_in_force, ledger_for(self.svc.instance()), who["email"], doms))
        from dw_dagster.approval.autonomy_view import autonomy_for, autonomy_html

        mine = sorted({cs.domain for cs, _, _ in found}) or [d.name for d in doms.domains if who["email"] in d.approvers]
        if mine:  # a person listed nowhere sees no domain's record
            body += autonomy_html(await run_in_threadpool(autonomy_for, self.svc.instance(), mine), doms)
        return _page("Change sets waiting for you", body, who)

    async def login(self, request: Request) -> Response:
        try:
            doms = self.svc.domains()
            verifier = oidc_verifier(doms)
            discovery = await run_in_threadpool(verifier.discovery)
        except (DomainsFileError, ApprovalRefused, IdentityError) as err:
            return _message("Cannot log in", str(err), 500)
        from dw_dagster.approval.identity.oidc import authorization_url, pkce_pair

        code_verifier, challenge = pkce_pair()
        pending = {"state": secrets.token_urlsafe(32), "nonce": secrets.token_urlsafe(32), "verifier": code_verifier,
                   "at": time.time()}
        hint = (request.query_params.get("login_hint") or "").strip()
        try:
            hint = canonical_email(hint) if hint and len(hint) <= 320 else ""
        except IdentityError:
            hint = ""
        url = authorization_url(verifier.settings, discovery, redirect_uri=self.svc.redirect_uri, state=pending["state"],
                                nonce=pending["nonce"], code_challenge=challenge, login_hint=hint or None)
        response = _redirect(url)
        await run_in_threadpool(self.sessions.begin_login, response, pending)
        return response

    async def callback(self, request: Request) -> Response:
        pending = await run_in_threadpool(self.sessions.take_login, request)
        q = request.query_params
        if not isinstance(pending, dict) or not 0 <= time.time() - pending.get("at", 0) < LOGIN_SECONDS:
            return _message("Log in again", "This login was not started here, or took longer than "
                            f"{LOGIN_SECONDS // 60} minutes: start again from the review page.", 400)
        if not hmac.compare_digest(q.get("state", "").encode(), pending["state"].encode()):
            return _message("Login refused", "state mismatch: the redirect does not answer the login started here "
                            "(RFC 6749 §10.12)", 400)
        try:
            doms = self.svc.domains()
            verifier = oidc_verifier(doms)
        except (DomainsFileError, ApprovalRefused) as err:
            return _message("Cannot log in", str(err), 500)
        if "iss" in q and q["iss"] != verifier.settings.issuer:
            return _message("Login refused", f"the redirect names issuer {q['iss']!r}, not {verifier.settings.issuer!r} "
                            "(RFC 9207)", 400)
        if "error" in q:
            desc = f" ({q['error_description']})" if q.get("error_description") else ""
            return _message("Login refused", f"the identity provider refused the login: {q['error']}{desc}", 403)
        if not q.get("code"):
            return _message("Login refused", "the redirect carries no authorization code", 400)

        def finish() -> VerifiedIdentity:
            from dw_dagster.approval.identity.oidc import exchange_code

            answer = exchange_code(verifier.settings, q["code"], self.svc.redirect_uri, pending["verifier"],
                                   discovery=verifier.discovery())
            return verifier.verify(answer["id_token"], nonce=pending["nonce"])

        try:
            identity = await run_in_threadpool(finish)
        except IdentityError as err:
            return _message("Login refused", f"the ID token was refused: {err}", 403)
        response = _redirect("/")
        await run_in_threadpool(lambda: self.sessions.start(response, email=identity.email, iss=identity.issuer or "",
                                                       sub=identity.subject or "", cred=identity.credential_id or ""))
        return response

    async def form_of(self, request: Request) -> dict[str, str] | None:
        body = await request.body()
        if len(body) > _MAX_FORM:
            return None
        return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}

    def same_origin(self, request: Request) -> bool:
        sent = request.headers.get("origin")
        return sent is None or sent == self.origin

    async def decide_route(self, request: Request) -> Response:
        who = await run_in_threadpool(self._who, request)
        if who is None:
            return _redirect("/login")  # no decision without a live session; an expired or ended one logs in again
        form = await self.form_of(request)
        if form is None or not self.same_origin(request) or not self.sessions.csrf_ok(who, form.get("csrf")):
            return _message("Refused", "this form does not come from your review page (its CSRF token or origin "
                            "does not match your session): nothing was decided", 403, who)
        cs_id, version, decision = form.get("cs", ""), form.get("v", ""), form.get("decision", "")
        if decision not in PAST or not cs_id or not version:
            return _message("Refused", "the form names no change set, version and decision (approve or reject)", 400, who)
        identity = VerifiedIdentity(
            email=who["email"], method="oidc", issuer=who["iss"], subject=who["sub"],
            verified_at=dt.datetime.fromtimestamp(who["at"], dt.timezone.utc),
            credential_id=decision_credential(who["cred"], cs_id, version, decision),
            detail=f"verified by OIDC issuer {who['iss']} (review page login)")
        try:
            doms = self.svc.domains()
            what = await run_in_threadpool(self.svc.decide, identity, cs_id, version, decision,
                                           (form.get("comment") or "")[:500], doms)
        except DomainsFileError as err:
            return _message("Cannot read the domains file", str(err), 500, who)
        except ApprovalRefused as err:
            return _message("Refused", f"Refused: {err}", 409, who)
        return _message(f"Change set {cs_id} {PAST[decision]}", f"Recorded: {what}.", 200, who, ok=True)

    async def logout(self, request: Request) -> Response:
        who = await run_in_threadpool(self._who, request)
        form = await self.form_of(request) or {}
        if who is not None and not self.sessions.csrf_ok(who, form.get("csrf")):
            return _message("Refused", "this form does not come from your review page", 403, who)
        response = _page("Logged out", "<h1>Logged out</h1><p>Your session has ended on the server: a copy of its "
                         "cookie decides nothing. <a href=\"/login\">Log in again</a></p>")
        await run_in_threadpool(self.sessions.end, request, response)
        return response


__all__ = ["SESSION_SECONDS", "build_app", "decision_credential"]
