"""A database from a URL, and the Dagster resource that holds one."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from dw_dagster.databases.base import Database
from dw_dagster.databases.duckdb import DuckDBDatabase
from dw_dagster.databases.sqlalchemy import SqlAlchemyDatabase
from dw_dagster.dagster_private import public


@public
def database_from_url(url: str) -> Database:
    """Open a :class:`Database` from a URL.

    ``duckdb:///path/to/file.duckdb`` (or a bare path ending in ``.duckdb``) opens DuckDB natively;
    ``snowflake://user:password@account/database/schema?warehouse=WH&role=R`` opens
    :class:`~dw_dagster.databases.snowflake.SnowflakeDatabase` (``?host=127.0.0.1&port=8085&protocol=http``
    reaches an emulator); ``bigquery://project/dataset?location=EU`` opens
    :class:`~dw_dagster.databases.bigquery.BigQueryDatabase` with Application Default Credentials, and
    ``bigquery://project/dataset?endpoint=http://127.0.0.1:9050`` an emulator with anonymous
    credentials; ``informix://`` and ``ibm_db_sa://`` open
    :class:`~dw_dagster.databases.informix.InformixDatabase` (the ``informix`` extra's driver,
    imported only then); anything else is handed to SQLAlchemy.

    Raises:
        ValueError: for an empty URL, or a malformed ``snowflake://`` or ``bigquery://`` URL.
        ImportError: the ``snowflake`` or ``bigquery`` extra of dw-dagster is not installed.
    """
    if not url:
        raise ValueError("database URL is empty")
    if url.startswith("snowflake://"):
        from dw_dagster.databases.snowflake import SnowflakeDatabase

        return SnowflakeDatabase.from_url(url)
    if url.startswith("bigquery://"):
        from dw_dagster.databases.bigquery import BigQueryDatabase

        return BigQueryDatabase.from_url(url)
    if url.startswith("duckdb:///"):
        return DuckDBDatabase(url[len("duckdb:///") :])
    if url.startswith("duckdb://"):
        return DuckDBDatabase(url[len("duckdb://") :] or ":memory:")
    if url.endswith(".duckdb") and "://" not in url:
        return DuckDBDatabase(url)
    from dw_dagster.databases.informix import InformixDatabase, is_informix_url

    if is_informix_url(url):  # the driver (dw-dagster[informix]) is imported only here
        return InformixDatabase(url)
    return SqlAlchemyDatabase(url)


@public
class DatabaseResource(dg.ConfigurableResource):
    """A Dagster resource that opens a :class:`Database` from a URL.

    Examples:
        .. code-block:: python

            pos = DatabaseResource(url=dg.EnvVar("POS_SOURCE_URL"))
            warehouse = DatabaseResource(url="duckdb:///warehouse.duckdb")
    """

    url: str = Field(description="duckdb:///path.duckdb, or any SQLAlchemy URL (postgresql+psycopg://...)")

    def get_database(self) -> Database:
        return database_from_url(self.url)
