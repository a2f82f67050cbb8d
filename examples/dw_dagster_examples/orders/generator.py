"""Deterministic order events for the orders-stream incident (DESIGN.md §3, dead-letter cause).

The source is a MySQL-compatible ``shop.orders`` table (MariaDB in the tests) whose change
stream lands in the warehouse table ``analytics.orders``, where ``shipping_country`` is REQUIRED.
Columns of an order (all times naive UTC):

``order_id`` (BIGINT key, increasing with ``order_ts``), ``customer_id`` (BIGINT), ``order_ts``
(when it was placed), ``amount`` (DECIMAL(18,2), in ``currency``), ``currency`` (ISO 4217),
``payment_method`` (``card``, ``paypal``, ``apple_pay`` or ``gift_card``), ``shipping_country``
(ISO 3166 alpha-2; NULL only in the incident), ``status`` (``placed``, ``shipped``,
``fulfilled``), ``updated_at`` (time of the last change).

The story at ``scale=1.0``:

- 35 days of orders, Wednesday 2026-10-21 to **Tuesday 2026-11-24** (UTC), about 43,600 orders
  on a Tuesday, with weekly seasonality, an hourly profile and ±0.8 % daily noise.
- Gift-card orders (``payment_method = 'gift_card'``, about 10.6 % of orders) are e-gift cards:
  no shipping address, delivered at once (``status = 'fulfilled'``), never updated or deleted.
  Until the release their ``shipping_country`` carried the billing country.
- Physical orders are inserted as ``placed``; 55 % are ``shipped`` 4–30 h later (an update),
  3 % get a partial refund 1–48 h later (an update of ``amount``), 0.4 % are deleted by fraud
  screening within 10 min–3 h (a delete; a deleted order gets no update).
- The orders-service release of **2026-11-24 09:00:00 UTC** (:data:`RELEASE_TS`) stops copying
  the billing country for gift-card orders: every gift-card order from then on has NULL
  ``shipping_country`` — **3,912** of them (:data:`PARKED_ROWS`), all inserts, each rejected by
  the sink once with the same reason.
- The stream is read up to 2026-11-25 06:00:00 UTC (:data:`STREAM_END`): later updates have not
  happened yet.
- Tuesday's orders *landed* in the warehouse (placed that UTC day, not deleted, not parked) are
  **9 %** under the baseline of the project's volume check (:mod:`dw_dagster.checks.volume`: the
  mean of the same weekday's daily counts in the 28 days before — here the four Tuesdays
  2026-10-27 … 2026-11-17). Tuesday's *source* volume is in line with those Tuesdays: only the
  warehouse is short. The other six days the check scores (2026-11-18 … 23) are inside their bands.

Calibration: :func:`plan` sets Tuesday's order count so that its landed count is
``round(0.91 × baseline mean)`` and apportions exactly ``round(3912 × scale)`` gift cards to the
hours from 09:00 on; every other count is ``round(count × scale)`` of the figures above, split
over hours with the largest-remainder method, so the figures are exact integers without
generating a row. :func:`expected` scores the planned landed counts with the volume check's own
:func:`~dw_dagster.checks.volume.score_days`.

Rows are then drawn per day from ``random.Random`` seeded with :data:`SEED` and the date, so the
event stream of :func:`changes` is the same on every run and machine.
"""

from __future__ import annotations

import datetime as dt
import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

SEED = 20261124
FIRST_DAY = dt.date(2026, 10, 21)  # a Wednesday: five full weeks up to the incident day
INCIDENT_DAY = dt.date(2026, 11, 24)  # a Tuesday
DAYS = (INCIDENT_DAY - FIRST_DAY).days + 1  # 35
#: the orders-service release: from this instant gift-card orders carry NULL shipping_country
RELEASE_TS = dt.datetime(2026, 11, 24, 9, 0, 0)
#: the stream as read by the sink: changes after this instant have not happened yet
STREAM_END = dt.datetime(2026, 11, 25, 6, 0, 0)

# Figures at scale 1.0
PARKED_ROWS = 3_912
TUESDAY_SHORTFALL = 0.09
BASE_ORDERS = 43_620  # a Tuesday's orders before noise (weekday factor 1.0)
CUSTOMERS = 600_000
ORDER_ID_START = 50_000_001

