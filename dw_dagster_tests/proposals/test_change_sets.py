"""Recording proposals (proposals/change_sets.py) on a real Dagster instance: versions, content keys, idempotence.

A change set's version is the hash of its content; its content key the hash without its times.
Proposing the same content again (a re-executed diagnosis run) returns the first record — same
version, same expiry, no second observation on the asset — while a changed diff is a new version
that supersedes the one waiting. A record whose content was altered after sealing is refused.

Cases from the field: a retried run re-emitting the same side effect twice
(https://github.com/dagster-io/dagster/issues/26753: run requests with the same key not
de-duplicated); a signed record altered after signing must not verify.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.ledger import ledger_for
from dw_dagster.core.models import ChangeSet, TamperedRecord
from dw_dagster.proposals.change_sets import change_set_observation, load_change_set, propose, record_proposal
from dw_dagster_tests.proposals.world import NOW, OWNER

ASSET = dg.AssetKey(["pos", "sales_line"])


def _cs(diff: str = "diff --git a/x b/x\n", now: dt.datetime = NOW, **kw) -> ChangeSet:
    content = dict(id="cs-1", incident_id="inc-1", diagnosis_id="dg-1", domain="pos", proposer=c.PROPOSER, created_at=now,
                   expires_at=now + dt.timedelta(hours=24), approvers=[OWNER], cause_kind="late_rows_behind_watermark",
                   summary="rerun 11-03", target_asset=list(ASSET.path), window=["2026-11-03"], diff=diff, files=[],
                   rebuild_assets=[], verify_checks=[["pos", "sales_line", "reconcile"]])
    return ChangeSet.seal(**{**content, **kw})


def _observations(instance) -> list[dg.EventLogRecord]:
    return list(records.iter_observations(instance, ASSET))


@pytest.fixture
def instance():
    """An ephemeral Dagster instance (its ledger in memory, as long as the instance lives)."""
    return dg.DagsterInstance.ephemeral()


def test_a_proposal_is_recorded_once_and_shown_on_its_asset(instance):
    cs = _cs()
    recorded, new = propose(instance, cs)
    assert new and recorded == cs
    (obs,) = _observations(instance)
    md = obs.asset_observation.metadata
    assert md[c.CHANGE_SET_ID_KEY].value == "cs-1" and md[c.CHANGE_SET_KEY].value["version"] == cs.version
    assert f"### Change set cs-1, proposed 2026-11-06 09:00 UTC (version {cs.version})" in md[c.CHANGE_SET_MD_KEY].value
    assert load_change_set(instance, "cs-1") == cs and ledger_for(instance).change_set_row("cs-1").content_key == cs.content_key()


def test_the_same_content_proposed_again_keeps_its_first_version_and_expiry(instance):
    first, _ = propose(instance, _cs())
    again, new = propose(instance, _cs())  # the same run again: the same version
    assert not new and again == first
    later, new = propose(instance, _cs(now=NOW + dt.timedelta(hours=5)))  # a later run: other times, same content
    assert later.content_key() == first.content_key()
    assert not new and later == first and later.expires_at == NOW + dt.timedelta(hours=24)
    assert len(_observations(instance)) == 1 and len(records.change_sets(instance)) == 1


def test_a_changed_diff_is_a_new_version_that_supersedes_the_waiting_one(instance):
    first, _ = propose(instance, _cs())
    second, new = propose(instance, _cs(diff="diff --git a/y b/y\n"))
    assert new and second.version != first.version and second.content_key() != first.content_key()
    led = ledger_for(instance)
    assert led.change_set_row("cs-1", first.version).state == "superseded"
    assert led.change_set_row("cs-1").version == second.version and load_change_set(led, "cs-1") == second
    assert load_change_set(instance, "cs-1", first.version) == first
    assert len(_observations(instance)) == 2


def test_an_altered_change_set_is_refused_and_nothing_is_recorded(instance):
    altered = _cs().model_copy(update={"window": ["2026-11-03", "2026-11-04"]})
    with pytest.raises(TamperedRecord, match="its content hashes to .*, not to its version"):
        propose(instance, altered)
    assert ledger_for(instance).change_set_rows() == [] and _observations(instance) == []


def test_record_proposal_takes_a_ledger_and_shows_nothing(instance):
    led = ledger_for(instance)
    recorded, new = record_proposal(led, _cs())
    assert new and led.change_set_row("cs-1").target_asset == "pos/sales_line" and _observations(instance) == []
    assert change_set_observation(recorded).asset_key == ASSET
