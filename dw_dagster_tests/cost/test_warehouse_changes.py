"""Warehouse setting changes drafted from measured symptoms, approved, applied through the repair machinery
and verified over the next period's metered credits.

fakesnow cannot run ``ALTER WAREHOUSE`` (it does not parse it) and answers ``SHOW WAREHOUSES`` with one
fixed row. The statements Snowflake would run are tested here as generated text; the flow runs on
fakesnow with dw_dagster's emulation of the two statements over a seeded settings table
(:mod:`dw_dagster_dev.fakes.fakesnow_server`), which changes the settings and nothing else: the
metering after a change is seeded by the test from the same workload run with the new setting.
"""

import datetime as dt
import re

import dagster as dg
import pytest

from dw_dagster.core.domains import Domains
from dw_dagster.core.models import utcnow
from dw_dagster.cost.models import CostError, Period
from dw_dagster.cost.warehouse import Rules, Settings, Symptoms, alter_warehouse, draft_warehouse_changes, findings
from dw_dagster.databases.sql import UnsafeIdentifierError
from dw_dagster_dev import cost_workload as cw

SCHEMA = "SNOWFLAKE.AU_WH"
OWNER = "priya.raman@grocer.example"
SINCE, DAYS = dt.date(2026, 10, 1), 14
PERIOD = Period(since=SINCE, until=SINCE + dt.timedelta(days=DAYS))
# Snowflake's grammar for the statements drafted (docs: ALTER WAREHOUSE ... SET objectProperties)
ALTER = re.compile(r'^ALTER WAREHOUSE ("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*) SET '
                   r"([A-Z_]+ = (?:\d+|'[A-Z0-9_-]+'))(, [A-Z_]+ = (?:\d+|'[A-Z0-9_-]+'))*$")


def test_statements_snowflake_would_run_are_built_and_quoted():
    """Tested on the generated SQL: fakesnow cannot run ALTER WAREHOUSE."""
    assert alter_warehouse("LOAD_WH", {"AUTO_SUSPEND": 60}) == "ALTER WAREHOUSE LOAD_WH SET AUTO_SUSPEND = 60"
    assert alter_warehouse("load wh", {"WAREHOUSE_SIZE": "XSMALL", "MAX_CLUSTER_COUNT": 2}) == \
        "ALTER WAREHOUSE \"load wh\" SET WAREHOUSE_SIZE = 'XSMALL', MAX_CLUSTER_COUNT = 2"
    hostile = alter_warehouse('wh"; DROP DATABASE x; --', {"AUTO_SUSPEND": 60})
    assert hostile == 'ALTER WAREHOUSE "wh""; DROP DATABASE x; --" SET AUTO_SUSPEND = 60'
    for text in ("ALTER WAREHOUSE LOAD_WH SET AUTO_SUSPEND = 60", hostile,
                 alter_warehouse("BI_WH", {"MIN_CLUSTER_COUNT": 1, "MAX_CLUSTER_COUNT": 3, "SCALING_POLICY": "ECONOMY"})):
        assert ALTER.fullmatch(text), text
    for bad in ({"AUTO_SUSPEND": "60; DROP"}, {"AUTO_SUSPEND": True}, {"WAREHOUSE_SIZE": "HUGE"}, {"COMMENT": "x"}, {}):
        with pytest.raises(CostError):
            alter_warehouse("LOAD_WH", bad)
    with pytest.raises(UnsafeIdentifierError):
        alter_warehouse("wh`x", {"AUTO_SUSPEND": 60})


def _sym(**kw):
    base = dict(warehouse="WH", credits=100.0, idle=0.0, idle_hours=0, hours=100, queries=1000, exec_ms=3.6e7,
                overload_ms=0.0, queued_queries=0, remote_spill=0.0, spilling_queries=0, small_queries=100,
                max_exec_ms=900_000.0, size="Small")
    return Symptoms(**{**base, **kw})


def _settings(**kw):
    return Settings(**{**dict(name="WH", size="Small", auto_suspend=600, min_cluster_count=1, max_cluster_count=1,
                              scaling_policy="STANDARD"), **kw})


def test_rules_fire_on_measured_symptoms():
    rules = Rules()
    assert findings(_sym(), _settings(), rules, PERIOD) == []  # a healthy warehouse: nothing drafted
    (idle,) = findings(_sym(idle=40.0, idle_hours=30), _settings(auto_suspend=600), rules, PERIOD)
    assert idle.rule == "idle" and idle.set == {"AUTO_SUSPEND": 60} and idle.rollback == {"AUTO_SUSPEND": 600}
    assert idle.saving_expected == pytest.approx(max(40.0, 100.0 - 2 * 10) * (1 - 60 / 600))
    assert findings(_sym(idle=40.0), _settings(auto_suspend=60), rules, PERIOD) == []  # already at the target
    queued = dict(queued_queries=200, overload_ms=3.6e7 * 2)
    (q,) = findings(_sym(**queued), _settings(), rules, PERIOD)
    assert q.set == {"MAX_CLUSTER_COUNT": 2} and q.saving_expected < 0
    (q2,) = findings(_sym(**queued), _settings(max_cluster_count=4), rules, PERIOD)
    assert q2.set == {"WAREHOUSE_SIZE": "MEDIUM"} and q2.rollback == {"WAREHOUSE_SIZE": "SMALL"}
    (sp,) = findings(_sym(spilling_queries=3, remote_spill=2 ** 33), _settings(size="Large"), rules, PERIOD)
    assert sp.rule == "spilling" and sp.set == {"WAREHOUSE_SIZE": "XLARGE"}
    (small,) = findings(_sym(small_queries=990, max_exec_ms=4000.0, idle=10.0), _settings(size="Large"), rules, PERIOD)
    assert small.rule == "oversized" and small.set == {"WAREHOUSE_SIZE": "MEDIUM"}
    assert small.saving_expected == pytest.approx(45.0)
    assert findings(_sym(small_queries=990, max_exec_ms=4000.0), _settings(size="Small"), rules, PERIOD) == []


