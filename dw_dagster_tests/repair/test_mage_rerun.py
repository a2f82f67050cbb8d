"""The Mage rerun a change set names for the engineer, and the verify stage's bounded wait for it,
against the fake Mage (the real server: ``dw_dagster_tests/integrations/test_mage_real.py``)."""

import datetime as dt
import time

import dagster as dg
import pytest

from dw_dagster.core.http import RetryPolicy
from dw_dagster.core.models import ChangeSet, ChangeStep, utcnow
from dw_dagster.integrations.mage import MageClient, MageResource
from dw_dagster.changes.manual_steps import MAGE_RERUN_CHECK, mage_rerun_step, manual_steps_markdown
from dw_dagster.repair.mage_rerun import build_mage_rerun_check, wait_for_reruns
from dw_dagster.changes.steps import steps_markdown
from dw_dagster_dev.fakes.mage_server import DEFAULT_EMAIL, DEFAULT_PASSWORD, FakeMage, FakeMageServer
from dw_dagster_tests.harness.mage_server import MageAdmin

UTC = dt.timezone.utc
FAST = RetryPolicy(attempts=2, base_wait_s=0.01, max_wait_s=0.02, timeout_s=3.0)


@pytest.fixture
def mage():
    with FakeMageServer(FakeMage()) as server:
        admin = MageAdmin(server.url, DEFAULT_EMAIL, DEFAULT_PASSWORD)
        uuid, trigger_id, token = admin.batch_pipeline("finance_daily")
        yield server, admin, uuid, trigger_id, token


def client(server) -> MageClient:
    return MageClient(server.url, email=DEFAULT_EMAIL, password=DEFAULT_PASSWORD, policy=FAST)


class Clock:
    def __init__(self) -> None:
        self.t, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_the_rerun_step_names_the_pipeline_the_order_the_call_and_the_link():
    step = mage_rerun_step("finance_daily", ["migration-1", "replay-2"], ui_url="http://mage.internal:6789/",
                           check=["orders", MAGE_RERUN_CHECK])
    assert step.summary.startswith("rerun `finance_daily` in Mage after steps 1–2 (migration-1, replay-2)")
    assert step.command == 'mage-agent run_pipeline {"pipeline_uuid": "finance_daily"}'
    assert step.url == "http://mage.internal:6789/pipelines/finance_daily/triggers"
    assert (step.kind, step.system, step.target, step.check) == ("mage_rerun", "mage", "finance_daily",
                                                                 ["orders", "mage_rerun"])
    assert mage_rerun_step("x", ["replay-1"]).summary.startswith("rerun `x` in Mage after step 1 (replay-1)")
    assert mage_rerun_step("x", []).url is None


def _change_set(**more) -> ChangeSet:
    now = utcnow()
    return ChangeSet.seal(id="cs-1", incident_id="inc-1", diagnosis_id="dg-1", domain="orders", proposer="dw-dagster",
                          created_at=now, expires_at=now + dt.timedelta(hours=1), approvers=["a@x"], cause_kind="k",
                          summary="s", target_asset=["orders"], window=[], diff="", files=[], rebuild_assets=[], **more)


def test_manual_steps_are_sealed_in_the_version_and_an_empty_list_keeps_old_versions():
    plain = _change_set()
    # a change set recorded before manual steps existed hashes without the field
    legacy = plain.model_dump(mode="json")
    del legacy["manual_steps"]
    assert ChangeSet.content_version(legacy) == plain.version
    with_rerun = _change_set(manual_steps=[mage_rerun_step("finance_daily", ["replay-1"])])
    with_rerun.verify_version()
    assert with_rerun.version != plain.version and with_rerun.content_key() != plain.content_key()
    altered = with_rerun.model_copy(update={"manual_steps": []})
    with pytest.raises(ValueError, match="altered"):
        altered.verify_version()
    md = manual_steps_markdown(with_rerun)
    assert "1. rerun `finance_daily` in Mage after step 1 (replay-1)" in md and "mage-agent run_pipeline" in md
    assert manual_steps_markdown(plain) == ""
    step = ChangeStep(kind="replay", change_class="replay_dead_letter", summary="replay", resource_key="warehouse")
    assert md in steps_markdown(_change_set(steps=[step], manual_steps=with_rerun.manual_steps))
    assert "For the engineer" not in steps_markdown(_change_set(steps=[step]))


