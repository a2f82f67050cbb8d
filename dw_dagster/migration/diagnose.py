"""A failing table pair's diagnosis when its target asset has no pipeline of its own to diagnose.

The diagnosis job runs this diagnoser for a pair's target asset that is not a watched asset with a
``pipeline:`` (that one gets its pipeline's diagnoser, e.g. the late rows behind the loader's
watermark with its fix). It names the cause from the pair's newest parity evaluations — the
evidence each carries (values and SQL) becomes the cause's evidence:

- ``target_missing``: the target table is gone (dropped) or was never loaded;
- ``type_mismatch``: a column's type loses values on the way (precision, scale, length, zone);
- ``duplicates``: keys held by more than one row on a side;
- ``missing_partitions``: slices of the time column the target does not hold at all;
- ``rows_short`` / ``rows_over``: rows missing or extra in slices the target holds;
- ``rows_changed_after_load``: keys on both sides whose values differ (the source changed after the load).

It proposes no change set (no fix is known without the pipeline); the incident is diagnosed and
waits for its owner, and the wave's gate waits with it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import dagster as dg

from dw_dagster.core import keys as k
from dw_dagster.core.models import BlastRadius, CauseFinding, Diagnosis, Evidence, Incident, utcnow
from dw_dagster.migration.checks import target_key
from dw_dagster.migration.config import MigrationConfig, PairConfig, WaveConfig, pair_kinds, parity_check_name, wave_asset_key


def _latest(instance: dg.DagsterInstance, pair: PairConfig, kind: str):
    key = dg.AssetCheckKey(target_key(pair), parity_check_name(kind))
    for rec in instance.event_log_storage.get_asset_check_execution_history(key, limit=5):
        ev = rec.event.dagster_event.event_specific_data if rec.event is not None and rec.event.dagster_event else None
        if isinstance(ev, dg.AssetCheckEvaluation):
            md = ev.metadata or {}
            values = getattr(md.get(k.PARITY_VALUES_KEY), "value", None) or {}
            sql_text = getattr(md.get(k.PARITY_SQL_KEY), "value", None) or ""
            return ev, values, str(sql_text)
    return None, {}, ""


def classify(pair: PairConfig, seen: dict[str, tuple]) -> list[CauseFinding]:  # noqa: C901 - one branch per cause
    """The causes the newest parity evaluations show (module docstring), largest first."""
    out: list[CauseFinding] = []
    counts = seen.get(k.PARITY_COUNTS, (None, {}, ""))[1]
    gap = int(counts.get("gap_rows") or 0)
    ev = lambda kind, what: [Evidence(description=what, database=pair.source.database, sql=seen[kind][2][:4000],  # noqa: E731
                                      values=seen[kind][1])] if kind in seen else []
    for kind, (e, values, _) in seen.items():
        if e is None or e.passed:
            continue
        desc = e.description or ""
        if kind == k.PARITY_SCHEMA and ("not found" in desc or "does not exist" in desc):
            out.append(CauseFinding(kind="target_missing", summary=f"the target table {pair.target.table} is missing "
                                    f"(dropped, or never loaded): {desc}", confidence=1.0,
                                    explained_rows=abs(gap), unexplained_rows=0, evidence=ev(kind, "the catalogs")))
        elif kind == k.PARITY_SCHEMA and values.get("type_problems"):
            out.append(CauseFinding(kind="type_mismatch", summary=f"a column's type loses values from {pair.source.table} "
                                    f"to {pair.target.table}: {desc}", confidence=1.0, explained_rows=0,
                                    unexplained_rows=0, details={"types": values.get("types", {})},
                                    evidence=ev(kind, "column types on both sides")))
        elif kind == k.PARITY_SCHEMA and (values.get("duplicate_keys_source") or values.get("duplicate_keys_target")):
            out.append(CauseFinding(kind="duplicates", summary=desc, confidence=1.0,
                                    explained_rows=int(values.get("duplicate_keys_target") or 0), unexplained_rows=0,
                                    evidence=ev(kind, "keys held by more than one row")))
        elif kind == k.PARITY_KEY_DIFF and values.get("changed"):
            out.append(CauseFinding(kind="rows_changed_after_load", summary=f"{values['changed']} key(s) hold other "
                                    f"values in the target than in the source ({desc}): the source changed after the "
                                    "load", confidence=1.0, explained_rows=0, unexplained_rows=0,
                                    details={"changed_columns": values.get("changed_columns", {})},
                                    evidence=ev(kind, "keys whose values differ")))
    if gap and counts.get("slices") and pair.time_column and set(pair.slice_by) & {pair.time_column}:
        empty = [s for s, v in counts["slices"].items() if v[0] and not v[1]]
        if empty:
            rows = sum(counts["slices"][s][0] for s in empty)
            out.append(CauseFinding(kind="missing_partitions", summary=f"{len(empty)} partition(s) of {pair.time_column} "
                                    f"are not in the target at all ({rows:,} rows)", confidence=rows / abs(gap),
                                    explained_rows=rows, unexplained_rows=abs(gap) - rows,
                                    window=[json.loads(s).get(pair.time_column) for s in empty][:50],
                                    evidence=ev(k.PARITY_COUNTS, "rows per slice")))
    if gap and not any(c.kind in ("missing_partitions", "target_missing") for c in out):
        out.append(CauseFinding(kind="rows_short" if gap > 0 else "rows_over",
                                summary=seen[k.PARITY_COUNTS][0].description or f"{gap} rows", confidence=0.5,
                                explained_rows=0, unexplained_rows=abs(gap), evidence=ev(k.PARITY_COUNTS, "rows per slice")))
    return sorted(out, key=lambda c: -c.explained_rows)


@dataclass
class MigrationPairDiagnoser:
    """``(context, incident) -> (Diagnosis, None)`` for one pair's target asset (module docstring)."""

    migration: MigrationConfig
    wave: WaveConfig
    pair: PairConfig
    domains: object = None

    def __call__(self, context: dg.OpExecutionContext, incident: Incident):
        seen = {kind: _latest(context.instance, self.pair, kind) for kind in pair_kinds(self.pair)}
        seen = {kind: v for kind, v in seen.items() if v[0] is not None}
        causes = classify(self.pair, seen)
        gap = int(seen.get(k.PARITY_COUNTS, (None, {}, ""))[1].get("gap_rows") or 0) or incident.gap_rows
        radius = BlastRadius(root="/".join(incident.asset_key),
                             dagster_assets=[list(wave_asset_key(self.migration.name, self.wave.name).path)])
        d = Diagnosis(id=f"dg-{uuid.uuid4().hex[:10]}", incident_id=incident.id, asset_key=list(incident.asset_key),
                      created_at=utcnow(), causes=causes, blast_radius=radius, gap_rows=gap,
                      unexplained_rows=max(0, abs(gap) - sum(c.explained_rows for c in causes)))
        context.log.info(f"pair {self.pair.label} of wave {self.wave.name}: "
                         f"{', '.join(c.kind for c in causes) or 'no cause named'}; the wave's gate waits")
        return d, None


__all__ = ["MigrationPairDiagnoser", "classify"]