@pytest.fixture(scope="module")
def fake_url(fakesnow_server):
    return (f"snowflake://fake:snow@fakesnow/SNOWFLAKE?host=127.0.0.1&port={fakesnow_server['port']}&protocol=http"
            "&login_timeout=20&network_timeout=20")


@pytest.fixture
def seeded(fake_url, tmp_path):
    """A fresh month of the workload in SNOWFLAKE.AU_WH and the warehouses' settings as seeded."""
    from dw_dagster_dev.cost_demo import EMULATOR_SCHEMA, schema_url
    from dw_dagster.databases import database_from_url

    wl = cw.generate(SINCE, DAYS, bi_per_hour=4)
    database_from_url(fake_url.replace("/SNOWFLAKE?", "/?")).execute("CREATE DATABASE IF NOT EXISTS SNOWFLAKE")
    for schema, tables in ((SCHEMA, tuple(cw.TABLES)), (EMULATOR_SCHEMA, ("WAREHOUSES",))):
        database_from_url(fake_url).execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        cw.load_parquet(database_from_url(schema_url(fake_url, schema.split(".")[1])), schema, wl, tmp_path, tables)
    return wl


def _domains(warehouses=("TRANSFORM_WH", "LOAD_WH", "BI_WH"), identity="unverified"):
    return Domains.model_validate({"domains": [{"name": "data_platform", "warehouses": list(warehouses),
                                                "approvers": [OWNER], "identity": identity}]})


def _cost(url):
    from dw_dagster.cost.sources import CostResource

    return CostResource(url=url, account_usage=SCHEMA)


def test_drafts_from_the_seeded_period_for_the_warehouse_owner(fake_url, seeded):
    from dw_dagster.databases import database_from_url

    cost = _cost(fake_url)
    drafts, notes = draft_warehouse_changes(cost.source(None), PERIOD, _domains(("LOAD_WH",)))
    assert [(d.steps[0].spec["warehouse"], d.steps[0].spec["rule"]) for d in drafts] == [("LOAD_WH", "idle")]
    assert any(n.startswith("TRANSFORM_WH: spilling would be drafted, but no domain lists") for n in notes)
    cs = drafts[0]
    step = cs.steps[0]
    assert cs.domain == "data_platform" and cs.approvers == [OWNER] and cs.change_classes == ["warehouse_setting"]
    assert step.sql == ["ALTER WAREHOUSE LOAD_WH SET AUTO_SUSPEND = 60"]
    assert step.rollback_sql == ["ALTER WAREHOUSE LOAD_WH SET AUTO_SUSPEND = 1800"]  # what SHOW WAREHOUSES reports now
    assert step.spec["saving_expected"] > 0 and step.spec["symptoms"]["idle_hours"] > 0
    assert cs.verify_checks == [["warehouse", "LOAD_WH", "warehouse_saving"]] and cs.target_asset == ["warehouse", "LOAD_WH"]
    cs.verify_version()
    (row,) = database_from_url(fake_url).fetch_all(step.spec["evidence_sql"])  # the owner can re-run the evidence
    assert row[0] == "LOAD_WH" and float(row[2]) == pytest.approx(step.spec["symptoms"]["idle"])
    everyone, _ = draft_warehouse_changes(cost.source(None), PERIOD, _domains())
    assert ("TRANSFORM_WH", "spilling") in {(d.steps[0].spec["warehouse"], d.steps[0].spec["rule"]) for d in everyone}


