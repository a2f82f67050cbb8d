"""BigQuery through ``google-cloud-bigquery`` (a ``bigquery.Client`` or a ``dagster_gcp.BigQueryResource``).

Takes SQL already rendered for the ``"bigquery"`` dialect (:func:`dw_dagster.databases.sql.render`);
small results come back as tuples (``NUMERIC`` as :class:`~decimal.Decimal`, never float), bulk rows
stream as Arrow record batches. The client is optional: ``pip install 'dw-dagster[bigquery]'``.
Errors are :class:`~dw_dagster.databases.DatabaseError` naming the database and the statement.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pyarrow as pa

from dw_dagster.databases.base import DatabaseError, _first_line, _rechunk, _short
from dw_dagster.databases.tags import bigquery_labels, tagged

BIGQUERY_EXTRA_HINT = "pip install 'dw-dagster[bigquery]'"

_BIGQUERY_URL_PARAMS = ("endpoint", "location")


def _import_bigquery() -> Any:
    """Import ``google.cloud.bigquery`` or raise an ImportError naming the extra."""
    try:
        bigquery = importlib.import_module("google.cloud.bigquery")
    except ImportError as e:
        raise ImportError(
            f"BigQueryDatabase needs google-cloud-bigquery, which is not installed: {BIGQUERY_EXTRA_HINT}"
        ) from e
    return bigquery


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
        retry_deadline_s: seconds a failed API request (a server error, a rate limit) is retried for.
        request_timeout_s: seconds one API request may take before it is given up (and retried while
            the deadline allows); a query that takes longer still runs: the job is polled until it ends.

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
        request_timeout_s: float = 120.0,
    ) -> None:
        _import_bigquery()
        for name, v in (("retry_deadline_s", retry_deadline_s), ("request_timeout_s", request_timeout_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a number of seconds above 0, got {v!r}")
        self.retry_deadline_s, self.request_timeout_s = retry_deadline_s, request_timeout_s
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

    def _job_config(self, labels: dict[str, str] | None = None) -> Any:
        bigquery = _import_bigquery()
        config = bigquery.QueryJobConfig()
        if self._default_dataset:
            config.default_dataset = self._default_dataset
        if labels:
            config.labels = labels
        return config

    def _run(self, client: Any, sql: str) -> Any:
        from google.api_core.retry import Retry

        # Inside a Dagster step: the step's tag as job labels and an appended comment (databases.tags).
        sql, tag = tagged(sql)
        # Bounded retries: a server error must surface as a DatabaseError, not retry for minutes. The request's own
        # timeout is not the retry deadline: a server that takes 12 s to accept a job (an emulator running a MERGE
        # in the request, a loaded endpoint) is slow, not failing; the job's id is the client's, so a retried
        # request never starts the job twice.
        kwargs: dict[str, Any] = {"job_config": self._job_config(bigquery_labels(tag)),
                                  "retry": Retry(deadline=self.retry_deadline_s),
                                  "job_retry": None, "timeout": self.request_timeout_s}
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
