"""The cost report: what a period metered, and who it is attributed to, reconciled to the meter.

One report per engine and period. ``metered`` is what the engine's own meter says (Snowflake:
``METERING_DAILY_HISTORY.CREDITS_BILLED`` of warehouse metering; BigQuery: the period's bytes
billed; DuckDB and other engines without billing: the seconds of the period's Dagster steps and
dbt nodes). ``attributed`` + ``idle`` + ``unattributed`` = ``metered``, and the report says so with
the numbers (``reconciliation``), within :data:`TOLERANCE`.
"""

from __future__ import annotations

from dw_dagster.dagster_private import public
import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dw_dagster.errors import DwDagsterError

#: attributed + idle + unattributed must equal metered within this (credits, bytes or seconds)
TOLERANCE = 1e-6


class CostError(DwDagsterError, ValueError):
    """A cost report cannot be made as asked (a bad period, an unknown engine, a view that is missing);
    the message says what to change."""


class Period(BaseModel):
    """Whole UTC days ``[since, until)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: dt.date
    until: dt.date

    @model_validator(mode="after")
    def _ordered(self) -> Period:
        if self.until <= self.since:
            raise ValueError(f"until ({self.until}) must be after since ({self.since}); until is exclusive")
        return self

    @property
    def start(self) -> dt.datetime:
        """``since`` at 00:00 (naive UTC, as the usage views are compared)."""
        return dt.datetime.combine(self.since, dt.time())

    @property
    def end(self) -> dt.datetime:
        """``until`` at 00:00 (naive UTC; exclusive)."""
        return dt.datetime.combine(self.until, dt.time())

    @property
    def days(self) -> int:
        return (self.until - self.since).days

    @classmethod
    def last_days(cls, days: int, until: dt.date | None = None) -> Period:
        """The ``days`` whole UTC days before ``until`` (default today, UTC)."""
        end = until or dt.datetime.now(dt.timezone.utc).date()
        return cls(since=end - dt.timedelta(days=days), until=end)

    @classmethod
    def parse(cls, since: str | dt.date | None, until: str | dt.date | None, default_days: int = 30,
              include_today: bool = False) -> Period:
        """A period from ``YYYY-MM-DD`` texts (either may be None: ``until`` defaults to today, UTC —
        tomorrow with ``include_today``, for a report of the day so far — ``since`` to ``default_days``
        before ``until``).

        Raises:
            CostError: a date that does not parse, or ``until`` not after ``since``.
        """
        try:
            u = until if isinstance(until, dt.date) or until is None else dt.date.fromisoformat(until)
            s = since if isinstance(since, dt.date) or since is None else dt.date.fromisoformat(since)
        except ValueError as e:
            raise CostError(f"dates are YYYY-MM-DD (whole UTC days): {e}") from None
        u = u or dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1 if include_today else 0)
        s = s or u - dt.timedelta(days=default_days)
        try:
            return cls(since=s, until=u)
        except ValidationError as e:
            raise CostError(str(e.errors()[0]["msg"]).removeprefix("Value error, ")) from None


Unit = Literal["credits", "bytes_billed", "seconds"]


@public
class CostReport(BaseModel):
    """What a period cost on one engine, attributed to dbt nodes, Dagster assets, runs and warehouses.

    Attributes:
        period: the whole UTC days covered.
        engine: ``snowflake``, ``bigquery`` or ``duckdb`` (Dagster step and dbt node timings).
        unit: ``credits`` (Snowflake), ``bytes_billed`` (BigQuery) or ``seconds``.
        metered: the meter's total for the period.
        attributed: what maps to a dbt node (model, test, seed, snapshot), a Dagster asset or a Dagster run.
        idle: metered with no query running (Snowflake: warehouse hours with credits and no query).
        unattributed: the rest: queries that map to nothing, and what the meter counted that no query
            in the history explains (``unattributed_detail`` names each part).
        by_model: dbt node id → its queries' amount (tests are nodes of their own).
        by_asset: Dagster asset key (``a/b``) → amount.
        by_run: Dagster run id → amount.
        by_warehouse: warehouse (BigQuery: project) → amount, its idle included.
        by_partition: asset → partition (or ``first..last`` for a run over a range) → amount, from the
            ``partition`` of dw_dagster's tags (Dagster's own partitions of the queries' steps).
        idle_by_warehouse: warehouse → idle amount (never spread over the queries).
        queries: ``{"total", "attributed", "unattributed"}`` query (or step) counts.
        queries_by: the same dimensions as the ``by_*`` maps, counting queries.
        unattributed_detail: the parts of ``unattributed``.
        reconciliation: the identity in words with its numbers.
        reconciled: whether attributed + idle + unattributed equals metered within :data:`TOLERANCE`.
        beside: other figures reported next to the metered allocation, never instead of it
            (Snowflake's ``QUERY_ATTRIBUTION_HISTORY``; BigQuery's bytes processed).
        extra: engine figures (cloud services, USD, slot time, price per TiB).
        notes: what the reader should know about the numbers.
        sql: the one statement that computed the report (pushed down to the engine).
    """

    model_config = ConfigDict(extra="forbid")

    period: Period
    engine: str
    unit: Unit
    metered: float
    attributed: float
    idle: float
    unattributed: float
    by_model: dict[str, float] = Field(default_factory=dict)
    by_asset: dict[str, float] = Field(default_factory=dict)
    by_run: dict[str, float] = Field(default_factory=dict)
    by_warehouse: dict[str, float] = Field(default_factory=dict)
    by_partition: dict[str, dict[str, float]] = Field(default_factory=dict)
    idle_by_warehouse: dict[str, float] = Field(default_factory=dict)
    queries: dict[str, int] = Field(default_factory=dict)
    queries_by: dict[str, dict[str, int]] = Field(default_factory=dict)
    unattributed_detail: dict[str, float] = Field(default_factory=dict)
    reconciliation: str = ""
    reconciled: bool = False
    beside: dict[str, Any] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    sql: str = ""

    def difference(self) -> float:
        """metered − (attributed + idle + unattributed)."""
        return self.metered - (self.attributed + self.idle + self.unattributed)

    def sealed(self) -> CostReport:
        """This report with ``reconciliation`` and ``reconciled`` filled in from its numbers."""
        diff = self.difference()
        text = (f"attributed {self.attributed:.9g} + idle {self.idle:.9g} + unattributed {self.unattributed:.9g} "
                f"= {self.attributed + self.idle + self.unattributed:.9g} {self.unit}; metered {self.metered:.9g}; "
                f"difference {diff:.3g}")
        return self.model_copy(update={"reconciliation": text, "reconciled": abs(diff) <= TOLERANCE})

    def to_json_dict(self) -> dict[str, Any]:
        """The report as ``dw-dagster cost --json`` prints it (period as ``{"since", "until"}`` dates)."""
        return self.model_dump(mode="json")

    def by(self, dimension: str) -> dict[str, float]:
        """One of the ``by_*`` maps: ``model``, ``asset``, ``run`` or ``warehouse``.

        Raises:
            CostError: another dimension.
        """
        if dimension not in DIMENSIONS:
            raise CostError(f"--by is one of {', '.join(DIMENSIONS)}, got {dimension!r}")
        return getattr(self, f"by_{dimension}")


#: the dimensions a report is broken down by
DIMENSIONS = ("model", "asset", "run", "warehouse")


__all__ = ["DIMENSIONS", "TOLERANCE", "CostError", "CostReport", "Period", "Unit"]
