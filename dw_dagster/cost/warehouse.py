"""Warehouse setting changes drafted from measured symptoms, for the warehouse's owner.

One statement per warehouse report (:func:`dw_dagster.cost.snowflake.symptom_statement`) measures
each warehouse over a period; ``SHOW WAREHOUSES`` says how it is set now. Rules:

- **idle**: idle credits (hours metered with no query, and keep-alive time around queries) above a
  share of the warehouse's credits, with ``AUTO_SUSPEND`` above the target → lower ``AUTO_SUSPEND``;
- **queued**: queries queued for overload (a share of queries, and of execution time) → one more
  cluster (multi-cluster warehouses, Enterprise edition) while below the cap, else one size larger;
- **spilling**: queries spilling to remote storage → one size larger;
- **oversized**: only small queries (nearly all under a second, none long, none queued or spilling)
  on a Medium or larger warehouse → one size smaller.

Each finding is a :class:`~dw_dagster.core.models.ChangeSet` for the domain whose ``warehouses`` list
the warehouse: one ``warehouse_setting`` step with the forward ``ALTER WAREHOUSE ... SET ...``, the
rollback to the values ``SHOW WAREHOUSES`` reports now, the evidence statement and its numbers, and
the expected saving (credits over the period; negative: what a performance change may cost). It
waits for a listed approver like any change set, runs through the remediation sensor
(:mod:`dw_dagster.cost.warehouse_apply`) and is verified by a follow-up check over the next
period's metered credits.
"""

from __future__ import annotations

from dw_dagster.dagster_private import public
import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, Field
from sqlglot import exp

from dw_dagster.core import keys as c
from dw_dagster.core.domains import WAREHOUSE_SETTING, Domains
from dw_dagster.core.models import ChangeSet, ChangeStep, stable_hash, utcnow
from dw_dagster.cost.models import CostError, Period
from dw_dagster.cost.snowflake import SnowflakeCost, symptom_statement
from dw_dagster.databases import sql

#: Snowflake sizes in order: the name SHOW WAREHOUSES shows → the keyword ALTER WAREHOUSE takes, credits/hour
SIZES = [("X-Small", "XSMALL", 1), ("Small", "SMALL", 2), ("Medium", "MEDIUM", 4), ("Large", "LARGE", 8),
         ("X-Large", "XLARGE", 16), ("2X-Large", "XXLARGE", 32), ("3X-Large", "XXXLARGE", 64),
         ("4X-Large", "X4LARGE", 128), ("5X-Large", "X5LARGE", 256), ("6X-Large", "X6LARGE", 512)]
_BY_NAME = {n.replace("-", "").upper(): i for i, (n, _, _) in enumerate(SIZES)}
_BY_NAME.update({k: i for i, (_, k, _) in enumerate(SIZES)})
#: the settings a drafted change may set (and how a value is written)
SETTINGS = {"AUTO_SUSPEND": int, "WAREHOUSE_SIZE": str, "MIN_CLUSTER_COUNT": int, "MAX_CLUSTER_COUNT": int,
            "SCALING_POLICY": str}


def size_index(size: str | None) -> int | None:
    """Position of a size (``X-Small``, ``XSMALL``, ``'x-small'``...) in :data:`SIZES`, or None."""
    if not size:
        return None
    return _BY_NAME.get(str(size).replace("-", "").replace("'", "").replace("_", "").upper())


class Rules(BaseModel):
    """The thresholds the rules use (all can be set per deployment)."""

    idle_share: float = Field(0.15, description="idle credits / the warehouse's credits that draft a lower AUTO_SUSPEND")
    auto_suspend: int = Field(60, ge=0, description="the AUTO_SUSPEND (seconds) drafted")
    queued_share: float = Field(0.10, description="share of queries queued for overload that drafts more clusters")
    queued_time_share: float = Field(0.05, description="overload queueing / (execution + queueing) that drafts more clusters")
    max_clusters: int = Field(4, ge=1, description="the most clusters a drafted change asks for (multi-cluster: Enterprise)")
    spilling_queries: int = Field(1, ge=1, description="queries spilling to remote storage that draft a larger size")
    small_share: float = Field(0.95, description="share of queries under 1 s that, on Medium or larger, drafts a smaller size")
    small_max_ms: int = Field(60_000, description="no query longer than this (ms) for the smaller-size rule")
    measure_days: int = Field(7, ge=1, le=90, description="days after the change its saving is measured over")


