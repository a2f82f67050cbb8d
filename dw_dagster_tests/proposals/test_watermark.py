"""The watermark fix (proposals/watermark.py) on a real pipeline file in a git working copy, and the dbt test it writes.

The pipeline file is the store-sales example's (``store_sales_line.yaml``): the fix sets its
``watermark_column`` to the arrival column and its ``lookback_hours`` to the lookback the diagnosis
measured, keeping every comment; it adds a singular dbt test that fails when a model's daily counts
differ from the landed rows (run here on DuckDB, rendered as dbt renders it). The diff applies
with ``git apply -p1`` (:func:`apply_change_set`).

Cases from the field: a row committed after a load read past its timestamp is never read again by
a load by high-watermark (https://github.com/dlt-hub/dlt/issues/2269); incremental models given a
lookback window after late records went missing (https://github.com/fivetran/dbt_jira/issues/118); a patch that no longer applies because the file changed since it was made is refused, never
half-applied.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from pathlib import Path

import dagster as dg
import duckdb
import jinja2
import pytest

from dw_dagster.core.models import UndoPlan
from dw_dagster.proposals.watermark import (
    DbtCountTest,
    ProposalError,
    apply_change_set,
    change_set_markdown,
    propose_watermark_fix,
    set_yaml_scalar,
    unified_diff,
)
from dw_dagster_tests.proposals.world import NOW, OWNER, diagnosis, domain, git_repo, incident, late_rows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dw_dagster_examples" / "store_sales" / "pipelines" / "store_sales_line.yaml"
PIPELINE = "pipelines/store_sales_line.yaml"
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01")
TEST = DbtCountTest(model="daily_sales", count_column="line_count", source_name="pos", source_table="sales_line",
                    group={"store_id": "store_id", "sale_date": "cast(sale_ts as date)"})


@pytest.fixture
def repo(tmp_path):
    return git_repo(tmp_path / "pipelines-repo", {PIPELINE: EXAMPLE.read_text()})


def _propose(repo, window=("2026-11-03", "2026-11-04"), now=NOW, **kw):
    inc = incident()
    args = dict(incident=inc, diagnosis=diagnosis(inc), finding=late_rows(list(window)), domain=domain(),
                pipeline_root=repo, pipeline_file=PIPELINE, partitions_def=DAILY,
                rebuild_assets=[["dbt", "daily_sales"]], verify_checks=[["pos", "sales_line", "reconcile"]],
                dbt_test=TEST, undo=UndoPlan(resource_key="warehouse", table="pos.sales_line", partition_column="sale_ts",
                                             window=[]), now=now)
    return propose_watermark_fix(**{**args, **kw})


def test_the_fix_reads_by_arrival_with_the_lookback_and_applies_to_the_repository(repo):
    cs = _propose(repo)
    cs.verify_version()
    assert cs.window == ["2026-11-03", "2026-11-04"] and cs.approvers == [OWNER]
    assert cs.expires_at == NOW + dt.timedelta(hours=24) and cs.new_tests == [TEST.path]
    assert cs.undo_plan.window == cs.window and cs.change_classes == ["pipeline_code", "rerun_window", "rebuild_models"]
    assert "Read pos/sales_line by posted_ts with a 48 h lookback (was sale_ts with a strict '>')" in cs.summary
    assert ("-watermark_column: sale_ts\n-lookback_hours: 0\n+watermark_column: posted_ts\n+lookback_hours: 48\n"
            in cs.diff)
    assert f"diff --git a/{TEST.path} b/{TEST.path}\nnew file mode 100644\n" in cs.diff
    assert [f.path for f in cs.files] == [TEST.path, PIPELINE] and cs.files[0].before_sha256 is None
    commit = apply_change_set(cs, repo, OWNER)
    after = (repo / PIPELINE).read_text()
    assert "watermark_column: posted_ts\nlookback_hours: 48\n" in after
    assert after.replace("posted_ts\nlookback_hours: 48", "sale_ts\nlookback_hours: 0", 1) == EXAMPLE.read_text()
    assert "# When a row reached the source database" in after  # comments kept
    log = subprocess.run(["git", "log", "-1", "--format=%H %s"], cwd=repo, capture_output=True, text=True).stdout
    assert log.startswith(commit) and f"Apply dw-dagster change set {cs.id}" in log
    assert (repo / TEST.path).read_text() == TEST.sql(cs.id)


def test_proposing_again_is_the_same_proposal(repo):
    first, again = _propose(repo), _propose(repo)
    assert again.version == first.version
    later = _propose(repo, now=NOW + dt.timedelta(hours=3))
    assert (later.id, later.content_key()) == (first.id, first.content_key()) and later.version != first.version
    (repo / PIPELINE).write_text((repo / PIPELINE).read_text().replace("merge_key: sales_line_id", "merge_key: line_id"))
    changed = _propose(repo)  # another file: another diff, another change set
    assert changed.diff != first.diff and changed.id != first.id and changed.content_key() != first.content_key()


def test_a_dbt_test_already_in_the_repository_is_not_added_again(repo):
    (repo / TEST.path).parent.mkdir(parents=True)
    (repo / TEST.path).write_text("-- already there\n")
    cs = _propose(repo)
    assert cs.new_tests == [] and TEST.path not in cs.diff and "add 1 dbt test" not in cs.summary
    assert cs.change_classes == ["pipeline_code", "rerun_window", "rebuild_models"]


def test_partitions_that_cannot_run_now_are_named_with_their_rows(repo):
    per = [{"partition": "2026-10-31", "explained_rows": 5}, {"partition": "2026-11-03", "explained_rows": 100},
           {"partition": "2099-01-01", "explained_rows": 7}]
    inc = incident()
    cs = _propose(repo, window=(), finding=late_rows(["2026-10-31", "2026-11-03", "2099-01-01"], rows=112, per_partition=per),
                  incident=inc, diagnosis=diagnosis(inc))
    assert cs.window == ["2026-11-03"] and cs.expected_recovered_rows == 100
    assert [(n.partition, n.rows) for n in cs.outside_partitions] == [("2026-10-31", 5)]
    assert cs.deferred_partitions == ["2099-01-01"] and cs.deferred_details[0].rows == 7
    assert "not run: 5 row(s) in 1 partition(s) outside" in cs.summary and "7 row(s) in 1 deferred" in cs.summary
    md = change_set_markdown(cs)
    assert "- **Outside the asset's partitions, not run**: 2026-10-31 (5 rows)" in md and "```diff" in md


@pytest.mark.parametrize("change,message", [
    (dict(finding=late_rows([f"2026-11-{d:02d}" for d in range(1, 10)])), "window of 9 partitions exceeds domain 'pos' cap of 7"),
    (dict(finding=late_rows(["2099-01-01"])), re.escape("no partition to rerun now: 2099-01-01 (0 rows): does not exist yet, "
                                                        "until 2099-01-02T00:00:00+00:00")),
    (dict(finding=late_rows(["2026-10-01"])), re.escape("2026-10-01 (0 rows): before the first partition")),
    (dict(pipeline_file="pipelines/missing.yaml"), "pipeline file not found: .*missing.yaml"),
    (dict(watermark_key="high_watermark"), "no top-level 'high_watermark:' line to change"),
], ids=["over_cap", "future_only", "before_start", "missing_file", "missing_key"])
def test_a_fix_that_cannot_be_proposed_as_asked_is_refused(repo, change, message):
    with pytest.raises(ProposalError, match=message):
        _propose(repo, **change)


def test_a_diff_that_no_longer_applies_is_refused_and_nothing_changes(repo, tmp_path):
    cs = _propose(repo)
    (repo / PIPELINE).write_text((repo / PIPELINE).read_text().replace("lookback_hours: 0", "lookback_hours: 6"))
    before = (repo / PIPELINE).read_text()
    with pytest.raises(ProposalError, match=f"change set {cs.id} does not apply to"):
        apply_change_set(cs, repo, OWNER)
    assert (repo / PIPELINE).read_text() == before and not (repo / TEST.path).exists()
    with pytest.raises(ProposalError, match="is not a git working copy"):
        apply_change_set(cs, tmp_path, OWNER)


def test_set_yaml_scalar_keeps_layout_and_touches_only_top_level_keys():
    text = "a: 1  # one\nnested:\n  a: 2\nb: x\n"
    assert set_yaml_scalar(text, "a", "9") == "a: 9  # one\nnested:\n  a: 2\nb: x\n"
    with pytest.raises(ProposalError, match="no top-level 'c:' line"):
        set_yaml_scalar(text, "c", "1")
    assert unified_diff({"f.txt": ("x\n", "x\n")}) == ""  # nothing changed: no hunk


def _render(sql: str) -> str:
    """The dbt test as dbt renders it: ``source()`` and ``ref()`` to this DuckDB's tables, ``config()`` to nothing."""
    env = jinja2.Environment()
    return env.from_string(sql).render(source=lambda s, t: f"{s}.{t}", ref=lambda m: m, config=lambda **_: "")


