"""Run a fake server module as a child process that exits when its parent does.

``python -m dw_dagster_dev.fakes.child PARENT_PID MODULE [ARGS...]`` watches ``PARENT_PID`` once a
second and exits when the parent is gone, then runs ``MODULE`` as ``__main__`` with ``ARGS``. The
demo uses it so a killed demo leaves no fake server behind.
"""

import os
import runpy
import sys
import threading
import time


def _watch(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def main() -> None:
    parent, module, *args = sys.argv[1:]
    threading.Thread(target=_watch, args=(int(parent),), daemon=True).start()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
