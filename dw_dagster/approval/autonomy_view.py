"""The review page's earned-autonomy table: per domain and change class, what the receipts say.

For the domains of the change sets a person is asked to decide (else every domain they approve
for), one row per change class with its record (:func:`dw_dagster.core.autonomy.autonomy_records`):
applied, verified, undone, failed, the clean streak against the domain's ``earn_after``, the
domain's autonomy now, and the last failure with its note. An approver sees how a class has fared
before trusting it again; ``dw-dagster change-sets autonomy`` shows the same and drafts the change.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape as esc

import dagster as dg

from dw_dagster.core.autonomy import ClassRecord, autonomy_records
from dw_dagster.core.domains import Domains


def autonomy_for(instance: dg.DagsterInstance, domains: Sequence[str]) -> list[ClassRecord]:
    """The records of ``domains`` (none when no domain is named)."""
    wanted = set(domains)
    return [r for r in autonomy_records(instance) if r.domain in wanted]


def _level(doms: Domains | None, name: str, klass: str) -> str:
    try:
        d = doms.get(name) if doms is not None else None
    except Exception:  # noqa: BLE001 - a domain no longer listed: shown without its level
        d = None
    if d is None:
        return "-"
    allowed = klass in (getattr(d, "allowed_change_classes", None) or [])
    earn = getattr(d, "earn_after", None)
    return f"{d.autonomy}{' · allowed' if allowed else ''}" + (f" · earns after {earn}" if earn else "")


def autonomy_html(recs: Sequence[ClassRecord], doms: Domains | None = None) -> str:
    """The ``Autonomy record`` section (``id=autonomy``, a row ``class=autonomy-row`` per domain and class)."""
    if not recs:
        return ("<h2>Autonomy record</h2><p class=muted id=no-autonomy>No repair applied yet in these domains: "
                "every change class still needs an approval.</p>")
    rows = "".join(
        f"<tr class=autonomy-row data-domain=\"{esc(r.domain)}\" data-class=\"{esc(r.change_class)}\">"
        f"<td>{esc(r.domain)}</td><td>{esc(r.change_class)}</td><td>{r.applied}</td><td>{r.verified}</td>"
        f"<td>{r.undone}</td><td>{r.failed}</td><td>{r.clean_streak}</td><td>{esc(_level(doms, r.domain, r.change_class))}</td>"
        f"<td>{esc((f'{r.last_failure_at:%Y-%m-%d %H:%M UTC}: ' if r.last_failure_at else '') + (r.last_failure or '-'))}</td></tr>"
        for r in recs)
    return ("<h2>Autonomy record</h2><p class=muted>Per domain and change class, from the receipts: a clean streak that "
            "reaches the domain's earn_after proposes raising the class's autonomy (dw-dagster change-sets autonomy); "
            "a failure or an undo proposes lowering it.</p><table id=autonomy><tr><th>domain</th><th>change class</th>"
            "<th>applied</th><th>verified</th><th>undone</th><th>failed</th><th>clean streak</th><th>autonomy now</th>"
            f"<th>last failure</th></tr>{rows}</table>")


__all__ = ["autonomy_for", "autonomy_html"]
