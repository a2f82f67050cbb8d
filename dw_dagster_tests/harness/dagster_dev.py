"""Start and stop a real ``dagster dev`` (webserver + daemon + code server) for end-to-end tests.

:func:`dagster_dev` starts ``dagster dev -w workspace.yaml`` on 127.0.0.1 with a free port chosen at
run time, in its own process group, against the ``DAGSTER_HOME`` it is given, and waits until the
code location is loaded and the daemon's sensor thread is healthy. On exit it stops it: SIGINT to
``dagster dev`` (as Ctrl-C would; it shuts its webserver, daemon and code server down), then
SIGTERM and SIGKILL to the process group only if something is left; any process with that
``DAGSTER_HOME`` that outlived the group is killed and reported in ``DagsterDev.stragglers``.

:func:`write_instance_yaml` writes the instance's ``dagster.yaml`` (SQLite by default, or
``storage: postgres`` as production deployments run); :func:`postgres_database` makes a fresh
database on the loopback PostgreSQL server and drops it afterwards.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKSPACE = REPO / "workspace.yaml"
BIN = Path(sys.executable).parent
LOCATION = "store_sales"
REPOSITORY = "__repository__"  # the repository name Dagster gives a Definitions object
POSTGRES_SERVER = os.environ.get("DW_TEST_POSTGRES_SERVER", "postgresql://postgres@127.0.0.1:5432")


class DagsterDevError(RuntimeError):
    """dagster dev did not start, or a GraphQL call failed; the message carries the log's tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_instance_yaml(dagster_home: Path, postgres_url: str | None = None) -> Path:
    """``dagster.yaml`` for a test instance: SQLite (Dagster's default) or ``storage: postgres``.

    The run coordinator is ``dw_dagster.GuardedRunCoordinator`` (the deployment the README asks
    for); runs are dequeued every second instead of every 5 s; telemetry is off.
    """
    config: dict[str, Any] = {
        "telemetry": {"enabled": False},
        # dw_dagster's coordinator: Dagster's queued one that refuses runs bypassing an approval
        "run_coordinator": {"module": "dw_dagster.guard", "class": "GuardedRunCoordinator",
                            "config": {"dequeue_interval_seconds": 1}},
    }
    if postgres_url:
        # dagster-postgres is written for psycopg2 (it binds NOTIFY's payload as a parameter, which
        # psycopg 3's server-side binding rejects), and SQLAlchemy 2.1 picks psycopg 3 for a bare
        # postgresql:// when it is installed (it is: the postgres extra): name the driver.
        if postgres_url.startswith("postgresql://"):
            postgres_url = "postgresql+psycopg2://" + postgres_url.removeprefix("postgresql://")
        config["storage"] = {"postgres": {"postgres_url": postgres_url}}
    dagster_home.mkdir(parents=True, exist_ok=True)
    path = dagster_home / "dagster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextmanager
def postgres_database(server: str = POSTGRES_SERVER) -> Iterator[str]:
    """A fresh database ``dw_dagster_test_<random>`` on ``server``; yields its URL, drops it after."""
    import psycopg

    name = f"dw_dagster_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _processes_with_env(key: str, value: str) -> list[int]:
    """Pids of live processes whose environment holds ``key=value`` (Linux /proc)."""
    needle = f"{key}={value}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                stat = (d / "stat").read_text()
                if stat[stat.rindex(")") + 2] != "Z":  # zombies are already gone
                    out.append(int(d.name))
        except OSError:
            continue
    return out


