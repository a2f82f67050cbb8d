"""Start ``mage start`` (mage-ai 0.9.80) on loopback, and stop its whole process group with the test run.

Run with Mage's OWN interpreter (``~/.cache/dw_dagster/mage-ai-0.9.80-venv/bin/python``), never the
project's: mage-ai pins versions dagster and dbt-core 1.11 cannot live with. The fixture in
``dw_dagster_tests/harness/mage_server.py`` builds that venv, starts this file in a new session
(process group) and stops the group.

``mage start`` forks a scheduler process and a Jupyter kernel; when the process that started this
launcher goes away (a killed pytest), a watcher thread sends SIGTERM to the whole group, so no
Mage process outlives the tests. The venv's console script ``bin/mage`` keeps the venv's build
path in its shebang, so Mage's CLI is called as a module here.

Usage::

    <mage venv>/bin/python dw_dagster_tests/harness/mage_launcher.py --project DIR --port 6789 [--host 127.0.0.1]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time


def _stop_group_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.killpg(os.getpgrp(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", required=True, help="the Mage project folder (made by `mage init`)")
    parser.add_argument("--host", default="127.0.0.1", help="bind host (keep it on loopback)")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    _stop_group_with_parent()
    from mage_ai.cli.main import app

    sys.argv = ["mage", "start", args.project, "--host", args.host, "--port", str(args.port)]
    app()


if __name__ == "__main__":
    main()
