"""The story of an incident or a change set, gathered for the review site's read-only pages.

:func:`incident_story` and :func:`change_set_story` read the ledger (incidents, every version of
every change set, decisions, stages, ladder steps, people a channel could not reach) and, for the
records only the event log holds (the incident and diagnosis as recorded, refusals, receipts,
notifications), only the assets the story touches — never the whole event log. The result is a
timeline of :class:`Entry` (incident, diagnosis, proposal, decisions and refusals, ladder steps,
stages, receipts, what was told where) and, for a repair under way, its progress in words
("stage 3 of 5: rebuild running").
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from pydantic import ValidationError

from dw_dagster.approval.ladder import ladder_history
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import ChangeSet, Diagnosis, Incident, Receipt, TamperedRecord

#: stage states in words
_STAGE_WORDS = {"issued": "queued", "started": "running", "succeeded": "done", "failed": "FAILED", "abandoned": "abandoned"}


@dataclass
class Entry:
    """One moment of the story: when, what kind, a title, details (plain text lines) and links."""

    at: dt.datetime
    kind: str
    title: str
    lines: list[str] = field(default_factory=list)
    sql: list[str] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    css: str = ""


@dataclass
class Version:
    """One version of a change set with everything that happened to it."""

    change_set: ChangeSet
    state: str
    note: str
    decisions: list[dict[str, Any]]
    stages: list[Any]
    progress: str


@dataclass
class Story:
    """What a page shows: the subject, its versions, its receipts, the timeline."""

    title: str
    incident: Incident | None = None
    incident_state: str = ""
    incident_note: str = ""
    diagnosis: Diagnosis | None = None
    versions: list[Version] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    unreachable: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[Entry] = field(default_factory=list)


def _ts(t: float | None) -> dt.datetime:
    return dt.datetime.fromtimestamp(t or 0, dt.timezone.utc)


def planned_stages(cs: ChangeSet, issued: list[str]) -> list[str]:
    """The stages a repair runs, as far as the review site can tell without the code location: the
    stages issued so far, then the ones the change set still has (windows, steps, rebuild, verify, receipt)."""
    if cs.undo_plan is not None and cs.undo_plan.of_change_set:
        plan = ["restore", *(["rebuild"] if cs.rebuild_assets else []), "verify", "receipt"]
    else:
        windows = [s for s in issued if s.startswith("window-")] or (["window-1"] if cs.window else [])
        snapshot = ["snapshot"] if "snapshot" in issued else []
        steps = [f"{s.kind}-{i + 1}" for i, s in enumerate(cs.steps)]
        plan = snapshot + windows + steps + (["rebuild"] if cs.rebuild_assets else []) + ["verify", "receipt"]
    return issued + [s for s in plan if s not in issued]


def progress(cs: ChangeSet, stages: dict[str, Any], state: str) -> str:
    """``stage 3 of 5: rebuild running`` for a repair under way; the state in words otherwise."""
    ordered = sorted(stages.values(), key=lambda s: s.issued_at)
    if not ordered:
        return {"proposed": "waiting for a decision", "approved": "approved; the first stage is not issued yet"}.get(
            state, state)
    names = [s.stage for s in ordered if not s.stage.startswith("receipt-halt")]
    plan = planned_stages(cs, names)
    current = ordered[-1]
    index = plan.index(current.stage) + 1 if current.stage in plan else len(plan)
    return f"stage {index} of {len(plan)}: {current.stage} {_STAGE_WORDS.get(current.state, current.state)}"


def _incident_model(row) -> Incident | None:
    try:
        return Incident.model_validate_json(row.body)
    except (ValidationError, ValueError):
        return None


def _versions(instance: dg.DagsterInstance, rows) -> list[Version]:
    led = ledger_for(instance)
    out = []
    by_cs: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r.recorded_at):
        try:
            cs = records.parse_change_set(row.body)
        except (TamperedRecord, ValidationError, ValueError):
            continue
        if cs.id not in by_cs:
            by_cs[cs.id] = led.decisions(cs.id)
        stages = led.stages(cs.id, cs.version)
        out.append(Version(change_set=cs, state=row.state, note=row.note,
                           decisions=[d for d in by_cs[cs.id] if d["version"] == cs.version],
                           stages=sorted(stages.values(), key=lambda s: s.issued_at),
                           progress=progress(cs, stages, row.state)))
    return out


def _receipts(instance: dg.DagsterInstance, cs_ids: set[str]) -> list[Receipt]:
    led = ledger_for(instance)
    assets = sorted({link.asset_key for link in led.receipt_links() if link.change_set_id in cs_ids})
    out: list[Receipt] = []
    for a in assets:
        out += [r for r in records.receipts(instance, dg.AssetKey(a.split("/"))) if r.change_set_id in cs_ids]
    return sorted(out, key=lambda r: r.created_at)


def _timeline(story: Story, dagster_url: str, mask, ladder: list[dict[str, Any]]) -> list[Entry]:
    entries: list[Entry] = []
    inc = story.incident
    if inc is not None:
        lines = [f"{inc.summary}", f"source {inc.source}" + (f", check {inc.check_name}" if inc.check_name else "")
                 + f"; gap {inc.gap_rows:,} rows ({inc.gap_pct:.2f} %)"]
        lines += [f"{', '.join(f'{k}={v}' for k, v in s.slice.items()) or 'all rows'}: {s.gap_words()}"
                  for s in inc.slices if not s.passed]
        links = [(inc.external_url, "in Lightup")] if inc.external_url else []
        entries.append(Entry(inc.detected_at, "incident", f"Incident {inc.id} detected on {'/'.join(inc.asset_key)}",
                             lines, links=links + [(f"{dagster_url}/assets/{'/'.join(inc.asset_key)}", "asset in Dagster")]))
    d = story.diagnosis
    if d is not None:
        p = d.primary
        sentence = (f"{p.kind} (confidence {p.confidence:.0%}): {p.summary} Explains {p.explained_rows:,} of "
                    f"{d.gap_rows:,} rows; {d.unexplained_rows:,} unexplained.") if p else \
            f"No cause found; {d.gap_rows:,} rows unexplained."
        lines = [sentence]
        sql = []
        for ev in (p.evidence if p else []):
            values = mask(ev.values) if mask and isinstance(ev.values, (dict, list)) else ev.values
            lines.append(f"Evidence: {ev.description} ({ev.database}): {str(values)[:600]}")
            sql.append(ev.sql)
        br = d.blast_radius
        lines.append(f"Blast radius: models {', '.join(m.name for m in br.models) or 'none'}; exposures "
                     f"{', '.join(e.label or e.name for e in br.exposures) or 'none'}; owners {', '.join(br.owners) or 'none'}")
        entries.append(Entry(d.created_at, "diagnosis", f"Diagnosis {d.id}", lines, sql=sql))
    for v in story.versions:
        cs = v.change_set
        entries.append(Entry(cs.created_at, "proposal", f"Change set {cs.id} version {cs.version[:12]} proposed",
                             [cs.summary, f"window {', '.join(cs.window) or 'none'}; expires {cs.expires_at:%Y-%m-%d %H:%M UTC}; "
                              f"now {v.state}" + (f" ({v.note})" if v.note else "")],
                             links=[(f"/change-sets/{cs.id}", "change set page")]))
        for dec in v.decisions:
            word = {"approve": "approved", "reject": "rejected"}.get(dec["decision"], dec["decision"])
            extra = "" if dec["active"] else f" (withdrawn: {dec.get('withdrawn_reason') or 'no longer counts'})"
            entries.append(Entry(_ts(dec["decided_at"]), "decision", f"{cs.id} {word} by {dec['approver']} ({dec['method']})"
                                 + extra, css="ok" if dec["decision"] == "approve" and dec["active"] else ""))
        for st in v.stages:
            run = [(f"{dagster_url}/runs/{st.run_id}", f"run {st.run_id[:8]}")] if st.run_id else []
            entries.append(Entry(_ts(st.started_at or st.issued_at), "stage",
                                 f"{cs.id} stage {st.stage}: {_STAGE_WORDS.get(st.state, st.state)}",
                                 [str((st.result or {}).get("reason") or (st.result or {}).get("outcome") or "")][:1]
                                 if st.result else [], links=run, css="bad" if st.state in ("failed", "abandoned") else ""))
    for step in ladder:
        if step["skipped"]:
            continue
        entries.append(Entry(dt.datetime.fromisoformat(step["at"]), "ladder",
                             f"Ladder: {step['kind']} {step['step']} of {step['change_set_id']} → {', '.join(step['to']) or 'nobody'}",
                             [step["text"]]))
    for r in story.receipts:
        if r.asset_key != (inc.asset_key if inc else r.asset_key):
            continue
        lines = [f"outcome: {r.outcome}", f"verified: {'yes' if r.verified else 'NO'}; partitions {', '.join(r.partitions) or 'none'}"]
        sql = []
        for o in r.checks:
            md = mask(dict(o.metadata)) if mask else o.metadata
            shown = {k: v for k, v in md.items() if not k.endswith("_json") and k not in (c.QUERY_KEY, c.QUERIES_KEY)}
            lines.append(f"check {o.check_name} on {'/'.join(o.asset_key)}: {'passed' if o.passed else 'FAILED'} {shown}"[:600])
            q = md.get(c.QUERY_KEY) or md.get(c.QUERIES_KEY)
            if isinstance(q, str):
                sql.append(q.strip().removeprefix("```sql").removesuffix("```").strip())
        entries.append(Entry(r.created_at, "receipt", f"Receipt {r.id} for {r.change_set_id}: "
                             f"{'verified' if r.verified else 'NOT verified'}", lines, sql=sql,
                             links=[(f"{dagster_url}/assets/{'/'.join(r.asset_key)}", "receipt on the asset page")],
                             css="ok" if r.verified else "bad"))
    return sorted(entries, key=lambda e: e.at)


def _refusal_entries(instance: dg.DagsterInstance, versions: list[Version]) -> list[Entry]:
    out = []
    assets = sorted({tuple(v.change_set.target_asset) for v in versions})
    ids = {v.change_set.id for v in versions}
    for r in records.refusals(instance, asset_keys=[dg.AssetKey(list(a)) for a in assets]):
        if r.get("change_set_id") in ids:
            at = dt.datetime.fromisoformat(r["at"]) if r.get("at") else dt.datetime.now(dt.timezone.utc)
            out.append(Entry(at, "refusal", f"Refused: {r.get('decision', 'approve')} of {r['change_set_id']} by "
                             f"{r.get('approver', '?')}", [r.get("reason", "")], css="refused"))
    return out


def _told(instance: dg.DagsterInstance, asset_keys: set[tuple[str, ...]], incident_id: str | None,
          cs_ids: set[str]) -> list[Entry]:
    out = []
    for a in sorted(asset_keys):
        for rec in records.iter_observations(instance, dg.AssetKey(list(a)), newest_first=False):
            n = records.metadata_json(rec.asset_observation.metadata if rec.asset_observation else {}, c.NOTIFICATION_KEY)
            if not isinstance(n, dict) or not n.get("complete"):
                continue
            if n.get("incident_id") != incident_id and n.get("change_set_id") not in cs_ids:
                continue
            at = dt.datetime.fromisoformat(n["at"]) if n.get("at") else _ts(rec.timestamp)
            out.append(Entry(at, "told", f"Told {n['channel']} ({n['action']}){'' if n.get('ok') else ' — NOT delivered'}",
                             [str(n.get("detail", ""))[:400]], css="" if n.get("ok") else "bad"))
    return out


def incident_story(instance: dg.DagsterInstance, incident_id: str, *, dagster_url: str, mask=None) -> Story | None:
    """The whole story of one incident, or None when the ledger does not know it."""
    led = ledger_for(instance)
    row = led.incident(incident_id)
    if row is None:
        return None
    inc = _incident_model(row)
    story = Story(title=f"Incident {incident_id}", incident=inc, incident_state=row.state, incident_note=row.note)
    asset = dg.AssetKey(row.asset_key.split("/"))
    story.diagnosis = next((d for d in records.diagnoses(instance, [asset]) if d.incident_id == incident_id), None)
    story.versions = _versions(instance, led.change_set_rows(incident_id=incident_id, latest_only=False))
    cs_ids = {v.change_set.id for v in story.versions}
    story.receipts = _receipts(instance, cs_ids)
    story.incident_state = _state_words(row, story.receipts)
    for cs_id in sorted(cs_ids):
        story.unreachable += [e["body"] for e in led.audit_entries("approver_unreachable", cs_id)]
    ladder = ladder_history(instance, incident_id=incident_id)
    story.timeline = sorted(_timeline(story, dagster_url, mask, ladder) + _refusal_entries(instance, story.versions)
                            + _told(instance, {tuple(asset.path)}, incident_id, cs_ids), key=lambda e: e.at)
    return story


def _state_words(row, receipts: list[Receipt]) -> str:
    """The incident's state in plain words (:func:`~dw_dagster.core.states.incident_words`) from its newest
    receipt on its own asset; the ledger's state when it has none."""
    from dw_dagster.core.states import incident_words

    own = [r for r in receipts if r.incident_id == row.incident_id and "/".join(r.asset_key) == row.asset_key]
    newest = max(own, key=lambda r: r.created_at, default=None)
    words = incident_words(row.state, newest, fallback=row.state)
    return words if newest is None or words.startswith(("undone", "undo")) else f"{words} ({row.state})"


