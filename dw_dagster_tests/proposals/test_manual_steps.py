"""Manual steps (changes/manual_steps.py): what the engineer does outside dw_dagster, named with how and where.

A Mage pipeline that read the repaired table is named for a rerun after the data steps, with the
``mage-agent`` call and the pipeline's page; the step travels in the sealed change set (its hash
covers it) and reads as markdown on the asset page. A malformed step is refused when built.

Cases from the field: a downstream run that succeeded on data later fixed must be run again by
hand — Mage added reruns of successful pipeline runs for it (https://github.com/mage-ai/mage-ai/pull/1337),
Airflow users asked the same of successful backfills (https://github.com/apache/airflow/issues/16452).
"""

from __future__ import annotations

import datetime as dt
import json

import pydantic
import pytest

from dw_dagster.core.models import ChangeSet, ManualStep
from dw_dagster.changes.manual_steps import (
    MAGE_RERUN,
    mage_agent_call,
    mage_rerun_step,
    mage_reruns,
    manual_steps_markdown,
)
from dw_dagster_tests.proposals.world import NOW, OWNER


def _cs(manual_steps) -> ChangeSet:
    return ChangeSet.seal(id="cs-1", incident_id="inc-1", diagnosis_id="dg-1", domain="pos", proposer="dw-dagster",
                          created_at=NOW, expires_at=NOW + dt.timedelta(hours=24), approvers=[OWNER], cause_kind="parked_rows",
                          summary="replay", target_asset=["orders"], window=[], diff="", files=[], rebuild_assets=[],
                          manual_steps=list(manual_steps))


@pytest.mark.parametrize("after,words", [
    ([], "rerun `finance_daily` in Mage once the change set's data changes are applied: it read the table"),
    (["replay-1"], "rerun `finance_daily` in Mage after step 1 (replay-1): it read"),
    (["migration-1", "replay-2"], "rerun `finance_daily` in Mage after steps 1–2 (migration-1, replay-2): it read"),
])
def test_the_rerun_is_named_after_the_data_steps(after, words):
    step = mage_rerun_step("finance_daily", after, ui_url="http://mage.local:6789/", check=["orders", "mage_rerun"])
    assert step.summary.startswith(words) and "dw_dagster starts nothing in Mage" in step.summary
    assert (step.kind, step.system, step.target, step.after) == (MAGE_RERUN, "mage", "finance_daily", after)
    assert step.url == "http://mage.local:6789/pipelines/finance_daily/triggers"
    assert step.command == 'mage-agent run_pipeline {"pipeline_uuid": "finance_daily"}'
    assert json.loads(mage_agent_call("a \"quoted\" one").split(" ", 2)[2]) == {"pipeline_uuid": 'a "quoted" one'}


def test_the_steps_travel_in_the_sealed_change_set_and_read_as_markdown():
    rerun = mage_rerun_step("finance_daily", ["replay-1"], check=["orders", "mage_rerun"])
    other = ManualStep(kind="notify_finance", system="email", target="finance@example.com", summary="tell finance")
    cs = _cs([rerun, other])
    cs.verify_version()
    assert cs.version != _cs([other]).version  # the hash covers the steps
    assert mage_reruns(cs) == [rerun] and mage_reruns(None) == [] and mage_reruns(_cs([])) == []
    assert manual_steps_markdown(cs) == "\n".join([
        "### For the engineer (outside dw_dagster)",
        f"1. {rerun.summary}",
        '   - call: `mage-agent run_pipeline {"pipeline_uuid": "finance_daily"}`',
        "   - verified by `mage_rerun` on orders",
        "2. tell finance",
        "   - call: ``",
    ])
    assert manual_steps_markdown(_cs([])) == ""


def test_a_malformed_step_is_refused():
    with pytest.raises(pydantic.ValidationError, match="String should match pattern"):
        ManualStep(kind="Mage Rerun", system="mage", target="x", summary="s")
