"""The Mage runs of an incident's window as diagnosis evidence, against the fake Mage (a real server:
``dw_dagster_tests/integrations/test_mage_real.py``)."""

import datetime as dt

import pytest

from dw_dagster.core.http import RetryPolicy
from dw_dagster.core.models import BlastRadius, CauseFinding, Diagnosis
from dw_dagster.diagnosis.job import diagnosis_markdown
from dw_dagster.diagnosis.mage_evidence import (
    GREEN_SENTENCE,
    PROBLEM_FACTOR,
    MageSource,
    apply_mage_evidence,
    read_mage_evidence,
)
from dw_dagster.integrations.mage import MageClient, MageError
from dw_dagster_dev.fakes.mage_server import DEFAULT_EMAIL, DEFAULT_PASSWORD, FakeMage, FakeMageServer

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 11, 24)  # the incident window, naive UTC as incidents carry it
T1 = dt.datetime(2026, 11, 25)
FAST = RetryPolicy(attempts=2, base_wait_s=0.01, max_wait_s=0.02, timeout_s=3.0)
SOURCE = MageSource(writes="orders_stream", reads=("finance_daily",))


def h(hours: float) -> dt.datetime:
    return (T0 + dt.timedelta(hours=hours)).replace(tzinfo=UTC)


@pytest.fixture
def mage():
    state = FakeMage()
    state.add_pipeline("orders_stream", type="streaming")
    state.add_pipeline("finance_daily")
    state.add_block("finance_daily", "load_orders")
    state.add_block("finance_daily", "gmv_by_day", "transformer", upstream_blocks=["load_orders"])
    with FakeMageServer(state) as server:
        yield server


def client(server) -> MageClient:
    return MageClient(server.url, email=DEFAULT_EMAIL, password=DEFAULT_PASSWORD, policy=FAST)


def finding(confidence: float = 0.9) -> CauseFinding:
    return CauseFinding(kind="required_null_dead_letter", summary="NULL in shipping_country → dead letter.",
                        confidence=confidence, explained_rows=39, unexplained_rows=0, details={"variant": "dead_letter"})


def test_a_healthy_stream_ran_green_throughout_and_the_batch_runs_are_listed(mage):
    s = mage.state
    stream = s.add_run("orders_stream", "running", h(-48))
    s.add_run("finance_daily", "completed", h(-22), h(-21.9))  # the night before: not in the window
    nightly = s.add_run("finance_daily", "completed", h(2), h(2.1))
    ev = read_mage_evidence(client(mage), SOURCE, (T0, T1), now=h(30))
    assert ev.details["green_throughout"] is True and ev.confidence_factor == 1.0
    assert ev.details["statuses"] == {"orders_stream": ["running"], "finance_daily": ["completed"]}
    assert GREEN_SENTENCE in ev.sentence and f"run {stream['id']} running" in ev.sentence
    assert f"downstream Mage pipeline finance_daily: run {nightly['id']} completed" in ev.sentence
    # the timeline: one line per run, by start, with status, start, end, block runs and the run's link
    tl = ev.details["timeline"]
    assert tl[0].startswith(f"Mage orders_stream run {stream['id']} running 2026-11-22 00:00:00Z → still running")
    assert tl[1].startswith(f"Mage finance_daily run {nightly['id']} completed 2026-11-24 02:00:00Z → 2026-11-24 02:06:00Z; "
                            "blocks: load_orders completed, gmv_by_day completed")
    assert tl[1].endswith(f"<{mage.url}/pipelines/finance_daily/runs/{nightly['id']}>")
    assert [e.description.split(":")[0] for e in ev.evidence] == [
        "Mage pipeline orders_stream (writes the table)", "Mage pipeline finance_daily (reads the table)"]
    assert ev.evidence[1].values["runs"][0]["block_runs"][1] == {"block": "gmv_by_day", "status": "completed", "error": None}

    f = apply_mage_evidence(finding(), ev)
    assert f.confidence == 0.9 and "Mage: the stream ran green throughout" in f.summary
    assert f.details["mage"]["writer"] == "orders_stream" and f.details["variant"] == "dead_letter"
    md = diagnosis_markdown(Diagnosis(id="dg-1", incident_id="inc-1", asset_key=["orders"], created_at=h(30), causes=[f],
                                      blast_radius=BlastRadius(root="orders"), gap_rows=39, unexplained_rows=0))
    assert "*Mage runs in the window:*" in md and f"- Mage finance_daily run {nightly['id']} completed" in md


