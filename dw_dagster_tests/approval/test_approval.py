"""The approval rules of DESIGN.md §4, each tried against the approval job and the ledger.

Identity through a real OIDC provider is in ``test_approval_identity.py``; these tests use a
domain that opted into ``identity: unverified`` where only the other rules are under test, and
show that every other domain refuses typed names.
"""

import datetime as dt
import multiprocessing
import textwrap

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import Approval, ChangeSet, FileChange, utcnow
from dw_dagster.core import records
from dw_dagster.approval.job import approve_in_process, valid_approval
from dw_dagster.core.signing import sign, signature_valid
from dw_dagster.proposals.change_sets import propose
from dw_dagster.repair.sensor import build_remediation_sensor

OWNER = "dana.ortiz@grocer.example"
DAILY = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-29")


def write_domains(path, *, identity="unverified", approvers=(OWNER,), cap=7) -> None:
    path.write_text(textwrap.dedent(f"""\
        domains:
          - name: store_sales
            assets: [[store_sales_line]]
            approvers: [{', '.join(approvers)}]
            max_window_partitions: {cap}
            identity: {identity}
        """))


def _cs(cs_id="cs-test000001", expires_in_h=24.0, window=("2026-11-26", "2026-11-27"), summary="s") -> ChangeSet:
    now = utcnow()
    return ChangeSet.seal(
        id=cs_id, incident_id="inc-1", diagnosis_id="dg-1", domain="store_sales", proposer=c.PROPOSER,
        created_at=now, expires_at=now + dt.timedelta(hours=expires_in_h), approvers=[OWNER],
        cause_kind="late_rows_behind_watermark", summary=summary, target_asset=["store_sales_line"], window=list(window),
        diff="", files=[FileChange(path="p.yaml", before_sha256="a", after_sha256="b")], rebuild_assets=[["fct"]],
    )


def _record(instance, cs: ChangeSet) -> ChangeSet:
    return propose(instance, cs)[0]


@pytest.fixture
def domains(tmp_path, monkeypatch):
    path = tmp_path / "domains.yaml"
    write_domains(path)
    monkeypatch.setenv("DW_DOMAINS_FILE", str(path))
    return path


@pytest.fixture
def instance(domains):
    with dg.instance_for_test() as inst:
        yield inst


@pytest.mark.parametrize("who,reason", [
    (c.PROPOSER, "proposed change set"),
    ("sam.lee@grocer.example", "is not an approver"),
], ids=["proposer", "not_listed"])
def test_refused_approvers(instance, who, reason):
    cs = _record(instance, _cs())
    ok, msg = approve_in_process(instance, cs.id, approver=who)
    assert not ok and reason in msg
    assert records.approvals(instance, cs.id) == []
    (refusal,) = records.refusals(instance, cs.id)
    assert refusal["approver"] == who.lower() and reason in refusal["reason"]


def test_a_verified_domain_refuses_a_typed_name(instance, domains):
    """The Launchpad attack: a colleague types the owner's email into the approval job's config."""
    write_domains(domains, identity="verified")
    cs = _record(instance, _cs())
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "needs a verified identity" in msg and "typed" in msg
    ok, msg = approve_in_process(instance, cs.id)
    assert not ok and "ID token is required" in msg
    assert records.approvals(instance, cs.id) == [] and valid_approval(instance, cs) is None


def test_expired_change_set_is_refused(instance):
    cs = _record(instance, _cs(expires_in_h=-1))
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "expired" in msg
    assert valid_approval(instance, cs) is None


def test_unknown_change_set_and_bad_decision(instance):
    assert "no change set" in approve_in_process(instance, "cs-nope", approver=OWNER)[1]
    _record(instance, _cs())
    assert "approve' or 'reject" in approve_in_process(instance, "cs-test000001", approver=OWNER, decision="maybe")[1]


def test_owner_approves_once_and_the_approval_is_signed(instance):
    cs = _record(instance, _cs())
    ok, _ = approve_in_process(instance, cs.id, approver="Dana.Ortiz@grocer.example ")
    assert ok
    (a,) = records.approvals(instance, cs.id)
    assert a.approver == OWNER and a.change_set_version == cs.version and signature_valid(a)
    assert a.identity.method == "unverified"
    assert valid_approval(instance, cs) == a
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "single-use" in msg


def test_rejection_ends_the_change_set(instance):
    cs = _record(instance, _cs())
    assert approve_in_process(instance, cs.id, approver=OWNER, decision="reject")[0]
    assert valid_approval(instance, cs) is None
    msg = approve_in_process(instance, cs.id, approver=OWNER)[1]
    assert "rejected" in msg


def test_an_edited_change_set_needs_and_gets_its_own_decision(instance):
    cs = _record(instance, _cs())
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    edited = _record(instance, _cs(window=("2026-11-25", "2026-11-27")))
    assert edited.version != cs.version
    assert valid_approval(instance, records.find_change_set(instance, cs.id)) is None
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)  # not "already decided": a new version
    assert ok, msg
    assert valid_approval(instance, records.find_change_set(instance, cs.id)).change_set_version == edited.version


