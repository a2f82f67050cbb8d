"""``dw-dagster`` commands that decide: approve, approvals token, change-sets, stop/resume, holds, incidents.

Every decision needs a verified identity (:mod:`dw_dagster.approval.identity`): ``--login`` runs the
identity provider's login in a browser (authorization code with PKCE, RFC 7636, on a loopback
redirect, RFC 8252) with a ``nonce`` that binds the ID token to this one decision; ``--id-token``
/ ``--id-token-file`` take a token obtained that way (``dw-dagster approvals token``). A typed
``--approver`` is accepted only by a domain that opted into ``identity: unverified``.
Exit codes: 0 done; 2 usage error; 3 refused by a rule (the message says which).
"""

from __future__ import annotations

import json
import os
import sys
import webbrowser
from pathlib import Path

import click

from dw_dagster.core import keys as c

domains_option = click.option(
    "--domains", "domains_file", type=click.Path(dir_okay=False), default=None,
    help="The domains file (approvers, identity provider); default $DW_DOMAINS_FILE.")
token_options = [
    click.option("--id-token", default=None, help="An ID token bound to this decision (`dw-dagster approvals token` "
                 "prints one: for a change set, --resume, or --lift-hold ASSET)."),
    click.option("--id-token-file", type=click.Path(dir_okay=False, exists=True), default=None,
                 help="A file holding such a token."),
    click.option("--login", is_flag=True, help="Log in at the identity provider now (opens a browser; prints the URL)."),
    click.option("--login-hint", default=None, help="Your email, passed to the provider's login page."),
]


def _token_opts(f):
    for opt in reversed(token_options):
        f = opt(f)
    return f


def _domains(domains_file: str | None):
    from dw_dagster.core.domains import DomainsFileError, load_domains

    path = domains_file or os.environ.get("DW_DOMAINS_FILE")
    if not path:
        raise click.UsageError("no domains file: pass --domains or set $DW_DOMAINS_FILE (who is listed now, and "
                               "how they prove it, live there)")
    try:
        return load_domains(path)
    except DomainsFileError as e:
        raise click.UsageError(str(e)) from e


def _open_url(url: str) -> None:
    click.echo(f"Log in to decide: {url}", err=True)
    try:
        webbrowser.open(url)
    except Exception:  # noqa: BLE001 - the printed URL is enough
        pass


def _token(domains, nonce: str, id_token: str | None, id_token_file: str | None, login: bool, login_hint: str | None) -> str:
    """The ID token for one decision, from the options (or an interactive login)."""
    given = [x for x in (id_token, id_token_file, login or None) if x]
    if len(given) > 1:
        raise click.UsageError("give one of --id-token, --id-token-file, --login")
    if id_token:
        return id_token.strip()
    if id_token_file:
        return Path(id_token_file).read_text().strip()
    if login:
        from dw_dagster.core.identity import IdentityError
        from dw_dagster.approval.identity.oidc import login as oidc_login

        if domains.identity.oidc is None:
            raise click.UsageError("the domains file names no OIDC provider (identity.oidc): --login needs one")
        try:
            return oidc_login(domains.identity.oidc, nonce=nonce, open_url=_open_url, login_hint=login_hint)
        except IdentityError as e:
            click.echo(f"refused: login failed: {e}", err=True)
            sys.exit(3)
    return ""


def _instance(dagster_home):
    from dw_dagster.cli.main import _instance as open_instance

    return open_instance(dagster_home)


def _key_or_exit() -> None:
    from dw_dagster.approval.job import ApprovalRefused, signing_key

    try:
        signing_key()
    except ApprovalRefused as e:
        raise click.UsageError(str(e)) from e


def _check_signing_key(instance) -> None:
    """Refuse to record a decision that could never count: a key other than the one kept with the
    instance (``$DAGSTER_HOME/approval_signing.key``, as the demo keeps it)."""
    from dw_dagster.approval.job import signing_key

    key_file = Path(os.environ["DAGSTER_HOME"]) / "approval_signing.key"
    kept = key_file.read_text().strip() if key_file.is_file() else ""
    if kept and kept.encode() != signing_key():
        raise click.UsageError(f"${c.SIGNING_KEY_ENV} is not the key kept with this instance ({key_file}); a decision "
                               "signed with it would be ignored")