@dataclass
class DagsterDev:
    """A running ``dagster dev``: its URL, GraphQL helpers, and its log."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    dagster_home: Path
    host: str = "127.0.0.1"
    stragglers: list[int] = field(default_factory=list)  # set on exit: pids that outlived the process group
    _client: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def client(self):
        """``dagster_graphql.DagsterGraphQLClient`` on this webserver."""
        if self._client is None:
            from dagster_graphql import DagsterGraphQLClient

            self._client = DagsterGraphQLClient(self.host, port_number=self.port, timeout=120)
        return self._client

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None, timeout: float = 120) -> dict:
        """POST one GraphQL document; returns ``data``; raises on transport or GraphQL errors."""
        r = httpx.post(f"{self.url}/graphql", json={"query": query, "variables": dict(variables or {})}, timeout=timeout)
        if r.status_code >= 400:
            raise DagsterDevError(f"GraphQL HTTP {r.status_code}: {r.text[:3000]}\n{self.log_tail(40)}")
        body = r.json()
        if body.get("errors"):
            raise DagsterDevError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def location_status(self, location: str = LOCATION) -> tuple[str, str | None]:
        """(loadStatus, error message or None) of a code location (default store_sales)."""
        data = self.graphql("""{ workspaceOrError { __typename ... on Workspace { locationEntries {
            name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }""")
        for e in data["workspaceOrError"].get("locationEntries", []):
            if e["name"] == location:
                err = e["locationOrLoadError"]
                return e["loadStatus"], (err or {}).get("message")
        return "MISSING", None

    def daemon_statuses(self) -> dict[str, bool]:
        data = self.graphql("{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }")
        return {d["daemonType"]: bool(d["healthy"]) for d in data["instance"]["daemonHealth"]["allDaemonStatuses"]
                if d["required"]}

    def start_sensor(self, name: str, location: str = LOCATION) -> str:
        """Set a sensor RUNNING through the ``startSensor`` mutation (what the UI's toggle does)."""
        data = self.graphql("""mutation Start($sel: SensorSelector!) { startSensor(sensorSelector: $sel) {
            __typename ... on Sensor { name sensorState { status } }
            ... on PythonError { message } ... on UnauthorizedError { message } ... on SensorNotFoundError { message } } }""",
                            {"sel": {"repositoryLocationName": location, "repositoryName": REPOSITORY, "sensorName": name}})
        res = data["startSensor"]
        if res["__typename"] != "Sensor":
            raise DagsterDevError(f"startSensor {name}: {res}")
        return res["sensorState"]["status"]

    def sensor_ticks(self, name: str, limit: int = 5, location: str = LOCATION) -> list[dict]:
        """The newest ticks of a sensor (status, skip reason, error, run ids)."""
        data = self.graphql("""query Ticks($sel: SensorSelector!, $limit: Int) { sensorOrError(sensorSelector: $sel) {
            __typename ... on Sensor { sensorState { status ticks(limit: $limit) {
              status timestamp skipReason runIds error { message } } } } } }""",
                            {"sel": {"repositoryLocationName": location, "repositoryName": REPOSITORY, "sensorName": name},
                             "limit": limit})
        res = data["sensorOrError"]
        return res["sensorState"]["ticks"] if res["__typename"] == "Sensor" else [res]

    def submit_job(self, job_name: str, run_config: Mapping[str, Any] | None = None, tags: Mapping[str, str] | None = None,
                   op_selection: list[str] | None = None, location: str = LOCATION) -> str:
        """Launch a job of a code location (default store_sales) through ``DagsterGraphQLClient.submit_job_execution``;
        returns the run id."""
        return self.client.submit_job_execution(job_name, repository_location_name=location, repository_name=REPOSITORY,
                                                run_config=dict(run_config or {}), tags=dict(tags or {}),
                                                op_selection=op_selection)

    def sensor_dry_run(self, name: str, location: str = LOCATION, cursor: str | None = None) -> dict:
        """GraphQL ``sensorDryRun`` (the UI's "Test sensor"): ``{"runRequests": [...], "skipReason", "error"}``."""
        data = self.graphql("""mutation Dry($sel: SensorSelector!, $cursor: String) {
            sensorDryRun(selectorData: $sel, cursor: $cursor) { __typename
              ... on DryRunInstigationTick { evaluationResult { skipReason error { message }
                runRequests { runKey jobName runConfigYaml tags { key value } assetSelection { path } } } }
              ... on PythonError { message } ... on SensorNotFoundError { message } } }""",
                            {"sel": {"repositoryLocationName": location, "repositoryName": REPOSITORY, "sensorName": name},
                             "cursor": cursor})
        res = data["sensorDryRun"]
        if res["__typename"] != "DryRunInstigationTick":
            raise DagsterDevError(f"sensorDryRun {name}: {res}")
        return res["evaluationResult"]

    def launch_run(self, job_name: str, *, location: str = LOCATION, tags: Mapping[str, str] | None = None,
                   run_config: Mapping[str, Any] | None = None, asset_selection: list[list[str]] | None = None,
                   check_selection: list[tuple[list[str], str]] | None = None) -> str:
        """GraphQL ``launchRun`` with any tags, config and asset / asset-check selection (what a Dagster user
        can send); returns the run id (the run may be refused later by the coordinator)."""
        selector: dict[str, Any] = {"repositoryLocationName": location, "repositoryName": REPOSITORY, "jobName": job_name}
        if asset_selection is not None:
            selector["assetSelection"] = [{"path": list(p)} for p in asset_selection]
        if check_selection is not None:
            selector["assetCheckSelection"] = [{"assetKey": {"path": list(p)}, "name": n} for p, n in check_selection]
        data = self.graphql("""mutation Launch($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
            ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } ... on InvalidSubsetError { message }
            ... on RunConfigValidationInvalid { errors { message } } ... on UnauthorizedError { message } } }""",
                            {"p": {"selector": selector, "runConfigData": dict(run_config or {}),
                                   "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}}})
        res = data["launchRun"]
        if res["__typename"] != "LaunchRunSuccess":
            raise DagsterDevError(f"launchRun {job_name} in {location}: {res}")
        return res["run"]["runId"]

    def reload_location(self) -> None:
        """Reload the code location (``reloadRepositoryLocation``), as after a merge; raises on failure."""
        from dagster_graphql import ReloadRepositoryLocationStatus

        info = self.client.reload_repository_location(LOCATION)
        if info.status != ReloadRepositoryLocationStatus.SUCCESS:
            raise DagsterDevError(f"reload of {LOCATION} failed: {info.failure_type}: {info.message}")

    def stop(self, timeout: float = 60) -> list[int]:
        """Stop dagster dev and everything it started; returns pids that had to be killed after the group.

        SIGINT goes to the ``dagster dev`` process only (as Ctrl-C would reach it): it tells the
        webserver and the daemon to shut down over their pipes and stops the code server. Only if
        the group outlives that, SIGTERM and then SIGKILL go to the whole process group.
        """
        pgid = self.proc.pid  # started with start_new_session: the group id is its pid
        steps = ((lambda: os.kill(self.proc.pid, signal.SIGINT), timeout),
                 (lambda: os.killpg(pgid, signal.SIGTERM), 15.0),
                 (lambda: os.killpg(pgid, signal.SIGKILL), 10.0))
        for send, wait in steps:
            try:
                send()
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and (self.proc.poll() is None or _group_alive(pgid)):
                time.sleep(0.2)
            if self.proc.poll() is not None and not _group_alive(pgid):
                break
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        stragglers = _processes_with_env("DAGSTER_HOME", str(self.dagster_home))
        for pid in stragglers:  # started (indirectly) by us: same DAGSTER_HOME, outside the group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return stragglers


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # members may be zombies of an exited parent; count only live ones
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        if rest[0] != "Z" and int(rest[2]) == pgid:
            return True
    return False


def _wait(cond: Callable[[], Any], timeout: float, what: str, dev: DagsterDev, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if dev.proc.poll() is not None:
            raise DagsterDevError(f"dagster dev exited with {dev.proc.returncode} while waiting for {what}\n{dev.log_tail()}")
        try:
            value = cond()
            if value:
                return value
        except (httpx.HTTPError, DagsterDevError) as e:
            last_error = e
        time.sleep(interval)
    raise DagsterDevError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last_error})\n{dev.log_tail()}")


@contextmanager
def dagster_dev(dagster_home: Path, env: Mapping[str, str], cwd: Path, *, workspace: Path = WORKSPACE,
                startup_timeout: float = 240, locations: tuple[str, ...] = (LOCATION,)) -> Iterator[DagsterDev]:
    """Run ``dagster dev`` for the duration of the block (see the module docstring).

    ``env`` is the whole environment of the process (``DAGSTER_HOME`` is set to ``dagster_home``).
    Its output goes to ``cwd/dagster_dev.log``. Raises :class:`DagsterDevError` when it does not
    come up (the webserver, each of ``locations`` loaded, a healthy sensor daemon). On exit, ``stragglers`` lists the processes with this ``DAGSTER_HOME`` that outlived
    the process group (killed then; a test asserts there are none).
    """
    port = free_port()
    log_path = cwd / "dagster_dev.log"
    # the loop sensors tick every 5 s instead of 30 (the example reads it; each repair stage waits for a tick)
    full_env = {"DW_SENSOR_INTERVAL_SECONDS": "5", **env, "DAGSTER_HOME": str(dagster_home)}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(BIN / "dagster"), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)],
            cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    dev = DagsterDev(proc=proc, port=port, log_path=log_path, dagster_home=dagster_home)
    try:
        t0 = time.monotonic()
        _wait(lambda: httpx.get(f"{dev.url}/server_info", timeout=5).status_code == 200, startup_timeout,
              "the webserver", dev)

        for location in locations:
            def loaded(location: str = location) -> bool:
                status, error = dev.location_status(location)
                if error:
                    raise AssertionError(f"code location {location} failed to load: {error}\n{dev.log_tail()}")
                return status == "LOADED"

            _wait(loaded, max(30.0, startup_timeout - (time.monotonic() - t0)), f"code location {location}", dev)
        _wait(lambda: dev.daemon_statuses().get("SENSOR"), max(30.0, startup_timeout - (time.monotonic() - t0)),
              "a healthy sensor daemon", dev)
        yield dev
    finally:
        dev.stragglers = dev.stop()