@dataclass
class Symptoms:
    """One warehouse over a period, as the symptom statement measured it."""

    warehouse: str
    credits: float
    idle: float
    idle_hours: int
    hours: int
    queries: int
    exec_ms: float
    overload_ms: float
    queued_queries: int
    remote_spill: float
    spilling_queries: int
    small_queries: int
    max_exec_ms: float
    size: str | None

    @classmethod
    def from_row(cls, row: tuple) -> Symptoms:
        w, cr, idle, ih, h, q, ex, ov, qq, rs, sq, sm, mx, size = row
        return cls(str(w), float(cr or 0), float(idle or 0), int(ih or 0), int(h or 0), int(q or 0), float(ex or 0),
                   float(ov or 0), int(qq or 0), float(rs or 0), int(sq or 0), int(sm or 0), float(mx or 0), size)


@dataclass
class Settings:
    """A warehouse as ``SHOW WAREHOUSES`` reports it now."""

    name: str
    size: str
    auto_suspend: int | None
    min_cluster_count: int
    max_cluster_count: int
    scaling_policy: str | None

    def value(self, setting: str) -> Any:
        return {"AUTO_SUSPEND": self.auto_suspend, "WAREHOUSE_SIZE": SIZES[size_index(self.size) or 0][1],
                "MIN_CLUSTER_COUNT": self.min_cluster_count, "MAX_CLUSTER_COUNT": self.max_cluster_count,
                "SCALING_POLICY": self.scaling_policy}[setting]


def show_warehouse(db: Any, name: str) -> Settings:
    """``SHOW WAREHOUSES LIKE '<name>'``, the row whose name is exactly ``name`` (LIKE's ``_`` matches any character).

    Raises:
        CostError: no such warehouse (or no privilege to see it).
    """
    show = exp.Show(this="WAREHOUSES", like=exp.Literal.string(name))
    text = show.sql(dialect="snowflake")
    for row in _rows_as_dicts(db, text):
        if str(row.get("name", "")).upper() == name.upper():
            def num(k: str) -> int | None:
                v = row.get(k)
                return None if v in (None, "", "null") else int(v)
            return Settings(name=str(row["name"]), size=str(row.get("size")), auto_suspend=num("auto_suspend"),
                            min_cluster_count=num("min_cluster_count") or 1, max_cluster_count=num("max_cluster_count") or 1,
                            scaling_policy=row.get("scaling_policy"))
    raise CostError(f"SHOW WAREHOUSES shows no warehouse {name} (missing, or the role may not see it)")


def _rows_as_dicts(db: Any, text: str) -> list[dict[str, Any]]:
    """A statement's rows as dicts with lower-case column names (SHOW's columns are named, not positioned)."""
    out = []
    for batch in db.fetch_batches(text):
        names = [n.lower() for n in batch.schema.names]
        for rec in batch.to_pylist():
            out.append({n: v for n, v in zip(names, rec.values())})
    return out


def alter_warehouse(name: str, values: dict[str, Any]) -> str:
    """``ALTER WAREHOUSE <name> SET <K> = <v>, ...``: the name quoted by sqlglot, values as sqlglot literals,
    settings only from :data:`SETTINGS` (sqlglot has no tree for ALTER WAREHOUSE: it is a Command).

    Raises:
        CostError: an unknown setting or a value of the wrong kind.
    """
    parts = []
    for key, value in values.items():
        kind = SETTINGS.get(key)
        if kind is None or not isinstance(value, kind) or isinstance(value, bool):
            raise CostError(f"cannot set {key} = {value!r} on a warehouse (settings: {', '.join(SETTINGS)})")
        if key == "WAREHOUSE_SIZE" and size_index(value) is None:
            raise CostError(f"unknown warehouse size {value!r}")
        parts.append(f"{key} = {sql.literal(value).sql(dialect='snowflake')}")
    if not parts:
        raise CostError("nothing to set")
    ident = sql.identifier(name).sql(dialect="snowflake")
    return f"ALTER WAREHOUSE {ident} SET {', '.join(parts)}"


@dataclass
class Finding:
    """One rule that fired on one warehouse: what to set, why, what it should save."""

    warehouse: str
    rule: str
    set: dict[str, Any]
    rollback: dict[str, Any]
    saving_expected: float
    saving_basis: str
    summary: str