def _decidable_or_exit(instance, cs, decision: str = "approve") -> None:
    """Exit 3 when the change set can take no decision now (decided, expired, done), naming why. A repair
    that failed takes an approval that finishes it (the stages that succeeded stay done)."""
    from dw_dagster.core.ledger import FAILED, HALTED, PROPOSED, ledger_for
    from dw_dagster.core.models import utcnow

    row = ledger_for(instance).change_set_row(cs.id, cs.version)
    finishing = row is not None and row.state == FAILED and row.latest and decision == "approve"
    why = None
    if row is not None and row.state not in (PROPOSED, HALTED) and not finishing:
        why = f"change set {cs.id} is {row.state}; it takes no decision now"
    elif not finishing and ledger_for(instance).active_decision(cs.id, cs.version) is not None:
        why = f"change set {cs.id} was already decided; a decision is single-use"
    elif utcnow() >= cs.expires_at:
        why = f"change set {cs.id} expired at {cs.expires_at.isoformat()}; ask for a new proposal"
    if why:
        click.echo(f"refused: {why}", err=True)
        sys.exit(3)


@click.command()
@click.argument("change_set_id")
@_token_opts
@click.option("--approver", default=None, help="Your email, typed: only for a domain with identity: unverified.")
@click.option("--reject", is_flag=True, help="Reject instead of approve (ends this version).")
@click.option("--comment", default="", help="Why.")
@domains_option
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
def approve(change_set_id, id_token, id_token_file, login, login_hint, approver, reject, comment, domains_file,
            dagster_home):
    """Approve (or --reject) a change set, as a verified approver, by running the approval job.

    Exit codes: 0 recorded; 2 usage error; 3 refused by a rule (the message says which).
    """
    from dw_dagster.core.identity import decision_nonce
    from dw_dagster.core import records
    from dw_dagster.approval.job import approve_in_process

    if approver is not None and len(approver) > 320:
        raise click.BadParameter("is longer than an email address can be (320 characters)", param_hint="--approver")
    domains = _domains(domains_file)
    _key_or_exit()
    decision = "reject" if reject else "approve"
    with _instance(dagster_home) as instance:
        cs = records.find_change_set(instance, change_set_id.strip())
        if cs is None:
            raise click.BadParameter(f"no change set {change_set_id.strip()[:80]!r} in this Dagster instance "
                                     "(dw-dagster change-sets lists them)", param_hint="CHANGE_SET_ID")
        _check_signing_key(instance)
        _decidable_or_exit(instance, cs, decision)  # before anyone logs in for nothing
        token = _token(domains, decision_nonce(cs.id, cs.version, decision), id_token, id_token_file, login, login_hint)
        if not token and not (approver or "").strip():
            raise click.UsageError("prove who you are: --login, --id-token or --id-token-file "
                                   "(--approver only for an identity: unverified domain)")
        ok, msg = approve_in_process(instance, cs.id, id_token=token, approver=(approver or "") if not token else "",
                                     decision=decision, comment=comment, domains=domains)
    if not ok:
        click.echo(f"refused: {msg}", err=True)
        sys.exit(3)
    click.echo(msg)


@click.group()
def approvals() -> None:
    """Tokens for the Launchpad, and the approver's endpoint (review page, Slack buttons)."""


@approvals.command("token")
@click.argument("change_set_id", required=False)
@click.option("--reject", is_flag=True, help="A token for rejecting instead.")
@click.option("--resume", "for_resume", is_flag=True, help="A token for lifting the org-wide stop in force "
              "(for `dw-dagster resume --id-token` or the dw_resume job).")


@click.option("--lift-hold", "lift_asset", default=None, metavar="ASSET",
              help="A token for `dw-dagster holds lift CHANGE_SET_ID --asset ASSET`.")


