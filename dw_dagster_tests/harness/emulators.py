"""Local Snowflake and BigQuery emulators on loopback, for tests that run one case on every warehouse.

* Snowflake: `fakesnow <https://pypi.org/project/fakesnow/>`_ serves Snowflake's HTTP protocol
  on DuckDB; the real ``snowflake-connector-python`` (and so ``dagster_snowflake``) talks to it.
  It runs in a subprocess started from this file (``python emulators.py fakesnow --port N``).
* BigQuery: `bqemulator <https://pypi.org/project/bqemulator/>`_ serves BigQuery's REST API on
  DuckDB; ``google-cloud-bigquery`` talks to it with anonymous credentials. It pins an older
  sqlglot than dw_dagster, so it lives in its own venv at ``<repo>/.cache/bqemulator-venv``
  (built once, then reused) and runs ``dw_dagster_tests/bqemulator_launcher.py`` there.

Both servers bind 127.0.0.1 on a free port, are started and stopped by the tests (session
fixtures in ``conftest.py``), and stop by themselves if the test process dies.

Where an emulator differs from the real service (see also ``test_warehouses.py``):

* fakesnow rewrites ``SUM(x)`` as ``SUM(TRY_CAST(x AS DOUBLE))`` (to mimic Snowflake's implicit
  VARCHAR-to-number cast), so the sum of a ``NUMBER(18,2)`` column comes back as a float.
  Snowflake returns ``NUMBER(38,2)``, an exact Decimal. The subprocess started here replaces
  that rewrite for ``SUM`` with one that keeps the argument's type (and the Snowflake-style
  column name), so exact decimal sums can be tested; ``SUM`` over a VARCHAR column then fails
  where Snowflake would cast.
* fakesnow returns a NULL ``TIMESTAMP_NTZ`` as 1970-01-01 00:00:00 (stored NULL, read back
  wrong); tests do not read NULL timestamps back.
* fakesnow answers a multi-statement text with HTTP 500 (the connector then retries until
  ``network_timeout``); Snowflake answers error 000008. Tests never send one to Snowflake.
* bqemulator downloads DuckDB's ``spatial`` extension at start; the launcher skips it (no
  GEOGRAPHY). A bare ``NUMERIC`` in its SQL is DuckDB's ``NUMERIC`` = ``DECIMAL(18,3)``, not
  BigQuery's ``NUMERIC(38,9)``: ``CAST('1234567890123456.78' AS NUMERIC)`` fails, and a
  ``NUMERIC(18,2)`` column made by ``CREATE TABLE`` refuses values with 16 integer digits
  (tables made through the REST API hold NUMERIC(38,9) exactly). Tests keep decimals to at most
  15 integer digits, which still have more significant digits than a float64 holds. It reports an unknown table as ``400 invalidQuery ... does not exist`` where
  BigQuery says ``404 Not found: Table ...``. It parses SQL with sqlglot, so it lexes quoted
  identifiers the way sqlglot does (doubled backtick) rather than the way BigQuery does
  (backslash escapes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO / ".cache"
BQEMULATOR_VENV = CACHE_DIR / "bqemulator-venv"
BQEMULATOR_LAUNCHER = Path(__file__).resolve().with_name("bqemulator_launcher.py")
# numpy: bqemulator imports it for some result conversions but does not depend on it.
BQEMULATOR_REQUIREMENTS = ("bqemulator==1.4.0", "numpy")
BQEMULATOR_PROJECT = "dw-test"

FAKESNOW_ACCOUNT = "fakesnow"
FAKESNOW_DATABASE = "DW_TEST"


# -- processes ---------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the server binds it a moment later)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_open(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def server_process(
    argv: Sequence[str], log_path: Path, ready: Callable[[], bool], *, timeout: float = 90.0, what: str = "server"
) -> Iterator[subprocess.Popen]:
    """Start ``argv``, wait until ``ready()`` is true, yield the process, then stop it.

    Stopping sends SIGTERM, waits up to 15 s, then SIGKILL. Output goes to ``log_path``; its tail
    is in the error if the process dies or is not ready within ``timeout`` seconds.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready:\n{_tail(log_path)}")
            try:
                if ready():
                    break
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {timeout:.0f} s:\n{_tail(log_path)}")
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


def _exit_with_parent() -> None:
    """In a server subprocess: SIGTERM ourselves when the process that started us goes away."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


# -- Snowflake (fakesnow) ----------------------------------------------------------------------


def _patch_fakesnow_exact_sum() -> None:
    """Make fakesnow's SUM keep its argument's type, as Snowflake does (see the module docstring)."""
    from sqlglot import exp

    import fakesnow.transforms as transforms
    from fakesnow.transforms import transforms as impl

    original = transforms.numeric_agg_implicit_cast
    col_name = getattr(impl, "_numeric_agg_col_name", None)

    def numeric_agg_keep_sum_type(expression: Any) -> Any:
        if isinstance(expression, exp.Sum):
            name = None if isinstance(expression.parent, exp.Alias) or col_name is None else col_name(expression, expression.this)
            if name and isinstance(expression.parent, exp.Select):
                return exp.alias_(expression, name, quoted=True)
            return expression
        return original(expression)

    transforms.numeric_agg_implicit_cast = numeric_agg_keep_sum_type


def _serve_fakesnow(host: str, port: int) -> None:
    """Run fakesnow's server until SIGTERM/SIGINT (or until the parent process dies)."""
    import fakesnow

    _patch_fakesnow_exact_sum()
    # SHOW WAREHOUSES / ALTER WAREHOUSE from a seeded SNOWFLAKE.DW_FAKESNOW.WAREHOUSES (cost tests)
    from dw_dagster_dev.fakes.fakesnow_server import patch_warehouse_emulation

    patch_warehouse_emulation()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    _exit_with_parent()
    with fakesnow.server(port=port, host=host):
        stop.wait()


