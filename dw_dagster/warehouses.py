"""The :class:`~dw_dagster.databases.Database` interface on Snowflake and BigQuery.

:class:`SnowflakeDatabase` runs on the Snowflake Python connector, through a
``dagster_snowflake.SnowflakeResource`` or plain connection arguments; :class:`BigQueryDatabase`
runs on ``google-cloud-bigquery``, through a ``bigquery.Client`` or a
``dagster_gcp.BigQueryResource``. Both take SQL already rendered for their dialect
(``"snowflake"`` / ``"bigquery"``, see :func:`dw_dagster.sql.render`), return small results as
tuples from :meth:`fetch_all` (``NUMBER``/``NUMERIC`` as :class:`~decimal.Decimal`, never float) and
stream bulk rows as Arrow record batches from :meth:`fetch_batches`.

The connector packages are optional and imported only when an adapter is built::

    pip install 'dw-dagster[snowflake]'   # dagster-snowflake + snowflake-connector-python
    pip install 'dw-dagster[bigquery]'    # dagster-gcp + google-cloud-bigquery

Errors are raised as :class:`~dw_dagster.databases.DatabaseError` naming the database
(:attr:`name`, which never holds a user or password) and the statement.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pyarrow as pa

from dw_dagster.databases import DatabaseError, _short

SNOWFLAKE_EXTRA_HINT = "pip install 'dw-dagster[snowflake]'"
BIGQUERY_EXTRA_HINT = "pip install 'dw-dagster[bigquery]'"

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
_BIGQUERY_URL_PARAMS = ("endpoint", "location")


def _import_snowflake_connector() -> Any:
    """Import ``snowflake.connector`` or raise an ImportError naming the extra."""
    try:
        import snowflake.connector
    except ImportError as e:
        raise ImportError(
            f"SnowflakeDatabase needs the Snowflake connector, which is not installed: {SNOWFLAKE_EXTRA_HINT}"
        ) from e
    return snowflake.connector


def _import_bigquery() -> Any:
    """Import ``google.cloud.bigquery`` or raise an ImportError naming the extra."""
    try:
        bigquery = importlib.import_module("google.cloud.bigquery")
    except ImportError as e:
        raise ImportError(
            f"BigQueryDatabase needs google-cloud-bigquery, which is not installed: {BIGQUERY_EXTRA_HINT}"
        ) from e
    return bigquery


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _rechunk(batch: pa.RecordBatch | pa.Table, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Split a record batch or table into record batches of at most ``batch_rows`` rows."""
    if isinstance(batch, pa.Table):
        yield from batch.to_batches(max_chunksize=batch_rows)
        return
    for offset in range(0, batch.num_rows, batch_rows):
        yield batch.slice(offset, batch_rows)


def _rows_to_batch(names: list[str], rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows)) if rows else [[] for _ in names]
    return pa.RecordBatch.from_arrays([pa.array(list(c)) for c in cols], names=names)


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
        """A cursor that has run ``sql``; cursor and connection are closed on exit."""
        with self.connect() as con:
            cur = con.cursor()
            try:
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


