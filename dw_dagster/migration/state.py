"""A wave's state, read from the parity evaluations Dagster recorded and the gate's ledger entry.

For each pair, the evaluations of its required parity kinds written by runs of the wave's job
(never evaluations reported from outside a run, never other jobs' runs) are grouped by run,
newest first. A pair *holds* in a run when every required kind passed there; its streak is the
number of newest runs in a row in which it held. The wave's gate opens when every pair's streak
reaches the rule's ``consecutive``: the evidence is those runs' evaluations (storage ids, values,
the SQL's hash), and its hash is what the sign-off is bound to.

Per pair the state is ``not_loaded`` (the target is missing or empty and the wave was never
signed off), ``failing: <kinds>``, ``holding since <time>``, ``signed_off`` or ``reopened:
<kind>`` (it failed after the wave was signed off). The gate's own state (round, the pending
request, the sign-off, the reopening) lives in the ledger (:func:`gate_record`), not in the event
log, so deleting runs or reporting events changes none of it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from dw_dagster.core import keys as k
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import stable_hash
from dw_dagster.migration.config import GateRule, MigrationConfig, PairConfig, WaveConfig, parity_check_name, wave_job_name
from dw_dagster.migration.checks import target_key

#: how many of a wave job's newest runs are read for streaks by default: a streak is counted up to the
#: rule's ``consecutive`` and a few more (``holding since`` is the start of the runs read)
_RUNS_READ = 8


@dataclass
class KindSeen:
    """One evaluation of one kind in one run."""

    kind: str
    storage_id: int
    run_id: str
    passed: bool
    description: str
    values: dict[str, Any]
    sql_hash: str
    at: float


@dataclass
class PairState:
    """One pair's state in the wave."""

    pair: str
    target: str
    state: str
    streak: int
    holding_since: float | None
    failing: list[str] = field(default_factory=list)
    latest: dict[str, KindSeen] = field(default_factory=dict)
    evidence: list[dict] = field(default_factory=list)
    rows_compared: int = 0
    gap_pct: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"pair": self.pair, "target": self.target, "state": self.state, "streak": self.streak,
                "holding_since": _iso(self.holding_since), "failing": self.failing, "rows_compared": self.rows_compared,
                "gap_pct": self.gap_pct,
                "latest": {kind: {"passed": s.passed, "storage_id": s.storage_id, "run_id": s.run_id,
                                  "description": s.description[:300], "values": _short_values(s.values)}
                           for kind, s in self.latest.items()}}


def _short_values(v: dict) -> dict:
    return {a: b for a, b in v.items() if a not in ("slices", "types", "values", "notes")}


def _iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds") if ts else None


def required_kinds(pair: PairConfig, rule: GateRule, lightup: bool) -> list[str]:
    kinds = [kind for kind in rule.require if kind != k.PARITY_LIGHTUP]
    if k.PARITY_LIGHTUP in rule.require and pair.lightup_compare_metric and lightup:
        kinds.append(k.PARITY_LIGHTUP)
    return kinds


def wave_run_ids(instance: dg.DagsterInstance, migration: str, wave: str, current: str | None = None,
                 limit: int = _RUNS_READ) -> list[str]:
    """The wave job's newest runs (ids, newest first), ``current`` included."""
    runs = instance.get_run_records(dg.RunsFilter(job_name=wave_job_name(migration, wave)), limit=limit)
    ids = [r.dagster_run.run_id for r in runs]
    if current and current not in ids:
        ids.insert(0, current)
    return ids


def _seen(rec, kind: str) -> KindSeen | None:
    ev = rec.event.dagster_event.event_specific_data if rec.event is not None and rec.event.dagster_event else None
    if not isinstance(ev, dg.AssetCheckEvaluation):
        return None
    md = ev.metadata or {}
    values = getattr(md.get(k.PARITY_VALUES_KEY), "value", None) or {}
    sql_text = getattr(md.get(k.PARITY_SQL_KEY), "value", None) or ""
    return KindSeen(kind, rec.id, rec.run_id, bool(ev.passed), ev.description or "",
                    values if isinstance(values, dict) else {}, hashlib.sha256(str(sql_text).encode()).hexdigest()[:16],
                    rec.create_timestamp)