@contextlib.contextmanager
def fakesnow_server(log_dir: Path) -> Iterator[dict[str, Any]]:
    """A fakesnow server on 127.0.0.1 in a subprocess; yields ``snowflake.connector.connect`` kwargs.

    The kwargs have no ``database``; the database :data:`FAKESNOW_DATABASE` is created. All
    connections share one in-memory DuckDB in the server process, gone when it stops.
    """
    host, port = "127.0.0.1", free_port()
    argv = [sys.executable, str(Path(__file__).resolve()), "fakesnow", "--host", host, "--port", str(port)]
    with server_process(argv, log_dir / "fakesnow.log", lambda: _port_open(host, port), what="fakesnow server"):
        kwargs = dict(
            user="fake",
            password="snow",
            account=FAKESNOW_ACCOUNT,
            host=host,
            port=port,
            protocol="http",
            # no telemetry sent anywhere else; fail within seconds instead of retrying for minutes
            session_parameters={"CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False},
            login_timeout=20,
            network_timeout=20,
        )
        import snowflake.connector

        with contextlib.closing(snowflake.connector.connect(**kwargs)) as con:
            con.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {FAKESNOW_DATABASE}")
        yield kwargs


# -- BigQuery (bqemulator) ---------------------------------------------------------------------


@dataclass
class VenvBuild:
    python: Path
    built_seconds: float | None  # None when the cached venv was reused


def build_venv_once(venv: Path, stamp_text: str, build: Callable[[Path, Any], None], *, what: str) -> VenvBuild:
    """Build (once) a venv with ``build``; later calls with the same ``stamp_text`` reuse it.

    The venv is built beside its final place and renamed when ``build`` has finished, under a file
    lock, so an interrupted or concurrent build never leaves a half-built venv in use. The stamp
    file ``<venv>/dw-requirements.txt`` holds ``stamp_text``; a different text rebuilds the venv. The
    build's seconds are kept in ``<venv>/dw-build-seconds.txt`` and its output in ``<venv>.build.log``.

    Args:
        venv: where the venv lives.
        stamp_text: what the venv holds (its requirements).
        build: ``build(tmp, log)`` fills the venv at ``tmp`` (not yet created), writing output to the
            binary file ``log``; raises ``RuntimeError`` when it fails.
        what: a name for error messages ("the bqemulator venv").

    Raises:
        RuntimeError: the build failed (with the tail of its log); nothing is left at ``venv``'s
            temporary place.
    """
    import fcntl
    import shutil

    venv_python = venv / "bin" / "python"
    stamp = venv / "dw-requirements.txt"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if venv_python.exists() and stamp.exists() and stamp.read_text() == stamp_text:
            return VenvBuild(venv_python, None)
        started = time.monotonic()
        tmp = venv.parent / f"{venv.name}.building-{os.getpid()}"
        log_path = venv.parent / f"{venv.name}.build.log"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with open(log_path, "wb") as log:
                build(tmp, log)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"building {what} at {venv} failed: {e}\n(log {log_path}):\n{_tail(log_path)}") from None
        (tmp / "dw-build-seconds.txt").write_text(f"{time.monotonic() - started:.1f}\n")
        (tmp / "dw-requirements.txt").write_text(stamp_text)
        shutil.rmtree(venv, ignore_errors=True)
        # bin/python finds its venv from its own path, so it survives the rename; the console
        # scripts' shebangs keep the build path: use `bin/python -m pip`, not `bin/pip`.
        tmp.rename(venv)
        return VenvBuild(venv_python, time.monotonic() - started)