def test_the_version_is_the_content_and_a_tampered_record_is_refused(instance):
    """Same id and version label, a 28-partition window (cap 7), no files: written straight into the
    storage. Its content does not hash to its version: refused and quarantined, never approved."""
    cs = _record(instance, _cs())
    assert cs.version == cs.computed_version() and len(cs.version) == 32
    forged = cs.model_copy(update={"window": [f"2026-11-{d:02d}" for d in range(1, 29)], "files": []})
    assert forged.computed_version() != forged.version
    led = ledger_for(instance)
    with led.engine.begin() as conn:
        from dw_dagster.core.ledger import change_sets_t

        conn.execute(change_sets_t.update().where(change_sets_t.c.change_set_id == cs.id).values(body=forged.model_dump_json()))
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "tampering" in msg
    assert records.find_change_set(instance, cs.id) is None
    assert any(q["ref"].startswith(f"change_set:{cs.id}") for q in records.quarantined(instance))


def test_a_change_set_only_in_the_event_log_counts_for_nothing(instance):
    """A dw/change_set observation the ledger never recorded (copied from another instance, written by
    hand) is not a proposal: it cannot be approved."""
    cs = _cs("cs-eventonly01")
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(cs.target_asset),
        metadata={c.CHANGE_SET_KEY: dg.MetadataValue.json(cs.model_dump(mode="json")), c.CHANGE_SET_ID_KEY: cs.id}))
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "no change set" in msg


def test_re_proposing_the_same_content_does_not_renew_the_expiry(instance):
    first = _record(instance, _cs(expires_in_h=1))
    later = _cs(expires_in_h=48)  # the same content proposed again (a re-executed diagnosis run)
    assert later.content_key() == first.content_key() and later.version != first.version
    recorded, new = propose(instance, later)
    assert not new and recorded.version == first.version and recorded.expires_at == first.expires_at
    assert len(records.change_sets(instance)) == 1


def test_the_domain_cap_is_checked_when_deciding(instance, domains):
    cs = _record(instance, _cs(window=("2026-11-24", "2026-11-25", "2026-11-26", "2026-11-27")))
    write_domains(domains, cap=3)
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "allows 3" in msg


def test_a_removed_approver_cannot_approve_and_their_approval_stops_counting(instance, domains):
    """The approvers that count are the domains file's as it is now, not the copy in the change set."""
    other = "sam.lee@grocer.example"
    write_domains(domains, approvers=(OWNER, other))
    cs = _record(instance, _cs())
    write_domains(domains, approvers=(other,))
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and "not an approver" in msg
    write_domains(domains, approvers=(OWNER, other))
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    assert valid_approval(instance, cs) is not None
    write_domains(domains, approvers=(other,))
    assert valid_approval(instance, cs) is None


def test_forged_or_copied_approvals_do_not_count(instance, monkeypatch):
    cs = _record(instance, _cs())
    fields = dict(id="ap-forged", change_set_id=cs.id, change_set_version=cs.version, decision="approve",
                  approver=OWNER, decided_at=utcnow())
    forged = Approval(**fields, signature="0" * 64)
    instance.report_runless_asset_event(dg.AssetObservation(
        asset_key=dg.AssetKey(cs.target_asset), metadata={c.APPROVAL_KEY: dg.MetadataValue.json(forged.model_dump(mode="json"))}))
    assert valid_approval(instance, cs) is None  # the event log is not where decisions count
    led = ledger_for(instance)
    assert led.record_decision(approval_id=forged.id, change_set_id=cs.id, version=cs.version, decision="approve",
                               approver=OWNER, method="oidc", decided_at=utcnow().timestamp(), body=forged.model_dump_json())
    assert valid_approval(instance, cs) is None  # written into the storage without the key: does not verify
    monkeypatch.setenv(c.SIGNING_KEY_ENV, "another-deployment-key-000000")
    other = Approval(**fields, signature=sign(Approval(**fields, signature="").signing_payload()))
    monkeypatch.undo()
    assert not signature_valid(other)


def test_no_signing_key_no_approval(instance, monkeypatch):
    cs = _record(instance, _cs())
    monkeypatch.delenv(c.SIGNING_KEY_ENV)
    ok, msg = approve_in_process(instance, cs.id, approver=OWNER)
    assert not ok and c.SIGNING_KEY_ENV in msg


def test_signing_key_from_a_file(instance, monkeypatch, tmp_path):
    key = tmp_path / "key"
    key.write_text("a-key-from-a-mounted-secret-0001\n")
    monkeypatch.delenv(c.SIGNING_KEY_ENV)
    monkeypatch.setenv("DW_APPROVAL_SIGNING_KEY_FILE", str(key))
    cs = _record(instance, _cs())
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    assert valid_approval(instance, cs) is not None
    monkeypatch.setenv(c.SIGNING_KEY_ENV, "test-signing-key-0123456789abcdef")
    assert valid_approval(instance, cs) is None  # signed with the file's key, not this one


