"""Reminders to the requester before a grant ends: email (SMTP) and Slack.

The access sensor claims a grant's one reminder in the ledger before sending it
(:meth:`dw_dagster.core.ledger.Ledger.claim_reminder`), so two daemons or a restart never send it
twice; a send that fails frees the claim and the next tick tries again. Each channel carries a
stable reference (``dw:access:<request>:reminder``): the email's ``Message-ID``, the Slack
message's metadata (Slack posts are looked up by it before a retry, :meth:`SlackResource.post_message`).
"""

from __future__ import annotations

import smtplib
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any, Protocol

from dw_dagster.dagster_private import public
from dw_dagster.access.models import AccessRequest
from dw_dagster.core.models import utcnow


class Notifier(Protocol):
    """Sends one reminder; returns where it went (one line). Raises on failure."""

    def remind(self, req: AccessRequest, *, ref: str, text: str) -> str:
        ...


def reminder_text(req: AccessRequest) -> str:
    """The reminder: what ends when, and that an extension is a new request."""
    e = req.dry_run.engine
    what = f"role {e.role}" if e.role else ", ".join(e.tables[:5])
    left = req.expires_at - utcnow()
    minutes = max(0, int(left.total_seconds() // 60))
    return (f"Your access to {what} on {req.database_name} (request {req.id}, for {req.spec.grantee_email}) ends at "
            f"{req.expires_at:%Y-%m-%d %H:%M:%S} UTC, in {minutes} min; it will be revoked then"
            f"{' and live sessions ended' if req.spec.end_sessions else ''}. To keep it, ask again: an extension is a "
            f"new request the owners approve (dw-dagster access request ... --why \"extension of {req.id}: ...\").")


@public
@dataclass(frozen=True)
class EmailNotifier:
    """Email through an SMTP server (``smtplib``; STARTTLS and login when given).

    Attributes:
        host, port: the SMTP server.
        sender: the ``From`` address.
        starttls: upgrade the connection with STARTTLS first.
        username, password: SMTP login (read them from the environment: ``dg.EnvVar``).
        timeout_s: connection timeout.
    """

    host: str
    port: int = 25
    sender: str = "dw-dagster@localhost"
    starttls: bool = False
    username: str | None = None
    password: str | None = None
    timeout_s: float = 10.0

    def remind(self, req: AccessRequest, *, ref: str, text: str) -> str:
        msg = EmailMessage()
        msg["From"], msg["To"] = self.sender, req.requester
        if req.spec.grantee_email != req.requester:
            msg["Cc"] = req.spec.grantee_email
        msg["Subject"] = f"[dw-dagster] your access {req.id} ends at {req.expires_at:%H:%M} UTC"
        msg["Message-ID"] = f"<{ref.replace(':', '.')}@dw-dagster>"
        msg.set_content(text)
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
            if self.starttls:
                smtp.starttls()
            if self.username:
                smtp.login(self.username, self.password or "")
            smtp.send_message(msg)
        return f"email to {req.requester} via {self.host}:{self.port}"


@public
@dataclass(frozen=True)
class SlackNotifier:
    """A Slack message (``chat.postMessage``) to ``channel`` mentioning the requester by email."""

    slack: Any
    channel: str | None = None

    def remind(self, req: AccessRequest, *, ref: str, text: str) -> str:
        answer = self.slack.post_message(f"{req.requester}: {text}", channel=self.channel, ref=ref, check_first=True)
        return f"Slack {answer.get('channel')} ts {answer.get('ts')}"


__all__ = ["EmailNotifier", "Notifier", "SlackNotifier", "reminder_text"]
