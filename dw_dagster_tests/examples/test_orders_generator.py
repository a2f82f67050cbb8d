"""The orders generator: calibration of the incident (from the plan, no rows), determinism, shape."""

import datetime as dt

import pytest

from dw_dagster.checks.volume import score_days
from dw_dagster_examples.orders import generator as g


def test_calibration_at_full_scale_matches_the_incident():
    e = g.expected(1.0)
    assert e.parked_rows == 3_912
    assert g.INCIDENT_DAY.weekday() == 1 and g.INCIDENT_DAY.month == 11 and g.INCIDENT_DAY.year == 2026
    assert g.RELEASE_TS.date() == g.INCIDENT_DAY
    # the volume check's own baseline: the four Tuesdays before, same weekday, within 28 days
    assert g.baseline_days(g.INCIDENT_DAY) == [dt.date(2026, 10, 27), dt.date(2026, 11, 3),
                                               dt.date(2026, 11, 10), dt.date(2026, 11, 17)]
    assert e.deviation_pct == pytest.approx(-9.0, abs=0.5)
    assert e.status == "low"
    mean = sum(e.landed_by_day[d] for d in g.baseline_days(g.INCIDENT_DAY)) / 4
    assert (e.incident_landed - mean) / mean * 100 == pytest.approx(e.deviation_pct, abs=0.001)
    # the other six days the check scores are inside their bands; the source itself is whole
    assert len(e.other_statuses) == 6 and set(e.other_statuses.values()) == {"ok"}
    assert abs(e.source_deviation_pct) < 1.0
    cells = g.plan(1.0)
    tue = cells[-1]
    assert tue.day == g.INCIDENT_DAY and tue.null_country == 3_912
    assert sum(c.null_country for c in cells[:-1]) == 0
    # the release makes gift cards lose their country, not become rarer or commoner
    cut = g.RELEASE_TS.hour
    share_before = sum(tue.gift_cards_by_hour[:cut]) / sum(tue.orders_by_hour[:cut])
    share_after = sum(tue.gift_cards_by_hour[cut:]) / sum(tue.orders_by_hour[cut:])
    assert share_after == pytest.approx(share_before, abs=0.005)
    assert sum(tue.gift_cards_by_hour[cut:]) == 3_912


def test_the_plan_scored_by_the_volume_check_agrees_with_expected():
    e = g.expected(1.0)
    s = score_days(e.landed_by_day, [g.INCIDENT_DAY])[0]
    assert s.deviation_pct == e.deviation_pct and s.baseline_days == 4 and s.status == "low"


@pytest.mark.parametrize("scale", [0.5, 0.1, 0.01, 0.005, 0.001])
def test_every_count_scales(scale):
    e = g.expected(scale)
    assert e.parked_rows == round(3_912 * scale)
    assert e.deviation_pct == pytest.approx(-9.0, abs=0.5 if scale >= 0.005 else 1.2)
    assert e.status == "low"
    assert set(e.other_statuses.values()) == {"ok"}
    full = g.expected(1.0)
    assert sum(e.source_by_day.values()) == pytest.approx(sum(full.source_by_day.values()) * scale, rel=0.01)


def test_scale_out_of_range_is_refused():
    for bad in (0.0, 0.0005, 11.0, float("nan")):
        with pytest.raises(ValueError, match="out of range"):
            g.plan(bad)


def test_changes_are_deterministic_and_consistent_with_the_plan():
    scale = 0.005
    first = list(g.changes(scale))
    assert first == list(g.changes(scale))
    assert g.plan(scale) == g.plan(scale)
    cells = g.plan(scale)
    # commit order, nothing after the stream's end, ids in order_ts order
    assert all(a.ts <= b.ts for a, b in zip(first, first[1:]))
    assert first[-1].ts <= g.STREAM_END
    inserts = [c for c in first if c.op == "insert"]
    assert len(inserts) == sum(c.orders for c in cells)
    ids = [c.order_id for c in inserts]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    ops = {c.op for c in first}
    assert ops == {"insert", "update", "delete"}
    # per key: one insert first; updates chain their images; a delete is last
    state: dict[int, dict] = {}
    for c in first:
        if c.op == "insert":
            assert c.order_id not in state and c.before is None
            state[c.order_id] = c.after
        else:
            assert state[c.order_id] == c.before
            if c.op == "delete":
                del state[c.order_id]
            else:
                assert c.after["updated_at"] == c.ts and c.after["order_id"] == c.order_id
                state[c.order_id] = c.after
    assert state == g.final_rows(scale)
    # NULL shipping_country: exactly the gift-card orders placed from the release on, all inserts,
    # never updated or deleted afterwards
    nulls = [c for c in first if c.after is not None and c.after["shipping_country"] is None]
    assert len(nulls) == round(3_912 * scale)
    assert all(c.op == "insert" and c.after["payment_method"] == "gift_card" and c.after["order_ts"] >= g.RELEASE_TS
               for c in nulls)
    null_ids = {c.order_id for c in nulls}
    assert not [c for c in first if c.op != "insert" and c.order_id in null_ids]
    assert all(r["shipping_country"] for r in state.values() if r["order_ts"] < g.RELEASE_TS)
    # the source per day at the stream's end is what the plan says
    by_day: dict[dt.date, int] = {}
    for r in state.values():
        by_day[r["order_ts"].date()] = by_day.get(r["order_ts"].date(), 0) + 1
    assert by_day == {c.day: c.source_rows for c in cells}


def test_rows_have_the_documented_shape():
    from decimal import Decimal

    rows = list(g.final_rows(0.002).values())
    assert set(rows[0]) == set(g.COLUMNS)
    for r in rows:
        assert isinstance(r["amount"], Decimal) and r["amount"] == r["amount"].quantize(Decimal("0.01"))
        assert r["amount"] > 0 and len(r["currency"]) == 3
        assert r["payment_method"] in ("card", "paypal", "apple_pay", "gift_card")
        assert (r["status"] == "fulfilled") == (r["payment_method"] == "gift_card")
        assert g.FIRST_DAY <= r["order_ts"].date() <= g.INCIDENT_DAY and r["updated_at"] >= r["order_ts"]
