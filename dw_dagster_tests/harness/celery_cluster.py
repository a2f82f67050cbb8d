"""A small Dagster deployment across processes: a code server, ``dagster-daemon``, celery workers.

What production runs on several machines, started here as child processes on one:

- :func:`code_server` — ``dagster api grpc`` serving one code location on a free loopback port,
  and the ``workspace.yaml`` pointing at it (the daemon and this process share the one server);
- :func:`dagster_daemon` — ``dagster-daemon run`` on that workspace: its queued-run coordinator
  daemon dequeues the runs the instance's run coordinator queued and the default run launcher
  starts each in a run worker process of the code server;
- :func:`celery_workers` — ``celery -A dagster_celery.app worker`` processes on the RabbitMQ
  broker: the celery executor of a run worker sends each step there;
- :func:`run_stages_in_daemon` — the remediation sensor started in that ``dagster-daemon``: its
  ticks run in the code server, so each ticket binds the location and the tick that dispatched it
  and every stage is submitted to the instance's run coordinator as in production.

Every process is started in its own process group with its log in a file; on exit it is stopped
the way an operator stops it (SIGTERM: celery's warm shutdown; SIGINT for the daemon and the code
server), waited for, and only killed if it outlives the grace period (then recorded in
``Proc.killed``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import yaml

from dw_dagster.testing.local_daemon import SENSOR_NAME_TAG
from dw_dagster_tests.harness.dagster_dev import BIN, free_port

#: the RabbitMQ broker every machine here runs (guest/guest on loopback)
BROKER = "pyamqp://guest:guest@127.0.0.1:5672//"
TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


class ClusterError(RuntimeError):
    """A process of the deployment did not start or a run did not end; the message carries its log."""


@dataclass
class Proc:
    """One child process: its command, log file and how it ended."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    returncode: int | None = None
    stop_seconds: float | None = None
    killed: bool = False
    worker_name: str = ""  # a celery worker's node name (``dw1-ab12cd@host``), read from its "ready." line
    leftover: list[str] = field(default_factory=list)  # command lines of group members alive after it ended

    def log_tail(self, lines: int = 40) -> str:
        try:
            return f"{self.name} log {self.log_path}:\n" + "\n".join(
                self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log for {self.name}: {e})"

    def stop(self, sig: int = signal.SIGTERM, grace: float = 60.0) -> None:
        """Send ``sig`` to the process, wait up to ``grace`` s, then kill its process group."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.killed = True
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.returncode = self.proc.returncode
        deadline = time.monotonic() + 10  # children (a celery pool process, a run worker) end just after
        while (left := _group_members(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stop_seconds = round(time.monotonic() - t0, 2)
        if left:
            self.leftover, self.killed = list(left.values()), True
            os.killpg(self.proc.pid, signal.SIGKILL)


def _group_members(pgid: int) -> dict[int, str]:
    """Live processes of process group ``pgid`` (Linux /proc): pid → command line."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
    return out


def _start(name: str, args: list[str], env: Mapping[str, str], root: Path) -> Proc:
    log_path = root / f"{name}.log"
    log = log_path.open("w")
    proc = subprocess.Popen(args, env={"DW_SENSOR_INTERVAL_SECONDS": "5", **env}, cwd=str(root), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    return Proc(name, proc, log_path)


def _wait_log(p: Proc, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in p.log_path.read_text(errors="replace"):
            return
        if p.proc.poll() is not None:
            raise ClusterError(f"{p.name} exited ({p.proc.returncode}) before '{needle}'\n{p.log_tail()}")
        time.sleep(0.3)
    raise ClusterError(f"{p.name}: no '{needle}' within {timeout} s\n{p.log_tail()}")


@dataclass
class CodeServer:
    proc: Proc
    port: int
    location: str
    workspace: Path


@contextmanager
def code_server(module: str, location: str, env: Mapping[str, str], root: Path, timeout: float = 120) -> Iterator[CodeServer]:
    """``dagster api grpc -m module -a defs`` on a free port, and ``root/workspace.yaml`` naming it."""
    port = free_port()
    p = _start("code_server", [str(BIN / "dagster"), "api", "grpc", "-m", module, "-a", "defs", "-h", "127.0.0.1",
                               "-p", str(port), "--location-name", location], env, root)
    ws = root / "workspace.yaml"
    ws.write_text(yaml.safe_dump({"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": port,
                                                                 "location_name": location}}]}))
    try:
        _wait_log(p, "Started Dagster code server", timeout)
        yield CodeServer(p, port, location, ws)
    finally:
        p.stop(signal.SIGINT)


