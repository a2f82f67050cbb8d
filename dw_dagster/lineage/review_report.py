"""A :class:`~dw_dagster.lineage.review_models.Review` as terminal text, as a pull-request comment, as a short summary.

Every name in the output (node ids, column names, descriptions) comes from the project under
review and is escaped: in Markdown, characters that format or link (``\\ ` * _ { } [ ] ( ) # +
! | ~ < > &``) are backslash-escaped or written as HTML entities and line breaks become spaces,
so a column called ``a|b`` or ``<img src=x>`` neither breaks a table nor renders. Long lists
are cut (:data:`ROWS` rows a table) with the count left out, and the comment stays under
GitHub's 65,536-character limit for an issue comment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from dw_dagster.lineage.review_models import ColumnChange, Review

ROWS = 40
MARKDOWN_MAX = 60_000
#: first line of every comment; a CI step can find and update its earlier comment by it
MARKER = "<!-- dw-dagster-review -->"
_MD = re.compile(r"([\\`*_{}\[\]()#+!|~])")


def md(text: object) -> str:
    """``text`` escaped for GitHub Markdown (inline, also inside a table cell)."""
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD.sub(r"\\\1", s)
    return re.sub(r"[\r\n\t]+", " ", s)


def plain(text: object) -> str:
    """``text`` on one line for the terminal (control characters shown as ``\\x..``)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _counts(r: Review) -> dict[str, int]:
    return {k: sum(1 for n in r.nodes if n.change == k) for k in ("added", "modified", "removed")}


def headline(r: Review) -> str:
    """One line: what changed, how many breaking changes and sensitive-looking columns."""
    c = _counts(r)
    sens = len({(s.unique_id, s.column) for s in r.sensitive})
    return (f"{c['modified']} modified, {c['added']} added, {c['removed']} removed; {len(r.breaking)} breaking; "
            f"{sens} sensitive-looking new column(s); state:modified+ reaches {len(r.state_modified_plus)} node(s)")


def _reason(x) -> str:
    return x.detail if x.detail.startswith(x.kind + ":") else f"{x.kind}: {x.detail}"


def _change_text(c: ColumnChange, esc) -> str:
    if c.change == "renamed":
        return f"renamed from {esc(c.before)} ({esc(c.evidence)})"
    if c.change in ("type_changed", "nullability_changed"):
        return f"{c.change.replace('_', ' ')}: {esc(c.before)} → {esc(c.after)}"
    return c.change


def _readers(c: ColumnChange, esc, limit: int = 5) -> str:
    parts = [f"{esc(u.unique_id)} ({u.how})" for u in c.selected_by[:limit]]
    if len(c.selected_by) > limit:
        parts.append(f"and {len(c.selected_by) - limit} more")
    if c.unreadable:
        parts.append(f"{len(c.unreadable)} unreadable")
    return ", ".join(parts) or "—"


def _cut(items: Sequence, limit: int = ROWS) -> tuple[Sequence, int]:
    return items[:limit], max(0, len(items) - limit)


def review_markdown(r: Review, failures: Iterable[str] = ()) -> str:
    """The pull-request comment (GitHub-flavoured Markdown), starting with :data:`MARKER`.

    Args:
        r: the review.
        failures: the failed policies (:meth:`Review.failures`), shown at the top.
    """
    out = [MARKER, f"### dbt review: {md(headline(r))}", ""]
    failures = list(failures)
    if failures:
        out += [f"**Blocking:** {md('; '.join(failures))}", ""]
    if not r.nodes and not r.columns:
        out += ["No change to the dbt project's nodes.", ""]
    if r.nodes:
        rows, more = _cut(r.nodes)
        out += ["#### Nodes", "", "| change | node | type | why | reaches |", "|---|---|---|---|---|"]
        for n in rows:
            why = "; ".join(_reason(x) for x in n.reasons[:4])
            flag = "" if n.in_state_modified or n.change == "removed" else " (not in dbt's state:modified)"
            out.append(f"| {n.change}{flag} | {md(n.unique_id)} | {md(n.resource_type)} | {md(why)} | {n.reaches} |")
        if more:
            out.append(f"| … | {more} more | | | |")
        out.append("")
    col_rows = [(nc, c) for nc in r.columns for c in nc.changes]
    if r.columns:
        out += ["#### Columns", ""]
    if col_rows:
        out += ["| node | column | change | breaking | read by |", "|---|---|---|---|---|"]
        rows, more = _cut(col_rows)
        for nc, c in rows:
            out.append(f"| {md(nc.unique_id)} | {md(c.column)} | {_change_text(c, md)} | "
                       f"{'**yes**: ' + md(c.why) if c.breaking else 'no'} | {_readers(c, md)} |")
        if more:
            out.append(f"| … | {more} more | | | |")
        out.append("")
    extra = []
    for nc in r.columns:
        extra += [f"- **breaking contract change** on {md(nc.unique_id)}: {md(text)}" for text in nc.contract_breaking]
        if nc.note:
            extra.append(f"- {md(nc.unique_id)} ({md(nc.columns_from)}): {md(nc.note)}")
    out += extra + ([""] if extra else [])
    if r.sensitive:
        out += ["#### Sensitive-looking new columns", "", "| node | column | rule | matched | source |", "|---|---|---|---|---|"]
        rows, more = _cut(r.sensitive)
        for s in rows:
            out.append(f"| {md(s.unique_id)} | {md(s.column)} | {md(s.rule)} ({md(s.category)}) | "
                       f"{md(s.matched_on)}: {md(s.matched_text)} | {md(s.source)} |")
        if more:
            out.append(f"| … | {more} more | | | |")
        out.append("")
    br = r.blast_radius
    if br is not None:
        out += [f"#### Blast radius: {len(r.state_modified_plus)} node(s) (`dbt ls -s state:modified+ --state BASE`)", ""]
        out.append(f"- models, seeds, snapshots: {len(br.models)}; tests: {len(br.tests)}; exposures: {len(br.exposures)}; "
                   f"other: {len(br.other)}; deepest: {br.max_depth}")
        for e in br.exposures[:ROWS]:
            owner = e.owner_email or e.owner_name or "no owner"
            out.append(f"- exposure {md(e.unique_id)} {md(e.label or e.name)} ({md(e.type or '?')}), owner {md(owner)}"
                       + (f", {md(e.url)}" if e.url else ""))
        keys, more = _cut(["/".join(k) for k in br.dagster_assets])
        if keys:
            out.append(f"- Dagster assets: {', '.join(md(k) for k in keys)}" + (f" and {more} more" if more else ""))
        out.append("")
    if r.domains or r.owners:
        out += ["#### Owners", ""]
        for d in r.domains:
            out.append(f"- domain **{md(d.domain)}**: approvers {md(', '.join(d.approvers))}"
                       + (f"; escalation {md(', '.join(d.escalation))}" if d.escalation else "")
                       + (f"; {len(d.assets)} asset(s)" if d.assets else "")
                       + (f"; exposures {md(', '.join(d.exposures))}" if d.exposures else ""))
        if r.owners:
            out.append(f"- everyone named as an owner: {md(', '.join(r.owners))}")
        out.append("")
    if r.notes:
        out += ["#### Notes", ""] + [f"- {md(n)}" for n in r.notes] + [""]
    text = "\n".join(out)
    if len(text) > MARKDOWN_MAX:
        text = text[:MARKDOWN_MAX].rsplit("\n", 1)[0] + "\n\n… (cut to stay under GitHub's comment limit; `--json` has it all)\n"
    return text


