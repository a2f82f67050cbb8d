"""A migration in configuration: waves of table pairs, what each pair's parity compares, the gate rule.

The same models validate the ``migration:`` section of a ``defs.yaml`` (:class:`~dw_dagster.components.DataOpsComponent`)
and of a mapping or file given to :func:`~dw_dagster.definitions.build_dw_definitions`:

.. code-block:: yaml

    migration:
      name: pos_to_warehouse
      gate: {require: [schema, counts, key_diff], consecutive: 3}
      key_diff: {full_below_rows: 1000000, sample: [1, 16]}
      waves:
        - name: wave1
          domain: store_sales                 # the owning domain: its approvers sign the wave off
          pairs:
            - source: {database: pos, table: pos.sales_line}
              target: {asset: store_sales_line, database: warehouse, table: pos.sales_line}
              key: [sales_line_id]
              slice_by: [region]
              sums: [net_sales]
              time_column: sale_ts             # still being written: closed partitions only
              lightup_compare_metric: "{{ env('LU_SALES_LINE', '') }}"

Names are checked twice: here for their shape, and when the definitions load against each
engine's catalog (:mod:`dw_dagster.migration.resolve`), so a misspelt table or column is an
error naming the file, line and field before anything runs.
"""

from __future__ import annotations

from typing import Literal

import dagster as dg
from pydantic import Field, field_validator, model_validator

from dw_dagster.core import keys as k

ParityKind = Literal["schema", "counts", "key_diff", "lightup"]
_NAME = r"^[a-z][a-z0-9_]*$"


class TableRef(dg.Model, dg.Resolvable):
    """A table in a named database (``databases:``)."""

    database: str = Field(description="a name under databases")
    table: str = Field(description="schema.table (owner.table on Informix)")
    asset: str | None = Field(None, description="the source table's asset key, when it is one (the checks depend on it)")


class TargetRef(dg.Model, dg.Resolvable):
    """Where a pair lands: the target asset (its checks carry the parity) and its table."""

    asset: str = Field(description="the target asset key, e.g. raw/pos/sales_line (defined by your project)")
    database: str = Field(description="a name under databases")
    table: str = Field(description="schema.table")


class GateRule(dg.Model, dg.Resolvable):
    """When a wave may be signed off: which parity kinds must hold, for how many consecutive evaluations."""

    require: list[ParityKind] = Field(default_factory=lambda: ["schema", "counts", "key_diff"],
                                      description="parity kinds that must pass (lightup only counts where a pair has "
                                      "a compare metric)")
    consecutive: int = Field(3, ge=1, le=1000, description="consecutive wave evaluations in which every pair held")


class KeyDiffRule(dg.Model, dg.Resolvable):
    """How the cross-database key diff reads a pair: in full below a size, sampled by key buckets above it."""

    full_below_rows: int = Field(1_000_000, ge=0, description="source rows below which every key is compared")
    sample: list[int] = Field(default_factory=lambda: [1, 16], description="above it, compare keys in buckets "
                              "0..k-1 of n, as [k, n]: MOD(ABS(key), n) < k on the first key column (an integer)")
    max_download_rows: int = Field(2_000_000, ge=1, description="refuse to download more differing rows than this")
    transfer: Literal["auto", "stream", "bisect"] = Field(
        "auto", description="how the rows cross: stream (every row read once, PostgreSQL by binary COPY, compared "
        "locally), bisect (bucket hashes in each database, then the differing buckets' rows), auto (stream when "
        "200,000 rows or more are compared and a probe of a PostgreSQL side's stream takes at most twice its time to "
        "hash the same rows)")

    @field_validator("sample")
    @classmethod
    def _sample(cls, v: list[int]) -> list[int]:
        if len(v) != 2 or not 0 < v[0] <= v[1]:
            raise ValueError(f"sample is [k, n] with 0 < k <= n, got {list(v)}")
        return v


