"""Diagnosis tools: ``diagnose_incident`` (the recorded diagnosis) and ``get_root_cause`` (its cause chain).

Both read the ``dw/diagnosis`` the diagnosis job recorded (:class:`~dw_dagster.core.models.Diagnosis`);
neither queries a warehouse. When an incident has no diagnosis yet, the answer says so and how to
start one: the diagnosis runs as a Dagster run (``dw_diagnose_incident``) where the warehouse
credentials live, not silently from an assistant.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field

from dw_dagster.lineage.sensitive import mask_evidence_values, rules_in_force
from dw_dagster.core import records
from dw_dagster.core.ledger import asset_str
from dw_dagster.core.models import BlastRadius, CauseFinding, Diagnosis, Incident
from dw_dagster.diagnosis.job import diagnosis_markdown
from dw_dagster.mcp.incidents import detected_by
from dw_dagster.mcp.state import DwState, asset_of, fail
from dw_dagster.mcp.untrusted import LEDGER_NOTE, RECORD, UPSTREAM, Untrusted, untrusted
from dw_dagster.core import keys as c

#: lists longer than this (late keys, per-store groups, evidence rows) are cut in answers
LIST_CUT = 20


def _cut(value: Any, path: str, cuts: dict[str, int]) -> Any:
    if isinstance(value, list):
        if len(value) > LIST_CUT:
            cuts[path] = len(value)
        return [_cut(v, f"{path}[{i}]", cuts) for i, v in enumerate(value[:LIST_CUT])]
    if isinstance(value, dict):
        return {k: _cut(v, f"{path}.{k}", cuts) for k, v in value.items()}
    return value


class EvidenceView(BaseModel):
    """One query a person can re-run, and what dw_dagster saw when it ran it (the query names and the rows come
    from the warehouse: marked)."""

    description: Untrusted
    database: str = Field(description="where it ran: duckdb:<file>, a SQLAlchemy URL's database, dagster:event_log")
    sql: Untrusted = Field(description="the statement(s), as run")
    values: Untrusted = Field(description=f"the result (lists cut to their first {LIST_CUT} items; see `cut`)")
    cut: dict[str, int] = Field(default_factory=dict, description="path of each cut list → its full length")


class CauseView(BaseModel):
    """A cause the diagnosis tested, with its evidence."""

    kind: str = Field(description="e.g. late_rows_behind_watermark, required_null_dead_letter, duplicate_load, upstream")
    summary: Untrusted = Field(description="the finding in its diagnoser's words, quoting warehouse values")
    confidence: float = Field(description="explained / gap, 0.0–1.0")
    explained_rows: int
    unexplained_rows: int
    window: list[str] = Field(description="partition keys holding the explained rows")
    details: Untrusted = Field(description=f"the finding's numbers and keys (lists cut to {LIST_CUT} items; see `cut`)")
    cut: dict[str, int] = Field(default_factory=dict, description="path of each cut list → its full length")
    evidence: list[EvidenceView]


def cause_view(f: CauseFinding) -> CauseView:
    """A finding with its long lists cut (the full record stays on the asset's page)."""
    cuts: dict[str, int] = {}
    details = _cut(f.details, "details", cuts)
    evidence = []
    rules = rules_in_force()  # sample values leave the warehouse here: masked (a live diagnosis is not masked yet)
    details = mask_evidence_values(details, next((e.key_columns for e in f.evidence if e.key_columns), []), rules)
    for e in f.evidence:
        ecuts: dict[str, int] = {}
        evidence.append(EvidenceView(description=_data(e.description), database=e.database, sql=_data(e.sql),
                                     values=_data(_cut(mask_evidence_values(e.values, e.key_columns, rules), "values",
                                                       ecuts)), cut=ecuts))
    return CauseView(kind=f.kind, summary=_data(f.summary), confidence=f.confidence, explained_rows=f.explained_rows,
                     unexplained_rows=f.unexplained_rows, window=f.window, details=_data(details), cut=cuts,
                     evidence=evidence)


def _data(value: Any) -> Untrusted:
    return Untrusted(untrusted_data=value, origin=RECORD)


class DiagnosisAnswer(BaseModel):
    """The recorded diagnosis of an incident, or why there is none and how to start one."""

    incident_id: str | None
    asset_key: list[str]
    diagnosed: bool = Field(description="False when no diagnosis is recorded yet (see next_step)")
    incident_state: str | None = Field(default=None, description="the incident's state in the ledger")
    diagnosis_id: str | None = None
    created_at: dt.datetime | None = None
    gap_rows: int | None = Field(default=None, description="source − target rows the incident reported")
    unexplained_rows: int | None = Field(default=None, description="rows of the gap no cause explains")
    primary: CauseView | None = Field(default=None, description="the cause explaining the most rows")
    other_causes: list[CauseView] = Field(default_factory=list, description="the other causes tested")
    blast_radius: BlastRadius | None = None
    markdown: Untrusted | None = Field(default=None, description="the diagnosis as the asset's page shows it "
                                      "(dw/diagnosis_md)")
    incident_note: Untrusted | None = Field(default=None, description="the ledger's note on the incident, if any")
    next_step: str | None = Field(default=None, description="what to do when there is no diagnosis")


def _incident_for_check(state: DwState, asset: str, check: str) -> tuple[dg.AssetKey, Any]:
    key = state.asset(asset)
    for r in state.ledger().incidents(asset_key=asset_str(key)):  # newest first
        try:
            inc = Incident.model_validate_json(r.body)
        except ValueError:
            continue
        if inc.check_name == check or (check == c.LIGHTUP_CHECK and inc.source == "lightup"):
            return key, r
    return key, None


def diagnose_incident(state: DwState, incident_id: str | None, asset: str | None, check: str | None) -> DiagnosisAnswer:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    if incident_id is None and (asset is None or check is None):
        raise fail("give incident_id, or asset and check (the failed check whose incident to explain)")
    state.require_records()
    if incident_id is not None:
        row = state.incident_row(incident_id)
        key = asset_of(row.asset_key)
    else:
        key, row = _incident_for_check(state, asset, check.strip())
        if row is None:
            return DiagnosisAnswer(
                incident_id=None, asset_key=list(key.path), diagnosed=False,
                next_step=(f"no incident on {key.to_user_string()} from check {check.strip()!r}. The check incident sensor "
                           "(dw_check_incident_sensor, running in `dagster dev` or the daemon) opens one when the check "
                           "fails and launches the diagnosis job; run_quality_check runs the check now"))
    diags = [d for d in records.diagnoses(state.view(), [key]) if d.incident_id == row.incident_id]
    if not diags:
        return DiagnosisAnswer(
            incident_id=row.incident_id, asset_key=list(key.path), diagnosed=False, incident_state=row.state,
            incident_note=untrusted(row.note, LEDGER_NOTE),
            next_step=(f"incident {row.incident_id} is {row.state} with no recorded diagnosis"
                       + (" (its note: incident_note)" if row.note else "") + ". To start one: `dw-dagster incidents rediagnose "
                       f"{row.incident_id} --by YOU --reason WHY` (the incident sensor launches dw_diagnose_incident on its "
                       "next tick), or launch dw_diagnose_incident from the Launchpad with the incident's record as "
                       "incident_json; remediate also runs it. The diagnosis queries the warehouse in a Dagster run, not "
                       "from this tool"))
    d: Diagnosis = diags[0]
    primary = d.primary
    return DiagnosisAnswer(
        incident_id=row.incident_id, asset_key=d.asset_key, diagnosed=True, incident_state=row.state, diagnosis_id=d.id,
        created_at=d.created_at, gap_rows=d.gap_rows, unexplained_rows=d.unexplained_rows,
        primary=cause_view(primary) if primary else None,
        other_causes=[cause_view(f) for f in d.causes if f is not primary], blast_radius=d.blast_radius,
        markdown=_data(diagnosis_markdown(d)))


class ChainLink(BaseModel):
    """One step from the alert back to the rows: which system, what it showed."""

    system: str = Field(description="lightup, dagster check, dagster run, source database, warehouse, dagster event log, ...")
    what: str = Field(description="one sentence, in dw_dagster's words")
    refs: dict[str, Any] = Field(default_factory=dict, description="ids, times and numbers dw_dagster keeps")
    data: dict[str, Untrusted] = Field(default_factory=dict, description="what the step showed that came from outside "
                                       "dw_dagster (the alert's text and link, the evidence's query and rows), marked")


class RootCause(BaseModel):
    """The cause chain across systems, short form of diagnose_incident."""

    incident_id: str
    asset_key: list[str]
    cause_kind: str | None = Field(description="None when no cause explains the gap")
    confidence: float | None
    explained_rows: int | None
    unexplained_rows: int | None
    chain: list[ChainLink] = Field(description="alert → the Dagster run and its watermark → the rows, in order")
    fix: str | None = Field(default=None, description="the change set proposed for it, its state and receipt, if any")


def _loads_before(instance: dg.DagsterInstance, key: dg.AssetKey, partitions: list[str], before: dt.datetime) -> list[dict]:
    """Per partition of ``partitions``, the newest materialization recorded before ``before`` (the load
    the incident saw), with its ``dw/loads`` entry (watermark, rows read)."""
    found: dict[str, dict] = {}
    page = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=list(partitions),
                                                                  before_timestamp=before.timestamp()), limit=100)
    for rec in page.records:  # newest first
        pk = rec.partition_key
        if pk not in partitions or pk in found:
            continue
        loads = records.metadata_json(rec.asset_materialization.metadata, c.LOADS_KEY) or {}
        entry = loads.get(pk) if isinstance(loads, dict) else None
        found[pk] = {"partition": pk, "run_id": rec.run_id, "loaded_at": dt.datetime.fromtimestamp(rec.timestamp, dt.timezone.utc).isoformat(),
                     **({k: entry[k] for k in ("watermark_column", "watermark_low", "rows_read", "rows_inserted",
                                                 "source_snapshot_ts") if k in entry} if isinstance(entry, dict) else {})}
        if len(found) == len(partitions):
            break
    return [found[p] for p in partitions if p in found]


