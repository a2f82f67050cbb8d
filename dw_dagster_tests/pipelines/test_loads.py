"""The pipeline file of an incremental load: validated when read, hostile names refused; a missing target
is created only with the source catalog's exact types, never guessed (no all-VARCHAR table)."""

import pytest
import yaml

from dw_dagster.pipelines.incremental import IncrementalLoadSpec, LoadSpecError
from dw_dagster_tests.databases.test_source_postgres import SPEC


@pytest.mark.parametrize("change,message", [
    ({"target_table": "pos.x'; DROP TABLE pos.sales_line; --"}, "not a plain"),
    ({"target_table": 'x"\'; DELETE FROM pos'}, "not a plain"),
    ({"merge_key": "sales_line_idd"}, "merge_key 'sales_line_idd' must be one of the loaded columns"),
    ({"columns": ["sales_line_id", "store_id; --"]}, "not a plain column name"),
], ids=["hostile_dotted_table", "hostile_table", "merge_key_typo", "hostile_column"])
def test_pipeline_file_refuses_hostile_or_inconsistent_names(tmp_path, change, message):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({**SPEC, **change}))
    with pytest.raises(LoadSpecError, match=message):
        IncrementalLoadSpec.from_file(f)


def test_bad_yaml_names_the_file_and_line(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("source_table: pos.sales_line\ncolumns: [a, b\n")
    with pytest.raises(LoadSpecError, match=r"(?s)p.yaml:3: not valid YAML.*p.yaml, line 2"):
        IncrementalLoadSpec.from_file(f)


def _duck_source(path):
    from dw_dagster.databases import DuckDBDatabase

    src = DuckDBDatabase(path)
    src.execute("CREATE SCHEMA src")
    src.execute("CREATE TABLE src.t (id BIGINT NOT NULL, name VARCHAR, amount DECIMAL(18,2), ts TIMESTAMP)")
    src.execute("INSERT INTO src.t VALUES (1, 'a', 1.50, TIMESTAMP '2026-11-01 10:00:00')")
    return src


def _spec(**over):
    base = dict(source_table="src.t", target_table="wh.t", merge_key="id", partition_column="ts",
                watermark_column="ts", lookback_hours=0, columns=["id", "name", "amount", "ts"])
    return IncrementalLoadSpec(**{**base, **over})


def test_a_missing_target_is_created_with_the_source_types_never_all_varchar(tmp_path):
    import datetime as dt

    from dw_dagster.databases import DuckDBDatabase
    from dw_dagster.pipelines.incremental import load_partition

    src, wh = _duck_source(tmp_path / "s.duckdb"), DuckDBDatabase(tmp_path / "w.duckdb")
    res = load_partition(src, wh, _spec(), "2026-11-01", dt.datetime(2026, 11, 1), dt.datetime(2026, 11, 2))
    assert res.rows_read == 1
    types = dict(wh.fetch_all("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 't'"))
    assert types == {"id": "BIGINT", "name": "VARCHAR", "amount": "DECIMAL(18,2)", "ts": "TIMESTAMP"}


def test_a_missing_target_whose_types_are_unknown_is_refused_and_not_created(tmp_path):
    import datetime as dt

    from dw_dagster.databases import DuckDBDatabase
    from dw_dagster.pipelines.incremental import LoadError, ensure_target, load_partition

    src, wh = _duck_source(tmp_path / "s.duckdb"), DuckDBDatabase(tmp_path / "w.duckdb")
    day = (dt.datetime(2026, 11, 1), dt.datetime(2026, 11, 2))
    no_tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'wh'"
    with pytest.raises(LoadError, match="does not exist; create it first"):
        ensure_target(wh, _spec(), None)  # no source to take the types from
    with pytest.raises(LoadError, match=r"has no column\(s\) \['colour'\]"):
        load_partition(src, wh, _spec(columns=["id", "ts", "colour"]), "2026-11-01", *day)
    with pytest.raises(LoadError, match="cannot give the column types"):
        load_partition(src, wh, _spec(source_table="src.nope"), "2026-11-01", *day)
    assert wh.fetch_all(no_tables)[0][0] == 0


@pytest.mark.parametrize("type_text,dialect", [("numeric", "postgres"), ("mood", "duckdb"), ("my_domain_t", "postgres")])
def test_a_source_type_without_an_exact_duckdb_type_is_refused(type_text, dialect):
    from types import SimpleNamespace

    from dw_dagster.pipelines.incremental import LoadError, _warehouse_type

    with pytest.raises(LoadError, match="no exact DuckDB equivalent"):
        _warehouse_type(type_text, "c", SimpleNamespace(dialect=dialect), _spec())


def test_load_metadata_leads_with_a_one_line_summary():
    """Materializations have no description: the first metadata entry says what the event is."""
    import datetime as dt

    from dw_dagster import load_metadata
    from dw_dagster.pipelines.incremental import LoadResult

    def result(day: int, low, read: int, inserted: int | None):
        start = dt.datetime(2026, 11, day)
        return LoadResult(partition_key=start.date().isoformat(), partition_start=start,
                          partition_end=start + dt.timedelta(days=1), watermark_column="sale_ts", watermark_low=low,
                          lookback_hours=0, source_snapshot_ts=start, rows_read=read, rows_inserted=inserted,
                          rows_updated=0 if inserted is not None else None)

    low = dt.datetime(2026, 11, 26, 21, 59, 59)
    one = load_metadata([result(26, low, 1234, 12)])
    assert next(iter(one)) == "dw/summary"
    assert one["dw/summary"] == "load of 2026-11-26: read 1,234 rows above sale_ts 2026-11-26 21:59:59, inserted 12"
    two = load_metadata([result(26, low, 1000, None), result(27, low, 2000, None)])
    assert two["dw/summary"] == "load of 2026-11-26..2026-11-27 (2 partitions): read 3,000 rows above sale_ts 2026-11-26 21:59:59"
    first = load_metadata([result(1, None, 5, 5)])
    assert first["dw/summary"] == "load of 2026-11-01: read 5 rows, inserted 5"