class PairConfig(dg.Model, dg.Resolvable):
    """One table pair: the source table, the target asset and table, and what parity compares."""

    source: TableRef
    target: TargetRef
    key: list[str] = Field(min_length=1, description="the key columns (compound allowed)")
    slice_by: list[str] = Field(default_factory=list, description="columns counts and sums are grouped by")
    sums: list[str] = Field(default_factory=list, description="numeric columns whose exact sums are compared per slice")
    compare_columns: list[str] | None = Field(None, description="columns the key diff compares (default: every shared one)")
    time_column: str | None = Field(None, description="a time or partition column (naive UTC) of a table still being "
                                    "written: only rows of closed partitions are compared")
    partition_cadence: Literal["hourly", "daily", "weekly", "monthly"] = Field(
        "daily", description="the partitions time_column is cut into (a partition closes when it ends)")
    lightup_compare_metric: str | None = Field(None, description="the Lightup compare metric of this pair (its latest "
                                               "datapoint must read 0); empty: none")
    trim_trailing_blanks: bool = Field(False, description="compare text with trailing blanks trimmed (CHAR sources)")
    case_insensitive_keys: bool = False
    timestamp_precision: str | None = Field(None, description="compare timestamps at this precision (e.g. "
                                            "millisecond for an engine that keeps fewer digits)")
    key_diff: KeyDiffRule | None = Field(None, description="this pair's own key diff rule (default the migration's)")

    @field_validator("lightup_compare_metric", mode="before")
    @classmethod
    def _blank(cls, v):
        return None if isinstance(v, str) and not v.strip() else v

    @property
    def label(self) -> str:
        """``source.table → target asset`` for messages."""
        return f"{self.source.table} → {self.target.asset}"


class WaveConfig(dg.Model, dg.Resolvable):
    """One wave: table pairs moved and signed off together, owned by one domain."""

    name: str = Field(pattern=_NAME, description="lower-case letters, digits, _ (part of asset keys and job names)")
    domain: str = Field(description="the owning domain (its approvers sign the wave off)")
    pairs: list[PairConfig] = Field(min_length=1)
    gate: GateRule | None = Field(None, description="this wave's own gate rule (default the migration's)")


class MigrationConfig(dg.Model, dg.Resolvable):
    """A named migration: waves of table pairs, the gate rule, the key diff rule, an optional schedule."""

    name: str = Field(pattern=_NAME, description="lower-case letters, digits, _ (part of asset keys and job names)")
    waves: list[WaveConfig] = Field(min_length=1)
    gate: GateRule = Field(default_factory=GateRule)
    key_diff: KeyDiffRule = Field(default_factory=KeyDiffRule)
    schedule: str | None = Field(None, description="cron of the wave evaluations (e.g. '0 * * * *'); none: run the "
                                 "wave jobs yourself or from CI")
    max_workers: int = Field(4, ge=1, le=64, description="pairs of a wave evaluated at once")
    resolve_at_load: bool = Field(True, description="check every table and column against the engines' catalogs "
                                  "when the definitions load")

    @model_validator(mode="after")
    def _unique(self) -> MigrationConfig:
        problems, seen_waves, seen_targets = [], set(), {}
        for i, w in enumerate(self.waves):
            if w.name in seen_waves:
                problems.append(f"waves.{i}.name: wave {w.name!r} is listed twice")
            seen_waves.add(w.name)
            for j, p in enumerate(w.pairs):
                if p.target.asset in seen_targets:
                    problems.append(f"waves.{i}.pairs.{j}.target.asset: {p.target.asset!r} is already the target of "
                                    f"{seen_targets[p.target.asset]} (its parity checks would collide)")
                seen_targets[p.target.asset] = f"waves.{i}.pairs.{j}"
                kinds = (w.gate or self.gate).require
                if "lightup" in kinds and not p.lightup_compare_metric:
                    pass  # lightup holds vacuously for pairs without a compare metric
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def wave(self, name: str) -> WaveConfig:
        """The wave called ``name``.

        Raises:
            KeyError: no such wave.
        """
        for w in self.waves:
            if w.name == name:
                return w
        raise KeyError(f"migration {self.name} has no wave {name!r} (waves: {', '.join(w.name for w in self.waves)})")

    def gate_of(self, wave: WaveConfig) -> GateRule:
        return wave.gate or self.gate


def wave_asset_key(migration: str, wave: str) -> dg.AssetKey:
    """``migration/<migration>/<wave>``."""
    return dg.AssetKey([k.MIGRATION_ASSET_PREFIX, migration, wave])


def wave_job_name(migration: str, wave: str) -> str:
    """``dw_migration__<migration>__<wave>``."""
    return f"{k.MIGRATION_WAVE_JOB_PREFIX}{migration}__{wave}"


def parity_check_name(kind: str) -> str:
    """``parity_<kind>``."""
    return f"{k.PARITY_CHECK_PREFIX}{kind}"


def pair_kinds(pair: PairConfig) -> list[str]:
    """The parity kinds checked on a pair (lightup only with a compare metric)."""
    return [kind for kind in k.PARITY_KINDS if kind != k.PARITY_LIGHTUP or pair.lightup_compare_metric]


__all__ = ["GateRule", "KeyDiffRule", "MigrationConfig", "PairConfig", "TableRef", "TargetRef", "WaveConfig",
           "pair_kinds", "parity_check_name", "wave_asset_key", "wave_job_name"]
