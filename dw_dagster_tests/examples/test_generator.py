import datetime as dt

from dw_dagster_examples.store_sales import generator as g


def test_calibration_at_full_scale_matches_the_incident():
    cells = g.plan(1.0)
    assert len(cells) == 300 * 28
    late = [c for c in cells if c.backdated]
    assert sum(c.lines for c in late) == 212_400
    assert len({c.store_id for c in late}) == 19
    assert {c.region for c in late} == {"Southwest"}
    assert {c.day for c in late} == set(g.OUTAGE_DAYS)
    sw = sum(c.lines for c in cells if c.region == "Southwest")
    assert sw == 11_800_000
    assert round(212_400 / sw * 100, 4) == 1.8
    assert {r for _, r in g.stores()} >= {"Southwest", "Northeast", "West"}


def test_plan_is_deterministic_and_scales():
    assert g.plan(0.01) == g.plan(0.01)
    small = g.plan(0.01)
    assert sum(c.lines for c in small if c.backdated) == 2_124
    assert sum(c.lines for c in small if c.region == "Southwest") == 118_000


def test_post_lines_fills_the_source_in_two_phases(duck):
    n1 = g.post_lines(duck, 0.002, g.BEFORE_RECOVERY)
    late_sql = "SELECT count(*) FROM pos.sales_line WHERE posted_ts >= TIMESTAMP '2026-11-28 09:00:00' AND sale_ts < TIMESTAMP '2026-11-28'"
    assert duck.fetch_all(late_sql)[0][0] == 0
    assert duck.fetch_all("SELECT max(sale_ts) FROM pos.sales_line")[0][0] == dt.datetime(2026, 11, 27, 21, 59, 59)
    n2 = g.post_lines(duck, 0.002, g.AFTER_RECOVERY)
    assert g.post_lines(duck, 0.002, g.AFTER_RECOVERY) == 0  # nothing posted twice
    total = sum(c.lines for c in g.plan(0.002))
    assert n1 + n2 == total == duck.fetch_all("SELECT count(DISTINCT sales_line_id) FROM pos.sales_line")[0][0]
    assert duck.fetch_all(late_sql)[0][0] == round(212_400 * 0.002)
    # every offline store's closing line ties with the last watermark of 2026-11-27
    tied = duck.fetch_all(
        "SELECT count(*) FROM pos.sales_line WHERE sale_ts = TIMESTAMP '2026-11-27 21:59:59' AND posted_ts > TIMESTAMP '2026-11-28'"
    )[0][0]
    assert tied == 19
    typ = duck.fetch_all("SELECT data_type FROM information_schema.columns WHERE table_name = 'sales_line' AND column_name = 'net_sales'")
    assert typ[0][0] == "DECIMAL(18,2)"
