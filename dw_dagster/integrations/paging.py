"""Page the on-call people about a dw_dagster incident: PagerDuty and Opsgenie, over their real HTTP APIs.

Two Dagster resources, each usable on its own and each implementing the small :class:`Pager`
protocol (``trigger`` / ``annotate`` / ``resolve``) so a sensor or the demo can call one interface:

- :class:`~dw_dagster.integrations.pagerduty.PagerDutyResource` sends alert events to the **Events API v2**
  (``POST https://events.pagerduty.com/v2/enqueue``; PagerDuty developer docs, "Events API v2 →
  Send an Alert Event") and, to annotate, uses the **REST API v2** (``https://api.pagerduty.com``;
  "REST API → Incidents: List incidents", "Create a note on an incident") to find the incident
  that the events created (``GET /incidents?incident_key=<dedup_key>``) and add notes to it.
- :class:`~dw_dagster.integrations.opsgenie.OpsgenieResource` uses the **Alert API** (``https://api.opsgenie.com``, EU
  ``https://api.eu.opsgenie.com``; Opsgenie docs, "Alert API": Create Alert, Add Note to Alert,
  Close Alert, Get Request Status), addressing the alert by its ``alias``.

Both key the page on the dw_dagster incident id through :func:`dedup_key_for`, so a repeated
trigger for the same incident lands on the same page, and ``annotate``/``resolve`` need only the
incident id. Every call goes through :func:`dw_dagster.core.http.send` (timeouts, jittered retries on
429/5xx honouring ``Retry-After``); every failure is an :class:`~dw_dagster.core.http.HttpApiError`
naming the vendor, method, endpoint path and status, with the routing key, API token and API key
scrubbed from its text.

**Exactly once.** Triggers, acknowledges and resolves are idempotent by the vendors' design and
keep plain retries: PagerDuty's Events API v2 folds every event with the same ``dedup_key`` into
the one open incident ("Events API v2 → Alert de-duplication"), and Opsgenie de-duplicates a
Create Alert whose ``alias`` matches an open alert (count + 1) and refuses to close a closed one
(so a close's note is added once). Notes are not: each ``POST`` adds one more. A note given an
idempotency ``ref`` (``dw:<task>:<step>``) carries it as a last line (:func:`~dw_dagster.core.http.marker_line`),
is sent without blind retries, and is looked up first (PagerDuty ``GET /incidents/{id}/notes``,
"List notes for an incident"; Opsgenie ``GET /v2/alerts/{alias}/notes``, "List Alert Notes")
whenever an earlier attempt may have been applied (:func:`~dw_dagster.core.http.post_once`).
:meth:`PagerDutyResource.resolution_steps` and :meth:`OpsgenieResource.resolution_steps` split
``resolve`` into its side effects so a caller can record each before the next one runs.

Message builders for the notes (:func:`diagnosis_note`, :func:`resolution_note`) and a
convenience :func:`page_incident` turn dw_dagster records (:class:`~dw_dagster.core.models.Incident`,
:class:`~dw_dagster.core.models.Diagnosis`, :class:`~dw_dagster.core.models.Receipt`) into page text.
"""

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import dagster as dg
import httpx
from pydantic import Field

from dw_dagster.core.http import HttpApiError, RetryPolicy, json_body, post_once, send
from dw_dagster.core.models import Diagnosis, ExposureRef, Incident, Receipt
from dw_dagster.dagster_private import public

Severity = Literal["critical", "error", "warning", "info"]
SEVERITIES: tuple[str, ...] = ("critical", "error", "warning", "info")

#: Severity → Opsgenie priority (P1 highest).
OPSGENIE_PRIORITY: dict[str, str] = {"critical": "P1", "error": "P2", "warning": "P3", "info": "P5"}


#: One side effect of a multi-step action: ``(step name, run)``. ``run(ref, check_first)`` performs
#: it (``ref`` is the idempotency marker for notes, or None; ``check_first`` True forces a look-up
#: before posting, None leaves the vendor's default) and returns what to record about it.
PagerStep = tuple[str, Callable[[str | None, bool | None], dict[str, Any]]]

#: PagerDuty Events API v2: dedup_key ≤ 255 characters ("Send an Alert Event")
PD_DEDUP_KEY_MAX = 255

_KEY_PREFIX = "dw-dagster:"


