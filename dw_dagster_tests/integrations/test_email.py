"""Email through a real SMTP server (aiosmtpd on loopback, STARTTLS required, AUTH from environment variables):
approval requests, each ladder step (reminder, escalation, denial) and receipts, each carrying the change
set id and version and the review link, sent once however the server answers.

One SMTP server (and one instance and daemon) for the file; each test proposes its own change set.
"""

import datetime as dt
import email
import ipaddress
import socket
import ssl
from email import policy
from types import SimpleNamespace

import dagster as dg
import pytest

from dw_dagster.approval.ladder import climb
from dw_dagster.core import keys as c
from dw_dagster.core.domains import Domains
from dw_dagster.core.http import HttpApiError
from dw_dagster.core.models import ChangeSet, CheckOutcome, Incident, Receipt, utcnow
from dw_dagster.integrations.mail import EmailResource, Mail
from dw_dagster.integrations.notifications import build_notification_sensor, notifications
from dw_dagster.proposals.change_sets import propose
from dw_dagster.testing.local_daemon import LocalSensorDaemon

OWNER, BOSS, ONCALL = "dana.ortiz@grocer.example", "head.of.data@grocer.example", "data-oncall@grocer.example"
USER, PASSWORD = "dw-dagster-smtp", "s3cret-smtp-pass"
DOMAINS = Domains.model_validate({"domains": [{
    "name": "store_sales", "assets": [["store_sales_line"]], "approvers": [OWNER], "escalation": [ONCALL],
    "remind_after": "2h", "escalate_after": "6h", "escalation_approvers": [BOSS], "deny_after": "24h"}]})
H = dt.timedelta(hours=1)


