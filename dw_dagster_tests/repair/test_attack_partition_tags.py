"""An attack found in review (it worked before the fix; the test keeps it refused): partition tags the guard does not read.

Dagster 1.13's execution context takes a run's partition from any ``dagster/partition/<dimension>``
tag *before* ``dagster/partition`` and the range tags (``PlanExecutionContext.partition_key`` /
``partition_key_range``: the multi-dimensional branch comes first), for any partitioned asset. Tried:
a run of a daily asset job with ``dagster/partition/x=2026-11-01`` materializes 2026-11-01 whatever
its other partition tags say. The guard (``_partition_bounds``, ``SHAPE_TAGS``) reads only
``dagster/partition`` and the range tags, so:

1. a held partition is materialized by a run tagged ``dagster/partition=2026-11-05`` (outside the
   window) + ``dagster/partition/x=2026-11-03`` (held) — GraphQL ``launchRun`` of the nightly job,
   through ``dagster dev``: SUCCESS, 2026-11-04 rewritten while held (/tmp/attack/e2e_attack.py, E3);
2. a ticket read from a dry run of the remediation sensor binds a run of the exact dispatched shape
   plus ``dagster/partition/x=2026-11-01``: the stage "succeeds" having rerun 2026-11-01 and not the
   approved 2026-11-03..04 (E2);
3. a range over *static* partitions is compared only by its two ends: ``a_eu..d_latam`` covers the
   held ``b_us, c_apac`` but neither end is in the window (a UI backfill of the range, E4).
"""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.core.models import ChangeSet, utcnow
from dw_dagster.approval.job import approve_in_process
from dw_dagster.proposals.change_sets import propose
from dw_dagster.guard.admission import RunFacts, RunRefused, admit_run
from dw_dagster_tests.repair.test_autonomy_and_stop import OWNER, _domains, world  # noqa: F401
from dw_dagster_tests.repair.test_guard import _approved


def test_a_multi_dimension_partition_tag_does_not_bypass_a_held_window(world):
    defs, instance, domains, wh = world
    _approved(defs, instance, domains)  # holds 2026-11-03..04 of orders
    run = instance.create_run_for_job(defs.resolve_job_def("rerun_orders"), tags={
        "dagster/partition": "2026-11-05", "dagster/partition/x": "2026-11-03"})
    with pytest.raises(RunRefused, match="held by change set"):
        admit_run(instance, RunFacts.of_run(run, ["orders"]))


def test_an_issued_ticket_refuses_a_run_with_an_extra_partition_tag(world):
    defs, instance, domains, wh = world
    _approved(defs, instance, domains)
    sensor = defs.resolve_sensor_def("dw_remediation_sensor")
    (rr,) = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests
    run = instance.create_run_for_job(defs.resolve_job_def(rr.job_name),
                                      tags={**rr.tags, "dagster/partition/x": "2026-11-01"},
                                      asset_selection=frozenset(rr.asset_selection))
    with pytest.raises(RunRefused):
        admit_run(instance, RunFacts.of_run(run, ["orders"]))


def test_a_range_over_static_partitions_that_covers_a_held_window_is_refused(world):
    defs, instance, domains, wh = world
    _domains(domains, "L2")
    now = utcnow()
    cs = ChangeSet.seal(id="cs-regional01", incident_id="inc-r", diagnosis_id="dg-inc-r", domain="orders",
                        proposer=c.PROPOSER, created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=[OWNER],
                        cause_kind="late_rows_behind_watermark", summary="rerun two regions", target_asset=["regional"],
                        window=["b_us", "c_apac"], diff="", files=[], rebuild_assets=[], verify_checks=[],
                        change_classes=["rerun_window"], undo="rerun again")
    cs, _ = propose(instance, cs)
    assert approve_in_process(instance, cs.id, approver=OWNER)[0]
    run = instance.create_run_for_job(defs.resolve_job_def("verify_orders"), tags={  # tags of a range backfill run
        "dagster/asset_partition_range_start": "a_eu", "dagster/asset_partition_range_end": "d_latam"})
    with pytest.raises(RunRefused, match="held by change set"):
        admit_run(instance, RunFacts.of_run(run, ["regional"]))