def _sensor():
    window_job = dg.define_asset_job("w", selection=["store_sales_line"], partitions_def=DAILY)

    @dg.job(name="receipts")
    def receipt_job():
        pass

    return build_remediation_sensor(partitions_def=DAILY, window_job=window_job,
                                    rebuild_job=dg.define_asset_job("r", selection=["fct"]),
                                    verify_job=dg.define_asset_job("v", selection=["store_sales_line"]),
                                    receipt_job=receipt_job)


def test_remediation_sensor_waits_for_approval_and_issues_one_ticket(instance):
    cs = _record(instance, _cs())
    sensor = _sensor()
    assert not sensor.evaluate_tick(dg.build_sensor_context(instance=instance)).run_requests
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance)).run_requests
    assert rr.run_key == f"{cs.id}:{cs.version[:16]}:window-1:{rr.tags['dw/ticket'][:10]}"
    assert rr.tags["dagster/asset_partition_range_start"] == "2026-11-26"
    assert rr.tags["dagster/asset_partition_range_end"] == "2026-11-27"
    assert rr.job_name == "w" and rr.asset_selection == [dg.AssetKey("store_sales_line")]
    stage = ledger_for(instance).stage_by_ticket(rr.tags["dw/ticket"])
    assert (stage.stage, stage.state, stage.job_name) == ("window-1", "issued", "w")
    (again,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance)).run_requests
    assert again.run_key == rr.run_key and again.tags["dw/ticket"] == rr.tags["dw/ticket"]  # same ticket, never a second


def _map_in_processes(ctx, n: int, fn, args: list) -> list:
    """``fn`` over ``args`` in ``n`` spawned processes, which then exit on their own (close and join).
    ``with Pool`` terminates them instead, and Dagster turns a SIGTERM into a KeyboardInterrupt, which
    can catch a worker mid-flush and leave the pool waiting for it for ever."""
    pool = ctx.Pool(n)
    try:
        return pool.map(fn, args)
    finally:
        pool.close()
        pool.join()


def _decide(args) -> tuple[bool, str]:
    home, cs_id, domains = args
    import os

    os.environ["DW_DOMAINS_FILE"] = domains
    with dg.DagsterInstance.from_config(home) as inst:
        return approve_in_process(inst, cs_id, approver=OWNER)


def test_concurrent_decisions_record_exactly_one(tmp_path, domains):
    """Six processes approve the same version at the same moment: exactly one decision is recorded."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)) as inst:
        cs = _record(inst, _cs())
    for trial in range(3):
        ctx = multiprocessing.get_context("spawn")
        results = _map_in_processes(ctx, 6, _decide, [(str(home), cs.id, str(domains))] * 6)
        oks = [r for r in results if r[0]]
        if trial == 0:
            assert len(oks) == 1, results
            assert all("single-use" in msg for ok, msg in results if not ok), results
        else:
            assert not oks
    with dg.DagsterInstance.from_config(str(home)) as inst:
        assert len(records.approvals(inst, cs.id)) == 1


def _decide_together(args) -> tuple[bool, str, bool]:
    """One process's approval, held at a barrier just before the ledger records it, so every process
    has passed every check (nobody decided yet) and they all write at the same moment."""
    home, cs_id, domains, barrier = args
    import os
    import threading

    from dw_dagster.core.ledger import Ledger

    os.environ["DW_DOMAINS_FILE"] = domains
    record = Ledger.record_decision
    met: list[bool] = []

    def together(self, **kw):
        try:
            barrier.wait(timeout=120)
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
        return record(self, **kw)

    Ledger.record_decision = together
    with dg.DagsterInstance.from_config(home) as inst:
        ok, msg = approve_in_process(inst, cs_id, approver=OWNER)
    return ok, msg, met == [True]


def test_concurrent_decisions_on_the_postgres_ledger_record_exactly_one(tmp_path, domains):
    """dagster-postgres storage (the ledger's tables in the same PostgreSQL database): four processes
    pass every check of the same approval and reach the ledger at the same moment (a barrier right
    before the write): exactly one decision is recorded, the others are told it is single-use."""
    from dw_dagster.core.ledger import ledger_url
    from dw_dagster_tests.harness.dagster_dev import postgres_database, write_instance_yaml

    with postgres_database() as url:
        home = tmp_path / "home"
        write_instance_yaml(home, url)
        with dg.DagsterInstance.from_config(str(home)) as inst:
            assert ledger_url(inst).startswith("postgresql")
            cs = _record(inst, _cs())
        ctx = multiprocessing.get_context("spawn")
        with ctx.Manager() as manager:
            barrier = manager.Barrier(4)
            results = _map_in_processes(ctx, 4, _decide_together, [(str(home), cs.id, str(domains), barrier)] * 4)
        assert all(met for _, _, met in results), results  # all four were between their checks and the write at once
        oks = [r for r in results if r[0]]
        assert len(oks) == 1, results
        assert all("single-use" in msg for ok, msg, _ in results if not ok), results
        with dg.DagsterInstance.from_config(str(home)) as inst:
            assert len(records.approvals(inst, cs.id)) == 1
            assert [d["active"] for d in ledger_for(inst).decisions(cs.id)] == [True]
            assert ledger_for(inst).change_set_row(cs.id).state == "approved"