def test_a_completed_rerun_after_the_last_step_passes(mage):
    server, admin, uuid, trigger_id, token = mage
    admin.wait_finished(admin.trigger(trigger_id, token)["id"])  # before the data steps: not the rerun
    time.sleep(1.1)  # Mage's created_at has whole seconds
    after = dt.datetime.now(UTC)
    run = admin.trigger(trigger_id, token)
    (o,) = wait_for_reruns(client(server), [uuid], after, timeout_s=20, poll_s=0.2)
    assert (o["passed"], o["run_id"], o["status"]) == (True, run["id"], "completed")
    assert o["reason"].startswith(f"run {run['id']} completed") and o["url"].endswith(f"/pipelines/{uuid}/runs/{run['id']}")


def test_a_failed_rerun_fails_with_its_reason(mage):
    server, admin, uuid, trigger_id, token = mage
    after = dt.datetime.now(UTC)
    run = admin.trigger(trigger_id, token, fail="finance_daily: duplicate order_id 1042")
    (o,) = wait_for_reruns(client(server), [uuid], after, timeout_s=20, poll_s=0.2)
    assert (o["passed"], o["run_id"], o["status"]) == (False, run["id"], "failed")
    assert o["reason"] == f"run {run['id']} failed (block load_orders failed: finance_daily: duplicate order_id 1042)"


def test_no_rerun_within_the_timeout_fails_saying_how_to_rerun(mage):
    server, admin, uuid, *_ = mage
    clock = Clock()
    (o,) = wait_for_reruns(client(server), [uuid], dt.datetime.now(UTC), timeout_s=3, poll_s=1, sleep=clock.sleep,
                           monotonic=clock.monotonic)
    assert not o["passed"] and o["run_id"] is None and clock.sleeps == [1, 1, 1]
    assert "no run of finance_daily was started after the last data step" in o["reason"] and "within 3 s" in o["reason"]
    assert 'mage-agent run_pipeline {"pipeline_uuid": "finance_daily"}' in o["reason"]


def test_a_rerun_still_running_at_the_timeout_fails(mage):
    server, admin, uuid, trigger_id, token = mage
    server.state.pickup_s = 60  # the scheduler has not picked it up yet
    after = dt.datetime.now(UTC)
    run = admin.trigger(trigger_id, token)
    clock = Clock()
    (o,) = wait_for_reruns(client(server), [uuid], after, timeout_s=2, poll_s=1, sleep=clock.sleep,
                           monotonic=clock.monotonic)
    assert (o["passed"], o["run_id"], o["status"]) == (False, run["id"], "initial")
    assert o["reason"] == f"run {run['id']} still initial after 2 s (the wait's bound)"


def test_mage_unreachable_fails_the_wait_with_its_error(mage):
    server, admin, uuid, *_ = mage
    url = server.url
    server.stop()
    (o,) = wait_for_reruns(MageClient(url, policy=FAST), [uuid], dt.datetime.now(UTC), timeout_s=1, poll_s=1)
    assert not o["passed"] and o["reason"].startswith("Mage could not be read") and url in o["reason"]


def test_the_check_run_by_hand_records_the_outcome_in_its_metadata(mage, tmp_path):
    server, admin, uuid, trigger_id, token = mage
    bad = admin.wait_finished(admin.trigger(trigger_id, token, fail="boom")["id"])
    check = build_mage_rerun_check(asset="orders", pipelines=[uuid], timeout_s=5, poll_s=0.2)
    defs = dg.Definitions(assets=[dg.AssetSpec("orders")], asset_checks=[check],
                          jobs=[dg.define_asset_job("verify", selection=dg.AssetSelection.checks(*check.check_keys))],
                          resources={"mage": MageResource(url=server.url, email=DEFAULT_EMAIL, password=DEFAULT_PASSWORD)})
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        res = defs.resolve_job_def("verify").execute_in_process(instance=instance)
        (ev,) = [e.event_specific_data for e in res.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    md = {k: getattr(v, "value", v) for k, v in ev.metadata.items()}
    assert not ev.passed and "Mage rerun not proven" in ev.description and "boom" in ev.description
    assert (md["dw/mage_pipeline"], md["dw/mage_run_id"], md["dw/mage_status"]) == (uuid, bad["id"], "failed")
    assert md["dw/mage_reruns_json"][0]["reason"] == f"run {bad['id']} failed (block load_orders failed: boom)"
