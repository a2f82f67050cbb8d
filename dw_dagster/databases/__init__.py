"""One small interface over the databases dw_dagster reads: warehouses and operational sources.

:class:`Database` (:mod:`.base`) is the protocol every engine implements: SQL comes in rendered for
its :attr:`~Database.dialect` by sqlglot (:mod:`.sql`), small results come back as tuples from
``fetch_all`` and bulk rows stream as Arrow record batches from ``fetch_batches``. One small file
per engine: :mod:`.duckdb` (the embedded warehouse), :mod:`.sqlalchemy` (PostgreSQL, MySQL/MariaDB,
Informix through ``ibm_db_sa`` and anything else SQLAlchemy reaches), :mod:`.snowflake`,
:mod:`.bigquery`; :mod:`.resource` builds one from a URL and holds it as a Dagster resource;
:mod:`.catalog` reads columns, types and nullability from each engine's catalog.
"""

from dw_dagster.databases import informix_dialect as _informix_dialect  # noqa: F401 - registers the 'informix' sqlglot dialect
from dw_dagster.databases import sql
from dw_dagster.databases.base import Database, DatabaseError
from dw_dagster.databases.duckdb import DuckDBDatabase, LocalDuckDB
from dw_dagster.databases.resource import DatabaseResource, database_from_url
from dw_dagster.databases.sqlalchemy import SqlAlchemyDatabase

__all__ = ["Database", "DatabaseError", "DatabaseResource", "DuckDBDatabase", "LocalDuckDB", "SqlAlchemyDatabase",
           "database_from_url", "sql"]
