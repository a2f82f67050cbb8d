"""A REAL Mage OSS server (mage-ai 0.9.80) on loopback for the tests, in its own cached venv.

mage-ai cannot be installed beside dagster and dbt-core 1.11 (it pins ``typing_extensions==4.11.0``,
``PyJWT==2.6.0``, ``click<8.2``... ``shared/reference/components_mcp_mage.md`` §4.1), so it lives in
its own venv, built by :func:`ensure_mage_venv` the first time it is needed and reused afterwards:

- where: ``$DW_MAGE_VENV``, else ``${XDG_CACHE_HOME:-~/.cache}/dw_dagster/mage-ai-0.9.80-venv``
  (outside the clone, so every worktree and test run on the machine shares it);
- how: ``python -m venv``, ``pip install uv`` (from the configured index), then ``uv pip install
  mage-ai==0.9.80`` (185 wheels, about 1.3 GB installed). Measured on the 2-core machine from a
  clean cache: 45 s in all with uv, 5.7 min with pip alone; if uv cannot be installed, pip does it
  all. Then Mage's server
  modules are imported once with bytecode writing on, so later starts do not compile them
  (``PYTHONDONTWRITEBYTECODE`` is set on the CI machines: without this step every start takes
  about 55 s instead of about 25 s);
- a stamp file records the requirements; a build that fails leaves nothing behind and raises
  with the tail of its log (``<venv>.build.log``).

:func:`mage_server` runs ``mage init`` in a temporary folder, turns usage statistics off, and runs
``mage start`` through ``mage_launcher.py`` on a free loopback port with user authentication ON
(``REQUIRE_USER_AUTHENTICATION=1``), its own owner account (``DEFAULT_OWNER_EMAIL`` /
``DEFAULT_OWNER_PASSWORD``) and a short session lifetime (``MAGE_ACCESS_TOKEN_EXPIRY_TIME``) so the
client's renewal is exercised; it is ready when ``GET /api/status`` reports the scheduler running,
and its whole process group (server, scheduler, kernel) is stopped afterwards.

:class:`MageAdmin` makes what the tests read, through Mage's REST API, the same way on the real
server and on the fake (``dw_dagster_dev.fakes.mage_server``): a batch pipeline with one
loader block (:data:`LOADER_BLOCK`: it fails when the run's variables hold a truthy ``fail``), an
API trigger, and runs started with the trigger's token.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dw_dagster_tests.harness.emulators import VenvBuild, build_venv_once, free_port, run_logged

MAGE_VERSION = "0.9.80"
MAGE_REQUIREMENTS = (f"mage-ai=={MAGE_VERSION}",)
MAGE_LAUNCHER = Path(__file__).resolve().with_name("mage_launcher.py")
#: Mage OSS's API key (``OAUTH2_APPLICATION_CLIENT_ID``, ``mage_ai/settings/server.py``).
MAGE_API_KEY = "zkWlN0PkIKSN0C11CfUHUj84OT5XOJ6tDZ6bDRO2"
#: Modules ``mage start`` and a block run import: compiled once at build time.
WARM_IMPORTS = ("mage_ai.server.server", "mage_ai.orchestration.pipeline_scheduler",
                "mage_ai.data_preparation.executors.block_executor", "pandas")

#: The loader block the tests run: completes with three rows, or fails when asked to.
LOADER_BLOCK = '''import pandas as pd
if 'data_loader' not in globals():
    from mage_ai.data_preparation.decorators import data_loader


@data_loader
def load_orders(*args, **kwargs):
    fail = kwargs.get('fail')
    if fail:
        raise ValueError(fail if isinstance(fail, str) else 'dw test: asked to fail')
    return pd.DataFrame({'order_id': [1, 2, 3]})
'''
FAIL_MESSAGE = "dw test: asked to fail"


def mage_venv_path() -> Path:
    """Where the Mage venv lives: ``$DW_MAGE_VENV``, else under ``${XDG_CACHE_HOME:-~/.cache}/dw_dagster/``."""
    if os.environ.get("DW_MAGE_VENV"):
        return Path(os.environ["DW_MAGE_VENV"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dw_dagster" / f"mage-ai-{MAGE_VERSION}-venv"


def _bytecode_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def ensure_mage_venv(venv: Path | None = None) -> VenvBuild:
    """Build (once) the venv Mage runs in; later calls reuse it (see the module docstring).

    Returns:
        The venv's python and the seconds the build took (None when the cached venv was reused).

    Raises:
        RuntimeError: the venv could not be built (no network to the package index, disk full...),
            with the tail of the build log.
    """
    venv = venv or mage_venv_path()

    def build(tmp: Path, log: Any) -> None:
        python = str(tmp / "bin" / "python")
        run_logged([sys.executable, "-m", "venv", str(tmp)], log)
        try:
            run_logged([python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "uv"], log)
        except RuntimeError:
            log.write(b"uv could not be installed: installing with pip (several minutes)\n")
            run_logged([python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
                        *MAGE_REQUIREMENTS], log)
        else:
            env = dict(os.environ)
            for pip_var, uv_var in (("PIP_INDEX_URL", "UV_INDEX_URL"), ("PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL")):
                if env.get(pip_var) and not env.get(uv_var):
                    env[uv_var] = env[pip_var]
            run_logged([python, "-m", "uv", "pip", "install", "--no-cache", "--python", python,
                        *MAGE_REQUIREMENTS], log, env=env)
        run_logged([python, "-c", "import " + ", ".join(WARM_IMPORTS)], log, env=_bytecode_env())

    return build_venv_once(venv, "\n".join(MAGE_REQUIREMENTS) + "\n", build, what=f"the Mage venv (mage-ai {MAGE_VERSION})")


@dataclass
class MageServer:
    """A running Mage server.

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        project: the Mage project folder.
        email: the owner's email (user authentication is on).
        password: the owner's password.
        token_ttl_s: session lifetime (``MAGE_ACCESS_TOKEN_EXPIRY_TIME``, seconds).
        ready_seconds: from ``mage start`` to the scheduler running.
        log_path: the server's output.
    """

    url: str
    project: Path
    email: str
    password: str
    token_ttl_s: int
    ready_seconds: float
    log_path: Path


def _processes() -> dict[int, tuple[int, int, str]]:
    """Every process on the machine: ``pid -> (ppid, pgid, state)`` from ``/proc/<pid>/stat``."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            out[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), fields[0])
    return out


