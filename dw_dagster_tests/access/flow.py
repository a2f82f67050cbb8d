"""The world the access-request tests share: real PostgreSQL roles, a real OIDC provider, SMTP and
paging servers on loopback, a Dagster instance on disk and the access machinery on it.

People: SAM asks (and is also an approver of ``finance``: he must not approve his own request),
DANA is the grantee (and an approver of ``crm``: she must not approve access for herself), ANA owns
``finance``, BO owns ``crm``, CY is BO's colleague and listed nowhere.
"""

from __future__ import annotations

import datetime as dt
import textwrap
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import httpx

from dw_dagster.access import build_access_definitions
from dw_dagster.access.models import AccessSpec
from dw_dagster.access.notify import EmailNotifier
from dw_dagster.access.request import prepare, request_nonce, requester_identity, submit
from dw_dagster.approval.job import approve_in_process
from dw_dagster.core.domains import load_domains
from dw_dagster.core.identity import decision_nonce
from dw_dagster.core.records import load_change_set
from dw_dagster.databases import DatabaseResource, SqlAlchemyDatabase
from dw_dagster.integrations.pagerduty import PagerDutyResource
from dw_dagster_dev.fakes.paging_server import (DEFAULT_PAGERDUTY_TOKEN, DEFAULT_PAGERDUTY_USERS, DEFAULT_ROUTING_KEY,
                                                    start_paging_server)
from dw_dagster_dev.fakes.oidc_server import start_oidc_server
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_tests.access.pg_world import PgWorld
from dw_dagster_tests.conftest import POSTGRES_URL

SAM, DANA, ANA, BO, CY = "sam@x.example", "dana@x.example", "ana@fin.example", "bo@crm.example", "cy@crm.example"
PEOPLE = (SAM, DANA, ANA, BO, CY)
CLIENT = "dw-dagster"
SENSOR = "dw_access_sensor"


@contextmanager
def services():
    """The OIDC provider, an SMTP server collecting mail and the paging fake, for a module."""
    from aiosmtpd.controller import Controller

    idp = start_oidc_server(users={p: {"sub": "sub-" + p.split("@")[0], "email_verified": True} for p in PEOPLE},
                            clients={CLIENT: {"redirect_uris": ["http://127.0.0.1/callback"]}}, default_user=SAM)

    class Inbox:
        def __init__(self) -> None:
            self.messages: list[dict] = []
            self.lock = threading.Lock()

        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
            with self.lock:
                self.messages.append({"to": list(envelope.rcpt_tos), "from": envelope.mail_from,
                                      "data": envelope.content.decode("utf-8", "replace")})
            return "250 OK"

    import socket

    with socket.socket() as probe:  # aiosmtpd's Controller needs a real port to check it is up
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    inbox = Inbox()
    smtp = Controller(inbox, hostname="127.0.0.1", port=free)
    smtp.start()
    pager, pager_url = start_paging_server()
    try:
        yield idp, (smtp.hostname, smtp.port, inbox), (pager, pager_url)
    finally:
        smtp.stop()
        pager.stop()
        idp.stop()


def token(idp, email: str, nonce: str) -> str:
    r = httpx.post(idp.url + "/_fake/issue", json={"email": email, "aud": CLIENT, "nonce": nonce})
    assert r.status_code == 200, r.text
    return r.json()["id_token"]


