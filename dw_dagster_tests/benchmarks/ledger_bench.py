"""``ledger_lookup_5000_assets`` and ``remediation_tick_10k_change_sets``: lookups that do not read the event log.

``ledger_lookup_5000_assets``. Setup (not timed): a Dagster instance on SQLite storage (a temp
``DAGSTER_HOME``, as ``dagster dev`` keeps it) with 5,000 watched assets, three volume observations
each (15,000 events), and 500 change sets (each recorded in the ledger and shown as a
``dw/change_set`` observation on its asset, as the diagnosis job does). Timed (``ours_s``, median of
200 lookups of random ids, after ``repeat`` warm passes): one lookup = ``find_change_set`` (the
change set by id, hash re-checked) + ``open_incident`` (the open incident of its asset) + the
change sets of that asset. Peer (same run, same instance): how dw_dagster found a change set
before the ledger — every observation of every asset read back from the event log until the id
appears (``find_change_set`` then took ~14 s at 5,000 tables); timed once. Goal: ``ours_s`` ≤ 50 ms.

``remediation_tick_10k_change_sets``. Setup: 10,000 change sets in the ledger (bulk inserted, not
timed) on 1,000 assets: 9,850 finished (applied, rejected, expired), 100 waiting for approval,
50 approved and waiting for the owner's merge. Timed: one ``evaluate_tick`` of the remediation
sensor (median of ``repeat``). Peer: the same tick's read done the pre-ledger way, every
``dw/change_set`` and ``dw/approval`` observation of the 1,000 assets read from the event log
(10,000 change-set events seeded, not timed). Goal: ``ours_s`` ≤ 1 s.

Usage: ``python -m dw_dagster_tests.benchmarks.run --only ledger_lookup_5000_assets``
"""

from __future__ import annotations

import datetime as dt
import json
import random
import statistics
import time
from pathlib import Path

LOOKUP_ASSETS = 5000
LOOKUP_CHANGE_SETS = 500
TICK_CHANGE_SETS = 10_000
TICK_ASSETS = 1000
LOOKUP_GOAL_S = 0.05
TICK_GOAL_S = 1.0


def _instance(folder: Path):
    import dagster as dg

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return dg.DagsterInstance.from_config(str(folder))


def _change_set(i: int, asset: str, now: dt.datetime):
    from dw_dagster.core import keys as c
    from dw_dagster.core.models import ChangeSet, FileChange

    return ChangeSet.seal(
        id=f"cs-bench{i:06d}", incident_id=f"inc-bench{i:06d}", diagnosis_id=f"dg-{i}", domain="bench", proposer=c.PROPOSER,
        created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=["owner@bench.example"],
        cause_kind="late_rows_behind_watermark", summary=f"rerun 2 partitions of {asset}", target_asset=[asset],
        window=["2026-11-26", "2026-11-27"], diff="--- a/p.yaml\n+++ b/p.yaml\n", files=[FileChange(
            path="p.yaml", before_sha256="a" * 64, after_sha256="b" * 64)], rebuild_assets=[])


def _old_find(instance, change_set_id: str):
    """The pre-ledger lookup: every asset's observations read from the event log until the id appears."""
    import dagster as dg

    for ak in instance.get_asset_keys():
        cursor = None
        while True:
            res = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=ak), limit=500, cursor=cursor)
            for rec in res.records:
                md = rec.asset_observation.metadata if rec.asset_observation else {}
                v = md.get("dw/change_set")
                if v is not None and getattr(v, "value", v).get("id") == change_set_id:
                    return v
            if not res.has_more:
                break
            cursor = res.cursor
    return None


