"""Reading a dbt incremental model's high-watermark filter, and rewriting it as the fix proposes."""

import pytest

from dw_dagster.pipelines.dbt_incremental import DbtIncrementalError, incremental_model, read_incremental_filter

WHERE = """\
{{ config(materialized='incremental', unique_key='id') }}
select * from {{ source('s', 't') }}
{% if is_incremental() %}
where updated_at > (select max(updated_at) from {{ this }})
{% endif %}
"""

AND = """\
{{ config(materialized='incremental') }}
select * from {{ ref('stg') }}
where status <> 'test'
{%- if is_incremental() %}
  and loaded_at >= (select coalesce(max(loaded_at), '1900-01-01') - interval '3 days' from {{ this }})
{%- endif %}
"""


@pytest.mark.parametrize("text,expected", [
    (WHERE, ("updated_at", ">", "updated_at", 0.0, None)),
    (AND, ("loaded_at", ">=", "loaded_at", 72.0, None)),
    (WHERE.replace("max(updated_at) from", "max(updated_at) - interval '12' hour from"),
     ("updated_at", ">", "updated_at", 12.0, None)),
    (WHERE.replace("where updated_at >", "where kind = 'a' and (updated_at >").replace("{{ this }})", "{{ this }}))"),
     ("updated_at", ">", "updated_at", 0.0, None)),
])
def test_the_filter_is_read_from_the_model_as_written(text, expected):
    f = read_incremental_filter(text, "duckdb")
    assert (f.watermark_column, f.operator, f.max_column, f.lookback_hours, f.window_column) == expected
    assert "is_incremental" not in f.block.text and "{{ this }}" in f.block.text


@pytest.mark.parametrize("text,message", [
    ("select 1", "0 {% if is_incremental() %} blocks"),
    (WHERE + WHERE, "2 {% if is_incremental() %} blocks"),
    (WHERE.replace("{% endif %}", ""), "has no {% endif %}"),
    (WHERE.replace("{{ this }}", "{{ this }} where x = {{ my_macro() }}"), "Jinja dw_dagster cannot evaluate"),
    (WHERE.replace("(select max(updated_at) from {{ this }})", "'2020-01-01'"), "has 0 comparisons"),
    (WHERE.replace("where updated_at", "where a > (select max(a) from {{ this }}) or updated_at"), "has 2 comparisons"),
    (WHERE.replace("where ", "qualify "), "starts with 'qualify'"),
    (WHERE.replace("max(updated_at)", "max(updated_at) - interval '2' week"), "not in minutes, hours or days"),
], ids=["no_block", "two_blocks", "unclosed", "unknown_jinja", "no_comparison", "two_comparisons", "not_where",
        "weeks"])
def test_a_filter_dw_dagster_cannot_read_is_refused_saying_what_it_found(text, message):
    with pytest.raises(DbtIncrementalError, match=message.replace("{", r"\{").replace("(", r"\(").replace(")", r"\)")):
        read_incremental_filter(text, "duckdb")


def test_the_rewrite_reads_back_as_the_proposed_filter_and_keeps_the_rest():
    from dw_dagster.proposals.dbt_incremental import rewrite_incremental_model

    new = rewrite_incremental_model(WHERE, "duckdb", column="ingested_at", lookback_hours=48, window_column="updated_at")
    f = read_incremental_filter(new, "duckdb")
    assert (f.watermark_column, f.operator, f.max_column, f.lookback_hours, f.window_column) == (
        "ingested_at", ">", "ingested_at", 48.0, "updated_at")
    assert new.startswith(WHERE[:WHERE.index("{% if is_incremental() %}")])  # outside the block: as written
    assert new.endswith("{% endif %}\n")
    # rewritten again (a later fix), the window clause stays one clause and the lookback changes
    again = rewrite_incremental_model(new, "duckdb", column="ingested_at", lookback_hours=96, window_column="updated_at")
    assert again.count("dw_window_start") == 2 and read_incremental_filter(again, "duckdb").lookback_hours == 96

    kept = rewrite_incremental_model(AND, "duckdb", column="loaded_at", lookback_hours=72, window_column="loaded_at",
                                     unique_key="id")
    assert kept.startswith("{{ config(unique_key='id', materialized='incremental') }}")
    assert "where status <> 'test'\n" in kept and "\nand (\n" in kept and "COALESCE(MAX(loaded_at), '1900-01-01')" in kept
    no_config = rewrite_incremental_model(WHERE.split("\n", 1)[1], "duckdb", column="updated_at", lookback_hours=0,
                                          window_column="updated_at", unique_key="id")
    assert no_config.startswith("{{ config(unique_key='id') }}\nselect")


def test_the_rewritten_model_renders_to_sql_that_runs(tmp_path):
    """The rewritten block, rendered as dbt would (with and without the window vars), runs on DuckDB."""
    import duckdb
    import jinja2

    from dw_dagster.proposals.dbt_incremental import rewrite_incremental_model

    new = rewrite_incremental_model(WHERE, "duckdb", column="ingested_at", lookback_hours=48, window_column="updated_at")
    body = new.split("\n", 1)[1]
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id INT, updated_at TIMESTAMP, ingested_at TIMESTAMP)")
    con.execute("CREATE TABLE this_t AS SELECT * FROM t")
    con.execute("INSERT INTO t VALUES (1, '2026-11-02 03:00', '2026-11-02 09:00'), (2, '2026-11-05 00:00', '2026-11-05 00:05')")
    con.execute("INSERT INTO this_t VALUES (2, '2026-11-05 00:00', '2026-11-05 00:05')")
    for window, ids in ((None, [2]), (("2026-11-02 00:00:00", "2026-11-03 00:00:00"), [1, 2])):
        def var(name, default=None, window=window):
            return {"dw_window_start": window[0], "dw_window_end": window[1]}[name] if window else default
        q = jinja2.Environment().from_string(body).render(
            this="this_t", var=var, is_incremental=lambda: True, source=lambda s, t: "t")
        assert [r[0] for r in con.execute(q + " ORDER BY id").fetchall()] == ids


def test_the_model_comes_from_the_manifest_and_must_be_incremental():
    manifest = {"nodes": {
        "model.p.m": {"resource_type": "model", "name": "m", "unique_id": "model.p.m", "database": "wh", "schema": "main",
                      "alias": "m", "original_file_path": "models/m.sql",
                      "config": {"materialized": "incremental", "unique_key": "id", "incremental_strategy": None},
                      "depends_on": {"nodes": ["source.p.s.t"]}},
        "model.p.v": {"resource_type": "model", "name": "v", "config": {"materialized": "view"}}},
        "sources": {"source.p.s.t": {"resource_type": "source", "database": "wh", "schema": "raw", "identifier": "t"}}}
    m = incremental_model(manifest, "m")
    assert (m.relation, m.file, m.unique_key, m.upstream) == ("wh.main.m", "models/m.sql", "id", ("wh.raw.t",))
    with pytest.raises(DbtIncrementalError, match="materialized 'view', not 'incremental'"):
        incremental_model(manifest, "v")
    with pytest.raises(DbtIncrementalError, match="0 models named 'x'"):
        incremental_model(manifest, "x")
