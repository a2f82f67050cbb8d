"""Engines shared by the field cases, one per test module (module scope).

``duck`` and ``duck2`` are two DuckDB files; ``pg`` is the loopback PostgreSQL
(``DW_TEST_POSTGRES_URL``) with a fresh schema per module; ``maria`` is the loopback MariaDB
(``root@127.0.0.1:3306``) with a fresh database per module. Each yields an :class:`Engine`: the
``Database`` and the prefix its tables take (``schema.`` or ``database.``).
"""

import uuid
from typing import Any, NamedTuple

import pytest

from dw_dagster_tests.conftest import POSTGRES_URL

MARIADB_URL = "mysql+pymysql://root@127.0.0.1:3306"


class Engine(NamedTuple):
    name: str
    db: Any
    prefix: str

    def table(self, name: str) -> str:
        return f"{self.prefix}{name}"


@pytest.fixture(scope="module")
def duck(tmp_path_factory):
    from dw_dagster.databases import DuckDBDatabase

    yield Engine("duckdb", DuckDBDatabase(tmp_path_factory.mktemp("fc") / "a.duckdb"), "")


@pytest.fixture(scope="module")
def duck2(tmp_path_factory):
    from dw_dagster.databases import DuckDBDatabase

    yield Engine("duckdb2", DuckDBDatabase(tmp_path_factory.mktemp("fc") / "b.duckdb"), "")


@pytest.fixture(scope="module")
def pg():
    from dw_dagster.databases import SqlAlchemyDatabase

    db = SqlAlchemyDatabase(POSTGRES_URL)
    try:
        db.fetch_all("SELECT 1")
    except Exception as e:  # pragma: no cover - CI machines have the server
        pytest.fail(f"PostgreSQL on loopback is required: {e}")
    schema = f"fc_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE SCHEMA {schema}")
    yield Engine("postgres", db, f"{schema}.")
    db.execute(f"DROP SCHEMA {schema} CASCADE")
    db.dispose()


@pytest.fixture(scope="module")
def maria():
    from dw_dagster.databases import SqlAlchemyDatabase

    name = f"fc_{uuid.uuid4().hex[:8]}"
    root = SqlAlchemyDatabase(MARIADB_URL)
    try:
        root.execute(f"CREATE DATABASE {name}")
    except Exception as e:  # pragma: no cover - CI machines have the server
        pytest.fail(f"MariaDB on loopback 3306 is required: {e}")
    db = SqlAlchemyDatabase(f"{MARIADB_URL}/{name}")
    yield Engine("mariadb", db, f"{name}.")
    db.dispose()
    root.execute(f"DROP DATABASE {name}")
    root.dispose()


@pytest.fixture
def engine(request):
    """The engine named by the test's parameter (``duck``, ``pg`` or ``maria``)."""
    return request.getfixturevalue(request.param)
