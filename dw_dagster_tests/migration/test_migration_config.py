"""The migration's configuration: names resolved against each engine's catalog at load, errors as
``file:line: field: problem``; ``dw-dagster migration plan`` and ``status``."""

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from dw_dagster import DwConfigError, build_dw_definitions
from dw_dagster.databases import DuckDBDatabase

DOMAINS = """domains:
  - name: pos
    assets: [[a]]
    approvers: [owner@x.example]
    identity: unverified
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("mig_cfg")
    src = DuckDBDatabase(h / "src.duckdb")
    src.execute("CREATE SCHEMA pos")
    src.execute("CREATE TABLE pos.orders (id INTEGER PRIMARY KEY, region VARCHAR, amount DECIMAL(10,2))")
    src.execute("CREATE TABLE pos.lines (id INTEGER PRIMARY KEY, order_id INTEGER, qty INTEGER)")
    src.execute("CREATE TABLE pos.stores (id INTEGER PRIMARY KEY, name VARCHAR)")
    tgt = DuckDBDatabase(h / "tgt.duckdb")
    tgt.execute("CREATE SCHEMA pos")
    tgt.execute("CREATE TABLE pos.orders (id INTEGER, region VARCHAR, amount DECIMAL(10,2))")
    (h / "domains.yaml").write_text(DOMAINS)
    return h


def _yaml(home: Path, pairs: str, domain: str = "pos") -> Path:
    text = textwrap.dedent(f"""\
        domains: domains.yaml
        databases:
          src: {{url: "duckdb:///{home}/src.duckdb"}}
          tgt: {{url: "duckdb:///{home}/tgt.duckdb"}}
        migration:
          name: m
          waves:
            - name: w1
              domain: {domain}
              pairs:
        """) + textwrap.indent(textwrap.dedent(pairs), " " * 8)
    path = home / "dataops.yaml"
    path.write_text(text)
    return path


GOOD = """\
- source: {database: src, table: pos.orders}
  target: {asset: a, database: tgt, table: pos.orders}
  key: [id]
  slice_by: [region]
  sums: [amount]
"""


def test_a_good_migration_loads_and_a_target_not_loaded_yet_is_no_error(home):
    path = _yaml(home, GOOD + "- source: {database: src, table: pos.stores}\n"
                 "  target: {asset: b, database: tgt, table: pos.stores}\n  key: [id]\n")
    defs = build_dw_definitions(path)
    assert defs.resolve_job_def("dw_migration__m__w1") is not None
    assert defs.resolve_assets_def(["migration", "m", "w1"]) is not None


@pytest.mark.parametrize("pairs,line,field,words", [
    (GOOD.replace("sums: [amount]", "sums: [amount, ammount]"), 15, "migration.waves.0.pairs.0.sums",
     "column ammount is not in the source table pos.orders"),
    (GOOD.replace("key: [id]", "key: [order_no]"), 13, "migration.waves.0.pairs.0.key",
     "column order_no is not in the source table pos.orders"),
    (GOOD.replace("table: pos.orders}\n  target", "table: pos.order}\n  target"), 11, "migration.waves.0.pairs.0.source.table",
     "table pos.order is not in database src"),
])
def test_unknown_names_are_refused_with_file_line_field(home, pairs, line, field, words):
    path = _yaml(home, pairs)
    with pytest.raises(DwConfigError) as e:
        build_dw_definitions(path)
    text = str(e.value)
    assert f"{path}:{line}: {field}: {words}" in text, text


def test_every_unknown_name_at_once_and_references(home):
    pairs = GOOD.replace("slice_by: [region]", "slice_by: [regio]").replace("sums: [amount]", "sums: [amt]")
    with pytest.raises(DwConfigError) as e:
        build_dw_definitions(_yaml(home, pairs))
    assert "slice_by: column regio" in str(e.value) and "sums: column amt" in str(e.value)
    with pytest.raises(DwConfigError, match=r"dataops.yaml:\d+: migration.waves.0.domain: domain 'nobody' is not in"):
        build_dw_definitions(_yaml(home, GOOD, domain="nobody"))
    with pytest.raises(DwConfigError, match=r"migration.waves.0.pairs.0.target.database: 'nowhere' is not under databases"):
        build_dw_definitions(_yaml(home, GOOD.replace("database: tgt", "database: nowhere")))


def test_a_python_mapping_names_the_call(home):
    cfg = {"domains": str(home / "domains.yaml"),
           "databases": {"src": {"url": f"duckdb:///{home}/src.duckdb"}, "tgt": {"url": f"duckdb:///{home}/tgt.duckdb"}},
           "migration": {"name": "m", "waves": [{"name": "w1", "domain": "pos", "pairs": [
               {"source": {"database": "src", "table": "pos.orders"}, "target": {"asset": "a", "database": "tgt",
                                                                                 "table": "pos.orders"},
                "key": ["idd"]}]}]}}
    with pytest.raises(DwConfigError, match=r"build_dw_definitions\(config\): migration.waves.0.pairs.0.key: column idd"):
        build_dw_definitions(cfg)
    cfg["migration"]["waves"][0]["pairs"].append(dict(cfg["migration"]["waves"][0]["pairs"][0]))
    with pytest.raises(Exception, match="already the target of"):
        build_dw_definitions(cfg)


def test_the_component_names_its_defs_yaml_line(home, tmp_path):
    """Through the Component the line is the defs.yaml's (fields under ``attributes:``)."""
    from dw_dagster.migration.resolve import ConfigSource

    text = _yaml(home, GOOD).read_text()  # its own file: no test before it need have written one
    defs_yaml = "type: dw_dagster.DataOpsComponent\nattributes:\n" + textwrap.indent(text, "  ")
    src = ConfigSource(tmp_path / "defs.yaml", defs_yaml, ("attributes",))
    assert src.locate(("migration", "waves", 0, "pairs", 0, "key")).endswith("defs.yaml:15")  # two lines below the file's own