@public
def dedup_key_for(incident_id: str) -> str:
    """The PagerDuty ``dedup_key`` (and Opsgenie ``alias``) for a dw_dagster incident.

    Deterministic: ``"dw-dagster:" + incident_id`` while that fits in 255 characters, else the
    first 180 characters of the id plus a 16-hex SHA-256 of the whole id (so two long ids that
    share a prefix still get different keys).

    Args:
        incident_id: the :class:`~dw_dagster.core.models.Incident` id, e.g. ``inc-4f296e71f448``.

    Returns:
        A string of at most 255 characters (within Opsgenie's 512-character alias limit too).

    Raises:
        ValueError: ``incident_id`` is empty or blank.
    """
    if not incident_id or not incident_id.strip():
        raise ValueError("incident_id must not be empty")
    key = _KEY_PREFIX + incident_id
    if len(key) <= PD_DEDUP_KEY_MAX:
        return key
    digest = hashlib.sha256(incident_id.encode()).hexdigest()[:16]
    return f"{_KEY_PREFIX}{incident_id[:180]}:{digest}"


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in an ellipsis when it was cut."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


@runtime_checkable
class Pager(Protocol):
    """What dw_dagster needs from a paging service, keyed by the dw_dagster incident id."""

    def trigger(self, incident_id: str, summary: str, *, severity: Severity = "error",
                details: Mapping[str, Any] | None = None,
                links: Sequence[tuple[str, str]] = ()) -> str:
        """Open (or re-trigger) the page; return the vendor key (dedup key / alias)."""
        ...

    def annotate(self, incident_id: str, text: str, *, ref: str | None = None,
                 check_first: bool | None = None) -> None:
        """Add a note (cause, blast radius, progress) to the open page, at most once per ``ref``."""
        ...

    def resolve(self, incident_id: str, *, receipt_url: str | None = None, note: str | None = None) -> None:
        """Note the receipt link (when given) and resolve the page."""
        ...


class _VendorResource(dg.ConfigurableResource):
    """Shared retry and timeout settings (see :class:`dw_dagster.core.http.RetryPolicy`)."""

    timeout_s: float = Field(default=10.0, description="HTTP timeout per try, seconds")
    retry_attempts: int = Field(default=4, description="tries per call, the first included")
    retry_base_wait_s: float = Field(default=0.5, description="first back-off, seconds (doubles, full jitter)")
    retry_max_wait_s: float = Field(default=8.0, description="cap on one back-off and on Retry-After, seconds")

    def retry_policy(self) -> RetryPolicy:
        """The :class:`RetryPolicy` built from this resource's fields."""
        return RetryPolicy(attempts=self.retry_attempts, base_wait_s=self.retry_base_wait_s,
                           max_wait_s=self.retry_max_wait_s, timeout_s=self.timeout_s)

    def _secrets(self) -> list[str]:
        return []

    def _redact(self, error: HttpApiError) -> HttpApiError:
        detail = error.detail
        for s in self._secrets():
            if s:
                detail = detail.replace(s, "[redacted]")
        return HttpApiError(error.service, error.method, error.endpoint, error.status, detail,
                            maybe_applied=error.maybe_applied)

    def _send(self, client: httpx.Client, service: str, method: str, url: str, *, idempotent: bool = True,
              **kwargs: Any) -> httpx.Response:
        try:
            return send(client, service, method, url, policy=self.retry_policy(), idempotent=idempotent, **kwargs)
        except HttpApiError as e:
            raise self._redact(e) from None

    def _post_once(self, post: Callable[[], Any], find: Callable[[], Any] | None, check_first: bool) -> tuple[Any, bool]:
        """:func:`~dw_dagster.core.http.post_once` with this resource's policy, errors redacted."""
        try:
            return post_once(post, find, policy=self.retry_policy(), check_first=check_first)
        except HttpApiError as e:
            raise self._redact(e) from None

    def _json(self, response: httpx.Response, service: str, method: str) -> Any:
        try:
            return json_body(response, service, method)
        except HttpApiError as e:
            raise self._redact(e) from None


def _base(url: str) -> str:
    return url.rstrip("/")


def _resolve_text(receipt_url: str | None, note: str | None) -> str | None:
    """The resolve note: ``note`` as given when it already holds the link, else the link plus ``note``."""
    if note and (not receipt_url or receipt_url in note):
        return note
    if receipt_url or note:
        return resolution_note(receipt_url, extra=note)
    return None


def _string_details(details: Mapping[str, Any], budget: int) -> dict[str, str]:
    """Opsgenie ``details``: a string → string map within ``budget`` characters (keys + values)."""
    out: dict[str, str] = {}
    used = 0
    for key, value in details.items():
        k, v = str(key), value if isinstance(value, str) else repr(value)
        room = budget - used - len(k)
        if room <= 0:
            break
        v = clip(v, room)
        out[k] = v
        used += len(k) + len(v)
    return out


# -- page text from dw_dagster records ---------------------------------------------------------

