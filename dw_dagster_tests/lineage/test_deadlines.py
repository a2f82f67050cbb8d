"""Issue 31 item 3: ``meta.dw.needed_by`` on an exposure, and the blast radius ranked by the deadline at risk.

The failure kind — a dashboard read before its data was repaired, noticed only at the morning
meeting: https://github.com/dagster-io/dagster/issues/18441 (a downstream read ran although its
upstream partition was missing). The manifest is a real dbt manifest shape (nodes, sources,
exposures with ``meta`` and ``config.meta``) walked by the same blast radius the diagnosis uses.
"""

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from dw_dagster.lineage import blast_radius, manifest_graph
from dw_dagster.lineage.deadlines import NeededByError, parse_needed_by, rank_by_deadline

CHI = ZoneInfo("America/Chicago")


def _manifest():
    src = "source.shop.pos.sales_line"
    model = "model.shop.fct_store_sales_daily"

    def exposure(name, label, meta=None, config_meta=None):
        return {"unique_id": f"exposure.shop.{name}", "name": name, "label": label, "type": "dashboard",
                "resource_type": "exposure", "package_name": "shop", "owner": {"name": "Priya", "email": "p@x"},
                "depends_on": {"nodes": [model]}, "meta": meta or {}, "config": {"meta": config_meta or {}},
                "fqn": ["shop", name]}

    return {
        "metadata": {"dbt_schema_version": "https://schemas.getdbt.com/dbt/manifest/v12.json"},
        "nodes": {model: {"unique_id": model, "name": "fct_store_sales_daily", "resource_type": "model",
                          "package_name": "shop", "depends_on": {"nodes": [src]}, "fqn": ["shop", "fct_store_sales_daily"],
                          "config": {"materialized": "table"}}},
        "sources": {src: {"unique_id": src, "name": "sales_line", "source_name": "pos", "resource_type": "source",
                          "package_name": "shop", "fqn": ["shop", "pos", "sales_line"]}},
        "exposures": {
            "exposure.shop.store_pnl": exposure("store_pnl", "Store P&L", config_meta={"dw": {
                "needed_by": "08:00 America/Chicago", "bi": {"tool": "tableau", "workbook": "store-pnl"}}}),
            "exposure.shop.weekly_review": exposure("weekly_review", "Weekly review", meta={"dw": {
                "needed_by": "30 6 * * 1 America/Chicago"}}),
            "exposure.shop.ad_hoc": exposure("ad_hoc", "Ad hoc"),
        },
        "parent_map": {}, "child_map": {},
    }


def test_the_blast_radius_ranks_its_dashboards_by_the_deadline_at_risk():
    graph = manifest_graph(_manifest())
    br = blast_radius(graph, ["source.shop.pos.sales_line"], {})
    by_name = {e.name: e for e in br.exposures}
    assert by_name["store_pnl"].needed_by == "08:00 America/Chicago" and by_name["store_pnl"].bi["tool"] == "tableau"
    assert by_name["weekly_review"].needed_by.startswith("30 6") and by_name["ad_hoc"].needed_by is None
    now = dt.datetime(2026, 12, 7, 5, 40, tzinfo=CHI)  # a Monday, 05:40 in Chicago
    ranked = rank_by_deadline(br.exposures, expected_end=dt.datetime(2026, 12, 7, 6, 50, tzinfo=CHI), now=now)
    assert [r.exposure for r in ranked] == ["weekly_review", "store_pnl"]  # 06:30 first, then 08:00; ad hoc has none
    weekly, pnl = ranked
    assert weekly.at_risk and weekly.minutes_to_spare == -20.0
    assert not pnl.at_risk and pnl.minutes_to_spare == 70.0
    assert pnl.words() == "the Store P&L is needed at 08:00 CST; the repair's expected end is 06:50 CST (70 min to spare)"
    assert weekly.words().endswith("(20 min LATE)")


def test_needed_by_forms_and_mistakes():
    after = dt.datetime(2026, 3, 7, 15, 0, tzinfo=dt.timezone.utc)  # the day before US DST starts
    assert parse_needed_by("08:00 America/Chicago", after=after) == dt.datetime(2026, 3, 8, 8, 0, tzinfo=CHI)
    assert parse_needed_by("08:00 America/Chicago", after=after).utcoffset() == dt.timedelta(hours=-5)  # CDT now
    assert parse_needed_by("7:15", after=after) == dt.datetime(2026, 3, 8, 7, 15, tzinfo=dt.timezone.utc)
    assert parse_needed_by("0 9 * * 1-5", after=after).weekday() == 0  # Saturday → next Monday
    for bad, words in [("8am", "neither 'HH:MM Zone'"), ("08:00 Mars/Base", "is not a time zone"),
                       ("0 25 * * * UTC", "not a valid cron"), ("24:00 UTC", "neither")]:
        with pytest.raises(NeededByError, match=words):
            parse_needed_by(bad, after=after)


def test_the_review_page_shows_each_deadline_of_the_blast_radius():
    """The approval's review page names the deadline of each exposure the repair reaches."""
    from dw_dagster.approval.server import _blast_html
    from dw_dagster.core.models import BlastRadius, Diagnosis, ExposureRef, utcnow

    br = BlastRadius(root="x", exposures=[
        ExposureRef(unique_id="exposure.shop.store_pnl", name="store_pnl", label="Store P&L", type="dashboard", depth=2,
                    needed_by="08:00 America/Chicago"),
        ExposureRef(unique_id="exposure.shop.bad", name="bad", depth=2, needed_by="8am"),
        ExposureRef(unique_id="exposure.shop.adhoc", name="adhoc", depth=2)])
    diag = Diagnosis(id="dg", incident_id="i", asset_key=["a"], created_at=utcnow(), causes=[], blast_radius=br,
                     gap_rows=0, unexplained_rows=0)
    html = _blast_html(diag, None)
    assert "Store P&amp;L (dashboard) — <strong>needed by 08:00 America/Chicago</strong> (next: " in html
    assert ":00 CST)" in html or ":00 CDT)" in html
    assert "needed by 8am</strong> (needed_by &#x27;8am&#x27; is neither" in html
    assert "adhoc</li>" in html


def test_the_approval_request_and_pages_name_the_deadline():
    """Slack's approval request and the pages label an exposure with its needed_by."""
    from dw_dagster.core.models import ExposureRef
    from dw_dagster.integrations.paging import exposure_label

    x = ExposureRef(unique_id="exposure.shop.store_pnl", name="store_pnl", label="Store P&L", type="dashboard", depth=2,
                    owner_name="Priya Raman", owner_email="priya@x", needed_by="08:00 America/Chicago")
    assert exposure_label(x) == "Store P&L (dashboard, owner Priya Raman <priya@x>, needed by 08:00 America/Chicago)"
    assert exposure_label(x.model_copy(update={"needed_by": None})) == "Store P&L (dashboard, owner Priya Raman <priya@x>)"