def run_logged(argv: Sequence[str], log: Any, env: dict[str, str] | None = None) -> None:
    """Run ``argv`` with its output appended to the binary file ``log``.

    Raises:
        RuntimeError: it exited with a non-zero code (naming the command).
    """
    log.write(f"$ {' '.join(argv)}\n".encode())
    log.flush()
    rc = subprocess.call(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... exited with code {rc}")


def ensure_venv(venv: Path, requirements: Sequence[str], *, what: str, python: str = sys.executable) -> VenvBuild:
    """Build (once) a venv holding ``requirements`` with pip (:func:`build_venv_once`); later calls reuse it.

    Raises:
        RuntimeError: venv creation or ``pip install`` failed (with the tail of its log).
    """
    def build(tmp: Path, log: Any) -> None:
        run_logged([python, "-m", "venv", str(tmp)], log)
        run_logged([str(tmp / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
                    *requirements], log)

    return build_venv_once(venv, "\n".join(requirements) + "\n", build, what=what)


def ensure_bqemulator_venv(venv: Path = BQEMULATOR_VENV) -> VenvBuild:
    """Build (once) the venv bqemulator runs in (:func:`ensure_venv`); later calls reuse it.

    Raises:
        RuntimeError: venv creation or ``pip install`` failed (with the tail of its log).
    """
    return ensure_venv(venv, BQEMULATOR_REQUIREMENTS, what="the bqemulator venv")


@contextlib.contextmanager
def bqemulator_server(python: Path, log_dir: Path, project: str = BQEMULATOR_PROJECT) -> Iterator[str]:
    """bqemulator on 127.0.0.1 (REST; in-memory storage) run by ``python``; yields its endpoint URL."""
    host, port = "127.0.0.1", free_port()
    endpoint = f"http://{host}:{port}"

    def ready() -> bool:
        with urllib.request.urlopen(f"{endpoint}/bigquery/v2/projects/{project}/datasets", timeout=2) as r:
            return r.status == 200

    argv = [str(python), str(BQEMULATOR_LAUNCHER), "--host", host, "--port", str(port), "--project", project]
    with server_process(argv, log_dir / "bqemulator.log", ready, what="bqemulator"):
        yield endpoint


def bigquery_client(endpoint: str, project: str = BQEMULATOR_PROJECT) -> Any:
    """A ``google.cloud.bigquery.Client`` for the emulator at ``endpoint`` (anonymous credentials)."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    return bigquery.Client(
        project=project, credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=endpoint)
    )


# -- the same table on every warehouse ---------------------------------------------------------


def _typed_literal(value: object, sqltype: Any) -> Any:
    """``CAST(<literal> AS type)``; decimals go through a string so that no side rounds them.

    (A BigQuery literal such as ``1.10`` is FLOAT64; ``CAST('1.10' AS NUMERIC)`` is exact.)
    """
    from sqlglot import exp

    from dw_dagster.databases import sql

    lit = sql.literal(str(value) if isinstance(value, Decimal) else value)
    if isinstance(lit, exp.Cast):  # dates and timestamps already carry their type
        return lit
    return exp.cast(lit, sqltype.copy())


def make_table(db: Any, name: str, columns: dict[str, str], rows: Sequence[Sequence[object]]) -> None:
    """Create ``name`` with ``columns`` (DuckDB type names) on ``db`` and insert ``rows``.

    The statements are built as sqlglot trees (identifiers from :func:`dw_dagster.databases.sql.table` and
    :func:`dw_dagster.databases.sql.identifier`, values from :func:`dw_dagster.databases.sql.literal`) and rendered
    for ``db.dialect``, so DuckDB, Snowflake and BigQuery get the same data: e.g.
    ``DECIMAL(18,2)`` becomes ``NUMERIC(18, 2)`` and ``TIMESTAMP`` becomes ``DATETIME`` on BigQuery.

    Args:
        db: a :class:`dw_dagster.databases.Database`.
        name: ``schema.table`` (``dataset.table`` on BigQuery).
        columns: column name -> DuckDB type, in order.
        rows: tuples in column order; ``None`` is NULL.
    """
    from sqlglot import exp

    from dw_dagster.databases import sql

    types = {c: exp.DataType.build(t, dialect="duckdb") for c, t in columns.items()}
    create = exp.Create(
        kind="TABLE",
        this=exp.Schema(
            this=sql.table(name),
            expressions=[exp.ColumnDef(this=sql.identifier(c), kind=t.copy()) for c, t in types.items()],
        ),
    )
    db.execute(create.sql(dialect=db.dialect))
    if rows:
        values = exp.values([exp.tuple_(*(_typed_literal(v, types[c]) for v, c in zip(row, columns, strict=True))) for row in rows])
        insert = exp.insert(values, sql.table(name), columns=[sql.identifier(c) for c in columns])
        db.execute(insert.sql(dialect=db.dialect))


@dataclass
class Warehouse:
    """A warehouse for one test: its :class:`~dw_dagster.databases.Database` and a fresh schema."""

    kind: str  # "duckdb", "snowflake" or "bigquery"
    db: Any
    schema: str  # a dataset on BigQuery

    def table(self, name: str) -> str:
        """``schema.name``, the two-part name of a table in this test's schema."""
        return f"{self.schema}.{name}"

    def make_table(self, name: str, columns: dict[str, str], rows: Sequence[Sequence[object]]) -> str:
        """:func:`make_table` in this test's schema; returns the two-part name."""
        qualified = self.table(name)
        make_table(self.db, qualified, columns, rows)
        return qualified


def _main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="dw_dagster test emulators")
    sub = parser.add_subparsers(dest="cmd", required=True)
    fs = sub.add_parser("fakesnow", help="serve fakesnow on loopback until SIGTERM")
    fs.add_argument("--host", default="127.0.0.1")
    fs.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "fakesnow":
        _serve_fakesnow(args.host, args.port)


if __name__ == "__main__":
    _main()
