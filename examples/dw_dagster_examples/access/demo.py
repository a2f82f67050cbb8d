"""``dw-dagster demo access``: an access request end to end on a Dagster instance and a PostgreSQL server.

Sam asks for Dana to read through the ``analyst`` role for 24 seconds (a demo's hour). The
dry-run on the server says what that opens (the ledger, two columns of the customers table, one of
them sensitive) and that ``finance`` and ``crm`` must both approve. Sam, who is also a finance
approver, cannot approve his own request; Ana (finance) and Bo (crm) log in at the identity
provider and approve. The access sensor grants, the server shows Dana can read; 12 seconds before
the end Sam is reminded in Slack; at the end the grant is revoked and the server shows it is gone;
the receipt on ``dw_access`` says who asked, why, who approved, when granted and revoked, and how
the revoke was verified.

The roles and schema the demo makes on the server carry a unique prefix and are dropped at the end.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dagster as dg

from dw_dagster import AccessSpec, database_from_url, records
from dw_dagster.approval.job import approve_in_process
from dw_dagster.approval.identity import decision_nonce
from dw_dagster.access import request_access, request_nonce
from dw_dagster_examples.access.definitions import DEFAULT_URL, HOME_ENV, URL_ENV, build_definitions
from dw_dagster_dev.demo import DemoError, DemoSpec, Timeline, clip, demo_login_for
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_dev.services import OidcProvider

SAM, DANA, ANA, BO = "sam.lee@grocer.example", "dana.ortiz@grocer.example", "ana.ruiz@grocer.example", "bo.kim@grocer.example"
DURATION_S = 24
CHANNEL = "C0DATAOPS1"  # the fake Slack workspace's data-ops channel
SENSOR = "dw_access_sensor"

__all__ = ["AccessDemoResult", "DEMO", "run_access_demo"]


@dataclass
class AccessDemoResult:
    """What the demo did (``--json``)."""

    scale: float = 1.0
    request_id: str | None = None
    requested_by: str | None = None
    grantee: str | None = None
    grantee_role: str | None = None
    database: str | None = None
    statements: list[str] = field(default_factory=list)
    rollback: list[str] = field(default_factory=list)
    newly_reachable: list[dict] = field(default_factory=list)
    sensitive: list[dict] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    approvers: list[str] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    approvals: list[dict] = field(default_factory=list)
    readable_while_granted: bool | None = None
    reminder: dict = field(default_factory=dict)
    granted_at: str | None = None
    expires_at: str | None = None
    revoked_at: str | None = None
    revoke_verified: bool | None = None
    revoke_checks: list[dict] = field(default_factory=list)
    readable_after_revoke: bool | None = None
    receipt_id: str | None = None
    receipt: dict = field(default_factory=dict)
    seconds: float = 0.0
    dagster_home: str = ""
    access_home: str = ""
    ok: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


class _Server:
    """The demo's roles and tables on the PostgreSQL server (uniquely named; dropped by :meth:`drop`)."""

    def __init__(self, url: str) -> None:
        self.db = database_from_url(url)
        self.prefix = f"dwdemo_{uuid.uuid4().hex[:6]}_"
        self.schema = self.prefix + "shop"
        self.roles: list[str] = []

    def make(self) -> None:
        s, p = self.schema, self.prefix
        self.db.execute(f'CREATE SCHEMA "{s}"')
        self.db.execute(f'CREATE TABLE "{s}".ledger (entry_id int, amount numeric(12, 2), booked_on date)')
        self.db.execute(f'CREATE TABLE "{s}".customers (customer_id int, email text, phone text, region text)')
        self.db.execute(f'COMMENT ON COLUMN "{s}".customers.phone IS \'mobile phone number of the customer\'')
        self.db.execute(f'GRANT USAGE ON SCHEMA "{s}" TO PUBLIC')
        for role, login in ((p + "analyst", False), (p + "dana_ortiz", True)):
            self.db.execute(f'CREATE ROLE "{role}"{" LOGIN" if login else ""}')
            self.roles.append(role)
        self.db.execute(f'GRANT SELECT ON "{s}".ledger TO "{p}analyst"')
        self.db.execute(f'GRANT SELECT (customer_id, email) ON "{s}".customers TO "{p}analyst"')

    def can_read(self, role: str, table: str) -> bool:
        return bool(self.db.fetch_all(f"SELECT has_table_privilege('{role}', '\"{self.schema}\".{table}', 'SELECT')")[0][0])

    def drop(self) -> None:
        try:
            self.db.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            for role in reversed(self.roles):
                if self.db.fetch_all(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'"):
                    self.db.execute(f'DROP OWNED BY "{role}"')
                    self.db.execute(f'DROP ROLE "{role}"')
        finally:
            dispose = getattr(self.db, "dispose", None)
            if dispose:
                dispose()


def _domains_file(home: Path, server: _Server, issuer: str) -> Path:
    path = home / "domains.yaml"
    path.write_text(f"""# written by dw-dagster demo access
domains:
  - name: finance
    tables: ["{server.schema}.ledger"]
    approvers: [{ANA}, {SAM}]
    escalation: [finance-lead@grocer.example]
  - name: crm
    tables: ["{server.schema}.customers"]
    approvers: [{BO}]
identity:
  oidc:
    issuer: {issuer}
    audience: dw-dagster
access:
  role_name: "{server.prefix}{{local_snake}}"
  remind_before_minutes: 60
""")
    return path


def _tick_until(daemon: LocalSensorDaemon, done, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise DemoError(f"{what}: not reached within {timeout_s:.0f} s")
        daemon.tick(SENSOR)
        time.sleep(0.5)


def run_access_demo(*, home: Path, instance: dg.DagsterInstance, scale: float, log: Timeline,
                    result: AccessDemoResult) -> AccessDemoResult:
    """The whole access loop (module docstring); fills ``result`` stage by stage."""
    from dw_dagster_dev.fakes.paging_server import DEFAULT_SLACK_TOKEN, start_paging_server

    url = os.environ.get(URL_ENV) or DEFAULT_URL
    result.access_home = str(home)
    server = _Server(url)
    slack, slack_url = start_paging_server()
    saved = {k: os.environ.get(k) for k in ("SLACK_BOT_TOKEN", "SLACK_API_URL", "SLACK_CHANNEL", HOME_ENV)}
    os.environ.update({"SLACK_BOT_TOKEN": DEFAULT_SLACK_TOKEN, "SLACK_API_URL": f"{slack_url}/api",
                       "SLACK_CHANNEL": CHANNEL, HOME_ENV: str(home)})
    try:
        with OidcProvider(home / "services", [SAM, DANA, ANA, BO]) as idp:
            try:
                server.make()
            except Exception as e:  # noqa: BLE001 - a server the demo cannot use is named
                raise DemoError(f"setup: cannot make the demo's roles and tables on {url.split('@')[-1]}: {e}") from e
            log("setup", f"PostgreSQL {server.db.name}: schema {server.schema}, roles {', '.join(server.roles)}")
            domains_file = _domains_file(home, server, idp.url)
            defs = build_definitions(url, home, interval_s=1)
            daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
            _request(instance, server, domains_file, log, result)
            _approve(instance, daemon, domains_file, log, result)
            _grant_remind_revoke(instance, daemon, server, slack, log, result)
    finally:
        slack.stop()
        server.drop()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    result.ok = bool(result.revoke_verified and result.readable_while_granted and result.readable_after_revoke is False
                     and result.receipt_id and result.reminder)
    if not result.ok:
        raise DemoError("receipt: the loop did not end verified")
    return result


def _request(instance, server: _Server, domains_file: Path, log: Timeline, result: AccessDemoResult) -> None:
    from dw_dagster.core.domains import load_domains

    spec = AccessSpec(database="warehouse", grantee_email=DANA, role=server.prefix + "analyst", duration_s=DURATION_S,
                      why="quarter close: reconcile the ledger against customer refunds", end_sessions=True)
    token = demo_login_for(domains_file, request_nonce(spec), SAM)
    req, state = request_access(instance, spec, server.db, domains=load_domains(domains_file), id_token=token)
    if state != "pending":
        raise DemoError(f"request: filed as {state}, not pending")
    s = req.summary()
    result.request_id, result.requested_by, result.grantee = req.id, req.requester, req.spec.grantee_email
    result.grantee_role, result.database, result.expires_at = s["grantee_role"], req.database_name, s["expires_at"]
    result.statements, result.rollback = s["statements"], s["rollback"]
    result.newly_reachable, result.sensitive = s["newly_reachable"], s["sensitive"]
    result.domains, result.approvers = [d["domain"] for d in s["domains"]], s["approvers"]
    log("request", f"{req.id}: {SAM} (verified by OIDC) asks for {DANA}: role {spec.role} for {DURATION_S} s")
    for x in s["newly_reachable"]:
        log.detail(f"dry-run: opens {x['privilege']} on {x['table']} ({', '.join(x['columns'])})")
    for x in s["sensitive"]:
        log.detail(f"sensitive: {x['table']}.{x['column']} ({x['category']})")
    owners = ["{} ({})".format(d["domain"], ", ".join(d["approvers"])) for d in s["domains"]]
    log.detail("must approve: " + "; ".join(owners))


def _approve(instance, daemon: LocalSensorDaemon, domains_file: Path, log: Timeline, result: AccessDemoResult) -> None:
    cs = {c.domain: c for c in (records.find_change_set(instance, i) for i in _request_sets(instance, result.request_id))}

    def decide(domain: str, who: str) -> tuple[bool, str]:
        change = cs[domain]
        token = demo_login_for(domains_file, decision_nonce(change.id, change.version, "approve"), who)
        return approve_in_process(instance, change.id, id_token=token, domains=domains_file,
                                  comment=f"{who} for {domain}")

    ok, msg = decide("finance", SAM)
    if ok:
        raise DemoError("approve: the requester approved his own request")
    result.refused.append({"approver": SAM, "reason": msg})
    log("approve", f"REFUSED {SAM}: {clip(msg, 150)}")
    ok, msg = decide("finance", ANA)
    if not ok:
        raise DemoError(f"approve: finance's owner was refused: {msg}")
    log("approve", f"finance: {clip(msg, 150)}")
    daemon.tick(SENSOR)
    if _state(instance, result.request_id) != "pending":
        raise DemoError("approve: one of two domains was enough")
    ok, msg = decide("crm", BO)
    if not ok:
        raise DemoError(f"approve: crm's owner was refused: {msg}")
    log("approve", f"crm: {clip(msg, 150)}")


def _grant_remind_revoke(instance, daemon: LocalSensorDaemon, server: _Server, slack, log: Timeline,
                         result: AccessDemoResult) -> None:
    from dw_dagster.core.ledger import ledger_for

    led = ledger_for(instance)
    _tick_until(daemon, lambda: _state(instance, result.request_id) == "active", "grant", 60)
    row = led.access_row(result.request_id)
    result.granted_at = row.result["grant"]["at"]
    result.approvals = row.result["grant"]["approvals"]
    result.readable_while_granted = server.can_read(result.grantee_role, "ledger")
    log("grant", f"granted at {result.granted_at}; the server says {result.grantee_role} can read the ledger: "
                 f"{result.readable_while_granted}")
    _tick_until(daemon, lambda: led.access_row(result.request_id).reminded_at is not None, "reminder", DURATION_S + 30)
    messages = slack.state.snapshot()["slack"]["messages"].get(CHANNEL, [])
    text = next((m.get("text", "") for m in messages if result.request_id in m.get("text", "")), "")
    result.reminder = {"channel": CHANNEL, "text": text, "at": led.access_row(result.request_id).result["reminder"]["at"]}
    log("remind", f"Slack {CHANNEL}: {clip(text, 150)}")
    _tick_until(daemon, lambda: _state(instance, result.request_id) in ("revoked", "revoke_failed"), "revoke", DURATION_S + 60)
    row = led.access_row(result.request_id)
    revoke = row.result.get("revoke") or {}
    result.revoked_at, result.revoke_verified = revoke.get("at"), revoke.get("verified")
    result.revoke_checks = revoke.get("checks", [])
    result.readable_after_revoke = server.can_read(result.grantee_role, "ledger")
    log("revoke", f"revoked at {result.revoked_at}, verified {result.revoke_verified} "
                  f"({len(result.revoke_checks)} checks on the server); readable now: {result.readable_after_revoke}")
    receipt = next((r for r in records.receipts(instance, dg.AssetKey("dw_access")) if r.incident_id == result.request_id), None)
    if receipt is None:
        raise DemoError("receipt: none written")
    ev = receipt.evidence_summary
    result.receipt_id = receipt.id
    result.receipt = {k: ev.get(k) for k in ("requested_by", "requester_identity", "why", "granted_at", "revoked_at",
                                             "revoke_verified", "sessions_ended")} | {"approved_by": receipt.approver_identity}
    log("receipt", f"{receipt.id} on dw_access: granted {ev['granted_at']}, revoked {ev['revoked_at']}, "
                   f"revoke_verified {ev['revoke_verified']}")


def _request_sets(instance, request_id: str) -> list[str]:
    from dw_dagster.core.ledger import ledger_for

    return json.loads(ledger_for(instance).access_row(request_id).body)["change_sets"]


def _state(instance, request_id: str) -> str:
    from dw_dagster.core.ledger import ledger_for

    return ledger_for(instance).access_row(request_id).state


DEMO = DemoSpec(
    name="access", run=run_access_demo, new_result=lambda scale: AccessDemoResult(scale=scale), home_attr="access_home",
    home_folder="access", instance_folder="access_dagster_home", log_name="access_demo.log", home_env=HOME_ENV,
    location_module="dw_dagster_examples.access.definitions", asset="dw_access",
    events="dw/access_request, dw/approval, dw/access_event, dw/receipt", default_scale=1.0, min_scale=1.0, max_scale=1.0)