def change_set_story(instance: dg.DagsterInstance, change_set_id: str, *, dagster_url: str, mask=None) -> Story | None:
    """Every version of one change set with its decisions, refusals, ladder steps, stages and receipts."""
    led = ledger_for(instance)
    rows = _rows_of(led, change_set_id)
    if not rows:
        return None
    story = Story(title=f"Change set {change_set_id}")
    story.versions = _versions(instance, rows)
    if story.versions:
        inc_row = led.incident(story.versions[-1].change_set.incident_id)
        if inc_row is not None:
            story.incident, story.incident_state, story.incident_note = _incident_model(inc_row), inc_row.state, inc_row.note
            story.incident_state = _state_words(inc_row, _receipts(instance, {change_set_id}))
    story.receipts = _receipts(instance, {change_set_id})
    story.unreachable = [e["body"] for e in led.audit_entries("approver_unreachable", change_set_id)]
    ladder = ladder_history(instance, change_set_id=change_set_id)
    timeline = [e for e in _timeline(story, dagster_url, mask, ladder) if e.kind != "incident"]
    assets = {tuple(v.change_set.target_asset) for v in story.versions}
    story.timeline = sorted(timeline + _refusal_entries(instance, story.versions) + _told(instance, assets, None, {change_set_id}),
                            key=lambda e: e.at)
    return story


def _rows_of(led, change_set_id: str) -> list:
    """Every recorded version of one change set (indexed by its primary key)."""
    import sqlalchemy as sa

    from dw_dagster.core.ledger_tables import ChangeSetRow, _row, change_sets_t

    with led.engine.connect() as conn:
        return [_row(ChangeSetRow, r) for r in conn.execute(
            sa.select(change_sets_t).where(change_sets_t.c.change_set_id == change_set_id)
            .order_by(change_sets_t.c.recorded_at))]


__all__ = ["Entry", "Story", "Version", "change_set_story", "incident_story", "planned_stages", "progress"]