def pair_history(instance: dg.DagsterInstance, pair: PairConfig, kinds: list[str], runs: list[str],
                 ) -> dict[str, dict[str, KindSeen]]:
    """run id → kind → evaluation, for the wave's runs, from each check's execution history."""
    wanted, out = set(runs), {}
    for kind in kinds:
        key = dg.AssetCheckKey(target_key(pair), parity_check_name(kind))
        for rec in instance.event_log_storage.get_asset_check_execution_history(key, limit=len(runs) * 2 + 3):
            if rec.run_id not in wanted:
                continue
            seen = _seen(rec, kind)
            if seen is not None and kind not in out.get(rec.run_id, {}):
                out.setdefault(rec.run_id, {})[kind] = seen
    return out


def pair_state(pair: PairConfig, kinds: list[str], history: dict[str, dict[str, KindSeen]], runs: list[str],
               rule: GateRule, signed_off: bool, ever_signed: bool) -> PairState:
    """The streak, state and evidence of one pair (see the module docstring)."""
    evaluated = [r for r in runs if r in history]
    streak, since, evidence = 0, None, []
    for run in evaluated:
        seen = history[run]
        if not all(kind in seen and seen[kind].passed for kind in kinds):
            break
        streak += 1
        since = min(s.at for s in seen.values())
        if len(evidence) < rule.consecutive:
            evidence.append({kind: {"storage_id": seen[kind].storage_id, "run_id": run, "values": seen[kind].values,
                                    "sql_hash": seen[kind].sql_hash} for kind in kinds})
    latest = history[evaluated[0]] if evaluated else {}
    failing = [kind for kind in kinds if kind in latest and not latest[kind].passed]
    counts = latest.get(k.PARITY_COUNTS)
    cv = counts.values if counts else {}
    rows = int(cv.get("source_rows") or 0) + int(cv.get("target_rows") or 0)
    missing = any("not found" in (s.description or "") or "does not exist" in (s.description or "")
                  for s in latest.values() if not s.passed)
    empty = bool(cv) and int(cv.get("target_rows") or 0) == 0 and int(cv.get("source_rows") or 0) > 0
    if not evaluated:
        state = "not_loaded" if not ever_signed else "reopened: not evaluated"
    elif failing or any(kind not in latest for kind in kinds):
        gone = failing or [kind for kind in kinds if kind not in latest]
        if ever_signed and signed_off is False and failing:
            state = f"reopened: {', '.join(failing)}"
        elif (missing or empty) and not ever_signed:
            state = "not_loaded"
        else:
            state = f"failing: {', '.join(gone)}"
    elif signed_off:
        state = "signed_off"
    else:
        state = f"holding since {_iso(since)} ({min(streak, rule.consecutive)}/{rule.consecutive})"
    return PairState(pair.label, pair.target.asset, state, streak, since if streak else None, failing, latest,
                     evidence, rows, float(cv.get("worst_gap_pct") or 0.0))


def evidence_hash(pairs: list[PairState]) -> str:
    """The hash a sign-off is bound to: every pair's holding evaluations (ids, values, SQL hashes)."""
    return stable_hash([{"pair": p.pair, "evaluations": p.evidence} for p in pairs], 32)


def evidence_values_key(pairs: list[PairState]) -> str:
    """The evidence without its evaluation ids: unchanged while the same numbers keep holding."""
    return stable_hash([{"pair": p.pair, "values": [{kind: (e["values"], e["sql_hash"]) for kind, e in ev.items()}
                                                    for ev in p.evidence[:1]]} for p in pairs], 32)


# -- the gate's ledger entry -------------------------------------------------------------------------

