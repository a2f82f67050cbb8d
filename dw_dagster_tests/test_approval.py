"""The approval rules of DESIGN.md §4, each one tried against the approval job."""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster import constants as c
from dw_dagster.models import Approval, ChangeSet, FileChange, utcnow
from dw_dagster.remediation import records
from dw_dagster.remediation.approval import approve_in_process, sign, signature_valid, valid_approval
from dw_dagster.remediation.sensors import build_remediation_sensor

OWNER = "dana.ortiz@grocer.example"
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-29")


def _cs(cs_id="cs-test000001", expires_in_h=24.0, version="v1", window=("2026-11-26", "2026-11-27")) -> ChangeSet:
    now = utcnow()
    return ChangeSet(
        id=cs_id, version=version, incident_id="inc-1", diagnosis_id="dg-1", domain="store_sales", proposer=c.PROPOSER,
        created_at=now, expires_at=now + dt.timedelta(hours=expires_in_h), approvers=[OWNER],
        cause_kind="late_rows_behind_watermark", summary="s", target_asset=["store_sales_line"], window=list(window),
        diff="", files=[FileChange(path="p.yaml", before_sha256="a", after_sha256="b")], rebuild_assets=[["fct"]],
    )


def _record(instance, cs: ChangeSet) -> None:
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(cs.target_asset),
        metadata={c.CHANGE_SET_KEY: dg.MetadataValue.json(cs.model_dump(mode="json")), c.CHANGE_SET_ID_KEY: cs.id}))


@pytest.fixture
def instance(monkeypatch):
    monkeypatch.delenv("DW_DOMAINS_FILE", raising=False)
    with dg.instance_for_test() as inst:
        yield inst


@pytest.mark.parametrize("who,reason", [
    (c.PROPOSER, "proposed change set"),
    ("sam.lee@grocer.example", "is not an approver"),
], ids=["proposer", "not_listed"])
def test_refused_approvers(instance, who, reason):
    cs = _cs()
    _record(instance, cs)
    ok, msg = approve_in_process(instance, cs.id, who)
    assert not ok and reason in msg
    assert records.approvals(instance, cs.id) == []
    (refusal,) = records.refusals(instance, cs.id)
    assert refusal["approver"] == who.lower() and reason in refusal["reason"]


def test_expired_change_set_is_refused(instance):
    cs = _cs(expires_in_h=-1)
    _record(instance, cs)
    ok, msg = approve_in_process(instance, cs.id, OWNER)
    assert not ok and "expired" in msg
    assert valid_approval(instance, cs) is None


def test_unknown_change_set_and_bad_decision(instance):
    assert "no change set" in approve_in_process(instance, "cs-nope", OWNER)[1]
    _record(instance, _cs())
    assert "approve' or 'reject" in approve_in_process(instance, "cs-test000001", OWNER, decision="maybe")[1]


def test_owner_approves_once_and_the_approval_is_signed(instance):
    cs = _cs()
    _record(instance, cs)
    ok, _ = approve_in_process(instance, cs.id, "Dana.Ortiz@grocer.example ")
    assert ok
    (a,) = records.approvals(instance, cs.id)
    assert a.approver == OWNER and a.change_set_version == cs.version and signature_valid(a)
    assert valid_approval(instance, cs) == a
    ok, msg = approve_in_process(instance, cs.id, OWNER)
    assert not ok and "single-use" in msg


def test_rejection_ends_the_change_set(instance):
    cs = _cs()
    _record(instance, cs)
    assert approve_in_process(instance, cs.id, OWNER, decision="reject")[0]
    assert valid_approval(instance, cs) is None
    assert "already decided" in approve_in_process(instance, cs.id, OWNER)[1]


def test_an_edited_change_set_needs_a_new_approval(instance):
    cs = _cs()
    _record(instance, cs)
    assert approve_in_process(instance, cs.id, OWNER)[0]
    edited = _cs(version="v2", window=("2026-11-25", "2026-11-27"))
    _record(instance, edited)
    assert valid_approval(instance, records.find_change_set(instance, cs.id)) is None


def test_forged_or_copied_approvals_do_not_count(instance, monkeypatch):
    cs = _cs()
    _record(instance, cs)
    fields = dict(id="ap-forged", change_set_id=cs.id, change_set_version=cs.version, decision="approve",
                  approver=OWNER, decided_at=utcnow())
    forged = Approval(**fields, signature="0" * 64)
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(cs.target_asset), metadata={c.APPROVAL_KEY: dg.MetadataValue.json(forged.model_dump(mode="json"))}))
    assert valid_approval(instance, cs) is None
    # signed with another key (a replay from another deployment)
    monkeypatch.setenv(c.SIGNING_KEY_ENV, "another-deployment-key-000000")
    other = Approval(**fields, signature=sign(Approval(**fields, signature="").signing_payload()))
    monkeypatch.undo()
    assert not signature_valid(other)


