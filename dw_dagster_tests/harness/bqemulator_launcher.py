"""Start bqemulator (a BigQuery REST emulator on DuckDB) on loopback, without DuckDB's spatial extension.

Run with the emulator's OWN interpreter (``.cache/bqemulator-venv/bin/python``), never the
project's: bqemulator pins an older sqlglot than dw_dagster and fakesnow need. The test fixture in
``dw_dagster_tests/emulators.py`` builds that venv and runs this file.

bqemulator's ``DuckDBEngine._load_spatial`` runs ``INSTALL spatial`` at start, which downloads the
extension from DuckDB's extension repository; that host is unreachable here and startup fails.
GEOGRAPHY is the only thing the extension backs and dw_dagster never uses it, so the method is
replaced with a no-op before the server starts. Everything else is bqemulator's own ``start``
command (REST on ``--rest-port``, gRPC on a random port, in-memory "ephemeral" storage).

Usage::

    .cache/bqemulator-venv/bin/python dw_dagster_tests/bqemulator_launcher.py --port 9050 [--project p]

Stops on SIGTERM or SIGINT, and when the process that started it exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time


def _exit_with_parent() -> None:
    """SIGTERM ourselves (a clean bqemulator shutdown) when the process that started us goes away."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="REST bind host (keep it on loopback)")
    parser.add_argument("--port", type=int, required=True, help="REST port")
    parser.add_argument("--project", default="dw-test", help="default project id")
    args = parser.parse_args(argv)

    # The format extensions (avro) are another download; they are best-effort in bqemulator but
    # switching them off avoids a network attempt at start.
    os.environ.setdefault("BQEMU_ENABLE_FORMAT_EXTENSIONS", "false")
    os.environ.setdefault("BQEMU_TRACING_ENABLED", "false")

    from bqemulator import cli
    from bqemulator.storage.engine import DuckDBEngine

    DuckDBEngine._load_spatial = lambda self: None  # no GEOGRAPHY: no extension download

    _exit_with_parent()
    cli.main(
        [
            "start",
            "--rest-host", args.host,
            "--rest-port", str(args.port),
            "--grpc-host", "127.0.0.1",
            "--grpc-port", "0",
            "--ephemeral",
            "--project", args.project,
            "--log-level", "warning",
        ],
        prog_name="bqemulator",
    )


if __name__ == "__main__":
    sys.exit(main())
