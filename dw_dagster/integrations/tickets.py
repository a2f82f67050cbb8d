"""What dw_dagster needs from a ticket system (Jira Cloud, ServiceNow), and Atlassian Document Format.

:class:`TicketSystem` is the small protocol both :class:`~dw_dagster.integrations.jira.JiraResource`
and :class:`~dw_dagster.integrations.servicenow.ServiceNowResource` implement, keyed by the
dw_dagster incident id: open (or find) the ticket, comment on it at most once per ref, close it.
:func:`adf` turns plain text (lines, URLs) into an Atlassian Document Format document, the body
Jira REST v3 requires for descriptions and comments; :func:`adf_text` reads one back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

_URL = re.compile(r"https?://[^\s<>\"')]+")


@dataclass(frozen=True)
class Ticket:
    """A ticket: its key (``OPS-12``, ``INC0010001``), its system id, its link, and who opened it."""

    key: str
    id: str
    url: str
    opened_by: str = "dw_dagster"

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "id": self.id, "url": self.url, "opened_by": self.opened_by}


@runtime_checkable
class TicketSystem(Protocol):
    """A ticket system as the notification sensor uses it (one task channel per system: :attr:`kind`)."""

    kind: str

    def find_ticket(self, incident_id: str) -> Ticket | None:
        """The ticket dw_dagster opened for ``incident_id``, or None."""
        ...

    def open_ticket(self, incident_id: str, summary: str, description: str, *, check_first: bool = True) -> Ticket:
        """The ticket for ``incident_id``, created at most once (found first when it may exist)."""
        ...

    def find_alerting_ticket(self, lightup_incident_uuid: str, config: dict[str, Any]) -> Ticket | None:
        """The ticket Lightup's alert channel (``config``: the integration's) opened for its incident, or None."""
        ...

    def comment(self, ticket: Ticket, text: str, *, ref: str | None, check_first: bool | None = None) -> dict[str, Any]:
        """Add ``text`` to the ticket at most once per ``ref``."""
        ...

    def close(self, ticket: Ticket, text: str) -> dict[str, Any]:
        """Move the ticket to done/resolved with ``text`` (nothing when it is already there)."""
        ...


def _inline(line: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pos = 0
    for m in _URL.finditer(line):
        if m.start() > pos:
            out.append({"type": "text", "text": line[pos:m.start()]})
        out.append({"type": "text", "text": m.group(0), "marks": [{"type": "link", "attrs": {"href": m.group(0)}}]})
        pos = m.end()
    if pos < len(line):
        out.append({"type": "text", "text": line[pos:]})
    return out


def adf(text: str) -> dict[str, Any]:
    """Plain text as an ADF ``doc`` (version 1): one paragraph per line (empty lines dropped), URLs as links,
    a fenced block (```` ``` ````) as a ``codeBlock``."""
    content: list[dict[str, Any]] = []
    code: list[str] | None = None
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if code is None:
                code = []
            else:
                content.append({"type": "codeBlock", "attrs": {"language": "sql"},
                                "content": [{"type": "text", "text": "\n".join(code) or " "}]})
                code = None
            continue
        if code is not None:
            code.append(line)
        elif line.strip():
            content.append({"type": "paragraph", "content": _inline(line)})
    if code:
        content.append({"type": "codeBlock", "attrs": {"language": "sql"}, "content": [{"type": "text", "text": "\n".join(code)}]})
    return {"type": "doc", "version": 1, "content": content or [{"type": "paragraph", "content": []}]}


def adf_text(node: Any) -> str:
    """The text of an ADF node (a whole document: paragraphs joined by newlines)."""
    if isinstance(node, str):
        return node
    if not isinstance(node, dict):
        return ""
    if node.get("type") == "text":
        return str(node.get("text", ""))
    parts = [adf_text(c) for c in node.get("content") or []]
    joiner = "\n" if node.get("type") in ("doc", "bulletList", "orderedList", "listItem") else ""
    return joiner.join(parts)


__all__ = ["Ticket", "TicketSystem", "adf", "adf_text"]