def findings(sym: Symptoms, now: Settings, rules: Rules, period: Period) -> list[Finding]:
    """The rules that fire on one warehouse (see the module docstring)."""
    out: list[Finding] = []
    idx = size_index(now.size) or 0
    rate = SIZES[idx][2]
    days = f"{period.days} days"
    keep_alive = max(sym.idle, sym.credits - rate * sym.exec_ms / 3_600_000.0)
    idle_share = keep_alive / sym.credits if sym.credits else 0.0
    if sym.credits and sym.idle / sym.credits >= rules.idle_share and (now.auto_suspend or 0) > rules.auto_suspend:
        kept = rules.auto_suspend / float(now.auto_suspend)
        saving = keep_alive * (1 - kept)
        out.append(Finding(sym.warehouse, "idle", {"AUTO_SUSPEND": rules.auto_suspend}, {"AUTO_SUSPEND": now.auto_suspend},
                           saving, f"idle and keep-alive credits {keep_alive:.4g} × (1 − {rules.auto_suspend}/{now.auto_suspend})",
                           f"{sym.warehouse}: {100 * sym.idle / sym.credits:.0f} % of its {sym.credits:.4g} credits over "
                           f"{days} were idle hours ({sym.idle_hours} of {sym.hours} metered hours had no query; "
                           f"{100 * idle_share:.0f} % with keep-alive time); lower AUTO_SUSPEND from {now.auto_suspend} s "
                           f"to {rules.auto_suspend} s, saving about {saving:.4g} credits per {days}"))
    queued = sym.queries and sym.queued_queries / sym.queries >= rules.queued_share and \
        sym.overload_ms / max(sym.exec_ms + sym.overload_ms, 1.0) >= rules.queued_time_share
    if queued:
        extra = rate * sym.overload_ms / 3_600_000.0
        if now.max_cluster_count < rules.max_clusters:
            change, back = {"MAX_CLUSTER_COUNT": now.max_cluster_count + 1}, {"MAX_CLUSTER_COUNT": now.max_cluster_count}
            what = f"raise MAX_CLUSTER_COUNT from {now.max_cluster_count} to {now.max_cluster_count + 1} (multi-cluster: Enterprise edition)"
        else:
            change, back = _resize(now, idx + 1)
            what = f"resize from {now.size} to {SIZES[min(idx + 1, len(SIZES) - 1)][0]}"
        out.append(Finding(sym.warehouse, "queued", change, back, -extra,
                           f"an extra cluster running while queries queued: {sym.overload_ms / 1000:.0f} s × {rate} credits/h",
                           f"{sym.warehouse}: {sym.queued_queries} of {sym.queries} queries queued for overload "
                           f"({sym.overload_ms / 1000:.0f} s in all) over {days}; {what}, costing up to {extra:.4g} credits"))
    if sym.spilling_queries >= rules.spilling_queries and idx + 1 < len(SIZES):
        change, back = _resize(now, idx + 1)
        out.append(Finding(sym.warehouse, "spilling", change, back, -sym.credits,
                           "worst case: the doubled rate for the same run time (spilling queries usually finish faster)",
                           f"{sym.warehouse}: {sym.spilling_queries} queries spilled {sym.remote_spill / 2**30:.1f} GiB to remote "
                           f"storage over {days}; resize from {now.size} to {SIZES[idx + 1][0]}"))
    small = (sym.queries and idx >= 2 and sym.small_queries / sym.queries >= rules.small_share
             and sym.max_exec_ms <= rules.small_max_ms and not sym.spilling_queries and not queued)
    if small:
        change, back = _resize(now, idx - 1)
        saving = (sym.credits - sym.idle) * 0.5
        out.append(Finding(sym.warehouse, "oversized", change, back, saving,
                           "half the rate for queries under a second, whose run time hardly depends on size",
                           f"{sym.warehouse}: {sym.small_queries} of {sym.queries} queries ran under a second (longest "
                           f"{sym.max_exec_ms / 1000:.1f} s) on a {now.size} warehouse over {days}; resize to "
                           f"{SIZES[idx - 1][0]}, saving about {saving:.4g} credits per {days}"))
    return out


def _resize(now: Settings, to: int) -> tuple[dict[str, Any], dict[str, Any]]:
    to = max(0, min(to, len(SIZES) - 1))
    return {"WAREHOUSE_SIZE": SIZES[to][1]}, {"WAREHOUSE_SIZE": now.value("WAREHOUSE_SIZE")}


