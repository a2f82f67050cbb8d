"""The dbt incremental fix (proposals/dbt_incremental.py): the model diff, its bounded dbt_window step, its refusals.

A real model file in a git-shaped working copy is rewritten to read by the arrival column with the
lookback the diagnosis measured, plus the bounded-rebuild clause; the diff applies to the file and
the rewritten model, rendered as dbt renders it, re-reads on DuckDB exactly the late row the old
filter skipped. The step rebuilds contiguous ranges of the late days with ``--vars``, never
``--full-refresh``; strategies that append are refused (a re-read would duplicate rows).

Cases from the field: an incremental model's ``max(updated_at)`` filter missing rows that arrive
late (https://github.com/fivetran/dbt_jira/issues/117); ``append`` duplicating re-read rows is why a
window rebuild needs a merging strategy (https://github.com/dlt-hub/dlt/issues/2269 shows the same
high-watermark gap on the loading side).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess

import duckdb
import jinja2
import pytest

from dw_dagster.pipelines.dbt_incremental import DbtIncrementalModel, read_incremental_filter
from dw_dagster.proposals.dbt_incremental import (
    DBT_WINDOW,
    propose_dbt_incremental_fix,
    rewrite_incremental_model,
    window_ranges,
    window_vars,
)
from dw_dagster.proposals.watermark import ProposalError
from dw_dagster_tests.proposals.world import NOW, diagnosis, domain, git_repo, incident, late_rows

MODEL_FILE = "models/orders_inc.sql"
MODEL_SQL = """\
{{ config(materialized='incremental', unique_key='order_id') }}
select order_id, amount, updated_at, ingested_at from {{ source('shop', 'raw_orders') }}
{% if is_incremental() %}
where updated_at > (select max(updated_at) from {{ this }})
{% endif %}
"""
DAYS = ["2026-11-03", "2026-11-04", "2026-11-06"]


def _model(**kw) -> DbtIncrementalModel:
    args = dict(unique_id="model.shop.orders_inc", name="orders_inc", relation="main.orders_inc", file=MODEL_FILE,
                unique_key="order_id", incremental_strategy=None, upstream=("main.raw_orders",))
    return DbtIncrementalModel(**{**args, **kw})


@pytest.fixture
def repo(tmp_path):
    return git_repo(tmp_path / "repo", {f"dbt_project/{MODEL_FILE}": MODEL_SQL})


def _propose(repo, *, days=DAYS, lookback=48, model=None, key_column=None, arrival_in_model=True, cap=7, text=None):
    if text is not None:
        (repo / "dbt_project" / MODEL_FILE).write_text(text)
    inc = incident(("dbt", "orders_inc"))
    return propose_dbt_incremental_fix(
        incident=inc, diagnosis=diagnosis(inc),
        finding=late_rows(list(days), watermark="updated_at", arrival="ingested_at", lookback=lookback, rows=12),
        domain=domain(cap), repo_root=repo, project_dir=repo / "dbt_project", model=model or _model(), dialect="duckdb",
        key_column=key_column, arrival_in_model=arrival_in_model, target_resource_key="warehouse",
        target_table="main.orders_inc", source_table="main.raw_orders", rebuild_assets=[["dbt", "orders_daily"]],
        verify_checks=[["dbt", "orders_inc", "reconcile"]], now=NOW)


def test_the_model_diff_reads_by_arrival_and_rebuilds_bounded_ranges(repo):
    cs = _propose(repo)
    cs.verify_version()
    (step,) = cs.steps
    assert step.kind == DBT_WINDOW and step.change_class == "rerun_window" and step.resource_key == "warehouse"
    assert step.spec["ranges"] == [["2026-11-03 00:00:00", "2026-11-05 00:00:00"], ["2026-11-06 00:00:00", "2026-11-07 00:00:00"]]
    assert step.sql == [
        "dbt build --select orders_inc --vars '{\"dw_window_start\": \"2026-11-03 00:00:00\", \"dw_window_end\": \"2026-11-05 00:00:00\"}'",
        "dbt build --select orders_inc --vars '{\"dw_window_start\": \"2026-11-06 00:00:00\", \"dw_window_end\": \"2026-11-07 00:00:00\"}'"]
    assert not any("--full-refresh" in s for s in step.sql)
    assert cs.window == [] and cs.undo_plan.window == DAYS and cs.undo_plan.partition_column == "updated_at"
    assert "by ingested_at with a 48 h lookback (was updated_at > max)" in cs.summary
    assert cs.diff.startswith(f"diff --git a/dbt_project/{MODEL_FILE} b/dbt_project/{MODEL_FILE}\n")
    subprocess.run(["git", "apply", "-p1", "-"], cwd=repo, input=cs.diff, text=True, check=True, capture_output=True)
    after = (repo / "dbt_project" / MODEL_FILE).read_text()
    f = read_incremental_filter(after, "duckdb")
    assert (f.watermark_column, f.max_column, f.lookback_hours, f.window_column) == ("ingested_at", "ingested_at", 48.0,
                                                                                     "updated_at")
    assert cs.files[0].after_sha256 and after.startswith(MODEL_SQL.split("{% if")[0])
    assert _propose(repo.parent / "repo", text=MODEL_SQL).version == cs.version  # the same finding again: the same version


def _render(text: str, window: tuple[str, str] | None) -> str:
    vars_ = {"dw_window_start": window[0], "dw_window_end": window[1]} if window else {}
    return jinja2.Environment().from_string(text).render(
        config=lambda **_: "", source=lambda s, t: t, this="orders_inc", is_incremental=lambda: True,
        var=lambda name, default=None: vars_.get(name, default))


def test_the_rewritten_model_re_reads_the_late_row_the_old_filter_skipped(repo):
    cs = _propose(repo)
    subprocess.run(["git", "apply", "-p1", "-"], cwd=repo, input=cs.diff, text=True, check=True, capture_output=True)
    after = (repo / "dbt_project" / MODEL_FILE).read_text()
    db = duckdb.connect()
    db.execute("CREATE TABLE raw_orders AS SELECT * FROM (VALUES "
               "(1, 10.0, TIMESTAMP '2026-11-03 08:00', TIMESTAMP '2026-11-03 08:05'), "
               "(2, 20.0, TIMESTAMP '2026-11-05 09:00', TIMESTAMP '2026-11-05 09:01'), "
               "(3, 30.0, TIMESTAMP '2026-11-03 12:00', TIMESTAMP '2026-11-05 23:00')) "  # late: landed after row 2
               "t(order_id, amount, updated_at, ingested_at)")
    db.execute("CREATE TABLE orders_inc AS SELECT * FROM raw_orders WHERE order_id IN (1, 2)")
    ids = lambda sql: sorted(r[0] for r in db.execute(sql).fetchall())  # noqa: E731
    assert ids(_render(MODEL_SQL, None)) == []  # the old filter: row 3 is below max(updated_at), never read
    assert ids(_render(after, None)) == [2, 3]  # by arrival with the lookback
    assert ids(_render(after, ("2026-11-03 00:00:00", "2026-11-05 00:00:00"))) == [1, 2, 3]  # plus the window


def test_a_model_without_unique_key_gets_the_key_and_an_existing_lookback_is_kept(repo):
    text = MODEL_SQL.replace(", unique_key='order_id'", "").replace("max(updated_at) from", "max(updated_at) - interval '72' hour from")
    cs = _propose(repo, model=_model(unique_key=None), key_column="order_id", lookback=24, arrival_in_model=False,
                  text=text)
    assert "+{{ config(unique_key='order_id', materialized='incremental') }}" in cs.diff
    assert "by updated_at with a 72 h lookback (was updated_at > max - 72 h)" in cs.summary


@pytest.mark.parametrize("change,message", [
    (dict(days=[]), "the finding names no day to rebuild"),
    (dict(days=[f"2026-11-{d:02d}" for d in range(1, 10)]), "window of 9 days exceeds domain 'pos' cap of 7"),
    (dict(model=_model(incremental_strategy="append")), "uses incremental_strategy 'append', which does not merge"),
    (dict(model=_model(incremental_strategy="microbatch")), "'microbatch', which does not merge on unique_key"),
    (dict(model=_model(unique_key=None)), "has no unique_key and no key is configured to add"),
    (dict(model=_model(file="models/gone.sql")), "model file not found: .*gone.sql"),
    (dict(text="select 1"), r"0 \{% if is_incremental\(\) %\} blocks"),
    (dict(lookback=1.5), "lookback 1.5 h is not a whole number of hours"),
], ids=["no_days", "over_cap", "append", "microbatch", "no_key", "missing_file", "no_filter", "fractional_lookback"])
def test_a_fix_that_cannot_be_proposed_is_refused(repo, change, message):
    with pytest.raises(ProposalError, match=message):
        _propose(repo, **change)


def test_a_model_that_already_re_reads_another_column_is_refused(repo):
    other = rewrite_incremental_model(MODEL_SQL, "duckdb", column="ingested_at", lookback_hours=0, window_column="ingested_at")
    with pytest.raises(ProposalError, match="already re-reads windows of ingested_at; the late rows are measured by day "
                                            "of updated_at"):
        _propose(repo, text=other)


def test_window_ranges_join_consecutive_days():
    d = dt.datetime
    assert window_ranges(["2026-11-04", "2026-11-03", "2026-11-03", "2026-12-31", "2027-01-01", "2026-11-10"]) == [
        (d(2026, 11, 3), d(2026, 11, 5)), (d(2026, 11, 10), d(2026, 11, 11)), (d(2026, 12, 31), d(2027, 1, 2))]
    assert window_ranges([]) == []
    assert json.loads(window_vars(d(2026, 11, 3), d(2026, 11, 5))) == {"dw_window_start": "2026-11-03 00:00:00",
                                                                       "dw_window_end": "2026-11-05 00:00:00"}
