"""Email over SMTP: approval requests, ladder steps (reminders, escalations, denials) and receipts.

:class:`EmailResource` sends through an SMTP submission server (RFC 6409, port 587) with
STARTTLS (RFC 3207) before it logs in (RFC 4954 ``AUTH``; the user name and password are read
from the environment variables the configuration *names*, never written in it). Every message
carries the change set id and version (or the incident and receipt), the review page link and the
Dagster asset link, in its body and in ``X-DW-*`` headers a mail rule can use.

**Exactly once, as far as SMTP allows.** SMTP has no way to ask a server whether a message was
accepted. A message counts as sent when the server answered ``250`` to its data; the
notification task records that at once, so a later tick never sends it again. Each message has a
``Message-ID`` made from its task and step (the same on every try), so the one case SMTP leaves
open — the connection dropped after the data was sent and before the ``250`` came back, then the
next tick sends again — reaches the reader as two copies with one ``Message-ID``, which mail
clients show as one message. Any refusal (a ``4xx`` such as 421 or 451: the server did not take
it; a ``5xx``), a refused connection or a failed login fails the task, which the next tick tries
again; only a message the server accepted is recorded as sent.
"""

from __future__ import annotations

import os
import smtplib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formataddr, formatdate
from typing import Any

import dagster as dg
from pydantic import Field

from dw_dagster.dagster_private import public

from dw_dagster.core.http import HttpApiError
from dw_dagster.core.models import ChangeSet
from dw_dagster.errors import DwDagsterError


class EmailError(DwDagsterError, RuntimeError):
    """Sending failed; the message names the server, the SMTP stage and the reply (never the password)."""


@dataclass(frozen=True)
class Mail:
    """One message: recipients, subject, plain text, and the ``X-DW-*`` headers."""

    to: list[str]
    subject: str
    text: str
    cc: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)


@public
class EmailResource(dg.ConfigurableResource):
    """SMTP with STARTTLS and a login from the environment (see the module docstring).

    Example (``definitions``)::

        EmailResource(host="smtp.grocer.example", sender="dw-dagster@grocer.example",
                      username_env="DW_SMTP_USER", password_env="DW_SMTP_PASSWORD")
    """

    host: str = Field(description="the SMTP submission server")
    port: int = Field(default=587, description="587 (submission with STARTTLS)")
    sender: str = Field(description="the From address")
    sender_name: str = Field(default="dw-dagster", description="the From display name")
    starttls: bool = Field(default=True, description="upgrade the connection with STARTTLS before anything else "
                           "(refused when the server does not offer it); false only for a trusted local relay")
    username_env: str | None = Field(default=None, description="the env var holding the SMTP user (no login when None)")
    password_env: str | None = Field(default=None, description="the env var holding the SMTP password")
    ca_file: str | None = Field(default=None, description="CA bundle that signs the server's certificate "
                                "(default: the system's)")
    timeout_s: float = Field(default=20.0, description="socket timeout, seconds")

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()

    def _credentials(self) -> tuple[str, str] | None:
        if not self.username_env:
            return None
        user = os.environ.get(self.username_env)
        password = os.environ.get(self.password_env or "") if self.password_env else None
        if not user or password is None:
            missing = [n for n in (self.username_env, self.password_env) if n and not os.environ.get(n)]
            raise EmailError(f"SMTP login needs ${' and $'.join(missing) or self.password_env}: not set")
        return user, password

    def message(self, mail: Mail, message_id: str) -> EmailMessage:
        """The RFC 5322 message for ``mail`` with ``message_id``."""
        msg = EmailMessage()
        msg["From"] = formataddr((self.sender_name, self.sender))
        msg["To"] = ", ".join(mail.to)
        if mail.cc:
            msg["Cc"] = ", ".join(mail.cc)
        msg["Subject"] = mail.subject
        msg["Date"] = formatdate(usegmt=True)
        msg["Message-ID"] = message_id
        msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies to a bot
        for k, v in mail.headers.items():
            msg[k] = v
        msg.set_content(mail.text)
        return msg

    def send(self, mail: Mail, *, message_id: str) -> dict[str, Any]:
        """Send one message; return ``{"message_id", "refused"}`` (recipients the server refused).

        Raises:
            HttpApiError: (service ``smtp``) the server could not be reached, refused STARTTLS or the
                login, or answered 4xx/5xx; ``maybe_applied`` when the connection broke after the
                data was sent. Never carries the password.
        """
        if not mail.to:
            raise EmailError("an email needs at least one recipient")
        msg = self.message(mail, message_id)
        where = f"{self.host}:{self.port}"
        stage = "connect"
        smtp: smtplib.SMTP | None = None
        try:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout_s)
            stage = "ehlo"
            smtp.ehlo()
            if self.starttls:
                stage = "starttls"
                if not smtp.has_extn("starttls"):
                    raise HttpApiError("smtp", "STARTTLS", where, None, "the server does not offer STARTTLS; "
                                       "refusing to log in or send in the clear")
                smtp.starttls(context=self._context())
                smtp.ehlo()
            creds = self._credentials()
            if creds:
                stage = "login"
                smtp.login(*creds)
            stage = "data"
            refused = smtp.send_message(msg, to_addrs=[*mail.to, *mail.cc])
            stage = "sent"
        except smtplib.SMTPRecipientsRefused as e:
            raise HttpApiError("smtp", "RCPT", where, _code(e.recipients), f"every recipient refused: {e.recipients}") from None
        except smtplib.SMTPResponseException as e:
            raise HttpApiError("smtp", stage.upper(), where, e.smtp_code,
                               f"{e.smtp_error.decode(errors='replace') if isinstance(e.smtp_error, bytes) else e.smtp_error}"
                               [:300]) from None
        except (smtplib.SMTPServerDisconnected, TimeoutError, OSError, ssl.SSLError) as e:
            raise HttpApiError("smtp", stage.upper(), where, None, f"{type(e).__name__}: {e}"[:300],
                               maybe_applied=stage == "data") from None
        finally:
            if smtp is not None and stage != "sent":
                smtp.close()
        # accepted: whatever the goodbye does (a 421 to QUIT, a dropped connection) the message was sent,
        # and reporting it as failed would send it again
        try:
            smtp.quit()
        except (smtplib.SMTPException, OSError):
            smtp.close()
        return {"message_id": message_id, "refused": sorted(refused)}


