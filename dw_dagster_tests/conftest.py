import os

import pytest

os.environ.setdefault("DW_APPROVAL_SIGNING_KEY", "test-signing-key-0123456789abcdef")
os.environ.setdefault("DAGSTER_TELEMETRY_DISABLED", "1")

POSTGRES_URL = os.environ.get("DW_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


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