@contextmanager
def dagster_daemon(workspace: Path, env: Mapping[str, str], root: Path, timeout: float = 120) -> Iterator[Proc]:
    """``dagster-daemon run -w workspace``; ready once its queued-run coordinator daemon runs."""
    p = _start("dagster_daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], env, root)
    try:
        _wait_log(p, "QueuedRunCoordinatorDaemon", timeout)
        yield p
    finally:
        p.stop(signal.SIGINT)


@contextmanager
def celery_workers(n: int, env: Mapping[str, str], root: Path, timeout: float = 120) -> Iterator[list[Proc]]:
    """``n`` celery workers of ``dagster_celery.app`` (one pool process each) on :data:`BROKER`.

    Each is named ``dw<k>-<random>@<host>`` (the name the celery executor records in its
    "Executing steps ... in celery worker" engine events), so a step another machine's worker ran
    would show. Yields once every worker logged that it is ready; stops them with SIGTERM (celery's
    warm shutdown: a running task finishes first).
    """
    tag = uuid.uuid4().hex[:6]
    env = {**env, "DAGSTER_CELERY_BROKER_HOST": "127.0.0.1"}
    with ExitStack() as stack:
        procs = []
        for k in range(1, n + 1):
            p = _start(f"celery_worker_{k}", [str(BIN / "celery"), "-A", "dagster_celery.app", "worker", "-Q", "dagster",
                                             "-n", f"dw{k}-{tag}@%h", "--concurrency", "1", "--prefetch-multiplier", "1",
                                             "--loglevel", "INFO", "--without-gossip", "--without-mingle"], env, root)
            stack.callback(p.stop, signal.SIGTERM)
            procs.append(p)
        for p in procs:
            _wait_log(p, " ready.", timeout)
            line = next(ln for ln in p.log_path.read_text().splitlines() if ln.endswith(" ready."))
            p.worker_name = line.rsplit(" ", 2)[-2]
        yield procs


def run_stages_in_daemon(instance: dg.DagsterInstance, workspace_context, location: str, *, change_set_id: str,
                         stage_tag: str, last_stage: str = "receipt", sensor_name: str = "dw_remediation_sensor",
                         timeout: float = 420.0) -> dict[str, str]:
    """Start ``sensor_name`` of code location ``location`` in the running ``dagster-daemon`` and wait
    until the stage ``last_stage`` of change set ``change_set_id`` succeeded.

    The daemon's sensor evaluation runs in the code server and records a tick; the remediation
    sensor issues each ticket for that location and tick, so every stage is a run the daemon
    reserved, submitted to the instance's run coordinator, dequeued and launched in a run worker.
    Stops the sensor before returning.

    Returns:
        stage name → run id, in the order the stages were launched.

    Raises:
        ClusterError: a stage run failed or was canceled, or ``last_stage`` did not succeed in time.
    """
    from dw_dagster.core.keys import CHANGE_SET_TAG

    request = workspace_context.create_request_context()
    (repo,) = request.get_code_location(location).get_repositories().values()
    sensor = repo.get_sensor(sensor_name)
    instance.start_sensor(sensor)
    stages: dict[str, str] = {}
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recs = instance.get_run_records(filters=dg.RunsFilter(tags={CHANGE_SET_TAG: change_set_id,
                                                                        SENSOR_NAME_TAG: sensor_name}))
            for run in (r.dagster_run for r in sorted(recs, key=lambda r: r.create_timestamp)):
                stage = run.tags.get(stage_tag)
                if run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
                    raise ClusterError(f"stage {stage}: run {run.run_id} {run.status.value}")
                if stage and run.status == dg.DagsterRunStatus.SUCCESS:
                    stages.setdefault(stage, run.run_id)
            if last_stage in stages:
                return stages
            time.sleep(1.0)
        ticks = instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id, limit=5)
        raise ClusterError(f"stage {last_stage} of {change_set_id} did not succeed within {timeout} s; stages "
                           f"{stages}; last ticks: {[(t.status.value, t.skip_reason, t.error) for t in ticks]}")
    finally:
        instance.stop_sensor(sensor.get_remote_origin_id(), sensor.selector_id, sensor)