@click.option("--login-hint", default=None, help="Your email, passed to the provider's login page.")
@domains_option
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
def approvals_token(change_set_id, reject, for_resume, lift_asset, login_hint, domains_file, dagster_home):
    """Log in and print an ID token bound to one decision: Launchpad config for ``dw_approve_change_set``
    (the default), or a token for ``resume`` (``--resume``) or ``holds lift`` (``--lift-hold ASSET``).

    The token is good for that one decision only and is accepted once, so the copy every Dagster
    viewer can read in a run's config decides nothing else.
    """
    from dw_dagster.core.identity import decision_nonce
    from dw_dagster.core import records
    from dw_dagster.guard.stop import active_stop, resume_nonce

    domains = _domains(domains_file)
    with _instance(dagster_home) as instance:
        if for_resume:
            if active_stop(instance) is None:
                raise click.UsageError("no org-wide stop is in force; nothing to lift")
            token = _token(domains, resume_nonce(instance), None, None, True, login_hint)
            click.echo(f"ops:\n  dw_lift_stop:\n    config:\n      id_token: {token}\n      reason: ''")
            return
        if not change_set_id:
            raise click.UsageError("name the change set (or give --resume)")
        cs = records.find_change_set(instance, change_set_id.strip())
        if cs is None:
            raise click.BadParameter(f"no change set {change_set_id.strip()[:80]!r}", param_hint="CHANGE_SET_ID")
        if lift_asset:
            token = _token(domains, decision_nonce(cs.id, cs.version, f"lift-hold:{lift_asset.strip('/')}"), None,
                           None, True, login_hint)
            click.echo(token)
            return
        _decidable_or_exit(instance, cs, "reject" if reject else "approve")
    decision = "reject" if reject else "approve"
    token = _token(domains, decision_nonce(cs.id, cs.version, decision), None, None, True, login_hint)
    click.echo(f"ops:\n  dw_record_decision:\n    config:\n      change_set_id: {cs.id}\n      decision: {decision}\n"
               f"      id_token: {token}\n      comment: ''")


@approvals.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=int, default=8770, show_default=True)
@domains_option
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
@click.option("--base-url", default=None, help="The URL people and Slack reach this server at (https behind a "
              "TLS proxy in production); default http://HOST:PORT.")


@click.option("--workspace", default=None, type=click.Path(dir_okay=False),
              help="The workspace file whose database resources the /dw-access slash command may name "
                   "(default $DW_WORKSPACE; without one, requests name a database URL).")


def approvals_serve(host, port, domains_file, dagster_home, base_url, workspace):
    """Serve the review page (OIDC login) and Slack's interactivity endpoint for the Approve / Reject buttons.

    Register BASE_URL/callback as the OIDC client's redirect URI and BASE_URL/slack/interactions
    as the Slack app's interactivity Request URL. Every decision is recorded by the same rules as
    `dw-dagster approve`.
    """
    from dw_dagster.approval.server import build_app  # its ImportError names the extra

    import uvicorn

    domains = _domains(domains_file)
    _key_or_exit()
    source = str(Path(domains_file or os.environ["DW_DOMAINS_FILE"]).resolve())  # re-read at every request
    base = (base_url or f"http://{host}:{port}").rstrip("/")
    with _instance(dagster_home) as instance:
        _check_signing_key(instance)
        from dw_dagster.access.slack import access_routes
        from dw_dagster.cli.access import _workspace_resources

        resources = _workspace_resources(workspace)[0] if workspace or os.environ.get("DW_WORKSPACE") else {}
        app = build_app(instance, source, base_url=base, extra_routes=access_routes(instance, source, resources))
        if domains.identity.oidc is None:
            click.echo("warning: the domains file names no OIDC provider: the review page cannot log anyone in", err=True)
        if domains.identity.slack is None:
            click.echo("warning: the domains file has no identity.slack: Slack button clicks are refused", err=True)
        elif not domains.identity.slack.team_id:
            click.echo("warning: identity.slack names no team_id: clicks from any workspace the app is installed "
                       "in are accepted", err=True)
        click.echo(f"review page {base}/ · OIDC redirect URI {base}/callback · "
                   f"Slack Request URL {base}/slack/interactions · /dw-access slash command {base}/slack/commands",
                   err=True)
        uvicorn.run(app, host=host, port=port, log_level="info", server_header=False)