def _flow(fake_url, tmp_path, *, before_approval=None, after_setting=None):
    """Propose the LOAD_WH idle change, approve it through the approval job, tick the warehouse sensor:
    the step, then (the clock moved past the measured week, whose metering is seeded) verify and receipt."""
    from dw_dagster.approval.job import approve_in_process
    from dw_dagster.core import records
    from dw_dagster.definitions import build_warehouse_change_definitions
    from dw_dagster.proposals.change_sets import propose
    from dw_dagster.changes.steps import step_results
    from dw_dagster_dev.cost_demo import schema_url
    from dw_dagster.testing.local_daemon import LocalSensorDaemon
    from dw_dagster.databases import database_from_url

    cost = _cost(fake_url)
    domains = _domains()
    (draft,) = [d for d in draft_warehouse_changes(cost.source(None), PERIOD, domains)[0]
                if d.steps[0].spec["rule"] == "idle"]
    out: dict = {}
    with dg.instance_for_test() as instance:
        cs, _ = propose(instance, draft)
        if before_approval:
            before_approval()
        ok, msg = approve_in_process(instance, cs.id, approver=OWNER, domains=domains, comment="reviewed")
        assert ok, msg
        clock = {"now": None}
        defs = build_warehouse_change_definitions(["TRANSFORM_WH", "LOAD_WH", "BI_WH"], cost, domains=domains,
                                                  clock=lambda: clock["now"] or utcnow())
        daemon = LocalSensorDaemon(defs, instance, log_level="ERROR")
        first = daemon.tick("dw_warehouse_remediation_sensor")
        out["first"] = first
        results = step_results(instance, cs)
        if results and not results[0].get("refused"):
            res = results[0]
            out["waiting"] = daemon.tick("dw_warehouse_remediation_sensor").skip_reason
            since = dt.date.fromisoformat(res["measure"]["since"])
            suspend = after_setting if after_setting is not None else 60
            week = cw.generate(since, 7, bi_per_hour=4, seed=31, warehouses=[
                w if w.name != "LOAD_WH" else cw.Warehouse("LOAD_WH", w.size, suspend) for w in cw.DEFAULT_WAREHOUSES])
            cw.load_parquet(database_from_url(schema_url(fake_url, "AU_WH")), SCHEMA, week, tmp_path / "week",
                            tuple(cw.TABLES), append=True)
            clock["now"] = dt.datetime.fromisoformat(res["verify_not_before"]) + dt.timedelta(seconds=1)
        for _ in range(3):
            tick = daemon.tick("dw_warehouse_remediation_sensor")
            if not tick.run_ids:
                break
        out["receipts"] = [r for r in records.receipts(instance) if r.change_set_id == cs.id]
        out["results"] = step_results(instance, cs)
        out["cs"] = cs
    return out


def test_approved_applied_and_verified_by_the_next_weeks_credits(fake_url, seeded, tmp_path):
    from dw_dagster.cost.warehouse import show_warehouse
    from dw_dagster.databases import database_from_url
    from dw_dagster.receipts.job import receipt_markdown

    out = _flow(fake_url, tmp_path)
    (res,) = out["results"]
    assert res["before"] == {"AUTO_SUSPEND": 1800} and res["after"] == {"AUTO_SUSPEND": 60}
    assert res["statements"] == ["ALTER WAREHOUSE LOAD_WH SET AUTO_SUSPEND = 60"]
    assert "waits until" in out["waiting"] and res["measure"]["since"] in out["waiting"]
    db = database_from_url(fake_url)
    assert show_warehouse(db, "LOAD_WH").auto_suspend == 60
    (rc,) = out["receipts"]
    check = next(o for o in rc.checks if o.check_name == "warehouse_saving")
    assert rc.verified and rc.outcome == "applied" and check.passed
    assert check.metadata["dw/saving_measured"] > 0 and check.metadata["dw/saving_expected"] > 0
    md = receipt_markdown(rc)
    assert "**Saving** (warehouse/LOAD_WH" in md and ": saved: measured" in md and "**Repair cost**" in md
    assert rc.evidence_summary["repair_cost"]["runs"] == 2
    db.execute(out["cs"].steps[0].rollback_sql[0])  # the rollback puts back what SHOW WAREHOUSES reported
    assert show_warehouse(db, "LOAD_WH").auto_suspend == 1800


def test_no_saving_is_said_and_not_verified(fake_url, seeded, tmp_path):
    """The week after the change metered as before (the workload kept its keep-alive): the receipt says
    it was not saved."""
    out = _flow(fake_url, tmp_path, after_setting=1800)
    (rc,) = out["receipts"]
    check = next(o for o in rc.checks if o.check_name == "warehouse_saving")
    assert not check.passed and not rc.verified and check.metadata["dw/saving_measured"] <= 0
    from dw_dagster.receipts.job import receipt_markdown

    assert "NOT saved" in receipt_markdown(rc)


def test_a_warehouse_changed_since_the_draft_is_refused(fake_url, seeded, tmp_path):
    """Someone set AUTO_SUSPEND by hand after the draft: its rollback would restore the wrong value, so the
    step refuses and changes nothing; the receipt says the repair failed at that stage."""
    from dw_dagster.cost.warehouse import alter_warehouse, show_warehouse
    from dw_dagster.databases import database_from_url

    db = database_from_url(fake_url)
    out = _flow(fake_url, tmp_path, before_approval=lambda: db.execute(alter_warehouse("LOAD_WH", {"AUTO_SUSPEND": 300})))
    (res,) = out["results"]
    assert res["refused"] and "changed since the draft" in res["reason"]
    assert show_warehouse(db, "LOAD_WH").auto_suspend == 300
    (rc,) = out["receipts"]
    assert rc.outcome.startswith("failed at warehouse_setting-1") and not rc.verified