def _system(database: str) -> str:
    parts = [p.strip() for p in database.split("|") if p.strip()]
    if parts and all(p.startswith("dagster:") for p in parts):
        return "dagster event log"
    if len(parts) > 1:
        return "databases " + " + ".join(parts)
    if "(local join" in database:
        return "dw_dagster (a local join of keys streamed from the source and the warehouse)"
    return f"database {database}"


def get_root_cause(state: DwState, incident_id: str) -> RootCause:
    """See the tool's docstring in :mod:`dw_dagster.mcp.server`."""
    row = state.incident_row(incident_id)
    inst, key = state.view(), asset_of(row.asset_key)
    inc = Incident.model_validate_json(row.body)
    origin = UPSTREAM if inc.source == "lightup" else RECORD
    chain = [ChainLink(system="lightup" if inc.source == "lightup" else "dagster check" if inc.source == "dw_check"
                       else inc.source, what=detected_by(inc),
                       refs={k: v for k, v in {"check": inc.check_name, "evaluation_id": inc.evaluation_id,
                                               "detected_at": inc.detected_at.isoformat()}.items() if v},
                       data={k: u for k, u in {
                           "summary": untrusted(inc.summary, origin), "external_id": untrusted(inc.external_id, UPSTREAM),
                           "url": untrusted(inc.external_url, UPSTREAM),
                           "slices": untrusted([s.model_dump(mode="json") for s in inc.slices if not s.passed] or None,
                                               origin)}.items() if u is not None})]
    diags = [d for d in records.diagnoses(inst, [key]) if d.incident_id == row.incident_id]
    if not diags:
        raise fail(f"incident {row.incident_id} has no recorded diagnosis, so no cause chain yet; diagnose_incident "
                   f"{row.incident_id} says how to start one")
    d = diags[0]
    p = d.primary
    if p is not None and p.explained_rows > 0:
        det = p.details
        if det.get("watermark_column"):
            loads = _loads_before(inst, key, list(p.window), inc.detected_at)
            chain.append(ChainLink(
                system="dagster run",
                what=(f"the runs that loaded {key.to_user_string()} for {', '.join(p.window)} (data.loads) read rows with "
                      "the watermark column (data.watermark_column) above the high-watermark with a strict '>'; rows that "
                      "reached the source later (data.arrival_column) at or below the latest load's high-watermark "
                      "(data.high_watermark) were never read"),
                data={"loads": _data(loads), "watermark_column": _data(det.get("watermark_column")),
                      "high_watermark": _data(det.get("high_watermark")), "arrival_column": _data(det.get("arrival_column"))}))
        for i, e in enumerate(p.evidence, 1):
            cuts: dict[str, int] = {}
            chain.append(ChainLink(system=_system(e.database), what=f"evidence query {i} of the diagnosis (data.description "
                                   "says what it shows)", refs={"cut": cuts},
                                   data={"description": _data(e.description), "sql": _data(e.sql),
                                         "values": _data(_cut(e.values, "values", cuts))}))
        chain.append(ChainLink(system="dw_dagster diagnosis", what=f"the diagnosis concluded {p.kind} (data.summary)",
                               refs={"diagnosis_id": d.id, "explained_rows": p.explained_rows,
                                     "unexplained_rows": d.unexplained_rows, "confidence": p.confidence},
                               data={"summary": _data(p.summary)}))
    else:
        chain.append(ChainLink(system="dw_dagster diagnosis", what=f"no cause explains the gap of {d.gap_rows} rows; "
                               f"{len(d.causes)} cause(s) tested", refs={"diagnosis_id": d.id}))
    fix = None
    sets = state.ledger().change_set_rows(incident_id=row.incident_id)
    if sets:
        r = sets[0]
        receipt = next((x for x in records.receipts(inst, key) if x.change_set_id == r.change_set_id), None)
        fix = (f"change set {r.change_set_id} ({r.state})"
               + (f"; receipt {receipt.id} {'verified' if receipt.verified else 'NOT verified'}" if receipt else ""))
    return RootCause(incident_id=row.incident_id, asset_key=list(key.path),
                     cause_kind=p.kind if p and p.explained_rows > 0 else None,
                     confidence=p.confidence if p and p.explained_rows > 0 else None,
                     explained_rows=p.explained_rows if p else None, unexplained_rows=d.unexplained_rows,
                     chain=chain, fix=fix)


__all__ = ["DiagnosisAnswer", "RootCause", "diagnose_incident", "get_root_cause"]
