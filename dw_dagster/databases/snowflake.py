"""Snowflake through the Snowflake Python connector (a ``dagster_snowflake.SnowflakeResource`` or connection arguments).

Small results come back as tuples (``NUMBER`` as :class:`~decimal.Decimal`, never float); bulk rows
stream as Arrow record batches. The connector is optional: ``pip install 'dw-dagster[snowflake]'``.
Errors are :class:`~dw_dagster.databases.DatabaseError` naming the database and the statement, never
a user or password.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pyarrow as pa

from dw_dagster.databases.base import DatabaseError, _first_line, _rechunk, _rows_to_batch, _short
from dw_dagster.databases.tags import tag_json, tagged

SNOWFLAKE_EXTRA_HINT = "pip install 'dw-dagster[snowflake]'"
#: Snowflake's QUERY_TAG holds at most 2,000 characters; a longer tag is left to the appended comment
QUERY_TAG_MAX = 2000


# Query parameters a snowflake:// URL may carry, with their type; anything else is refused.
_SNOWFLAKE_URL_PARAMS: dict[str, type] = {
    "warehouse": str,
    "role": str,
    "host": str,
    "port": int,
    "protocol": str,
    "authenticator": str,
    "login_timeout": int,
    "network_timeout": int,
}


def _import_snowflake_connector() -> Any:
    """Import ``snowflake.connector`` or raise an ImportError naming the extra."""
    try:
        import snowflake.connector
    except ImportError as e:
        raise ImportError(
            f"SnowflakeDatabase needs the Snowflake connector, which is not installed: {SNOWFLAKE_EXTRA_HINT}"
        ) from e
    return snowflake.connector


class SnowflakeDatabase:
    """A Snowflake database through the Snowflake Python connector.

    A connection is opened per call and closed after it, like
    :class:`~dw_dagster.databases.DuckDBDatabase`; give ``database`` (and ``schema`` if you
    name tables with one part) so that ``schema.table`` names resolve. The connector runs one
    statement per call: a text holding several statements is refused by Snowflake, not run.

    Args:
        resource: a ``dagster_snowflake.SnowflakeResource``; its ``get_connection()`` is used for
            every call. Give either this or ``connect_kwargs``.
        **connect_kwargs: arguments for ``snowflake.connector.connect`` (``account``, ``user``,
            ``password``, ``database``, ``schema``, ``warehouse``, ``role``; ``host``, ``port``
            and ``protocol`` to reach a server other than ``<account>.snowflakecomputing.com``).

    Raises:
        ImportError: the Snowflake connector is not installed (the message names the
            ``dw-dagster[snowflake]`` extra).
        ValueError: both or neither of ``resource`` and ``connect_kwargs`` were given.

    Examples:
        .. code-block:: python

            from dagster_snowflake import SnowflakeResource

            sf = SnowflakeResource(account="xy12345", user=dg.EnvVar("SF_USER"),
                                   password=dg.EnvVar("SF_PASSWORD"), database="ANALYTICS")
            db = SnowflakeDatabase(sf)
            db.fetch_all("SELECT COUNT(*) FROM pos.sales_line")
    """

    dialect = "snowflake"

    def __init__(self, resource: Any | None = None, **connect_kwargs: Any) -> None:
        if (resource is None) == (not connect_kwargs):
            raise ValueError("give SnowflakeDatabase either a SnowflakeResource or connection arguments")
        if resource is None:
            _import_snowflake_connector()
        self._resource = resource
        self._connect_kwargs = dict(connect_kwargs)
        if resource is not None:
            account, database, schema = resource.account, resource.database, resource.schema_
        else:
            account = connect_kwargs.get("account")
            database, schema = connect_kwargs.get("database"), connect_kwargs.get("schema")
        self.name = "snowflake:" + "/".join(str(p) for p in (account or "?", database, schema) if p)

    @classmethod
    def from_url(cls, url: str) -> SnowflakeDatabase:
        """Build from ``snowflake://user:password@account/database/schema?warehouse=WH&role=R``.

        ``database`` and ``schema`` are optional; user and password are percent-decoded. Query
        parameters: ``warehouse``, ``role``, ``authenticator``, ``login_timeout``,
        ``network_timeout``, and ``host``, ``port``, ``protocol`` for a server that is not
        ``<account>.snowflakecomputing.com`` (an emulator on loopback:
        ``?host=127.0.0.1&port=8085&protocol=http``).

        Raises:
            ValueError: the URL has no account, or an unknown or malformed query parameter.
            ImportError: the Snowflake connector is not installed.
        """
        parts = urlsplit(url)
        if parts.scheme != "snowflake":
            raise ValueError("a Snowflake URL starts with snowflake://")
        userinfo, _, account = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        if not account:
            raise ValueError("a snowflake:// URL needs an account: snowflake://user:password@account/database/schema")
        kwargs: dict[str, Any] = {"account": unquote(account)}
        if user:
            kwargs["user"] = unquote(user)
        if password:
            kwargs["password"] = unquote(password)
        path = [unquote(p) for p in parts.path.strip("/").split("/") if p]
        if len(path) > 2:
            raise ValueError("a snowflake:// URL path is /database or /database/schema")
        kwargs.update(zip(("database", "schema"), path))
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            kind = _SNOWFLAKE_URL_PARAMS.get(key)
            if kind is None:
                raise ValueError(
                    f"unknown snowflake:// URL parameter {key!r}; known: {', '.join(sorted(_SNOWFLAKE_URL_PARAMS))}"
                )
            try:
                kwargs[key] = kind(value)
            except ValueError:
                raise ValueError(f"snowflake:// URL parameter {key!r} must be a {kind.__name__}") from None
        return cls(**kwargs)

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        """A Snowflake connection, closed on exit (also when the body raises)."""
        if self._resource is not None:
            with self._resource.get_connection() as con:
                try:
                    yield con
                finally:
                    # SnowflakeResource.get_connection() skips its close() when the body raises.
                    con.close()
        else:
            connector = _import_snowflake_connector()
            con = connector.connect(**self._connect_kwargs)
            try:
                yield con
            finally:
                con.close()

    def _fail(self, what: str, e: BaseException, sql: str) -> DatabaseError:
        return DatabaseError(f"{self.name}: {what} failed: {type(e).__name__}: {_first_line(e)}\n  SQL: {_short(sql)}")

    @contextlib.contextmanager
    def _executed(self, sql: str) -> Iterator[Any]:
        """A cursor that has run ``sql``; cursor and connection are closed on exit.

        Inside a Dagster step the statement carries the step's tag (:mod:`dw_dagster.databases.tags`)
        as its ``QUERY_TAG`` and as an appended comment."""
        sql, tag = tagged(sql)
        with self.connect() as con:
            cur = con.cursor()
            try:
                if tag and len(tag_json(tag)) <= QUERY_TAG_MAX:
                    cur.execute(sql, _statement_params={"QUERY_TAG": tag_json(tag)})
                else:
                    cur.execute(sql)
                yield cur
            finally:
                cur.close()

    def fetch_all(self, sql: str) -> list[tuple]:
        """Run ``sql`` and return every row as a tuple (``NUMBER`` as Decimal, dates as date).

        Raises:
            DatabaseError: the connection or the query failed.
        """
        try:
            with self._executed(sql) as cur:
                return [tuple(r) for r in cur.fetchall()]
        except Exception as e:
            raise self._fail("query", e, sql) from e

    def fetch_batches(self, sql: str, batch_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        """Run ``sql`` and stream its rows as Arrow record batches of at most ``batch_rows`` rows.

        Uses the connector's Arrow result batches when the result comes back in Arrow format;
        otherwise (a JSON result) rows are fetched ``batch_rows`` at a time and converted.

        Raises:
            DatabaseError: the connection or the query failed.
        """
        try:
            with self._executed(sql) as cur:
                try:
                    tables = cur.fetch_arrow_batches()
                except Exception as e:  # NotSupportedError: the result is not in Arrow format
                    if type(e).__name__ != "NotSupportedError":
                        raise
                    tables = None
                if tables is not None:
                    for table in tables:
                        yield from _rechunk(table, batch_rows)
                else:
                    names = [d.name for d in cur.description]
                    while rows := cur.fetchmany(batch_rows):
                        yield _rows_to_batch(names, [tuple(r) for r in rows])
        except Exception as e:
            raise self._fail("query", e, sql) from e

    def execute(self, sql: str) -> None:
        """Run one statement that returns nothing (DDL, DML).

        Raises:
            DatabaseError: the connection or the statement failed.
        """
        try:
            with self._executed(sql):
                pass
        except Exception as e:
            raise self._fail("statement", e, sql) from e