def _descendants(pid: int) -> set[int]:
    """The processes started, directly or not, by ``pid`` (Mage's Jupyter kernel runs in its own session)."""
    procs, found, todo = _processes(), set(), [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, _, _) in procs.items():
            if ppid == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pgid: int, pids: set[int]) -> set[int]:
    """Which of ``pids``, or of process group ``pgid``, still run (zombies waiting for a reaper do not count)."""
    return {p for p, (_, g, state) in _processes().items() if (g == pgid or p in pids) and state != "Z"}


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the launcher's process group (server, scheduler) and every process it started (the kernel).

    SIGTERM first, SIGKILL to what is left after 20 s; only these processes, found by id.
    """
    pids = _descendants(proc.pid) | {proc.pid}
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        proc.poll()  # reap the launcher once it has exited
        left = _alive(proc.pid, pids)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and (proc.poll() is None or _alive(proc.pid, pids)):
            time.sleep(0.2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@contextlib.contextmanager
def mage_server(python: Path, workdir: Path, *, token_ttl_s: int = 3600, timeout: float = 300.0) -> Iterator[MageServer]:
    """``mage start`` with user authentication on, on a free loopback port; yields a :class:`MageServer`.

    Raises:
        RuntimeError: ``mage init`` failed, or the server exited or was not ready within ``timeout``
            seconds (with the tail of its log).
    """
    from dw_dagster_tests.harness.emulators import _tail

    workdir.mkdir(parents=True, exist_ok=True)
    project, data, log_path = workdir / "dw_mage_project", workdir / "mage_data", workdir / "mage.log"
    env = {**_bytecode_env(), "MAGE_DATA_DIR": str(data)}
    with open(workdir / "mage_init.log", "wb") as log:
        run_logged([str(python), "-m", "mage_ai.cli.main", "init", str(project)], log, env=env)
    meta = project / "metadata.yaml"
    text = meta.read_text()
    text = "\n".join("help_improve_mage: false" if line.startswith("help_improve_mage:")
                     else f"variables_dir: {data}" if line.startswith("variables_dir:") else line
                     for line in text.splitlines())
    meta.write_text(text + ("\n" if "help_improve_mage:" in text else "\nhelp_improve_mage: false\n"))
    email, password = "dw-test@example.com", secrets.token_urlsafe(12)
    env.update(REQUIRE_USER_AUTHENTICATION="1", DEFAULT_OWNER_EMAIL=email, DEFAULT_OWNER_PASSWORD=password,
               DEFAULT_OWNER_USERNAME="dw_test", MAGE_ACCESS_TOKEN_EXPIRY_TIME=str(token_ttl_s))
    host, port = "127.0.0.1", free_port()
    url = f"http://{host}:{port}"
    argv = [str(python), str(MAGE_LAUNCHER), "--project", str(project), "--host", host, "--port", str(port)]
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=workdir, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mage start exited with code {proc.returncode} before it was ready:\n{_tail(log_path)}")
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                status = httpx.get(f"{url}/api/status", timeout=2).json()["statuses"][0]
                if status["scheduler_status"] == "running":
                    break
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"mage start not ready after {timeout:.0f} s:\n{_tail(log_path)}")
            time.sleep(0.25)
        yield MageServer(url, project, email, password, token_ttl_s, time.monotonic() - started, log_path)
    finally:
        _stop_group(proc)


class MageAdmin:
    """Makes pipelines, blocks, API triggers and runs through Mage's REST API (real server or fake).

    Test-side only: dw_dagster itself never writes to Mage. With ``email`` it logs in once and again
    when the session has expired (the real server's sessions last seconds in the tests).
    """

    def __init__(self, url: str, email: str | None = None, password: str | None = None) -> None:
        self.url, self.email, self.password = url, email, password
        self.http = httpx.Client(base_url=url, timeout=60, headers={"X-API-KEY": MAGE_API_KEY})
        self._token: str | None = None

    def session(self) -> tuple[str, str]:
        """A new session: ``(JWT, inner token)``. Mage checks the password with bcrypt: about 1–3 s a login."""
        r = self.http.post("/api/sessions", params={"_http_error_codes": "true"},
                           json={"session": {"email": self.email, "password": self.password}})
        r.raise_for_status()
        jwt = r.json()["session"]["token"]
        body = jwt.split(".")[1]
        return jwt, json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))["token"]

    def token(self, *, fresh: bool = False) -> str | None:
        """The inner token of this admin's session (the ``OAUTH-TOKEN`` value), or None without user auth."""
        if self.email is None:
            return None
        if self._token is None or fresh:
            self._token = self.session()[1]
        return self._token

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One call with the session (logging in again once when Mage answers 401: the session expired)."""
        for attempt in (1, 2):
            token = self.token(fresh=attempt == 2)
            r = self.http.request(method, path, params={"_http_error_codes": "true"}, json=body,
                                  headers={"OAUTH-TOKEN": token} if token else {})
            if r.status_code != 401:
                break
        r.raise_for_status()
        data = r.json()
        if data.get("error"):
            raise RuntimeError(f"Mage {method} {path}: {json.dumps(data['error'])[:500]}")
        return data

    def batch_pipeline(self, name: str = "dw_batch") -> tuple[str, int, str]:
        """A batch pipeline with :data:`LOADER_BLOCK` and an active API trigger: ``(uuid, trigger id, token)``."""
        uuid = self.call("POST", "/api/pipelines", {"pipeline": {"name": name, "type": "python"}})["pipeline"]["uuid"]
        self.call("POST", f"/api/pipelines/{uuid}/blocks", {"block": {
            "name": "load_orders", "type": "data_loader", "language": "python", "content": LOADER_BLOCK}})
        trigger = self.call("POST", f"/api/pipelines/{uuid}/pipeline_schedules", {"pipeline_schedule": {
            "name": "dw_api_trigger", "schedule_type": "api", "status": "active"}})["pipeline_schedule"]
        return uuid, int(trigger["id"]), str(trigger["token"])

    def trigger(self, trigger_id: int, token: str, *, fail: bool | str = False) -> dict[str, Any]:
        """Start a run with the trigger's token (``POST /api/pipeline_schedules/{id}/pipeline_runs/{token}``).

        ``fail``: True, or the failure's message, makes :data:`LOADER_BLOCK` raise ``ValueError``.
        """
        r = self.http.post(f"/api/pipeline_schedules/{trigger_id}/pipeline_runs/{token}",
                           json={"pipeline_run": {"variables": {"fail": fail}}})
        r.raise_for_status()
        if r.json().get("error"):
            raise RuntimeError(f"Mage refused to start a run: {json.dumps(r.json()['error'])[:300]}")
        return r.json()["pipeline_run"]

    def wait_finished(self, run_id: int, timeout: float = 180.0) -> dict[str, Any]:
        """Poll ``GET /api/pipeline_runs/{id}`` until the run completed, failed or was cancelled."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.call("GET", f"/api/pipeline_runs/{run_id}")["pipeline_run"]
            if run["status"] in ("completed", "failed", "cancelled"):
                return run
            if time.monotonic() > deadline:
                raise RuntimeError(f"Mage run {run_id} still {run['status']} after {timeout:.0f} s")
            time.sleep(0.5)
