"""A private MariaDB server with row-based binary logging, for the orders CDC tests.

:func:`mariadb_server` initialises a fresh data directory with ``mariadb-install-db`` and runs
``mariadbd`` on a free loopback port, with exactly what row-based CDC needs::

    mariadb-install-db --no-defaults --datadir=D --user=root --auth-root-authentication-method=normal
                       --skip-test-db --skip-name-resolve --innodb-log-file-size=8M
    mariadbd --no-defaults --user=root --datadir=D --port=P --bind-address=127.0.0.1
             --socket=D/mariadb.sock --pid-file=D/mariadb.pid --log-error=D/error.log
             --log-bin=D/binlog --binlog-format=ROW --binlog-row-image=FULL
             --binlog-row-metadata=FULL --server-id=1 --skip-name-resolve --tmpdir=D/tmp ...

``--no-defaults`` keeps Debian's ``/etc/mysql`` files (``user=mysql``, ``/var/log/mysql``) out;
``--user=root`` is needed when the tests run as root; ``--binlog-row-metadata=FULL`` puts column
names in the log (mysql-replication needs them). The server is terminated (SIGTERM, then SIGKILL)
and its directory removed when the context exits; it also gets SIGTERM if the test process dies
(``PR_SET_PDEATHSIG``).

When the server binaries are missing, :func:`mariadb_server` falls back to a server given by
``DW_TEST_MARIADB_URL`` (or the shared one on 127.0.0.1:3306) **only if** its binary log is on.
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SHARED_URL = os.environ.get("DW_TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306")


@dataclass(frozen=True)
class MariaDBServer:
    """A running server: where it listens and whether it is private to the tests."""

    host: str
    port: int
    user: str
    password: str
    private: bool
    datadir: Path | None = None


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/usr/bin")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _ready(host: str, port: int, user: str, password: str) -> bool:
    import pymysql

    try:
        con = pymysql.connect(host=host, port=port, user=user, password=password, connect_timeout=2)
    except pymysql.MySQLError:
        return False
    con.close()
    return True


def binaries() -> tuple[str, str] | None:
    """(mariadb-install-db, mariadbd) paths, or None when the server is not installed."""
    install = _which("mariadb-install-db") or _which("mysql_install_db")
    server = _which("mariadbd") or _which("mysqld")
    return (install, server) if install and server else None


@contextlib.contextmanager
def private_server(timeout: float = 60.0) -> Iterator[MariaDBServer]:
    """Start a fresh MariaDB with row-based binary logging on a free loopback port (module docstring).

    Raises:
        RuntimeError: the binaries are missing, or the server did not come up (with its log).
    """
    found = binaries()
    if not found:
        raise RuntimeError("mariadb-install-db / mariadbd not found")
    install, server = found
    user = getpass.getuser()
    datadir = Path(tempfile.mkdtemp(prefix="dw-mariadb-"))
    port = free_port()
    proc = None
    # its own temporary directory: a mariadbd starting up deletes every #sql* file in its tmpdir (/tmp by
    # default), the in-flight temporary tables of the shared server on :3306 included, whose queries then
    # fail with "Error on delete of '/tmp/#sql-temptable-….MAI'" (seen in a full run)
    tmp = datadir / "tmp"
    tmp.mkdir()
    try:
        init = subprocess.run(
            [install, "--no-defaults", f"--datadir={datadir / 'data'}", f"--user={user}",
             "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
             "--innodb-log-file-size=8M", f"--tmpdir={tmp}"],
            capture_output=True, text=True, timeout=timeout)
        if init.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed ({init.returncode}):\n{init.stdout[-2000:]}\n{init.stderr[-2000:]}")
        log = datadir / "error.log"
        proc = subprocess.Popen(
            [server, "--no-defaults", f"--user={user}", f"--datadir={datadir / 'data'}", f"--port={port}",
             "--bind-address=127.0.0.1", f"--socket={datadir / 'mariadb.sock'}", f"--pid-file={datadir / 'mariadb.pid'}",
             f"--log-error={log}", f"--log-bin={datadir / 'binlog'}", "--binlog-format=ROW", "--binlog-row-image=FULL",
             "--binlog-row-metadata=FULL", "--server-id=1", "--skip-name-resolve", "--innodb-log-file-size=8M",
             "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0",
             "--performance-schema=OFF", "--max-connections=50", f"--tmpdir={tmp}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while not _ready("127.0.0.1", port, "root", ""):
            if proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited with code {proc.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"mariadbd not ready after {timeout:.0f} s:\n{_tail(log)}")
            time.sleep(0.2)
        yield MariaDBServer("127.0.0.1", port, "root", "", True, datadir)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(datadir, ignore_errors=True)


def shared_server_with_binlog(url: str = SHARED_URL) -> MariaDBServer | None:
    """The server at ``url`` if it is reachable and its binary log is row-based; else None."""
    from dw_dagster_examples.orders.cdc import BinlogSource, CdcConfigError, MySQLConnection

    conn = MySQLConnection.from_url(url)
    try:
        BinlogSource(conn).check_server()
    except (CdcConfigError, Exception):
        return None
    return MariaDBServer(conn.host, conn.port, conn.user, conn.password, False)


@contextlib.contextmanager
def mariadb_server() -> Iterator[MariaDBServer]:
    """A private server when the binaries are installed, else the shared one if its binlog is on.

    Raises:
        RuntimeError: neither is possible (the message says why).
    """
    if binaries():
        with private_server() as s:
            yield s
        return
    shared = shared_server_with_binlog()
    if shared is None:
        raise RuntimeError("no MariaDB server binaries (apt-get install mariadb-server) and the server at "
                           f"{SHARED_URL.split('@')[-1]} has no row-based binary log")
    yield shared