def _names(items: Iterable[str], limit: int = 10) -> str:
    items = list(items)
    if not items:
        return "none"
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def exposure_label(exposure: ExposureRef) -> str:
    """``Store P&L (dashboard, owner Priya Raman <priya@...>)`` for a dbt exposure."""
    parts = [exposure.type] if exposure.type else []
    owner = " ".join(x for x in (exposure.owner_name, f"<{exposure.owner_email}>" if exposure.owner_email else None) if x)
    if owner:
        parts.append(f"owner {owner}")
    if exposure.needed_by:  # meta.dw.needed_by: the approver sees the deadline at risk
        parts.append(f"needed by {exposure.needed_by}")
    return (exposure.label or exposure.name) + (f" ({', '.join(parts)})" if parts else "")


def blast_radius_lines(diagnosis: Diagnosis) -> list[str]:
    """One line each for models, tests, exposures (with owners) and owners of the blast radius."""
    br = diagnosis.blast_radius
    exposures = [exposure_label(e) for e in br.exposures]
    return [
        f"Models: {_names(m.name for m in br.models)}",
        f"dbt tests: {len(br.tests)}",
        f"Exposures: {_names(exposures)}",
        f"Owners: {_names(br.owners)}",
    ]


def diagnosis_note(diagnosis: Diagnosis, *, links: Sequence[tuple[str, str]] = ()) -> str:
    """A page note: the primary cause with its numbers, the window, and the blast radius.

    Args:
        diagnosis: the dw_dagster diagnosis.
        links: ``(href, text)`` pairs appended as "text: href" lines (e.g. the asset page).

    Returns:
        Plain text, a few hundred characters for a typical diagnosis (no vendor limit is near).
    """
    lines = [f"dw_dagster diagnosis {diagnosis.id} for incident {diagnosis.incident_id} "
             f"on {'/'.join(diagnosis.asset_key)}"]
    cause = diagnosis.primary
    if cause is None:
        lines.append(f"Cause: not found; {diagnosis.gap_rows:,} rows unexplained.")
    else:
        lines.append(f"Cause: {cause.kind} (confidence {cause.confidence:.0%}): {cause.summary}")
        lines.append(f"Explains {cause.explained_rows:,} of {diagnosis.gap_rows:,} rows; "
                     f"{diagnosis.unexplained_rows:,} unexplained.")
        if cause.window:
            lines.append(f"Window: {', '.join(cause.window)}")
    lines.append("Blast radius:")
    lines += [f"  {line}" for line in blast_radius_lines(diagnosis)]
    lines += [f"{text}: {href}" for href, text in links]
    return "\n".join(lines)


def resolution_note(receipt_url: str | None, receipts: Sequence[Receipt] = (), *, extra: str | None = None) -> str:
    """A page note for the resolution: the receipt link and, per receipt, asset and verification.

    Args:
        receipt_url: where the receipt can be read (e.g. the asset's page in the Dagster UI).
        receipts: the receipts written by the repair (may be empty).
        extra: a free-text line appended at the end.
    """
    if not receipts:
        lines = ["Resolved by dw_dagster."]
    elif all(r.verified for r in receipts):
        lines = ["Resolved by dw_dagster: repaired, verified, receipt written."]
    else:  # the wording follows the receipts, whoever calls this
        lines = [f"dw_dagster repair NOT verified ({receipts[0].outcome}); receipt written."]
    if receipt_url:
        lines.append(f"Receipt: {receipt_url}")
    for r in receipts:
        lines.append(f"- {'/'.join(r.asset_key)}: receipt {r.id} ({r.outcome}, {'verified' if r.verified else 'NOT verified'}), "
                     f"change set {r.change_set_id}, approved by {r.approver}, partitions {', '.join(r.partitions) or 'none'}")
    if extra:
        lines.append(extra)
    return "\n".join(lines)


@public
def page_incident(pager: Pager, incident: Incident, *, severity: Severity = "error",
                  links: Sequence[tuple[str, str]] = ()) -> str:
    """Trigger the page for a dw_dagster :class:`~dw_dagster.core.models.Incident`; return the vendor key.

    The summary is the incident's summary prefixed with the asset key; details carry the incident
    id, asset, check, gap rows and gap percent.
    """
    asset = "/".join(incident.asset_key)
    details = {"incident_id": incident.id, "asset": asset, "check": incident.check_name or "",
               "gap_rows": incident.gap_rows, "gap_pct": round(incident.gap_pct, 4),
               "detected_at": incident.detected_at.isoformat()}
    return pager.trigger(incident.id, f"[dw_dagster] {asset}: {incident.summary}", severity=severity,
                         details=details, links=links)


__all__ = [
    "OPSGENIE_PRIORITY",
    "Pager",
    "PagerStep",
    "blast_radius_lines",
    "clip",
    "dedup_key_for",
    "diagnosis_note",
    "exposure_label",
    "page_incident",
    "resolution_note",
]