def control_key(migration: str, wave: str) -> str:
    return f"{k.MIGRATION_CONTROL_PREFIX}{migration}/{wave}"


def gate_record(instance: dg.DagsterInstance, migration: str, wave: str) -> dict[str, Any]:
    """The wave's gate state in the ledger: ``{"round", "requested", "signed_off", "reopened", "history"}``."""
    rec = ledger_for(instance).control(control_key(migration, wave)) or {}
    return {"round": 0, "requested": None, "signed_off": None, "reopened": None, "history": [], **rec}


def save_gate_record(instance: dg.DagsterInstance, migration: str, wave: str, record: dict[str, Any]) -> None:
    ledger_for(instance).set_control(control_key(migration, wave), json.loads(json.dumps(record, default=str)))


@dataclass
class WaveState:
    """A wave's pairs and gate state at one evaluation."""

    migration: str
    wave: str
    domain: str
    rule: GateRule
    pairs: list[PairState]
    gate: dict[str, Any]
    state: str = ""
    evidence_hash: str | None = None

    @property
    def holding(self) -> int:
        return sum(1 for p in self.pairs if p.streak > 0 and not p.failing)

    @property
    def gate_open(self) -> bool:
        return bool(self.pairs) and all(p.streak >= self.rule.consecutive for p in self.pairs)

    def as_json(self) -> dict[str, Any]:
        signed = self.gate.get("signed_off") or {}
        return {"migration": self.migration, "wave": self.wave, "domain": self.domain, "state": self.state,
                "pairs_holding": self.holding, "pairs_total": len(self.pairs),
                "consecutive_required": self.rule.consecutive, "require": list(self.rule.require),
                "evidence_hash": self.evidence_hash or signed.get("evidence_hash"),
                "signed_off_by": ({"email": signed.get("by"), "method": signed.get("method"),
                                   "at": signed.get("at")} if signed else None),
                "reopened": self.gate.get("reopened"), "round": self.gate.get("round", 0),
                "requested": self.gate.get("requested"), "pairs": [p.as_json() for p in self.pairs]}


def read_wave_state(instance: dg.DagsterInstance, migration: MigrationConfig, wave: WaveConfig, *,
                    current_run: str | None = None, lightup: bool = True) -> WaveState:
    """The wave's state from its runs' evaluations and the gate's ledger entry (module docstring)."""
    rule = migration.gate_of(wave)
    gate = gate_record(instance, migration.name, wave.name)
    runs = wave_run_ids(instance, migration.name, wave.name, current_run, rule.consecutive + 3)
    signed = gate.get("signed_off") is not None
    ever = signed or bool(gate.get("history"))
    pairs = []
    for p in wave.pairs:
        kinds = required_kinds(p, rule, lightup)
        pairs.append(pair_state(p, kinds, pair_history(instance, p, kinds, runs), runs, rule, signed, ever))
    ws = WaveState(migration.name, wave.name, wave.domain, rule, pairs, gate)
    if ws.gate_open:
        ws.evidence_hash = evidence_hash(pairs)
    ws.state = wave_state_word(ws)
    return ws


def wave_state_word(ws: WaveState) -> str:
    """``signed_off``, ``reopened``, ``awaiting_sign_off``, ``holding``, ``failing`` or ``not_loaded``."""
    if ws.gate.get("signed_off"):
        return "signed_off"
    if ws.gate.get("reopened"):
        return "reopened"
    if ws.gate_open:
        return "awaiting_sign_off"
    if all(p.state == "not_loaded" for p in ws.pairs):
        return "not_loaded"
    if any(p.failing or p.state.startswith(("failing", "not_loaded")) for p in ws.pairs):
        return "failing"
    return "holding"


__all__ = ["KindSeen", "PairState", "WaveState", "control_key", "evidence_hash", "gate_record", "pair_history",
           "pair_state", "read_wave_state", "required_kinds", "save_gate_record", "wave_run_ids", "wave_state_word"]