@click.group("change-sets", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
@click.pass_context
def change_sets_cmd(ctx: click.Context, as_json: bool, dagster_home: str | None) -> None:
    """List change sets (newest first) with their state and decision, and any quarantined record.

    ``dw-dagster change-sets show CS`` shows one; ``--patch`` writes the diff the owner merges.
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"dagster_home": dagster_home}
        return
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.core.models import Approval
    from dw_dagster.core import records
    from dw_dagster.approval.job import PAST, signature_valid

    with _instance(dagster_home) as instance:
        led = ledger_for(instance)
        rows = []
        key_set = True
        try:
            from dw_dagster.approval.job import signing_key

            signing_key()
        except Exception:  # noqa: BLE001 - listing works without the key; signatures say "not checked"
            key_set = False
        for cs in records.change_sets(instance, latest_only=True):
            row = led.change_set_row(cs.id, cs.version)
            active = led.active_decision(cs.id, cs.version)
            status = row.state
            if active is not None:
                d = Approval.model_validate_json(active[1])
                how = d.identity.describe() if d.identity else d.approver
                status += f" ({PAST[d.decision]} by {how}"
                status += ")" if not key_set else ("" if signature_valid(d) else "; its signature does NOT verify") + ")"
            if row.note:
                status += f"; {row.note}"
            rows.append({"id": cs.id, "version": cs.version, "asset": "/".join(cs.target_asset), "cause": cs.cause_kind,
                         "window": cs.window, "state": row.state, "status": status, "approvers": cs.approvers,
                         "expires_at": cs.expires_at.isoformat(), "summary": cs.summary})
        bad = records.quarantined(instance)
    if as_json:
        click.echo(json.dumps({"change_sets": rows, "quarantined": bad}, indent=2, default=str))
        return
    if not rows:
        click.echo("no change sets")
    for r in rows:
        click.echo(f"{r['id']}  {r['status']}  {r['asset']}  {r['cause']}  window {','.join(r['window'])}\n    {r['summary']}")
    for q in bad:
        click.echo(f"QUARANTINED {q['kind']} {q['ref']} on {q['asset_key']}: {q['reason']}")


@change_sets_cmd.command("autonomy")
@click.option("--domains", "domains_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="the domains file: print the diff that raises or lowers autonomy per the records (earn_after)")


@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def change_sets_autonomy(ctx: click.Context, domains_file: str | None, as_json: bool) -> None:
    """Each domain's record per change class: applied, verified, undone, failed, the last failure.

    With ``--domains FILE``, the change to the domains file the records earn (a class verified
    ``earn_after`` times in a row is allowed; an allowed class that failed or was undone is
    withdrawn), as a diff an operator reviews and merges; dw_dagster never edits the file.
    """
    from dw_dagster.receipts.autonomy import autonomy_records, propose_autonomy_change

    with _instance((ctx.obj or {}).get("dagster_home")) as instance:
        recs = autonomy_records(instance)
    diff = propose_autonomy_change(Path(domains_file).read_text(), recs, path=Path(domains_file).name) if domains_file else None
    if as_json:
        click.echo(json.dumps({"records": [r.model_dump(mode="json") for r in recs], "domains_diff": diff}, indent=2))
        return
    for r in recs:
        last = f"; last failure {r.last_failure_at:%Y-%m-%d %H:%M} UTC: {r.last_failure}" if r.last_failure_at else ""
        click.echo(f"{r.domain}  {r.change_class}: {r.applied} applied, {r.verified} verified, {r.undone} undone, "
                   f"{r.failed} failed; {r.clean_streak} clean in a row{last}")
    if not recs:
        click.echo("no repair ended yet")
    if domains_file:
        click.echo(diff or "the records earn no change to the domains file")


@change_sets_cmd.command("show")
@click.argument("change_set_id")
@click.option("--patch", is_flag=True, help="write only the change set's diff (for `git apply -p1`) to stdout")
@click.option("--version", "version", default=None, help="a version other than the latest")
@click.option("--json", "as_json", is_flag=True)
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
@click.pass_context
def change_sets_show(ctx: click.Context, change_set_id: str, patch: bool, version: str | None, as_json: bool,
                     dagster_home: str | None) -> None:
    """One change set: what it changes (diff, window, steps with their SQL, rebuild, tests), its
    decisions and the stages run so far. With ``--patch``: only the diff, byte for byte as
    approved, so ``dw-dagster change-sets show CS --patch | git apply -p1`` merges it (exit 0
    with nothing written when the change set edits no file). Exit 2 for an unknown change set
    or a record that fails its hash check."""
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.core.models import TamperedRecord
    from dw_dagster.core.records import load_change_set
    from dw_dagster.proposals.watermark import change_set_markdown
    from dw_dagster.changes.steps import steps_markdown

    dagster_home = dagster_home or (ctx.obj or {}).get("dagster_home")
    with _instance(dagster_home) as instance:
        led = ledger_for(instance)
        try:
            cs = load_change_set(led, change_set_id, version)
        except TamperedRecord as e:
            err = click.ClickException(str(e))
            err.exit_code = 2
            raise err from None
        if cs is None:
            raise click.BadParameter(f"no change set {change_set_id!r}{f' version {version}' if version else ''} in "
                                     "this instance (dw-dagster change-sets lists them)", param_hint="CHANGE_SET_ID")
        row = led.change_set_row(cs.id, cs.version)
        decisions = [d for d in led.decisions(cs.id) if d["version"] == cs.version]
        stages = led.stages(cs.id, cs.version)
        from dw_dagster.approval.ladder import ladder_history

        ladder = [s for s in ladder_history(instance, change_set_id=cs.id) if s["version"] == cs.version]
        unreachable = [e["body"] for e in led.audit_entries("approver_unreachable", cs.id)
                       if e["body"].get("version") == cs.version]
    if patch:
        if cs.diff:
            click.echo(cs.diff, nl=not cs.diff.endswith("\n"))
        else:
            click.echo(f"change set {cs.id} edits no file", err=True)
        return
    history = [{"decision": d["decision"], "by": d["approver"], "method": d["method"], "at": str(d["decided_at"]),
                "counts": bool(d["active"]), "withdrawn": d["withdrawn_reason"]} for d in decisions]
    runs = [{"stage": name, "state": st.state, "run_id": st.run_id} for name, st in
            sorted(stages.items(), key=lambda kv: kv[1].issued_at)]
    if as_json:
        click.echo(json.dumps({"change_set": cs.model_dump(mode="json"), "state": row.state if row else None,
                               "decisions": history, "stages": runs, "ladder": ladder, "unreachable": unreachable},
                              indent=2, default=str))
        return
    click.echo(f"state: {row.state if row else 'unknown'}" + (f"; {row.note}" if row and row.note else ""))
    for h in history:
        click.echo(f"decision: {h['decision']} by {h['by']} ({h['method']}) at {h['at']}"
                   + ("" if h["counts"] else f" - does not count: {h['withdrawn'] or 'withdrawn'}"))
    for step in ladder:  # the escalation ladder: each step a ledger transition
        click.echo(f"ladder: {step['kind']} {step['step']} at {step['at']}"
                   + (" (skipped: a later step was due)" if step["skipped"] else f" → {', '.join(step['to']) or 'nobody'}"))
    for u in unreachable:
        click.echo(f"not reached: {u['email']} ({u['channel']}): {u['reason']}")
    for r in runs:
        click.echo(f"stage {r['stage']}: {r['state']}" + (f" (run {r['run_id']})" if r["run_id"] else ""))
    click.echo("")
    click.echo(change_set_markdown(cs))
    steps = steps_markdown(cs)
    if steps:
        click.echo("\n" + steps)


@change_sets_cmd.command("repropose")
@click.argument("change_set_id")
@click.option("--by", default=None, help="Who proposes it again (email); default dw-dagster.")
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
@click.pass_context
def change_sets_repropose(ctx: click.Context, change_set_id: str, by: str | None, dagster_home: str | None) -> None:
    """Propose a change set again as a new version (after its undo, or after it failed, was rejected or
    expired); an undo's id proposes the change set it undid. The new version carries the earlier
    versions and, when one ran, its diff marked merged; it waits for a listed approver like any.
    Exit 3 when refused (the version is still live, or the incident is closed)."""
    from dw_dagster.core import keys as c
    from dw_dagster.proposals.change_sets import propose
    from dw_dagster.repair.repropose import ReproposeError, repropose

    dagster_home = dagster_home or (ctx.obj or {}).get("dagster_home")
    with _instance(dagster_home) as instance:
        try:
            cs, new = propose(instance, repropose(instance, change_set_id.strip(), by or c.PROPOSER))
        except ReproposeError as e:
            click.echo(f"refused: {e}", err=True)
            sys.exit(3)
    click.echo(f"{'proposed' if new else 'already proposed'} {cs.id} version {cs.version}: {cs.summary}\n"
               f"approve it like any change set: dw-dagster approve {cs.id} --login (approvers: {', '.join(cs.approvers)})")


@click.command("stop")
@click.option("--by", required=True, help="Who stops (email); recorded with the stop. Anyone may stop.")
@click.option("--reason", default="", help="Why; shown in the UI and in every skipped sensor tick.")
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
def stop_cmd(by: str, reason: str, dagster_home: str | None) -> None:
    """Org-wide stop: halt every automatic dw_dagster repair now (queued repair runs are cancelled)."""
    from dw_dagster.guard.stop import set_stop

    if not by.strip():
        raise click.BadParameter("must name who stops", param_hint="--by")
    with _instance(dagster_home) as instance:
        state = set_stop(instance, True, by, reason)
    click.echo(f"STOPPED by {state.by} at {state.at.isoformat()}; cancelled {len(state.cancelled_runs)} queued repair "
               "run(s). Approvals are still recorded and wait; a verified operator lifts the stop with "
               "`dw-dagster resume --login`.")


@click.command("resume")
@_token_opts
@click.option("--by", default=None, help="Your email, typed: only when every domain is identity: unverified.")
@click.option("--reason", default="", help="Why.")
@domains_option
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
def resume_cmd(id_token, id_token_file, login, login_hint, by, reason, domains_file, dagster_home) -> None:
    """Lift the org-wide stop (a verified operator): the remediation sensor dispatches approved repairs again."""
    from dw_dagster.core.identity import IdentityError
    from dw_dagster.approval.job import ApprovalRefused, oidc_verifier, unverified_identity
    from dw_dagster.guard.stop import active_stop, resume_nonce, set_stop

    domains = _domains(domains_file)
    with _instance(dagster_home) as instance:
        if active_stop(instance) is None:
            click.echo("no org-wide stop is in force; nothing to lift")
            return
        nonce = resume_nonce(instance)
        token = _token(domains, nonce, id_token, id_token_file, login, login_hint)
        try:
            if token:
                identity = oidc_verifier(domains).verify(token, nonce=nonce)
            elif (by or "").strip():
                identity = unverified_identity(by)
            else:
                raise click.UsageError("prove who you are: --login, --id-token or --id-token-file")
            state = set_stop(instance, False, identity, reason, domains=domains)
        except (IdentityError, ApprovalRefused, ValueError) as e:
            click.echo(f"refused: {e}", err=True)
            sys.exit(3)
    click.echo(f"resumed by {state.verified_by} at {state.at.isoformat()}")


@click.group()
def holds() -> None:
    """Partitions held by an approved repair in progress (the run coordinator and executor refuse other runs there)."""


@holds.command("lift")
@click.argument("change_set_id")
@click.option("--asset", required=True, help="The held asset (slash-separated key).")
@click.option("--reason", required=True, help="Why other runs may write there now.")
@_token_opts
@domains_option
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None)
def holds_lift(change_set_id, asset, reason, id_token, id_token_file, login, login_hint, domains_file, dagster_home):
    """Let other runs materialize the held partitions of ASSET (a verified approver of its domain; recorded)."""
    from dw_dagster.core.identity import IdentityError, decision_nonce
    from dw_dagster.core.ledger import LedgerError
    from dw_dagster.core import records
    from dw_dagster.approval.job import oidc_verifier
    from dw_dagster.guard.admission import lift_hold

    domains = _domains(domains_file)
    with _instance(dagster_home) as instance:
        cs = records.find_change_set(instance, change_set_id.strip())
        if cs is None:
            raise click.BadParameter(f"no change set {change_set_id!r}", param_hint="CHANGE_SET_ID")
        from dw_dagster.core.ledger import ledger_for as _led

        state = _led(instance).change_set_row(cs.id, cs.version).state
        held = [r for r in _led(instance).open_windows(asset.strip("/")) if r.change_set_id == cs.id]
        if not held or not cs.window:
            click.echo(f"refused: change set {cs.id} ({state}) holds nothing on {asset}: only an approved repair "
                       "in progress holds its window", err=True)
            sys.exit(3)
        nonce = decision_nonce(cs.id, cs.version, f"lift-hold:{asset.strip('/')}")
        token = _token(domains, nonce, id_token, id_token_file, login, login_hint)
        if not token:
            raise click.UsageError("lifting a hold needs a verified identity: --login, --id-token or --id-token-file")
        try:
            identity = oidc_verifier(domains).verify(token, nonce=nonce)
            if not domains.get(cs.domain).may_approve(identity.email):
                raise IdentityError(f"{identity.email} is not an approver of domain {cs.domain!r}")
            if not _ledger_use(instance, identity, f"lift hold {cs.id} {asset}"):
                raise IdentityError("this ID token was already used")
            lift_hold(instance, cs.id, asset.strip("/"), identity, reason)
        except (IdentityError, LedgerError, KeyError) as e:
            click.echo(f"refused: {e}", err=True)
            sys.exit(3)
    click.echo(f"hold on {asset} lifted by {identity.describe()} (recorded): {reason}")


def _ledger_use(instance, identity, purpose: str) -> bool:
    from dw_dagster.core.ledger import ledger_for

    return identity.credential_id is None or ledger_for(instance).use_credential(identity.credential_id, purpose)


def register(main: click.Group) -> None:
    """Add the deciding commands to the ``dw-dagster`` group."""
    for command in (approve, approvals, change_sets_cmd, stop_cmd, resume_cmd, holds):
        main.add_command(command)


def register_incident_commands(incidents: click.Group) -> None:
    """``dw-dagster incidents close|reopen|rediagnose`` (a person, with a reason, recorded in the ledger)."""

    def _change(incident_id: str, by: str, reason: str, dagster_home: str | None, action: str) -> None:
        from dw_dagster.core.identity import IdentityError, canonical_email
        from dw_dagster.core.ledger import CLOSED, OPEN_INCIDENT_STATES, QUARANTINED, REDIAGNOSE, ledger_for
        from dw_dagster.core.models import Incident
        from dw_dagster.receipts.job import close_incident
        from dw_dagster.detection.incidents import incident_observation

        if not reason.strip():
            raise click.BadParameter("say why", param_hint="--reason")
        try:
            who = canonical_email(by)
        except IdentityError as e:
            raise click.BadParameter(str(e), param_hint="--by") from e
        with _instance(dagster_home) as instance:
            led = ledger_for(instance)
            row = led.incident(incident_id.strip())
            if row is None:
                raise click.BadParameter(f"no incident {incident_id.strip()[:80]!r} (dw-dagster incidents lists them)",
                                         param_hint="INCIDENT_ID")
            if action == "close":
                ok = close_incident(instance, row.incident_id, who, reason)
            elif action == "reopen":
                ok = led.set_incident_state(row.incident_id, REDIAGNOSE, from_states=[CLOSED], note=f"reopened by {who}: {reason}")
            else:
                ok = led.set_incident_state(row.incident_id, REDIAGNOSE, from_states=(*OPEN_INCIDENT_STATES, QUARANTINED),
                                            note=f"re-diagnosis asked by {who}: {reason}")
            if not ok:
                click.echo(f"refused: incident {row.incident_id} is {row.state}; cannot {action} it", err=True)
                sys.exit(3)
            if action != "close":
                led.audit(f"incident_{action}", row.incident_id, who, {"reason": reason})
            inc = Incident.model_validate_json(row.body)
            instance.report_runless_asset_event(incident_observation(
                inc, f"incident {inc.id} {action}{'d' if action == 'close' else ('ed' if action == 'reopen' else ' asked')} "
                     f"by {who}: {reason}"))
        verb = {"close": "closed", "reopen": "reopened (the incident sensor diagnoses it on its next tick)",
                "rediagnose": "marked for re-diagnosis (the incident sensor launches it on its next tick)"}[action]
        click.echo(f"incident {row.incident_id} {verb}; recorded as by {who}: {reason}")

    for action, help_text in (("close", "Close an incident (a person, with a reason): its checks may open new incidents again."),
                              ("reopen", "Re-open a closed incident; it is diagnosed again."),
                              ("rediagnose", "Diagnose an open or quarantined incident again (e.g. after its diagnosis failed).")):
        def _cmd(incident_id, by, reason, dagster_home, _action=action):
            _change(incident_id, by, reason, dagster_home, _action)

        _cmd.__doc__ = help_text
        cmd = click.argument("incident_id")(click.option("--by", required=True, help="Who (email).")(
            click.option("--reason", required=True, help="Why (recorded).")(
                click.option("--dagster-home", type=click.Path(file_okay=False), default=None)(_cmd))))
        incidents.command(action)(cmd)