def bench_ledger_lookup(work: Path, repeat: int) -> dict:
    import dagster as dg

    from dw_dagster.core.ledger import asset_str, ledger_for
    from dw_dagster.core import records
    from dw_dagster.proposals.change_sets import change_set_observation, record_proposal
    from dw_dagster.detection.incidents import open_incident

    instance = _instance(work / "lookup_home")
    now = dt.datetime.now(dt.timezone.utc)
    t = time.perf_counter()
    for i in range(LOOKUP_ASSETS):
        ak = dg.AssetKey(["warehouse", f"t_{i:05d}"])
        for k in range(3):
            instance.report_runless_asset_event(dg.AssetObservation(asset_key=ak, metadata={"dagster/row_count": 100 + k}))
    ids = []
    for i in range(LOOKUP_CHANGE_SETS):
        asset = f"warehouse/t_{i * (LOOKUP_ASSETS // LOOKUP_CHANGE_SETS):05d}"
        cs, _ = record_proposal(instance, _change_set(i, asset, now))
        instance.report_runless_asset_event(change_set_observation(cs))
        ids.append(cs.id)
    seed_s = time.perf_counter() - t
    led = ledger_for(instance)
    rng = random.Random(7)

    def lookup(cs_id: str) -> None:
        cs = records.find_change_set(instance, cs_id)
        assert cs is not None and cs.id == cs_id
        open_incident(instance, dg.AssetKey(cs.target_asset))
        assert led.change_set_rows(target_asset=asset_str(cs.target_asset))

    for _ in range(repeat):
        for cs_id in ids[:20]:
            lookup(cs_id)
    times = []
    for cs_id in rng.sample(ids, 200):
        t = time.perf_counter()
        lookup(cs_id)
        times.append(time.perf_counter() - t)
    ours_s = statistics.median(times)
    target = ids[len(ids) // 2]  # the peer scans until it finds it: about half the assets
    t = time.perf_counter()
    assert _old_find(instance, target) is not None
    peer_s = time.perf_counter() - t
    return {"name": "ledger_lookup_5000_assets", "assets": LOOKUP_ASSETS, "events": LOOKUP_ASSETS * 3 + LOOKUP_CHANGE_SETS,
            "rows": LOOKUP_ASSETS, "ours_s": ours_s, "ours_p95_s": round(sorted(times)[int(len(times) * 0.95)], 4),
            "peer": "the pre-ledger event-log scan (every asset's observations until the id)", "peer_s": peer_s,
            "goal": LOOKUP_GOAL_S, "goal_unit": "s", "setup_s": round(seed_s, 1)}


def _bulk_ledger(led, n: int, now: float) -> list[str]:
    """Insert ``n`` change sets into the ledger in one transaction (setup); returns their states."""
    from dw_dagster.core.ledger import APPLIED, APPROVED, EXPIRED, PROPOSED, REJECTED, change_sets_t, decisions_t
    from dw_dagster.approval.identity import VerifiedIdentity
    from dw_dagster.core.models import Approval
    from dw_dagster.core.signing import signed as _signed

    rows, decisions, states = [], [], []
    base = dt.datetime.fromtimestamp(now, dt.timezone.utc)
    for i in range(n):
        asset = f"warehouse/t_{i % TICK_ASSETS:05d}"
        cs = _change_set(i, asset, base)
        state = PROPOSED if i < 100 else APPROVED if i < 150 else (APPLIED, REJECTED, EXPIRED)[i % 3]
        states.append(state)
        rows.append(dict(change_set_id=cs.id, version=cs.version, content_key=cs.content_key(), target_asset=asset,
                         incident_id=cs.incident_id, domain=cs.domain, state=state, latest=True, recorded_at=now + i * 1e-3,
                         expires_at=cs.expires_at.timestamp(), updated_at=now, note="", body=cs.model_dump_json()))
        if state in (APPROVED, APPLIED, REJECTED):
            who = VerifiedIdentity(email="owner@bench.example", method="oidc", issuer="https://login.bench.example",
                                   subject="sub-owner", verified_at=base, credential_id=f"jti-{i}")
            a: Approval = _signed(dict(id=f"ap-bench{i:06d}", change_set_id=cs.id, change_set_version=cs.version,
                                       decision="reject" if state == REJECTED else "approve", approver=who.email,
                                       decided_at=base, comment="", identity=who))
            decisions.append(dict(approval_id=a.id, change_set_id=cs.id, version=cs.version, decision=a.decision,
                                  approver=a.approver, method="oidc", decided_at=now, active=True, withdrawn_reason=None,
                                  body=a.model_dump_json()))
    with led.engine.begin() as conn:
        conn.execute(change_sets_t.insert(), rows)
        conn.execute(decisions_t.insert(), decisions)
    return states


def bench_remediation_tick(work: Path, repeat: int) -> dict:
    import os

    import dagster as dg
    import sqlalchemy as sa

    os.environ.setdefault("DW_APPROVAL_SIGNING_KEY", "benchmark-signing-key-0123456789")  # signs the seeded decisions

    from dw_dagster.core import keys as c
    from dw_dagster.core.ledger import ledger_for
    from dw_dagster.repair.sensor import build_remediation_sensor

    instance = _instance(work / "tick_home")
    led = ledger_for(instance)
    now = time.time()
    t = time.perf_counter()
    states = _bulk_ledger(led, TICK_CHANGE_SETS, now)
    with led.engine.connect() as conn:  # the same change sets as events, for the peer (what the old sensor read)
        from dw_dagster.core.ledger import change_sets_t

        bodies = [r[0] for r in conn.execute(change_sets_t.select().with_only_columns(change_sets_t.c.body))]
    for body in bodies:
        data = json.loads(body)
        instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=dg.AssetKey(data["target_asset"]), metadata={c.CHANGE_SET_KEY: dg.MetadataValue.json(data)}))
    seed_s = time.perf_counter() - t
    domains = work / "domains.yaml"
    domains.write_text("domains:\n  - name: bench\n    select: ['key:\"warehouse/*\"']\n    approvers: [owner@bench.example]\n"
                       "    max_window_partitions: 7\n")
    partitions = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-29")
    window = dg.define_asset_job("w", selection=["warehouse/t_00000"], partitions_def=partitions)
    other = dg.define_asset_job("x", selection=["warehouse/t_00000"])
    pipeline = work / "pipeline"
    pipeline.mkdir()
    (pipeline / "p.yaml").write_text("watermark_column: sale_ts\n")  # not merged yet: the approved ones wait
    sensor = build_remediation_sensor(partitions_def=partitions, window_job=window, rebuild_job=other, verify_job=other,
                                      receipt_job=other, pipeline_root=pipeline, domains=domains)
    times, last = [], None
    for _ in range(max(repeat, 3)):
        t = time.perf_counter()
        last = sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
        times.append(time.perf_counter() - t)
    assert not last.run_requests and "waiting for the owner to merge" in (last.skip_message or ""), last.skip_message
    with led.engine.connect() as conn:  # the tick changed nothing: no decision withdrawn, no ticket issued
        from dw_dagster.core.ledger import decisions_t, stages_t

        assert conn.execute(sa.select(sa.func.count()).select_from(decisions_t).where(decisions_t.c.active.is_(False))).scalar() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(stages_t)).scalar() == 0

    def peer():
        n = 0
        for ak in instance.get_asset_keys():
            cursor = None
            while True:
                res = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=ak), limit=500, cursor=cursor)
                n += sum(1 for r in res.records if c.CHANGE_SET_KEY in r.asset_observation.metadata)
                if not res.has_more:
                    break
                cursor = res.cursor
        assert n == TICK_CHANGE_SETS

    peer_times = []
    for _ in range(max(1, repeat // 3)):
        t = time.perf_counter()
        peer()
        peer_times.append(time.perf_counter() - t)
    return {"name": "remediation_tick_10k_change_sets", "change_sets": TICK_CHANGE_SETS,
            "active": sum(s in ("proposed", "approved") for s in states), "rows": TICK_CHANGE_SETS,
            "ours_s": statistics.median(times), "peer": "the pre-ledger read: every dw/change_set observation from the event log",
            "peer_s": statistics.median(peer_times), "goal": TICK_GOAL_S, "goal_unit": "s", "setup_s": round(seed_s, 1)}


__all__ = ["bench_ledger_lookup", "bench_remediation_tick"]
