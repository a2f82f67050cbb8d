"""A Dagster deployment as separate processes: a code server per location, the webserver, the daemon.

``dagster dev`` runs all of them under one parent that exits when one of them dies, so a test that
kills the daemon would lose the webserver too. :func:`dagster_services` starts them the way a
production deployment does, each a process of its own on 127.0.0.1 (free ports chosen at run time):

- one ``dagster api grpc`` code server per location, each with its *own* environment (the same
  module may be loaded twice, under two location names, on two homes: a staging copy);
- ``dagster-webserver`` and ``dagster-daemon run`` on a workspace file naming those servers
  (``grpc_server`` entries), so both reach the same code servers, and the run workers the default
  run launcher starts are children of the code server of the run's location;
- the daemon can be killed (by the test, by the pid a run's events name) and started again with
  :meth:`DagsterServices.restart_daemon`, while the webserver and the code servers keep running.

Every process runs in its own process group and is stopped on exit (SIGTERM, then SIGKILL); any
process with this ``DAGSTER_HOME`` left afterwards is killed and listed in ``stragglers``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from dw_dagster_tests.harness.dagster_dev import BIN, DagsterDev, DagsterDevError, _processes_with_env, _wait, free_port


@dataclass(frozen=True)
class Location:
    """A code location: its name, the module and attribute of its definitions, and its own environment additions."""

    name: str
    module: str
    attribute: str = "defs"
    env: Mapping[str, str] = field(default_factory=dict)


def _start(argv: list[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, cwd=cwd, env={"DW_SENSOR_INTERVAL_SECONDS": "5", **env}, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(proc: subprocess.Popen | None, timeout: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class DagsterServices(DagsterDev):
    """The webserver (``proc``), the daemon and the code servers; GraphQL helpers from :class:`DagsterDev`."""

    daemon: subprocess.Popen | None = None
    code_servers: dict[str, subprocess.Popen] = field(default_factory=dict)
    workspace: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    daemon_starts: int = 0

    def start_daemon(self) -> None:
        """Start ``dagster-daemon run`` (after a kill, a new one) and wait until its sensor daemon is healthy."""
        self.daemon_starts += 1
        log = self.cwd / f"daemon_{self.daemon_starts}.log"
        started = time.time()
        self.daemon = _start([str(BIN / "dagster-daemon"), "run", "-w", str(self.workspace)], self.env, self.cwd, log)
        # a killed daemon's last heartbeat may still look fresh: wait for one written after this start
        _wait(lambda: self.daemon.poll() is None and self._sensor_heartbeat() >= started, 180,
              "the new daemon's sensor heartbeat", self)

    def _sensor_heartbeat(self) -> float:
        data = self.graphql('{ instance { daemonHealth { daemonStatus(daemonType: "SENSOR") { healthy '
                            'lastHeartbeatTime } } } }')
        st = data["instance"]["daemonHealth"]["daemonStatus"]
        return float(st["lastHeartbeatTime"] or 0) if st["healthy"] else 0.0

    def kill_daemon(self) -> int:
        """SIGKILL the daemon (as a crash would); returns its pid."""
        pid = self.daemon.pid
        os.killpg(pid, signal.SIGKILL)
        self.daemon.wait(30)
        return pid

    def restart_daemon(self) -> None:
        """A new daemon process after the last one died."""
        self.start_daemon()

    def log_tail(self, lines: int = 60) -> str:
        parts = []
        for p in sorted(self.cwd.glob("*.log")):
            try:
                tail = p.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {p.name}\n" + "\n".join(tail))
        return "\n".join(parts)


@contextmanager
def dagster_services(dagster_home: Path, env: Mapping[str, str], cwd: Path, locations: list[Location], *,
                     startup_timeout: float = 300) -> Iterator[DagsterServices]:
    """Start the code servers, the webserver and the daemon (module docstring); stop them all on exit.

    ``env`` is the base environment of every process (``DAGSTER_HOME`` is set to ``dagster_home``);
    each location's ``env`` is added for its code server (and so for its run workers).
    """
    base = {**env, "DAGSTER_HOME": str(dagster_home)}
    ports = {loc.name: free_port() for loc in locations}
    workspace = cwd / "workspace_services.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [
        {"grpc_server": {"host": "127.0.0.1", "port": ports[loc.name], "location_name": loc.name}} for loc in locations]}))
    port = free_port()
    dev: DagsterServices | None = None
    servers: dict[str, subprocess.Popen] = {}
    try:
        for loc in locations:
            servers[loc.name] = _start(
                [str(BIN / "dagster"), "api", "grpc", "-m", loc.module, "-a", loc.attribute, "-h", "127.0.0.1",
                 "-p", str(ports[loc.name]), "--location-name", loc.name],
                {**base, **loc.env}, cwd, cwd / f"code_server_{loc.name}.log")
        web = _start([str(BIN / "dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)],
                     base, cwd, cwd / "webserver.log")
        dev = DagsterServices(proc=web, port=port, log_path=cwd / "webserver.log", dagster_home=dagster_home,
                              code_servers=servers, workspace=workspace, env=base, cwd=cwd)
        t0 = time.monotonic()
        _wait(lambda: httpx.get(f"{dev.url}/server_info", timeout=5).status_code == 200, startup_timeout,
              "the webserver", dev)
        for loc in locations:
            def loaded(name: str = loc.name) -> bool:
                if servers[name].poll() is not None:
                    raise DagsterDevError(f"code server {name} exited\n{dev.log_tail()}")
                status, error = dev.location_status(name)
                if error and "UNAVAILABLE" not in error and "Could not reach" not in error:
                    raise AssertionError(f"code location {name} failed to load: {error}\n{dev.log_tail()}")
                if status == "LOADED" and error is None:
                    return True
                if error:  # the server was still starting when the webserver asked: ask it to look again
                    dev.client.reload_repository_location(name)
                return False

            _wait(loaded, max(60.0, startup_timeout - (time.monotonic() - t0)), f"code location {loc.name}", dev, 2.0)
        dev.start_daemon()
        yield dev
    finally:
        if dev is not None:
            _stop(dev.daemon)
            _stop(dev.proc)
        for proc in servers.values():
            _stop(proc)
        left = _processes_with_env("DAGSTER_HOME", str(dagster_home))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if dev is not None:
            dev.stragglers = left


__all__ = ["DagsterServices", "Location", "dagster_services"]