class BigQueryDatabase:
    """A BigQuery project through ``google-cloud-bigquery``, with a default dataset.

    Two-part names ``dataset.table`` resolve in the client's project; with ``dataset`` given,
    one-part names resolve in that dataset too (the query job's default dataset). Each call runs
    one query job and waits for it.

    Args:
        client: a ``google.cloud.bigquery.Client``, or a ``dagster_gcp.BigQueryResource`` whose
            ``get_client()`` is used for every call.
        dataset: the default dataset, ``"dataset"`` or ``"project.dataset"``.
        project: the project jobs run in and two-part names resolve in; defaults to the
            client's (or the resource's) project.
        location: the job location; defaults to the client's.

    Raises:
        ImportError: google-cloud-bigquery is not installed (the message names the
            ``dw-dagster[bigquery]`` extra).

    Examples:
        .. code-block:: python

            from dagster_gcp import BigQueryResource

            db = BigQueryDatabase(BigQueryResource(project="acme-dw"), dataset="pos")
            db.fetch_all("SELECT region, SUM(net_sales) FROM pos.sales_line GROUP BY region")
    """

    dialect = "bigquery"

    def __init__(
        self,
        client: Any,
        dataset: str | None = None,
        *,
        project: str | None = None,
        location: str | None = None,
        retry_deadline_s: float = 60.0,
    ) -> None:
        _import_bigquery()
        self.retry_deadline_s = retry_deadline_s
        self._client_or_resource = client
        self._is_resource = hasattr(client, "get_client") and not hasattr(client, "query")
        self.project = project or getattr(client, "project", None)
        self.location = location
        if dataset and "." in dataset:
            ds_project, _, dataset = dataset.partition(".")
            self.project = self.project or ds_project
            self._default_dataset = f"{ds_project}.{dataset}"
        else:
            self._default_dataset = f"{self.project}.{dataset}" if dataset and self.project else dataset
        self.dataset = dataset
        self.name = "bigquery:" + "/".join(p for p in (self.project or "default", dataset) if p)

    @classmethod
    def from_url(cls, url: str) -> BigQueryDatabase:
        """Build from ``bigquery://project/dataset?location=EU&endpoint=http://127.0.0.1:9050``.

        ``dataset`` is optional. Without ``endpoint`` the client is a
        ``dagster_gcp.BigQueryResource`` (Application Default Credentials, created lazily at the
        first query). With an ``http://`` endpoint (an emulator: Google serves BigQuery over
        HTTPS only) the client talks to that endpoint with anonymous credentials; an ``https://``
        endpoint keeps Application Default Credentials.

        Raises:
            ValueError: the URL has no project, or an unknown query parameter.
            ImportError: google-cloud-bigquery (or, without endpoint, dagster-gcp) is not installed.
        """
        parts = urlsplit(url)
        if parts.scheme != "bigquery":
            raise ValueError("a BigQuery URL starts with bigquery://")
        project = unquote(parts.netloc)
        if not project:
            raise ValueError("a bigquery:// URL needs a project: bigquery://project/dataset")
        path = [unquote(p) for p in parts.path.strip("/").split("/") if p]
        if len(path) > 1:
            raise ValueError("a bigquery:// URL path is /dataset")
        params: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key not in _BIGQUERY_URL_PARAMS:
                raise ValueError(f"unknown bigquery:// URL parameter {key!r}; known: {', '.join(_BIGQUERY_URL_PARAMS)}")
            params[key] = value
        dataset = path[0] if path else None
        bigquery = _import_bigquery()
        endpoint, location = params.get("endpoint"), params.get("location")
        if endpoint:
            from google.api_core.client_options import ClientOptions

            credentials = None
            if endpoint.startswith("http://"):
                from google.auth.credentials import AnonymousCredentials

                credentials = AnonymousCredentials()
            client = bigquery.Client(
                project=project,
                location=location,
                credentials=credentials,
                client_options=ClientOptions(api_endpoint=endpoint),
            )
            return cls(client, dataset, project=project, location=location)
        try:
            from dagster_gcp import BigQueryResource
        except ImportError as e:
            raise ImportError(f"bigquery:// URLs need dagster-gcp, which is not installed: {BIGQUERY_EXTRA_HINT}") from e
        return cls(BigQueryResource(project=project, location=location), dataset, project=project, location=location)

    @contextlib.contextmanager
    def client(self) -> Iterator[Any]:
        """The ``bigquery.Client`` to use (from the resource, per call, when built from one)."""
        if self._is_resource:
            with self._client_or_resource.get_client() as c:
                yield c
        else:
            yield self._client_or_resource

    def _job_config(self) -> Any:
        bigquery = _import_bigquery()
        config = bigquery.QueryJobConfig()
        if self._default_dataset:
            config.default_dataset = self._default_dataset
        return config

    def _run(self, client: Any, sql: str) -> Any:
        from google.api_core.retry import Retry

        # Bounded retries: a server error must surface as a DatabaseError, not retry for minutes.
        kwargs: dict[str, Any] = {"job_config": self._job_config(), "retry": Retry(deadline=self.retry_deadline_s),
                                  "job_retry": None, "timeout": self.retry_deadline_s}
        if self.project:
            kwargs["project"] = self.project
        if self.location:
            kwargs["location"] = self.location
        return client.query(sql, **kwargs)

    def _fail(self, what: str, e: BaseException, sql: str) -> DatabaseError:
        return DatabaseError(f"{self.name}: {what} failed: {type(e).__name__}: {_first_line(e)}\n  SQL: {_short(sql)}")

    def column_types(self, table: str) -> dict[str, str]:
        """Column name (lower case) → BigQuery type (``STRING``, ``NUMERIC``, ``FLOAT``...), from the tables API.

        Raises:
            DatabaseError: the table does not exist.
        """
        ref = table if table.count(".") == 2 else (
            f"{self.project}.{table}" if "." in table else f"{self._default_dataset}.{table}")
        try:
            with self.client() as client:
                return {f.name.lower(): f.field_type.upper() for f in client.get_table(ref).schema}
        except Exception as e:
            raise DatabaseError(f"{self.name}: table {table} not found: {type(e).__name__}: {_first_line(e)}") from e

    def fetch_all(self, sql: str) -> list[tuple]:
        """Run ``sql`` and return every row as a tuple (``NUMERIC`` as Decimal, ``DATE`` as date).

        Raises:
            DatabaseError: the job could not be created or failed.
        """
        try:
            with self.client() as client:
                return [tuple(row.values()) for row in self._run(client, sql).result()]
        except Exception as e:
            raise self._fail("query", e, sql) from e

    def fetch_batches(self, sql: str, batch_rows: int = 100_000) -> Iterator[pa.RecordBatch]:
        """Run ``sql`` and stream its rows as Arrow record batches of at most ``batch_rows`` rows.

        Pages of ``batch_rows`` rows are read through the REST API (``tabledata.list``) and
        converted to Arrow by google-cloud-bigquery; the BigQuery Storage API is not used.

        Raises:
            DatabaseError: the job could not be created or failed.
        """
        try:
            with self.client() as client:
                rows = self._run(client, sql).result(page_size=batch_rows)
                for batch in rows.to_arrow_iterable():
                    yield from _rechunk(batch, batch_rows)
        except Exception as e:
            raise self._fail("query", e, sql) from e

    def execute(self, sql: str) -> None:
        """Run a statement (DDL, DML, or a BigQuery script) and wait for it.

        Raises:
            DatabaseError: the job could not be created or failed.
        """
        try:
            with self.client() as client:
                self._run(client, sql).result()
        except Exception as e:
            raise self._fail("statement", e, sql) from e
