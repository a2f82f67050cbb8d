import os
import uuid

import pytest

os.environ.setdefault("DW_APPROVAL_SIGNING_KEY", "test-signing-key-0123456789abcdef")
os.environ.setdefault("DAGSTER_TELEMETRY_DISABLED", "1")

POSTGRES_URL = os.environ.get("DW_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

#: The slowest test files, slowest first (seconds each in a full run on 2 cores, junit times: daemon e2e 391,
#: repair identity 154, cli 152, cause daemon 149, warehouses' migrations 148, code locations 135, celery 133 ...), run first: ``make test``
#: hands files to workers in collection order (``--dist loadfile --no-loadscope-reorder``; without the second
#: flag xdist sorts files by their number of tests, and a slow file of few tests ran last on one worker while
#: the other idled). Files not listed keep their order, after these.
SLOW_FIRST = (
    "e2e/test_daemon_e2e.py", "cli/test_cli.py", "e2e/test_cause_fixes_daemon.py", "e2e/test_code_locations.py",
    "e2e/test_repair_identity_and_liveness.py", "e2e/test_celery.py", "mcp/test_remediate_versions.py",
    "e2e/test_wheel.py", "repair/test_migrations_warehouses.py", "integrations/test_mage_real.py",
    "lineage/test_lineage_dbt_oracle.py", "lineage/test_review_dbt_oracle.py", "detection/test_volume_store_attacks.py",
    "mcp/test_tools.py", "mcp/test_http.py", "repair/test_guard.py", "e2e/test_store_sales_e2e.py",
    "e2e/test_store_sales_fail_verify.py", "docs/test_docs.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Run the files of :data:`SLOW_FIRST` first, in that order (stable: each file's tests keep theirs)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}

    def key(item):
        path = item.nodeid.split("::", 1)[0].removeprefix("dw_dagster_tests/")
        return rank.get(path, len(rank))

    items[:] = sorted(items, key=key)


#: ``DW_TEST_CPU_REPORT=<dir>``: each test process writes ``cpu-<worker>.json`` there, the seconds of CPU every test
#: file used (the process's own and its finished child processes': dagster dev, code servers, run workers, dbt) and
#: its wall seconds. On 2 cores the suite is bound by the CPU, so this, not ``--durations``, says where time goes.
_CPU: dict[str, list[float]] = {}


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get("DW_TEST_CPU_REPORT"):
        yield
        return
    import time

    cpu0, wall0 = _cpu_seconds(), time.monotonic()
    yield
    spent = _CPU.setdefault(item.nodeid.split("::", 1)[0], [0.0, 0.0])
    spent[0] += _cpu_seconds() - cpu0
    spent[1] += time.monotonic() - wall0


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("DW_TEST_CPU_REPORT")
    if out and _CPU:
        import json
        from pathlib import Path

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(out).mkdir(parents=True, exist_ok=True)
        rows = {f: {"cpu_s": round(c, 1), "wall_s": round(w, 1)} for f, (c, w) in sorted(_CPU.items(), key=lambda kv: -kv[1][0])}
        (Path(out) / f"cpu-{worker}.json").write_text(json.dumps(rows, indent=1) + "\n")


@pytest.fixture
def duck(tmp_path):
    from dw_dagster.databases import DuckDBDatabase

    return DuckDBDatabase(tmp_path / "scratch.duckdb")


@pytest.fixture
def postgres():
    """The PostgreSQL server on loopback (an on-premises OLTP source); skipped only if unreachable."""
    from dw_dagster.databases import SqlAlchemyDatabase

    db = SqlAlchemyDatabase(POSTGRES_URL)
    try:
        db.fetch_all("SELECT 1")
    except Exception as e:  # pragma: no cover - CI machines have the server
        pytest.fail(f"PostgreSQL on loopback is required for this test: {e}")
    yield db
    db.dispose()


@pytest.fixture
def pg_schema(postgres):
    """A fresh schema on the loopback PostgreSQL server (its name), dropped with its tables afterwards."""
    schema = f"t_{uuid.uuid4().hex[:8]}"
    postgres.execute(f"CREATE SCHEMA {schema}")
    yield schema
    postgres.execute(f"DROP SCHEMA {schema} CASCADE")


# -- Snowflake and BigQuery emulators on loopback (dw_dagster_tests/emulators.py) ----------------


@pytest.fixture(scope="session")
def fakesnow_server(tmp_path_factory):
    """fakesnow (Snowflake on DuckDB) on 127.0.0.1 for the session; yields connector kwargs."""
    from dw_dagster_tests.harness.emulators import fakesnow_server as start

    with start(tmp_path_factory.mktemp("fakesnow")) as kwargs:
        yield kwargs


@pytest.fixture(scope="session")
def bqemulator_server(tmp_path_factory):
    """bqemulator (BigQuery REST on DuckDB) on 127.0.0.1 for the session; yields its endpoint URL.

    Its venv (``.cache/bqemulator-venv``) is built on first use, about a minute, then reused.
    """
    from dw_dagster_tests.harness.emulators import bqemulator_server as start
    from dw_dagster_tests.harness.emulators import ensure_bqemulator_venv

    build = ensure_bqemulator_venv()
    if build.built_seconds is not None:
        print(f"\nbuilt the bqemulator venv in {build.built_seconds:.0f} s")
    with start(build.python, tmp_path_factory.mktemp("bqemulator")) as endpoint:
        yield endpoint


@pytest.fixture(params=["duckdb", "snowflake", "bigquery"], ids=["duckdb", "snowflake", "bigquery"])
def warehouse(request, tmp_path):
    """A :class:`~dw_dagster_tests.harness.emulators.Warehouse`: a ``Database`` and a fresh schema (dataset).

    The schema is dropped after the test; DuckDB's lives in a file under ``tmp_path``.
    """
    import uuid

    from dw_dagster_tests.harness.emulators import FAKESNOW_DATABASE, Warehouse, bigquery_client

    schema = f"t_{uuid.uuid4().hex[:10]}"
    if request.param == "duckdb":
        from dw_dagster.databases import DuckDBDatabase

        db = DuckDBDatabase(tmp_path / "warehouse.duckdb")
        db.execute(f"CREATE SCHEMA {schema}")
        yield Warehouse("duckdb", db, schema)
    elif request.param == "snowflake":
        from dagster_snowflake import SnowflakeResource

        from dw_dagster.databases.snowflake import SnowflakeDatabase

        kwargs = dict(request.getfixturevalue("fakesnow_server"))
        admin = SnowflakeDatabase(**kwargs, database=FAKESNOW_DATABASE)
        admin.execute(f"CREATE SCHEMA {schema}")
        resource = SnowflakeResource(
            account=kwargs.pop("account"),
            user=kwargs.pop("user"),
            password=kwargs.pop("password"),
            database=FAKESNOW_DATABASE,
            schema=schema,
            login_timeout=kwargs.pop("login_timeout"),
            network_timeout=kwargs.pop("network_timeout"),
            additional_snowflake_connection_args=kwargs,  # host, port, protocol, session_parameters
        )
        try:
            yield Warehouse("snowflake", SnowflakeDatabase(resource), schema)
        finally:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    else:
        from dw_dagster.databases.bigquery import BigQueryDatabase

        client = bigquery_client(request.getfixturevalue("bqemulator_server"))
        client.create_dataset(schema)
        try:
            # bqemulator answers some queries (INFORMATION_SCHEMA) with HTTP 500, which the client retries for
            # retry_deadline_s (60 s by default: right for BigQuery's transient errors, minutes of a test run here)
            yield Warehouse("bigquery", BigQueryDatabase(client, dataset=schema, retry_deadline_s=10), schema)
        finally:
            client.delete_dataset(schema, delete_contents=True, not_found_ok=True)
            client.close()
