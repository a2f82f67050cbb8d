"""Verification queries of the orders repair: gift-card GMV per day, model against source.

``fct_daily_gmv`` includes gift cards again once the parked gift-card orders are replayed and the
model rebuilt: its gift-card orders and GMV per order date and currency must equal the source's.
:func:`gmv_from_model` reads the model, :func:`gmv_from_orders` aggregates an orders table the
same way (the source ``shop.orders``; or ``analytics.orders`` itself where dbt cannot run, as on
the BigQuery emulator), and :func:`gift_card_gmv_compare` compares them. Only aggregates come
back (one row per day and currency).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

import dagster as dg

from dw_dagster import Database
from dw_dagster.databases import sql

MODEL_TABLE = "analytics.fct_daily_gmv"
GIFT_CARD = "gift_card"

Cells = dict[tuple[dt.date, str], tuple[int, Decimal]]


def _date(v) -> dt.date:
    if isinstance(v, dt.datetime):
        return v.date()
    return v if isinstance(v, dt.date) else dt.date.fromisoformat(str(v)[:10])


def gmv_from_model(db: Database, table: str = MODEL_TABLE, *, payment_method: str = GIFT_CARD,
                   first_day: dt.date, last_day: dt.date) -> tuple[Cells, str]:
    """``(order_date, currency) → (orders, GMV)`` of ``payment_method`` from the model, days inclusive."""
    q = sql.render("SELECT order_date, currency, SUM(order_count), SUM(gmv) FROM :t WHERE payment_method = :pm "
                   "AND order_date >= :lo AND order_date <= :hi GROUP BY order_date, currency", db.dialect,
                   t=sql.table(table), pm=payment_method, lo=first_day, hi=last_day)
    return {(_date(d), str(cur)): (int(n or 0), Decimal(str(g or 0))) for d, cur, n, g in db.fetch_all(q)}, q


def gmv_from_orders(db: Database, table: str, *, payment_method: str = GIFT_CARD, first_day: dt.date,
                    last_day: dt.date) -> tuple[Cells, str]:
    """The same cells aggregated from an orders table (``order_ts``, ``currency``, ``amount``), days inclusive."""
    q = sql.render("SELECT CAST(order_ts AS DATE) AS d, currency, COUNT(*), SUM(amount) FROM :t WHERE payment_method = :pm "
                   "AND order_ts >= :lo AND order_ts < :hi GROUP BY CAST(order_ts AS DATE), currency", db.dialect,
                   t=sql.table(table), pm=payment_method, lo=dt.datetime.combine(first_day, dt.time()),
                   hi=dt.datetime.combine(last_day + dt.timedelta(days=1), dt.time()))
    return {(_date(d), str(cur)): (int(n or 0), Decimal(str(g or 0))) for d, cur, n, g in db.fetch_all(q)}, q


@dataclass
class GmvComparison:
    """Model (or target) cells against source cells, per order date and currency.

    Attributes:
        first_day, last_day: the compared days (inclusive).
        model, source: ``(day, currency) → (orders, GMV)``.
        queries: the two queries run.
    """

    first_day: dt.date
    last_day: dt.date
    model: Cells
    source: Cells
    queries: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> list[tuple[dt.date, str]]:
        keys = sorted(set(self.model) | set(self.source))
        return [k for k in keys if self.model.get(k, (0, Decimal(0))) != self.source.get(k, (0, Decimal(0)))]

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def day_totals(self, day: dt.date) -> dict:
        """``{"orders": (model, source), "gmv": {currency: (model, source)}}`` of one day."""
        cur = sorted({c for d, c in set(self.model) | set(self.source) if d == day})
        z = (0, Decimal(0))
        return {"orders": (sum(self.model.get((day, c), z)[0] for c in cur), sum(self.source.get((day, c), z)[0] for c in cur)),
                "gmv": {c: (str(self.model.get((day, c), z)[1]), str(self.source.get((day, c), z)[1])) for c in cur}}

    @property
    def description(self) -> str:
        last = self.day_totals(self.last_day)
        head = (f"gift-card orders on {self.last_day}: {last['orders'][0]:,} in the model, {last['orders'][1]:,} at the source; "
                "GMV " + ", ".join(f"{c} {m} vs {s}" for c, (m, s) in list(last["gmv"].items())[:4]))
        if self.passed:
            return f"every day {self.first_day}..{self.last_day} matches; {head}"
        days = sorted({d for d, _ in self.mismatches})
        return f"{len(self.mismatches)} day×currency cell(s) differ on {', '.join(map(str, days))}; {head}"

    def metadata(self) -> dict:
        rows = [{"day": d.isoformat(), "currency": c, "model_orders": self.model.get((d, c), (0, 0))[0],
                 "source_orders": self.source.get((d, c), (0, 0))[0], "model_gmv": str(self.model.get((d, c), (0, Decimal(0)))[1]),
                 "source_gmv": str(self.source.get((d, c), (0, Decimal(0)))[1])}
                for d, c in sorted(set(self.model) | set(self.source))]
        last = self.day_totals(self.last_day)
        return {"dw/cells_json": dg.MetadataValue.json(rows), "dw/mismatched_cells": len(self.mismatches),
                "dw/last_day": self.last_day.isoformat(), "dw/last_day_model_orders": last["orders"][0],
                "dw/last_day_source_orders": last["orders"][1],
                "dw/last_day_gmv_json": dg.MetadataValue.json(last["gmv"]),
                "dw/query": dg.MetadataValue.md("```sql\n" + ";\n".join(self.queries) + "\n```")}


def gift_card_gmv_compare(warehouse: Database, source: Database, *, model_table: str = MODEL_TABLE,
                          source_table: str = "shop.orders", days: int = 7,
                          last_day: dt.date | None = None, model_is_orders: bool = False) -> GmvComparison:
    """Compare gift-card orders and GMV per day and currency, model (warehouse) against source.

    Args:
        warehouse: holds ``model_table``.
        source: holds ``source_table``.
        days: how many order dates, ending at ``last_day`` (default: the model's latest order date).
        model_is_orders: ``model_table`` is an orders table, aggregated like the model (where dbt
            cannot run).

    Raises:
        dw_dagster.databases.DatabaseError: a table is missing or a query failed.
    """
    if last_day is None:
        col = "order_ts" if model_is_orders else "order_date"
        q = sql.render(f"SELECT MAX({col}) FROM :t", warehouse.dialect, t=sql.table(model_table))
        v = warehouse.fetch_all(q)[0][0]
        last_day = _date(v) if v is not None else dt.date.today()
    first_day = last_day - dt.timedelta(days=days - 1)
    if model_is_orders:
        model, q1 = gmv_from_orders(warehouse, model_table, first_day=first_day, last_day=last_day)
    else:
        model, q1 = gmv_from_model(warehouse, model_table, first_day=first_day, last_day=last_day)
    src, q2 = gmv_from_orders(source, source_table, first_day=first_day, last_day=last_day)
    return GmvComparison(first_day, last_day, model, src, [q1, q2])


__all__ = ["GmvComparison", "gift_card_gmv_compare", "gmv_from_model", "gmv_from_orders"]