def test_the_dbt_test_fails_exactly_where_the_model_misses_landed_rows():
    db = duckdb.connect()
    db.execute("CREATE SCHEMA pos")
    db.execute("CREATE TABLE pos.sales_line AS SELECT * FROM (VALUES (1, 10, TIMESTAMP '2026-11-03 10:00'), "
               "(2, 10, TIMESTAMP '2026-11-03 23:59'), (3, 11, TIMESTAMP '2026-11-04 00:00'), "
               "(4, 12, TIMESTAMP '2026-11-05 08:00')) t(sales_line_id, store_id, sale_ts)")
    db.execute("CREATE TABLE daily_sales AS SELECT * FROM (VALUES (10, DATE '2026-11-03', 2), "
               "(11, DATE '2026-11-04', 1)) t(store_id, sale_date, line_count)")
    sql = TEST.sql("cs-abc")
    assert sql.startswith("-- Added by dw-dagster change set cs-abc: daily_sales.line_count must equal")
    assert "{{ config(meta={'dagster': {'ref': {'name': 'daily_sales'}}}) }}" in sql
    rows = db.execute(_render(sql)).fetchall()
    assert rows == [(12, dt.date(2026, 11, 5), 1, None)]  # the store-day the model never got
    db.execute("INSERT INTO daily_sales VALUES (12, DATE '2026-11-05', 1)")
    assert db.execute(_render(sql)).fetchall() == []