def _certificate(folder) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (cert file, key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "smtp.pem", folder / "smtp.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mailbox:
    """The aiosmtpd handler: keeps what it accepted; can refuse the next DATA with a 4xx once."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.refuse_next: str | None = None

    async def handle_DATA(self, server, session, envelope):
        if self.refuse_next:
            reply, self.refuse_next = self.refuse_next, None
            return reply
        msg = email.message_from_bytes(envelope.content, policy=policy.default)
        self.messages.append({"rcpt": list(envelope.rcpt_tos), "tls": session.ssl is not None,
                              "login": session.auth_data if session.authenticated else None, "msg": msg})
        return "250 2.0.0 Ok: queued"


def _server(mailbox: Mailbox, folder, *, starttls: bool = True, quit_reply: str | None = None):
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import SMTP, AuthResult

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = getattr(auth_data, "login", None) == USER.encode() and getattr(auth_data, "password", None) == PASSWORD.encode()
        return AuthResult(success=ok, auth_data=auth_data.login if ok else None)

    context = None
    if starttls:
        cert, key = _certificate(folder)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)

    class Smtp(SMTP):
        async def smtp_QUIT(self, arg):
            if quit_reply is None:
                return await super().smtp_QUIT(arg)
            await self.push(quit_reply)  # e.g. 421: the server goes away rudely after it accepted the message
            self.transport.close()

    class Ctl(Controller):
        def factory(self):
            return Smtp(self.handler, **self.SMTP_kwargs)

    port = _free_port()
    ctl = Ctl(mailbox, hostname="127.0.0.1", port=port, authenticator=authenticator, auth_require_tls=starttls,
              require_starttls=starttls, tls_context=context, server_hostname="127.0.0.1")
    ctl.start()
    return ctl, port, (str(folder / "smtp.pem") if starttls else None)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smtp")
    mailbox = Mailbox()
    ctl, port, ca = _server(mailbox, folder)
    resource = EmailResource(host="127.0.0.1", port=port, sender="dw-dagster@grocer.example", username_env="DW_TEST_SMTP_USER",
                             password_env="DW_TEST_SMTP_PASSWORD", ca_file=ca, timeout_s=10)
    with pytest.MonkeyPatch.context() as mp, dg.instance_for_test() as instance:
        mp.setenv("DW_TEST_SMTP_USER", USER)
        mp.setenv("DW_TEST_SMTP_PASSWORD", PASSWORD)
        mp.setenv(c.SIGNING_KEY_ENV, "email-test-signing-key-0123456789")
        defs = dg.Definitions(assets=[dg.AssetSpec(dg.AssetKey("store_sales_line"))], resources={"email": resource},
                              sensors=[build_notification_sensor(email_resource_key="email", domains=DOMAINS,
                                                                 review_url="https://review.grocer.example")])
        daemon = LocalSensorDaemon(defs, instance, log_level="CRITICAL")
        daemon.tick("dw_notification_sensor")
        yield SimpleNamespace(mailbox=mailbox, resource=resource, instance=instance, daemon=daemon, folder=folder, ca=ca)
    ctl.stop()


def _propose(w, name: str, created: dt.datetime) -> ChangeSet:
    cs = ChangeSet.seal(id=f"cs-{name}", incident_id=f"inc-{name}", diagnosis_id=f"dg-{name}", domain="store_sales",
                        proposer=c.PROPOSER, created_at=created, expires_at=created + 24 * H, approvers=[OWNER],
                        cause_kind="late_rows_behind_watermark", summary=f"rerun 2026-11-26 ({name})",
                        target_asset=["store_sales_line"], window=["2026-11-26"], diff="", files=[], rebuild_assets=[])
    return propose(w.instance, cs)[0]


def _mails(w, cs_id: str) -> list:
    return [m for m in w.mailbox.messages if m["msg"]["X-DW-Change-Set"] == cs_id]


def _tick(w):
    return w.daemon.tick("dw_notification_sensor")


def test_request_and_every_ladder_step_by_email_over_starttls(world):
    w = world
    t0 = utcnow()
    cs = _propose(w, "ladder", t0)
    _tick(w)
    [request] = _mails(w, cs.id)
    msg = request["msg"]
    assert request["tls"] and request["login"] == USER.encode()  # STARTTLS, then AUTH with the env's login
    assert request["rcpt"] == [OWNER] and msg["X-DW-Change-Set-Version"] == cs.version
    assert cs.id in msg["Subject"] and cs.version[:12] in msg["Subject"]
    body = msg.get_content()
    assert f"Change set {cs.id}, version {cs.version}" in body and f"https://review.grocer.example/change-sets/{cs.id}" in body
    assert msg["Message-ID"].startswith("<dw.") and msg["Auto-Submitted"] == "auto-generated"
    for hours, step in ((2, "remind"), (6, "escalate"), (24, "deny")):
        climb(w.instance, DOMAINS, t0 + hours * H)
        _tick(w)
        mail = _mails(w, cs.id)[-1]
        assert mail["msg"]["X-DW-Ladder-Step"] == step
    remind, escalate, deny = (m["msg"] for m in _mails(w, cs.id)[1:])
    assert "Reminder" in remind.get_content() and remind["To"] == OWNER
    assert escalate["To"] == BOSS and OWNER in escalate["Cc"] and ONCALL in escalate["Cc"]
    assert "may now decide" in escalate.get_content() and f"dw-dagster approve {cs.id} --login" in escalate.get_content()
    assert "never granted" in deny.get_content() and "denied" in deny["Subject"]
    _tick(w)
    assert len(_mails(w, cs.id)) == 4  # once each


def _receipt(inc: Incident, *, verified: bool, cs_id: str) -> Receipt:
    now = utcnow()
    check = CheckOutcome(asset_key=["store_sales_line"], check_name="region_compare", passed=verified, severity="ERROR",
                         metadata={"dw/gap_rows": 0 if verified else 40, "dw/queries": "```sql\nSELECT 1\n```"})
    return Receipt(id=f"rc-{inc.id}", asset_key=["store_sales_line"], change_set_id=cs_id, change_set_version="b" * 32,
                   incident_id=inc.id, cause_kind="late_rows", cause_summary="late rows", evidence_summary={}, diff="",
                   approver=OWNER, approved_at=now, signature_valid=True, partitions=["2026-11-26"], run_ids={},
                   rows_before={}, rows_after={}, checks=[check], verified=verified, undo="", created_at=now,
                   previous_hash=None)


@pytest.mark.parametrize("verified", [True, False])
def test_the_receipt_is_emailed_in_the_words_of_its_outcome(world, verified):
    w = world
    inc = Incident(id=f"inc-rc-{verified}", asset_key=["store_sales_line"], source="dw_check", detected_at=utcnow(),
                   summary="Southwest short", gap_rows=40)
    for key, model in ((c.INCIDENT_KEY, inc), (c.RECEIPT_KEY, _receipt(inc, verified=verified, cs_id=f"cs-rc-{verified}"))):
        w.instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=dg.AssetKey(["store_sales_line"]), metadata={key: dg.MetadataValue.json(model.model_dump(mode="json"))}))
    _tick(w)
    [mail] = _mails(w, f"cs-rc-{verified}")
    text = mail["msg"].get_content()
    assert mail["msg"]["X-DW-Verified"] == ("yes" if verified else "no")
    if verified:
        assert "repaired and verified" in mail["msg"]["Subject"]
    else:
        assert "NOT verified" in mail["msg"]["Subject"] and "check region_compare" in text and "SELECT 1" in text
    assert f"https://review.grocer.example/incidents/{inc.id}" in text


def test_a_temporary_refusal_is_sent_on_the_next_tick_once(world):
    w = world
    cs = _propose(w, "deferred", utcnow())
    w.mailbox.refuse_next = "451 4.3.0 Mail server temporarily rejected message"
    first = _tick(w)
    assert "451" in first.skip_reason and _mails(w, cs.id) == []
    _tick(w)
    assert len(_mails(w, cs.id)) == 1
    [sent] = [n for n in notifications(w.instance) if n["channel"] == "email" and n.get("change_set_id") == cs.id and n["ok"]]
    assert sent["message_id"] == _mails(w, cs.id)[0]["msg"]["Message-ID"]


def test_a_rude_goodbye_after_the_message_was_accepted_is_not_a_failure(tmp_path):
    """The server accepted the message, then answered QUIT with 421 and hung up: reporting that as a
    failure makes the caller send the mail again (https://github.com/pallets-eco/flask-mail/pull/139,
    "could unnecessarily cause duplicate emails upon retry")."""
    mailbox = Mailbox()
    ctl, port, ca = _server(mailbox, tmp_path, quit_reply="421 4.4.2 closing connection")
    try:
        res = EmailResource(host="127.0.0.1", port=port, sender="dw-dagster@grocer.example", ca_file=ca,
                            username_env="DW_TEST_SMTP_USER", password_env="DW_TEST_SMTP_PASSWORD")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DW_TEST_SMTP_USER", USER)
            mp.setenv("DW_TEST_SMTP_PASSWORD", PASSWORD)
            out = res.send(Mail(to=[OWNER], subject="s", text="t"), message_id="<once@dw-dagster>")
        assert out["message_id"] == "<once@dw-dagster>" and len(mailbox.messages) == 1
    finally:
        ctl.stop()


def test_no_login_in_the_clear_and_a_missing_password_names_its_variable(tmp_path, monkeypatch):
    mailbox = Mailbox()
    ctl, port, _ = _server(mailbox, tmp_path, starttls=False)
    try:
        plain = EmailResource(host="127.0.0.1", port=port, sender="dw-dagster@grocer.example",
                              username_env="DW_TEST_SMTP_USER", password_env="DW_TEST_SMTP_PASSWORD")
        monkeypatch.setenv("DW_TEST_SMTP_USER", USER)
        monkeypatch.setenv("DW_TEST_SMTP_PASSWORD", PASSWORD)
        with pytest.raises(HttpApiError, match="does not offer STARTTLS"):
            plain.send(Mail(to=[OWNER], subject="s", text="t"), message_id="<x@dw-dagster>")
        monkeypatch.delenv("DW_TEST_SMTP_PASSWORD")
        relay = plain.model_copy(update={"starttls": False})
        with pytest.raises(Exception, match=r"\$DW_TEST_SMTP_PASSWORD") as e:
            relay.send(Mail(to=[OWNER], subject="s", text="t"), message_id="<y@dw-dagster>")
        assert PASSWORD not in str(e.value) and mailbox.messages == []
    finally:
        ctl.stop()