WEEKDAY_FACTOR = {0: 1.03, 1: 1.00, 2: 0.98, 3: 1.00, 4: 1.06, 5: 1.12, 6: 1.10}
DAILY_NOISE = 0.008
#: relative order volume per UTC hour (Europe and the Americas)
HOURLY_WEIGHTS = (2.2, 1.8, 1.4, 1.1, 0.9, 0.9, 1.2, 1.8, 2.6, 3.4, 4.0, 4.4,
                  4.8, 5.2, 5.6, 5.8, 6.0, 6.2, 6.4, 6.2, 5.6, 4.6, 3.6, 2.8)
GIFT_CARD_SHARE = 0.106
DELETE_RATE = 0.004  # of physical orders
SHIP_RATE = 0.55
REFUND_RATE = 0.03
#: (country, currency, weight)
COUNTRIES = (("US", "USD", 45), ("GB", "GBP", 12), ("DE", "EUR", 12), ("FR", "EUR", 8),
             ("CA", "CAD", 8), ("AU", "AUD", 6), ("NL", "EUR", 5), ("ES", "EUR", 4))
PAYMENT_METHODS = (("card", 68), ("paypal", 22), ("apple_pay", 10))
GIFT_CARD_AMOUNTS = (25, 50, 100, 150, 200)

# Below MIN_SCALE the incident day would park fewer than 4 rows; MAX_SCALE is ~15 M orders.
MIN_SCALE = 0.001
MAX_SCALE = 10.0

#: the order columns, in table order
COLUMNS = ("order_id", "customer_id", "order_ts", "amount", "currency", "payment_method",
           "shipping_country", "status", "updated_at")
KEY = "order_id"

Op = Literal["insert", "update", "delete"]


@dataclass(frozen=True)
class DayPlan:
    """How many orders one UTC day has, per hour, and what becomes of them (counts in rows).

    Attributes:
        day: the UTC date of ``order_ts``.
        first_order_id: the day's orders have ids ``first_order_id`` … ``first_order_id + orders - 1``.
        orders_by_hour: orders placed in each UTC hour (24 values).
        gift_cards_by_hour: of those, gift-card orders.
        deletes: physical orders of the day deleted by fraud screening (within 3 h).
        null_country: gift-card orders placed at or after :data:`RELEASE_TS` (NULL shipping_country).
    """

    day: dt.date
    first_order_id: int
    orders_by_hour: tuple[int, ...]
    gift_cards_by_hour: tuple[int, ...]
    deletes: int
    null_country: int

    @property
    def orders(self) -> int:
        """Orders placed that day, as the source sees them before deletes (rows)."""
        return sum(self.orders_by_hour)

    @property
    def gift_cards(self) -> int:
        return sum(self.gift_cards_by_hour)

    @property
    def source_rows(self) -> int:
        """Orders of the day still in the source at :data:`STREAM_END` (rows)."""
        return self.orders - self.deletes

    @property
    def landed(self) -> int:
        """Orders of the day in the warehouse after the sink: source rows minus parked ones (rows)."""
        return self.orders - self.deletes - self.null_country


def _check_scale(scale: float) -> None:
    if not MIN_SCALE <= scale <= MAX_SCALE:  # also false for nan
        raise ValueError(f"scale {scale} is out of range: use {MIN_SCALE} to {MAX_SCALE}")