@dataclass
class World:
    pg: PgWorld
    home: Path
    domains_file: Path
    instance: dg.DagsterInstance
    defs: dg.Definitions
    daemon: LocalSensorDaemon
    idp: object
    inbox: object
    pager: object
    db: SqlAlchemyDatabase
    shift: list = field(default_factory=lambda: [dt.timedelta(0)])
    smtp_port: int = 0

    @property
    def domains(self):
        return load_domains(self.domains_file)

    def role(self, email: str) -> str:
        return self.pg.prefix + email.split("@")[0]

    def spec(self, **kw) -> AccessSpec:
        base = dict(database="warehouse", grantee_email=DANA, duration_s=3600, why="quarter close: reconcile the ledger")
        return AccessSpec(**{**base, **kw})

    def request(self, spec: AccessSpec, by: str = SAM, *, verified: bool = True):
        doms = self.domains
        req = prepare(self.instance, spec, self.db, domains=doms, requester=by)
        who = requester_identity(doms, spec, id_token=token(self.idp, by, request_nonce(spec))) if verified else None
        return submit(self.instance, req, who, domains=doms)

    def approve(self, cs_id: str, email: str, decision: str = "approve"):
        cs = load_change_set(self.instance, cs_id)
        return approve_in_process(self.instance, cs_id, id_token=token(self.idp, email, decision_nonce(cs.id, cs.version, decision)),
                                  decision=decision, domains=self.domains_file)

    def tick(self):
        return self.daemon.tick(SENSOR)

    def later(self, seconds: float) -> None:
        """Move the clock of the access sensor and jobs (only theirs) forward."""
        self.shift[0] += dt.timedelta(seconds=seconds)

    def has(self, table: str, priv: str = "SELECT") -> bool:
        return self.pg.fetch(f"SELECT has_table_privilege('{self.role(DANA)}', '{self.pg.t(table)}', '{priv}')")[0][0]


def write_domains(path: Path, pg: PgWorld, idp_url: str, *, crm_identity: str = "verified") -> None:
    path.write_text(textwrap.dedent(f"""\
        domains:
          - name: finance
            tables: ["{pg.schema}.ledger*"]
            approvers: [{ANA}, {SAM}]
            escalation: [finance-lead@fin.example]
          - name: crm
            tables: ["{pg.schema}.customers"]
            approvers: [{BO}, {DANA}]
            identity: {crm_identity}
        identity:
          oidc:
            issuer: {idp_url}
            audience: {CLIENT}
        access:
          role_name: "{pg.prefix}{{local_snake}}"
          remind_before_minutes: 10
          revoke_retry_minutes: 1
        """))


def build_world(pg: PgWorld, tmp: Path, idp, smtp, pager_fake, monkeypatch, **defs_kw) -> World:
    host, port, inbox = smtp
    pager, pager_url = pager_fake
    pg.run(f"CREATE TABLE {pg.t('ledger')} (id int, amount numeric, note text)",
           f"CREATE TABLE {pg.t('customers')} (id int, email text, phone text, region text)",
           f"GRANT USAGE ON SCHEMA \"{pg.schema}\" TO PUBLIC")
    analyst = pg.create_role("analyst")
    pg.create_role("dana", "LOGIN")
    pg.run(f'GRANT SELECT ON {pg.t("ledger")} TO "{analyst}"', f'GRANT SELECT ON {pg.t("customers")} TO "{analyst}"')
    domains_file = tmp / "domains.yaml"
    write_domains(domains_file, pg, idp.url)
    home = tmp / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = dg.DagsterInstance.from_config(str(home))
    pd = PagerDutyResource(routing_key=DEFAULT_ROUTING_KEY, api_token=DEFAULT_PAGERDUTY_TOKEN,
                           from_email=DEFAULT_PAGERDUTY_USERS[0], events_base_url=pager_url, rest_base_url=pager_url,
                           incident_lookup_s=1.0, timeout_s=2.0, retry_attempts=2, retry_base_wait_s=0.01,
                           retry_max_wait_s=0.05)
    defs = build_access_definitions(databases={"warehouse": DatabaseResource(url=POSTGRES_URL)}, domains=str(domains_file),
                                    notifiers=[EmailNotifier(host=host, port=port)], pager=pd, minimum_interval_seconds=1,
                                    **defs_kw)
    shift = [dt.timedelta(0)]
    import dw_dagster.access.sensor as sensor_module
    from dw_dagster.core.models import utcnow as real

    import dw_dagster.access.jobs as jobs_module

    monkeypatch.setattr(sensor_module, "utcnow", lambda: real() + shift[0])
    monkeypatch.setattr(jobs_module, "utcnow", lambda: real() + shift[0])
    return World(pg=pg, home=home, domains_file=domains_file, instance=instance, defs=defs,
                 daemon=LocalSensorDaemon(defs, instance, log_level="WARNING"), idp=idp, inbox=inbox, pager=pager,
                 db=SqlAlchemyDatabase(POSTGRES_URL), shift=shift, smtp_port=port)