def test_plan_groups_tables_read_together_and_orders_them_before_their_models(home):
    from dw_dagster.cli import main

    manifest = {"sources": {"source.p.pos.orders": {"schema": "pos", "name": "orders", "resource_type": "source"},
                            "source.p.pos.lines": {"schema": "pos", "name": "lines", "resource_type": "source"},
                            "source.p.pos.stores": {"schema": "pos", "name": "stores", "resource_type": "source"}},
                "nodes": {"model.p.order_lines": {"resource_type": "model", "name": "order_lines", "schema": "pos",
                                                  "depends_on": {"nodes": ["source.p.pos.orders", "source.p.pos.lines"]}}}}
    (home / "manifest.json").write_text(json.dumps(manifest))
    out = CliRunner().invoke(main, ["migration", "plan", "--source-url", f"duckdb:///{home}/src.duckdb", "--schema", "pos",
                                    "--manifest", str(home / "manifest.json"), "--budget-mb", "0.002", "--domain", "pos",
                                    "--name", "pos_move"])
    assert out.exit_code == 0, out.output
    import yaml

    plan = yaml.safe_load(out.output)["migration"]
    waves = {w["name"]: [p["source"]["table"] for p in w["pairs"]] for w in plan["waves"]}
    together = next(ts for ts in waves.values() if "pos.orders" in ts)
    assert "pos.lines" in together, waves  # read together by order_lines: one wave, whatever the budget
    assert "read together with pos.lines by order_lines" in out.output
    assert plan["waves"][0]["pairs"][0]["key"] == ["id"]  # the primary key from the catalog
    assert "Nothing runs from a plan" in out.output


def test_status_says_so_without_waves(tmp_path):
    from dw_dagster.cli import main

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    out = CliRunner().invoke(main, ["migration", "status", "--dagster-home", str(tmp_path)])
    assert out.exit_code == 0 and "no migration waves" in out.output
    out = CliRunner().invoke(main, ["migration", "status", "--json", "--dagster-home", str(tmp_path), "--migration", "x"])
    assert out.exit_code == 1 and json.loads(out.output) == []


SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets"


@pytest.fixture(scope="module")
def pos_home(tmp_path_factory):
    h = tmp_path_factory.mktemp("snippets")
    for name in ("pos_source", "warehouse"):
        db = DuckDBDatabase(h / f"{name}.duckdb")
        db.execute("CREATE SCHEMA pos")
        db.execute("CREATE TABLE pos.sales_line (sales_line_id BIGINT, region VARCHAR, sale_ts TIMESTAMP, "
                   "net_sales DECIMAL(18,2))")
        db.execute("CREATE TABLE pos.stores (store_id INTEGER, name VARCHAR)")
    (h / "domains.yaml").write_text("domains:\n  - name: store_sales\n    assets: [[warehouse, sales_line]]\n"
                                    "    approvers: [dana.ortiz@grocer.example]\n    identity: unverified\n")
    return h


def test_docs_snippet_migration_yaml_loads(pos_home, monkeypatch):
    """docs/snippets/migration/migration.yaml, as the guide shows it."""
    monkeypatch.delenv("POS_SOURCE_URL", raising=False)
    path = pos_home / "dataops.yaml"
    path.write_text((SNIPPETS / "migration/migration.yaml").read_text())
    defs = build_dw_definitions(path, scope={"home": str(pos_home)})
    assert defs.resolve_job_def("dw_migration__pos_to_warehouse__wave1") is not None
    assert defs.resolve_schedule_def("dw_migration_schedule__pos_to_warehouse__wave1").cron_schedule == "0 * * * *"


def test_docs_snippet_python_config_builds(pos_home, monkeypatch):
    """docs/snippets/migration/python_config.py, with the two URLs it names."""
    monkeypatch.chdir(pos_home)
    scope = {"POS_URL": f"duckdb:///{pos_home}/pos_source.duckdb", "WAREHOUSE_URL": f"duckdb:///{pos_home}/warehouse.duckdb"}
    exec(compile((SNIPPETS / "migration/python_config.py").read_text(), "python_config.py", "exec"), scope)
    assert scope["defs"].resolve_assets_def(["migration", "pos_to_warehouse", "wave1"]) is not None


def test_docs_snippet_informix_prints_what_it_says(capsys):
    """docs/snippets/migration/informix.py: its last comment is what the last line prints."""
    text = (SNIPPETS / "migration/informix.py").read_text()
    exec(compile(text, "informix.py", "exec"), {})
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == text.strip().splitlines()[-1].lstrip("# ")
    assert '"region"' in printed[0] and '"' not in printed[1]


def test_plan_places_a_table_no_later_than_what_is_built_from_it():
    """A model's output that is itself migrated comes after the tables it reads; the budget splits the rest."""
    from dw_dagster.migration.plan import TableInfo, plan_waves

    tables = [TableInfo("pos.daily", 10, 900), TableInfo("pos.lines", 1000, 900), TableInfo("pos.stores", 10, 900)]
    waves = plan_waves(tables, [("daily_model", {"pos.lines"})], {"pos.daily": {"pos.lines"}}, budget_bytes=1000)
    where = {t.name: i for i, w in enumerate(waves) for t in w.tables}
    assert where["pos.lines"] < where["pos.daily"]
    assert "after pos.lines (built from it)" in waves[where["pos.daily"]].reasons["pos.daily"]
    assert all(w.bytes <= 1000 for w in waves)