def measure(source: SnowflakeCost, period: Period) -> tuple[list[Symptoms], str]:
    """Every metered warehouse's symptoms over ``period`` (one statement) and the statement."""
    text = symptom_statement(source, period)
    return [Symptoms.from_row(r) for r in source.db.fetch_all(text)], text


def evidence_statement(statement: str, warehouse: str, dialect: str = "snowflake") -> str:
    """The symptom statement narrowed to one warehouse (what the owner re-runs)."""
    inner = exp.maybe_parse(statement, dialect=dialect)
    outer = exp.select("*").from_(inner.subquery("s")).where(exp.column("wh", "s").eq(exp.Literal.string(warehouse)))
    return outer.sql(dialect=dialect)


@public
def draft_warehouse_changes(source: SnowflakeCost, period: Period, domains: Domains, *, rules: Rules | None = None,
                            resource_key: str = "dw_cost", now: dt.datetime | None = None) -> tuple[list[ChangeSet], list[str]]:
    """Change sets for the warehouses' owners from the symptoms of ``period``, and what was not drafted (why).

    Args:
        source: the Snowflake cost source (its database runs SHOW WAREHOUSES and, approved, the ALTER).
        domains: the domains file; a warehouse no domain lists is reported, not drafted.
        resource_key: the resource the step runs on (a :class:`~dw_dagster.cost.sources.CostResource`).

    Returns:
        (change sets to propose, notes).
    """
    rules = rules or Rules()
    now = now or utcnow()
    symptoms, statement = measure(source, period)
    drafts, notes = [], []
    for sym in symptoms:
        try:
            settings = show_warehouse(source.db, sym.warehouse)
        except CostError as e:
            notes.append(str(e))
            continue
        for f in findings(sym, settings, rules, period):
            try:
                domain = domains.for_warehouse(f.warehouse)
            except KeyError:
                notes.append(f"{f.warehouse}: {f.rule} would be drafted, but no domain lists the warehouse "
                             "(add it to a domain's `warehouses` in the domains file)")
                continue
            drafts.append(_change_set(f, sym, settings, domain, period, statement, rules, resource_key, now, source.db.dialect))
    return drafts, notes


def _change_set(f: Finding, sym: Symptoms, settings: Settings, domain: Any, period: Period, statement: str,
                rules: Rules, resource_key: str, now: dt.datetime, dialect: str) -> ChangeSet:
    forward, rollback = alter_warehouse(f.warehouse, f.set), alter_warehouse(f.warehouse, f.rollback)
    asset = [c.WAREHOUSE_ASSET_PREFIX, f.warehouse]
    evidence = evidence_statement(statement, f.warehouse, dialect)
    spec = {"warehouse": f.warehouse, "rule": f.rule, "set": f.set, "rollback": f.rollback,
            "before": asdict(settings), "symptoms": asdict(sym), "evidence_sql": evidence,
            "baseline": {"since": period.since.isoformat(), "until": period.until.isoformat(), "credits": sym.credits,
                         "credits_per_day": sym.credits / period.days},
            "saving_expected": f.saving_expected, "saving_basis": f.saving_basis, "measure_days": rules.measure_days}
    step = ChangeStep(kind=c.WAREHOUSE_SETTING_STEP, change_class=WAREHOUSE_SETTING, summary=f.summary,
                      resource_key=resource_key, spec=spec, sql=[forward], rollback_sql=[rollback])
    key = f"{f.warehouse}:{f.rule}"
    return ChangeSet.seal(
        id=f"cs-{stable_hash(['warehouse', key], 10)}", incident_id=f"cost:{key}", diagnosis_id=f"cost:{key}:{period.since}",
        domain=domain.name, proposer=c.PROPOSER, created_at=now,
        expires_at=now + dt.timedelta(hours=domain.approval_expiry_hours), approvers=list(domain.approvers),
        cause_kind=f"warehouse_{f.rule}", summary=f.summary, target_asset=asset, window=[], diff="", files=[],
        rebuild_assets=[], verify_checks=[[*asset, c.WAREHOUSE_SAVING_CHECK]],
        undo=f"{rollback} (the values SHOW WAREHOUSES reported when this was drafted)",
        change_classes=[WAREHOUSE_SETTING], steps=[step])


__all__ = ["Finding", "Rules", "SETTINGS", "SIZES", "Settings", "Symptoms", "alter_warehouse", "draft_warehouse_changes",
           "evidence_statement", "findings", "measure", "show_warehouse", "size_index"]
