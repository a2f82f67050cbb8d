"""Undo of the orders change set (a migration and a replay) through its own approval: the replayed
keys are deleted and the relax is rolled back; the table's rows and checksum, and the column's
REQUIRED mode, are as they were before the change."""

import dagster as dg
import pytest

from dw_dagster.databases import DuckDBDatabase
from dw_dagster.core.domains import DOMAINS_FILE_ENV
from dw_dagster_examples.orders import home as h
from dw_dagster_examples.orders import paths as p
from dw_dagster_examples.orders.definitions import build_definitions
from dw_dagster_examples.orders.demo import OWNER, run_orders_demo
from dw_dagster_dev.demo import demo_login
from dw_dagster_dev.services import OidcProvider
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster.core import records
from dw_dagster.approval.job import approve_in_process
from dw_dagster.repair.undo import UndoError, propose, propose_undo

SCALE = 0.005


def _state(wh: DuckDBDatabase, where: str = "") -> tuple[int, int]:
    (n, h_), = wh.fetch_all("SELECT count(*), coalesce(sum(hash(CAST(o AS VARCHAR)) % 1000000007), 0) "
                            f"FROM analytics.orders AS o {where}")
    return int(n), int(h_)


def _required(wh: DuckDBDatabase) -> str:
    return wh.fetch_all("SELECT is_nullable FROM information_schema.columns WHERE table_schema = 'analytics' "
                        "AND table_name = 'orders' AND column_name = 'shipping_country'")[0][0]


@pytest.fixture(scope="module")
def repaired(tmp_path_factory):
    root = tmp_path_factory.mktemp("orders_undo")
    (root / "dagster_home").mkdir()
    with pytest.MonkeyPatch.context() as mp, dg.instance_for_test(temp_dir=str(root / "dagster_home")) as instance:
        mp.setenv(h.HOME_ENV, str(root / "home"))
        mp.delenv(DOMAINS_FILE_ENV, raising=False)
        mp.delenv(p.SCALE_ENV, raising=False)
        result = run_orders_demo(home=root / "home", instance=instance, scale=SCALE)
        assert result.ok
        yield result, instance, root / "home"


def test_undo_restores_rows_checksum_and_required_mode(repaired):
    result, instance, home = repaired
    wh = DuckDBDatabase(h.warehouse_path(home))
    (cs,) = [x for x in records.change_sets(instance) if x.cause_kind != "undo"]
    # the state before the change set: every row but the keys it replayed; the column REQUIRED
    before = _state(wh, "WHERE order_id NOT IN (SELECT order_id FROM analytics.orders_dlq_replayed)")
    assert _state(wh)[0] == before[0] + result.replayed_rows and _required(wh) == "YES"
    undo = propose_undo(instance, cs.id)
    assert [s.kind for s in undo.steps] == ["replay_undo", "migration_rollback"] and undo.change_classes == ["undo"]
    # finance_daily read the repaired table: the engineer reruns it in Mage after the undo's steps too
    assert [(m.target, m.after, m.check) for m in undo.manual_steps] == [
        ("finance_daily", ["replay_undo-1", "migration_rollback-2"], ["orders", "mage_rerun"])]
    propose(instance, (undo))
    daemon = LocalSensorDaemon(build_definitions(home), instance, log_level="WARNING")
    tick = daemon.tick("dw_remediation_sensor")
    assert tick.run_ids == [] and f"{undo.id}: waiting for approval" in tick.skip_reason
    with OidcProvider(home / "undo_idp", [OWNER]):  # the owner logs in to approve the undo, as for any change
        token = demo_login(p.domains_path(home), undo.id, OWNER, instance)
        ok, msg = approve_in_process(instance, undo.id, id_token=token, domains=p.domains_path(home))
    assert ok, msg
    stages = []
    for _ in range(8):
        tick = daemon.tick("dw_remediation_sensor")
        if not tick.run_ids and not tick.failed_run_ids:
            break
        run = instance.get_run_by_id((tick.run_ids or tick.failed_run_ids)[0])
        stages.append((run.tags["dw/stage"], run.status.value))
    assert [s for s, _ in stages[:2]] == ["replay_undo-1", "migration_rollback-2"]
    assert all(status == "SUCCESS" for _, status in stages[:2])
    assert _state(wh) == before and _required(wh) == "NO"
    pending = wh.fetch_all("SELECT count(*) FROM analytics.orders_dlq_pending")[0][0]
    assert pending == result.parked_rows  # the parked rows are pending again, nothing lost
    with pytest.raises(UndoError, match="already proposed"):
        propose_undo(instance, cs.id)
    with pytest.raises(UndoError, match="is itself an undo"):
        propose_undo(instance, undo.id)