def review_text(r: Review, failures: Iterable[str] = ()) -> str:
    """The report for a terminal: headline, nodes with reasons, column changes, sensitive columns, blast radius, owners."""
    out = [f"dbt review {plain(r.base)} → {plain(r.head)}", plain(headline(r))]
    for f in failures:
        out.append(f"FAIL {plain(f)}")
    if r.nodes:
        out.append("nodes:")
        for n in r.nodes:
            tag = "" if n.in_state_modified or n.change == "removed" else " [not in dbt's state:modified]"
            reach = f" (reaches {n.reaches} downstream)" if n.reaches else ""
            out.append(f"  {n.change:<8} {plain(n.unique_id)}{tag}{reach}")
            for x in n.reasons:
                out.append(f"             {plain(_reason(x))}")
    if r.columns:
        out.append("columns:")
        for nc in r.columns:
            out.append(f"  {plain(nc.unique_id)} (from {nc.columns_from})" + (f": {plain(nc.note)}" if nc.note else ""))
            for c in nc.changes:
                out.append(f"    {plain(c.column)}: {_change_text(c, plain)}; {'BREAKING' if c.breaking else 'not breaking'}"
                           f" ({plain(c.why)}); read by {_readers(c, plain)}")
            for text in nc.contract_breaking:
                out.append(f"    contract: {plain(text)} (breaking)")
    if r.sensitive:
        out.append("sensitive-looking new columns:")
        for s in r.sensitive:
            out.append(f"  {plain(s.unique_id)}.{plain(s.column)}: rule {s.rule} ({s.category}) on {s.matched_on} "
                       f"{plain(s.matched_text)!r}; source: {plain(s.source)}")
    br = r.blast_radius
    if br is not None:
        out.append(f"blast radius (dbt ls -s state:modified+: {len(r.state_modified_plus)} nodes): {len(br.models)} models, "
                   f"{len(br.tests)} tests, {len(br.exposures)} exposures, {len(br.dagster_assets)} Dagster assets")
        for e in br.exposures:
            out.append(f"  exposure {plain(e.unique_id)} {plain(e.label or e.name)} owner "
                       f"{plain(e.owner_email or e.owner_name or '-')} {plain(e.url or '')}".rstrip())
    for d in r.domains:
        out.append(f"domain {plain(d.domain)}: approvers {plain(', '.join(d.approvers))}"
                   + (f"; slack {plain(d.slack_channel)}" if d.slack_channel else ""))
    if r.owners:
        out.append(f"owners: {plain(', '.join(r.owners))}")
    for n in r.notes:
        out.append(f"note: {plain(n)}")
    return "\n".join(out)


def review_summary(r: Review, limit: int = 8) -> list[str]:
    """A few plain lines for a chat message: the headline, then the breaking changes and sensitive columns."""
    lines = [headline(r)]
    for uid, c in r.breaking[:limit]:
        lines.append(f"breaking: {uid}: " + (f"{c.column} {_change_text(c, str)} ({c.why})" if isinstance(c, ColumnChange) else c))
    seen = []
    for s in r.sensitive:
        if (s.unique_id, s.column) not in seen:
            seen.append((s.unique_id, s.column))
            if len(seen) <= limit:
                lines.append(f"sensitive: {s.unique_id}.{s.column} ({s.rule})")
    return lines


__all__ = ["MARKER", "headline", "md", "plain", "review_markdown", "review_summary", "review_text"]
