"""Cause: rows an undo took back.

A verified undo puts a window back as it was before a repair: the rows the repair had loaded are
deleted again (kept aside in ``dw_undo.<snapshot>_taken``) and the incident is open again
(:func:`dw_dagster.receipts.job.reopen_after_undo`, which records what was taken back in the
ledger's ``incident_reopened`` audit entry). A diagnosis of that incident would otherwise look for
the gap's cause in the pipeline as it is now (whose merged fix reads the rows fine) and report it
unexplained. This cause names it: the rows the undo took back that the target still lacks, counted
in the target's database when the diagnosis holds its resource (one ``EXCEPT`` query), else as
the undo recorded them; the remediation is to propose the undone change set again
(``dw-dagster change-sets repropose CS``).
"""

from __future__ import annotations

from typing import Any

from dw_dagster.core.models import CauseFinding, Evidence

KIND = "undone_repair"


def undo_record(led: Any, incident_id: str) -> dict | None:
    """The newest ``incident_reopened`` audit body of an undo of ``incident_id`` (its taken-back rows), or None."""
    found = [e for e in led.audit_entries("incident_reopened", incident_id) if (e.get("body") or {}).get("undo")]
    return found[-1]["body"] if found else None


def diagnose_undone(record: dict, gap_rows: int, db: Any = None) -> CauseFinding | None:
    """The finding for the rows an undo took back (``record``: :func:`undo_record`), at most ``gap_rows``;
    None when it took back nothing or they are all in the target again.

    Raises:
        DatabaseError: the count query failed (``db`` given).
    """
    from dw_dagster.databases import sql

    taken = record.get("taken_back") or {}
    recorded = int(taken.get("rows") or 0)
    per = {k: int(v) for k, v in (taken.get("per_partition") or {}).items() if int(v) > 0}
    if recorded <= 0 or gap_rows <= 0:
        return None
    evidence, missing = [], recorded
    if db is not None and taken.get("table") and taken.get("target_table"):
        q = (f"SELECT count(*) FROM (SELECT * FROM {sql.table(taken['table']).sql(db.dialect)} EXCEPT "
             f"SELECT * FROM {sql.table(taken['target_table']).sql(db.dialect)}) AS t")
        (missing,), = db.fetch_all(q)
        missing = int(missing)
        evidence.append(Evidence(description="rows the undo took back that the target still lacks", database=db.dialect,
                                 sql=q, values={"missing": missing, "taken_back": recorded}))
    explained = min(missing, gap_rows)
    if explained <= 0:
        return None
    undone = record.get("undo", "")
    of = undone.split("-undo")[0]
    return CauseFinding(
        kind=KIND, confidence=round(explained / gap_rows, 4), explained_rows=explained, unexplained_rows=gap_rows - explained,
        window=sorted(per),
        summary=(f"{explained} of the {gap_rows} missing rows are rows the undo {undone} took back (kept in "
                 f"{taken.get('table')}): change set {of} had loaded them; to load them again, propose it again "
                 f"(`dw-dagster change-sets repropose {of}`)"),
        details={"undo": undone, "of_change_set": of, "taken_back_rows": recorded, "missing_rows": missing,
                 "taken_back_table": taken.get("table"), "receipt": record.get("receipt"),
                 "per_partition": [{"partition": k, "explained_rows": v} for k, v in sorted(per.items())]},
        evidence=evidence)


def with_undone_rows(diagnosis: Any, record: dict | None, db: Any = None) -> Any:
    """``diagnosis`` with the :func:`diagnose_undone` finding taking its share of what was unexplained
    (the ``unexplained`` finding shrinks by as much); unchanged when nothing is unexplained or no undo
    took rows back."""
    from dw_dagster.diagnosis.combine import UNEXPLAINED_KIND, unexplained_finding

    if record is None or diagnosis.unexplained_rows <= 0:
        return diagnosis
    finding = diagnose_undone(record, diagnosis.unexplained_rows, db)
    if finding is None:
        return diagnosis
    left = diagnosis.unexplained_rows - finding.explained_rows
    causes = []
    for f in diagnosis.causes:
        if f.kind == UNEXPLAINED_KIND:
            if left > 0:
                causes.append(unexplained_finding(left, diagnosis.gap_rows, [*(f.details.get("causes_tested") or []), KIND]))
            continue
        causes.append(f)
    return diagnosis.model_copy(update={"id": f"{diagnosis.id}-u", "causes": [*causes, finding], "unexplained_rows": left})


__all__ = ["KIND", "diagnose_undone", "undo_record", "with_undone_rows"]