def _code(recipients: dict) -> int | None:
    for value in recipients.values():
        if isinstance(value, tuple) and value:
            return int(value[0])
    return None


# -- messages -------------------------------------------------------------------------------------

def _links(review_url: str | None, asset_url: str | None) -> list[str]:
    return ([f"Review page: {review_url}"] if review_url else []) + ([f"Asset in Dagster: {asset_url}"] if asset_url else [])


def _cs_headers(cs_id: str, version: str, review_url: str | None) -> dict[str, str]:
    out = {"X-DW-Change-Set": cs_id, "X-DW-Change-Set-Version": version}
    if review_url:
        out["X-DW-Review-URL"] = review_url
    return out


def request_email(cs: ChangeSet, *, to: Sequence[str], review_url: str | None, asset_url: str | None,
                  sender: str = "", header: str | None = None) -> Mail:
    """The approval request: what would run, where, why, until when, and how to decide."""
    lines = ([header, ""] if header else []) + [
        f"Change set {cs.id}, version {cs.version}, waits for a decision by {', '.join(cs.approvers)}.",
        "",
        f"Summary: {cs.summary}",
        f"Asset: {'/'.join(cs.target_asset)} (domain {cs.domain})",
        f"Cause: {cs.cause_kind} (incident {cs.incident_id}, diagnosis {cs.diagnosis_id})",
        f"Window: {', '.join(cs.window) or 'none'}; rows to recover: {cs.expected_recovered_rows:,}",
        *(f"Not run: {line}" for line in cs.not_run_lines()),
        f"Rebuild: {', '.join('/'.join(k) for k in cs.rebuild_assets) or 'nothing'}",
        f"Expires: {cs.expires_at:%Y-%m-%d %H:%M UTC} (unanswered, it is never granted)",
        "",
        "Decide on the review page (signed in with your company login), with the buttons in Slack, or:",
        f"  dw-dagster approve {cs.id} --login",
        "",
        *_links(review_url, asset_url),
    ]
    subject = f"[dw-dagster] {'' if not header else header.split(':', 1)[0] + ': '}approval needed: change set {cs.id} " \
              f"({cs.version[:12]}) on {'/'.join(cs.target_asset)}"
    return Mail(to=list(to), subject=subject[:250], text="\n".join(lines), headers=_cs_headers(cs.id, cs.version, review_url))


def ladder_email(step: dict[str, Any], cs: ChangeSet | None, *, review_url: str | None, asset_url: str | None,
                 sender: str = "") -> Mail:
    """A ladder step (``dw/escalation``): the request again with why now, or the denial."""
    if cs is not None and step["step"] in ("remind", "escalate") and step["kind"] == "request":
        mail = request_email(cs, to=step["to"] or step["cc"], review_url=review_url, asset_url=asset_url,
                             header=step["text"])
        return Mail(to=mail.to, cc=[x for x in step["cc"] if x not in mail.to], subject=mail.subject, text=mail.text,
                    headers={**mail.headers, "X-DW-Ladder-Step": step["step"]})
    lines = [step["text"], "", f"Change set {step['change_set_id']}, version {step['version']}.",
             f"Summary: {step.get('summary', '')}", "", *_links(review_url, asset_url)]
    word = {"remind": "reminder", "escalate": "escalation", "deny": "denied"}[step["step"]]
    subject = f"[dw-dagster] {word}: change set {step['change_set_id']} ({step['version'][:12]})"
    to = step["to"] or step["cc"]
    return Mail(to=list(to), cc=[x for x in step["cc"] if x not in to], subject=subject, text="\n".join(lines),
                headers={**_cs_headers(step["change_set_id"], step["version"], review_url), "X-DW-Ladder-Step": step["step"]})


def receipt_email(verdict: Any, incident_id: str, *, to: Sequence[str], review_url: str | None, asset_url: str | None,
                  sender: str = "", next_steps: Sequence[str] = ()) -> Mail:
    """A receipt in the words of its real outcome (:class:`~dw_dagster.integrations.outcomes.RepairVerdict`)."""
    from dw_dagster.integrations.outcomes import outcome_lines

    r = verdict.receipt
    lines = outcome_lines(verdict, incident_id, next_steps=next_steps) + ["", *_links(review_url, asset_url)]
    subject = f"[dw-dagster] {verdict.headline}: incident {incident_id}, change set {r.change_set_id} ({r.change_set_version[:12]})"
    return Mail(to=list(to), subject=subject[:250], text="\n".join(lines),
                headers={**_cs_headers(r.change_set_id, r.change_set_version, review_url), "X-DW-Receipt": r.id,
                         "X-DW-Verified": "yes" if r.verified else "no"})


__all__ = ["EmailError", "EmailResource", "Mail", "ladder_email", "receipt_email", "request_email"]