def test_a_cancelled_stream_run_is_its_own_evidence_and_lowers_the_confidence(mage):
    s = mage.state
    bad = s.add_run("orders_stream", "cancelled", h(-10), h(9))
    s.add_run("orders_stream", "running", h(9.1))
    ev = read_mage_evidence(client(mage), SOURCE, (T0, T1), now=h(30))
    assert ev.details["green_throughout"] is False and ev.confidence_factor == PROBLEM_FACTOR
    assert GREEN_SENTENCE not in ev.sentence and f"run {bad['id']} cancelled" in ev.sentence
    own = [e for e in ev.evidence if e.description.startswith(f"Mage run {bad['id']}")]
    assert len(own) == 1 and own[0].values["status"] == "cancelled" and own[0].values["url"].endswith(f"/runs/{bad['id']}")
    assert ev.details["problems"] == [{"pipeline": "orders_stream", "run_id": bad["id"], "status": "cancelled", "blocks": []}]
    f = apply_mage_evidence(finding(0.8), ev)
    assert f.confidence == round(0.8 * PROBLEM_FACTOR, 4) and "did NOT run green" in f.summary


def test_a_failed_downstream_run_is_evidence_with_its_block_but_the_stream_still_ran_green(mage):
    s = mage.state
    s.add_run("orders_stream", "running", h(-1))
    bad = s.add_run("finance_daily", "failed", h(2), h(2.1))
    ev = read_mage_evidence(client(mage), SOURCE, (T0, T1), now=h(30))
    assert ev.details["green_throughout"] is True and ev.confidence_factor == 1.0
    own = next(e for e in ev.evidence if e.description.startswith(f"Mage run {bad['id']} of finance_daily failed"))
    assert own.values["blocks"] == [{"block": "load_orders", "status": "failed", "error": "seeded failure"},
                                     {"block": "gmv_by_day", "status": "upstream_failed", "error": None}]
    assert f"(run {bad['id']} failed)" in ev.sentence


def test_no_stream_run_and_a_gap_are_not_green(mage):
    s = mage.state
    ev = read_mage_evidence(client(mage), SOURCE, (T0, T1), now=h(30))
    assert ev.details["green_throughout"] is False and "no run of orders_stream" in ev.sentence
    s.add_run("orders_stream", "completed", h(-1), h(5))
    s.add_run("orders_stream", "running", h(8))  # nothing ran 05:00–08:00
    ev = read_mage_evidence(client(mage), SOURCE, (T0, T1), now=h(30))
    assert ev.details["green_throughout"] is False and GREEN_SENTENCE not in ev.sentence
    assert "do not cover the whole window" in ev.sentence and ev.confidence_factor == 1.0


def test_mage_unreachable_is_evidence_and_the_diagnosis_goes_on(mage):
    url = mage.url
    mage.stop()
    c = MageClient(url, email=DEFAULT_EMAIL, password=DEFAULT_PASSWORD, policy=FAST)
    ev = read_mage_evidence(c, SOURCE, (T0, T1))
    assert ev.details["green_throughout"] is None and ev.details["error"] and ev.confidence_factor == 1.0
    assert len(ev.evidence) == 1 and ev.evidence[0].description.startswith("Mage could not be read")
    assert url in ev.evidence[0].values["error"] and GREEN_SENTENCE not in ev.sentence
    f = apply_mage_evidence(finding(), ev)
    assert "the Mage runs could not be read" in f.summary and f.confidence == 0.9

    def not_configured() -> MageClient:
        raise MageError("no Mage URL: set MageResource.url or $MAGE_URL")

    ev = read_mage_evidence(not_configured, SOURCE, (T0, T1))
    assert "no Mage URL" in ev.details["error"] and ev.details["green_throughout"] is None


