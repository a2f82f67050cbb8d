"""The reminder and the revoke happen exactly once: across ticks, a restart, a lost evaluation, and
two daemons ticking the same instance at the same moment (two processes, real clocks).

Sources: a revoke that a restarted or duplicated scheduler repeats or loses is the failure
Opal/Vault lease revocation guards against (https://github.com/hashicorp/vault/issues/1948: one
mount's revocation errors blocking others; lease revocation must be retried, not dropped).
"""

import multiprocessing
import time

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.core.ledger import ledger_for
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_tests.access.flow import ANA, BO, SENSOR, build_world, services
from dw_dagster_tests.access.pg_world import pg_world


@pytest.fixture(scope="module")
def outside():
    with services() as s:
        yield s


@pytest.fixture
def w(outside, tmp_path, monkeypatch):
    idp, smtp, pager = outside
    with pg_world() as pg:
        world = build_world(pg, tmp_path, idp, smtp, pager, monkeypatch, reissue_after_seconds=0)
        yield world
        world.instance.dispose()
        world.db.dispose()


def _granted(w, **kw):
    req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], **kw))
    assert w.approve(req.change_sets[0], ANA)[0]
    w.tick()
    w.tick()
    assert ledger_for(w.instance).access_row(req.id).state == "active" and w.has("ledger")
    return req


def _revoke_runs(w) -> list[dg.DagsterRun]:
    return [r for r in w.instance.get_runs() if r.job_name == c.ACCESS_REVOKE_JOB]


def test_a_restarted_daemon_revokes_once_and_a_lost_evaluations_ticket_is_dead(w):
    req = _granted(w, duration_s=600)
    w.later(601)
    sensor = w.defs.resolve_sensor_def(SENSOR)
    lost = sensor.evaluate_tick(dg.build_sensor_context(instance=w.instance, definitions=w.defs))
    (rr,) = lost.run_requests  # evaluated (a ticket issued), then the daemon died before launching it
    restarted = LocalSensorDaemon(w.defs, w.instance, log_level="WARNING")
    tick = restarted.tick(SENSOR)  # the ticket nobody took is replaced (reissue_after_seconds=0)
    assert len(tick.run_ids) == 1 and ledger_for(w.instance).access_row(req.id).state == "revoked"
    revoke = w.defs.resolve_job_def(c.ACCESS_REVOKE_JOB)
    stale = revoke.execute_in_process(instance=w.instance, run_config=rr.run_config, tags=rr.tags, raise_on_error=False)
    assert not stale.success  # the lost evaluation's ticket was rotated away
    for _ in range(3):
        assert restarted.tick(SENSOR).run_ids == [] and w.daemon.tick(SENSOR).run_ids == []
    assert len([r for r in _revoke_runs(w) if r.status == dg.DagsterRunStatus.SUCCESS]) == 1
    version = ledger_for(w.instance).change_set_row(req.change_sets[0]).version
    assert sorted(ledger_for(w.instance).stages(req.change_sets[0], version)) == ["grant", "revoke-1"]


def _daemon(home: str, domains: str, url: str, smtp_port: int, stop: str, out) -> None:
    """One daemon process: the same code location on the same instance, ticking until ``stop`` exists."""
    from pathlib import Path

    from dw_dagster.access import build_access_definitions
    from dw_dagster.access.notify import EmailNotifier
    from dw_dagster.databases import DatabaseResource

    defs = build_access_definitions(databases={"warehouse": DatabaseResource(url=url)}, domains=domains,
                                    notifiers=[EmailNotifier(host="127.0.0.1", port=smtp_port)], minimum_interval_seconds=1)
    launched: dict[str, int] = {}
    deadline = time.time() + 240
    with dg.DagsterInstance.from_config(home) as instance:
        daemon = LocalSensorDaemon(defs, instance, log_level="ERROR")
        out.put("ready")
        while not Path(stop).exists() and time.time() < deadline:
            try:
                ran = daemon.tick(SENSOR).run_ids
            except Exception as e:  # noqa: BLE001 - a tick that fails (SQLite busy under three processes) is
                launched[f"tick error: {type(e).__name__}"] = launched.get(f"tick error: {type(e).__name__}", 0) + 1
                ran = []  # retried by the next tick, as the daemon does
            for run_id in ran:
                job = instance.get_run_by_id(run_id).job_name
                launched[job] = launched.get(job, 0) + 1
            time.sleep(0.2)
    out.put(launched)


def test_two_daemons_at_once_grant_once_remind_once_and_revoke_once(w, tmp_path):
    """Two daemon processes tick the same instance from before the approval to after the end: one
    grant run, one reminder, one revoke run between them."""
    from dw_dagster_tests.conftest import POSTGRES_URL

    stop = tmp_path / "stop"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_daemon, args=(str(w.home), str(w.domains_file), POSTGRES_URL, w.smtp_port, str(stop), out))
             for _ in range(2)]
    for p in procs:
        p.start()
    try:
        assert [out.get(timeout=180) for _ in procs] == ["ready", "ready"]
        before = len(w.inbox.messages)
        req, _ = w.request(w.spec(tables=[f"{w.pg.schema}.ledger"], duration_s=20))  # reminded 10 s before its end
        assert w.approve(req.change_sets[0], ANA)[0]
        deadline = time.monotonic() + 120
        while ledger_for(w.instance).access_row(req.id).state != "revoked" and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # a few more ticks of both daemons after the revoke
    finally:
        stop.write_text("")
        for p in procs:
            p.join(timeout=60)
    launched = [out.get(timeout=5) for _ in procs]
    total = {job: sum(x.get(job, 0) for x in launched) for job in (c.ACCESS_GRANT_JOB, c.ACCESS_REVOKE_JOB)}
    assert total == {c.ACCESS_GRANT_JOB: 1, c.ACCESS_REVOKE_JOB: 1}, launched
    row = ledger_for(w.instance).access_row(req.id)
    assert row.state == "revoked" and row.revoke_attempts == 1 and not w.has("ledger")
    mails = [m for m in w.inbox.messages[before:] if req.id in m["data"]]
    assert len(mails) == 1  # one reminder between the two daemons
    assert len(_revoke_runs(w)) == 1