def _apportion(total: int, weights: list[float] | tuple[float, ...]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder, stable ties)."""
    s = sum(weights)
    if total == 0 or s == 0:
        return [0] * len(weights)
    raw = [total * w / s for w in weights]
    out = [int(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def days() -> list[dt.date]:
    """The 35 UTC days of the history, oldest first; the last is :data:`INCIDENT_DAY`."""
    return [FIRST_DAY + dt.timedelta(days=i) for i in range(DAYS)]


def baseline_days(day: dt.date, training_days: int = 28) -> list[dt.date]:
    """The days the volume check compares ``day`` with: same weekday, strictly before, within
    ``training_days`` days, inside the history (the four Tuesdays before the incident day)."""
    return [d for d in days() if d < day and (day - d).days <= training_days and d.weekday() == day.weekday()]


def plan(scale: float = 1.0) -> list[DayPlan]:
    """Orders per day and hour at ``scale``, calibrated so the incident figures are exact.

    At every scale: the incident day parks exactly ``round(3912 × scale)`` rows and its landed
    count is ``round(0.91 × mean)`` of the same-weekday baseline's landed counts.

    Raises:
        ValueError: ``scale`` outside [:data:`MIN_SCALE`, :data:`MAX_SCALE`].
    """
    _check_scale(scale)
    rng = random.Random(SEED)
    noise = {d: rng.uniform(1 - DAILY_NOISE, 1 + DAILY_NOISE) for d in days()}
    parked = round(PARKED_ROWS * scale)
    out: list[DayPlan] = []
    next_id = ORDER_ID_START
    for d in days():
        if d != INCIDENT_DAY:
            n = round(BASE_ORDERS * scale * WEEKDAY_FACTOR[d.weekday()] * noise[d])
            by_hour = _apportion(n, HOURLY_WEIGHTS)
            gifts = _apportion(round(GIFT_CARD_SHARE * n), by_hour)
            deletes = round(DELETE_RATE * (n - sum(gifts)))
            null_country = 0
        else:
            prior = {p.day: p for p in out}
            base = [prior[b].landed for b in baseline_days(d)]
            target = round((1 - TUESDAY_SHORTFALL) * sum(base) / len(base))
            # the same share of physical orders as on other days (gift cards are never deleted)
            deletes = round(DELETE_RATE * (1 - GIFT_CARD_SHARE) * (target + parked))
            n = target + parked + deletes
            by_hour = _apportion(n, HOURLY_WEIGHTS)
            cut = RELEASE_TS.hour
            before = by_hour[:cut]
            gifts = _apportion(round(GIFT_CARD_SHARE * sum(before)), before) + _apportion(parked, by_hour[cut:])
            null_country = parked
        out.append(DayPlan(d, next_id, tuple(by_hour), tuple(gifts), deletes, null_country))
        next_id += n
    return out


@dataclass(frozen=True)
class Expectation:
    """What the incident looks like at one scale, from the plan alone (counts in rows).

    Attributes:
        scale: the scale.
        parked_rows: rows the sink parks (all on the incident day, one reason).
        landed_by_day: rows per ``order_ts`` UTC day in ``analytics.orders`` after the stream.
        source_by_day: rows per day in ``shop.orders`` at :data:`STREAM_END`.
        incident_landed: the incident day's landed rows.
        baseline_mean: mean landed rows of the baseline days (as the volume check computes it).
        deviation_pct: (landed − mean) / mean in %, as the volume check reports it (≈ −9).
        status: the volume check's status for the incident day (``low``).
        other_statuses: the check's status for each other day it scores (7 days in all).
        source_deviation_pct: the same score for the source's rows per day (≈ 0: the source is whole).
    """

    scale: float
    parked_rows: int
    landed_by_day: dict[dt.date, int]
    source_by_day: dict[dt.date, int]
    incident_landed: int
    baseline_mean: float
    deviation_pct: float
    status: str
    other_statuses: dict[dt.date, str]
    source_deviation_pct: float


def expected(scale: float = 1.0, evaluate_days: int = 7) -> Expectation:
    """The incident's figures at ``scale``, computed from :func:`plan` without generating rows.

    The landed counts are scored with :func:`dw_dagster.checks.volume.score_days` (the volume
    check's defaults: 28 training days, same weekday, 3 σ, 2 % floor), as the check would score
    ``analytics.orders`` by ``order_ts`` on the morning after.
    """
    from dw_dagster.checks.volume import score_days

    cells = plan(scale)
    landed = {c.day: c.landed for c in cells}
    source = {c.day: c.source_rows for c in cells}
    evaluate = [INCIDENT_DAY - dt.timedelta(days=i) for i in reversed(range(evaluate_days))]
    scores = {s.day: s for s in score_days(landed, evaluate)}
    src = score_days(source, [INCIDENT_DAY])[0]
    inc = scores[INCIDENT_DAY]
    base = [landed[b] for b in baseline_days(INCIDENT_DAY)]
    return Expectation(
        scale=scale,
        parked_rows=sum(c.null_country for c in cells),
        landed_by_day=landed,
        source_by_day=source,
        incident_landed=landed[INCIDENT_DAY],
        baseline_mean=sum(base) / len(base),
        deviation_pct=inc.deviation_pct,
        status=inc.status,
        other_statuses={d: s.status for d, s in scores.items() if d != INCIDENT_DAY},
        source_deviation_pct=src.deviation_pct,
    )


@dataclass(frozen=True)
class OrderChange:
    """One change to one order at the source, in commit order.

    Attributes:
        op: ``insert``, ``update`` or ``delete``.
        ts: when it happened (naive UTC).
        order_id: the key.
        before: the row before the change (None for an insert); keys are :data:`COLUMNS`.
        after: the row after the change (None for a delete).
    """

    op: Op
    ts: dt.datetime
    order_id: int
    before: dict | None
    after: dict | None


def _weighted(rng: random.Random, items: tuple) -> tuple:
    return rng.choices(items, weights=[i[-1] for i in items])[0]


def _day_changes(cell: DayPlan, scale: float) -> list[tuple[dt.datetime, int, int, OrderChange]]:
    """Every change of the orders placed on ``cell.day`` as heap entries (ts, order_id, seq, change)."""
    rng = random.Random(f"{SEED}:{cell.day.isoformat()}")
    customers = max(50, round(CUSTOMERS * scale))
    midnight = dt.datetime.combine(cell.day, dt.time())
    out: list[tuple[dt.datetime, int, int, OrderChange]] = []
    orders: list[tuple[dict, bool]] = []  # (row, physical)
    oid = cell.first_order_id
    for hour, (n, g) in enumerate(zip(cell.orders_by_hour, cell.gift_cards_by_hour)):
        seconds = sorted(rng.randrange(3600) for _ in range(n))
        gift = set(rng.sample(range(n), g))
        for i, s in enumerate(seconds):
            ts = midnight + dt.timedelta(hours=hour, seconds=s)
            country, currency, _ = _weighted(rng, COUNTRIES)
            is_gift = i in gift
            if is_gift:
                amount = Decimal(rng.choice(GIFT_CARD_AMOUNTS)).quantize(Decimal("0.01"))
                method, status = "gift_card", "fulfilled"
                shipping = None if ts >= RELEASE_TS else country
            else:
                amount = Decimal(str(round(min(rng.lognormvariate(4.0, 0.6), 5000.0), 2))).quantize(Decimal("0.01"))
                method, status, shipping = _weighted(rng, PAYMENT_METHODS)[0], "placed", country
            row = {"order_id": oid, "customer_id": rng.randint(1, customers), "order_ts": ts, "amount": amount,
                   "currency": currency, "payment_method": method, "shipping_country": shipping,
                   "status": status, "updated_at": ts}
            orders.append((row, not is_gift))
            oid += 1
    physical = [i for i, (_, p) in enumerate(orders) if p]
    deleted = set(rng.sample(physical, cell.deletes))
    for i, (row, is_physical) in enumerate(orders):
        ts, key = row["order_ts"], row["order_id"]
        out.append((ts, key, 0, OrderChange("insert", ts, key, None, row)))
        if not is_physical:
            continue
        if i in deleted:
            t = ts + dt.timedelta(seconds=rng.randint(600, 3 * 3600))
            out.append((t, key, 1, OrderChange("delete", t, key, row, None)))
            continue
        later: list[tuple[dt.datetime, int, dict]] = []
        if rng.random() < SHIP_RATE:
            later.append((ts + dt.timedelta(seconds=rng.randint(4 * 3600, 30 * 3600)), 1, {"status": "shipped"}))
        if rng.random() < REFUND_RATE:
            cut = Decimal(rng.choice(("0.90", "0.80", "0.75")))
            later.append((ts + dt.timedelta(seconds=rng.randint(3600, 48 * 3600)), 2,
                          {"amount": (row["amount"] * cut).quantize(Decimal("0.01"))}))
        current = row
        for seq, (t, _, change) in enumerate(sorted(later, key=lambda x: (x[0], x[1])), start=1):
            if t > STREAM_END:
                break
            after = {**current, **change, "updated_at": t}
            out.append((t, key, seq, OrderChange("update", t, key, current, after)))
            current = after
    return out


def changes(scale: float = 1.0) -> Iterator[OrderChange]:
    """The source's change stream at ``scale``, in commit order (ts, then order_id), up to :data:`STREAM_END`.

    Generated day by day; only about two days of changes are held in memory at once.

    Raises:
        ValueError: ``scale`` outside [:data:`MIN_SCALE`, :data:`MAX_SCALE`].
    """
    heap: list[tuple[dt.datetime, int, int, OrderChange]] = []
    for cell in plan(scale):
        for entry in _day_changes(cell, scale):
            heapq.heappush(heap, entry)
        horizon = dt.datetime.combine(cell.day + dt.timedelta(days=1), dt.time())
        while heap and heap[0][0] < horizon:
            yield heapq.heappop(heap)[3]
    while heap:
        yield heapq.heappop(heap)[3]


def final_rows(scale: float = 1.0) -> dict[int, dict]:
    """The source table at :data:`STREAM_END`: ``order_id`` → row (materialises every live row)."""
    state: dict[int, dict] = {}
    for c in changes(scale):
        if c.op == "delete":
            state.pop(c.order_id, None)
        else:
            state[c.order_id] = c.after
    return state