def _sink(db):
    """A small sink: gift-card orders of 2026-11-24 from 10:00 on have shipping_country NULL and are parked."""
    db.execute("CREATE SCHEMA shop")
    db.execute("CREATE SCHEMA analytics")
    db.execute("CREATE TABLE shop.orders (order_id INT, order_ts TIMESTAMP, payment_method VARCHAR, shipping_country VARCHAR)")
    rows = [(i, T0 + dt.timedelta(hours=i % 24, minutes=i), "gift_card" if i % 3 == 0 else "card",
             None if i % 3 == 0 and i % 24 >= 10 else "DE") for i in range(1, 61)]
    db.execute("INSERT INTO shop.orders VALUES " + ", ".join(
        f"({i}, TIMESTAMP '{ts}', '{pm}', {'NULL' if c is None else repr(c)})" for i, ts, pm, c in rows))
    db.execute("CREATE TABLE analytics.orders (order_id INT NOT NULL, order_ts TIMESTAMP, payment_method VARCHAR, "
               "shipping_country VARCHAR NOT NULL)")
    db.execute("INSERT INTO analytics.orders SELECT * FROM shop.orders WHERE shipping_country IS NOT NULL")
    db.execute("CREATE TABLE analytics.orders_dlq (order_id INT, payload VARCHAR, error_reason VARCHAR, failed_at TIMESTAMP)")
    db.execute("INSERT INTO analytics.orders_dlq SELECT order_id, '{}', 'shipping_country: missing required field', "
               "order_ts FROM shop.orders WHERE shipping_country IS NULL")
    return sum(1 for r in rows if r[3] is None)


def _diagnoser(mage_source):
    import functools

    import dagster as dg

    from dw_dagster.diagnosis.sink_diagnoser import DeadLetterDiagnoser
    from dw_dagster.pipelines.sink import sink_table_from_catalog

    return DeadLetterDiagnoser(
        target_asset=dg.AssetKey("orders"), source_table="shop.orders", source_resource_key="shop",
        target_resource_key="warehouse", partition_column="order_ts", group_column="payment_method",
        sink_table=functools.partial(sink_table_from_catalog, table="analytics.orders",
                                     dead_letter_table="analytics.orders_dlq", key="order_id"),
        volume_check=dg.AssetCheckKey(dg.AssetKey("orders"), "daily_volume"), manifest_path=None, dbt_asset_keys={},
        domains_file={"domains": [{"name": "d", "assets": [["orders"]], "approvers": ["a@x"]}]}, verify_checks=[],
        history=False, mage=mage_source)


def test_the_dead_letter_diagnosis_carries_the_mage_runs_and_completes_when_mage_is_down(mage, duck, tmp_path):
    import dagster as dg

    from dw_dagster.core.models import Incident

    parked = _sink(duck)
    mage.state.add_run("orders_stream", "running", h(-5))
    incident = Incident(id="inc-1", asset_key=["orders"], source="manual", detected_at=h(30), summary="short",
                        window_start=h(0), window_end=h(24))
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        plain, f0 = _diagnoser(None).diagnose(instance, duck, duck, incident)
        diag, f = _diagnoser(SOURCE).diagnose(instance, duck, duck, incident, mage_client=lambda: client(mage))
        assert f0.explained_rows == f.explained_rows == parked > 0 and f0.confidence == f.confidence == 1.0
        assert diag.id == plain.id  # the id hashes what the warehouse says, not Mage's moving runs
        assert f.summary.startswith(f0.summary) and "Mage: the stream ran green throughout" in f.summary
        assert f.details["mage"]["statuses"] == {"orders_stream": ["running"], "finance_daily": []}
        url = mage.url
        mage.stop()
        down, fd = _diagnoser(SOURCE).diagnose(instance, duck, duck, incident,
                                              mage_client=lambda: MageClient(url, policy=FAST))
    assert down.id == plain.id and fd.explained_rows == parked and fd.confidence == 1.0
    assert "the Mage runs could not be read" in fd.summary and GREEN_SENTENCE not in fd.summary
    assert fd.evidence[-1].description.startswith("Mage could not be read") and fd.details["mage"]["error"]