def test_a_decision_under_a_wrong_key_does_not_use_up_the_owner_decision(instance, monkeypatch):
    """Someone with a wrong $DW_APPROVAL_SIGNING_KEY approves (or rejects): it is recorded but never
    counts, so the owner with the deployment's key can still decide, and the change set runs."""
    cs = _cs()
    _record(instance, cs)
    key = c.SIGNING_KEY_ENV
    deployment_key = __import__("os").environ[key]
    for decision, wrong_key in (("reject", "not-this-deployments-key-1234"), ("approve", "another-wrong-key-56789")):
        monkeypatch.setenv(key, wrong_key)
        assert approve_in_process(instance, cs.id, OWNER, decision)[0]  # it cannot know the key is wrong
        monkeypatch.setenv(key, deployment_key)
        assert valid_approval(instance, cs) is None
    ok, msg = approve_in_process(instance, cs.id, OWNER)
    assert ok, msg
    assert valid_approval(instance, cs) is not None
    ok, msg = approve_in_process(instance, cs.id, OWNER)
    assert not ok and "already decided" in msg  # the valid decision is single-use


def test_no_signing_key_no_approval(instance, monkeypatch):
    cs = _cs()
    _record(instance, cs)
    monkeypatch.delenv(c.SIGNING_KEY_ENV)
    ok, msg = approve_in_process(instance, cs.id, OWNER)
    assert not ok and c.SIGNING_KEY_ENV in msg


def test_remediation_sensor_waits_for_approval(instance):
    cs = _cs()
    _record(instance, cs)
    window_job = dg.define_asset_job("w", selection=["store_sales_line"], partitions_def=DAILY)
    rebuild_job = dg.define_asset_job("r", selection=["fct"])
    verify_job = dg.define_asset_job("v", selection=["store_sales_line"])

    @dg.job(name="receipts")
    def receipt_job():
        pass

    sensor = build_remediation_sensor(partitions_def=DAILY, window_job=window_job, rebuild_job=rebuild_job,
                                      verify_job=verify_job, receipt_job=receipt_job)
    assert not sensor.evaluate_tick(dg.build_sensor_context(instance=instance)).run_requests
    assert approve_in_process(instance, cs.id, OWNER)[0]
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance)).run_requests
    a = valid_approval(instance, cs)
    assert rr.run_key == f"{cs.id}:{a.id}:window-1"
    assert rr.tags["dagster/asset_partition_range_start"] == "2026-11-26"
    assert rr.tags["dagster/asset_partition_range_end"] == "2026-11-27"
    assert rr.job_name == "w" and rr.asset_selection == [dg.AssetKey("store_sales_line")]


def test_c22_a_second_change_set_for_the_same_window_runs_after_a_failed_one(instance):
    """PUBLIC_CASES C22: P1's window run fails; P2 for the same partitions, approved after the fix,
    launches (run keys come from change set + approval, not from the partitions), and P1 stays stopped."""
    p1, p2 = _cs("cs-p1000000001"), _cs("cs-p2000000002")
    window_job = dg.define_asset_job("w", selection=["store_sales_line"], partitions_def=DAILY)

    @dg.job(name="receipts")
    def receipt_job():
        pass

    sensor = build_remediation_sensor(partitions_def=DAILY, window_job=window_job,
                                      rebuild_job=dg.define_asset_job("r", selection=["fct"]),
                                      verify_job=dg.define_asset_job("v", selection=["store_sales_line"]), receipt_job=receipt_job)
    _record(instance, p1)
    assert approve_in_process(instance, p1.id, OWNER)[0]
    (rr1,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance)).run_requests

    @dg.op
    def load_window():
        raise RuntimeError("source connection reset")

    @dg.job(name="w_failing")
    def failing():
        load_window()

    res = failing.execute_in_process(instance=instance, raise_on_error=False, tags=rr1.tags)
    assert not res.success
    tick = sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
    assert not tick.run_requests  # P1 never goes on to the rebuild, and is not retried under its old key
    _record(instance, p2)
    assert approve_in_process(instance, p2.id, OWNER)[0]
    (rr2,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance)).run_requests
    a2 = valid_approval(instance, p2)
    assert rr2.run_key == f"{p2.id}:{a2.id}:window-1" != rr1.run_key
    assert (rr2.tags["dagster/asset_partition_range_start"], rr2.tags["dagster/asset_partition_range_end"]) == \
        (rr1.tags["dagster/asset_partition_range_start"], rr1.tags["dagster/asset_partition_range_end"])
