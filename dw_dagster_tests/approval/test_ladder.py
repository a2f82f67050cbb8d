"""The escalation ladder on a clock the test controls: a reminder, an escalation to people who may
then decide (verified and bound to the version like approvers, never before their time), an
automatic denial (expired, never granted), several steps due at once, a repair that failed, and
every step recorded once in the ledger whoever climbs.

One instance for the file; each test proposes its own change set and climbs it with its own clock.
"""

import datetime as dt

import dagster as dg
import pytest

from dw_dagster.core.signing import ApprovalRefused
from dw_dagster.approval.job import decide
from dw_dagster.approval.ladder import climb, ladder_history
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.domains import Domains
from dw_dagster.core.identity import VerifiedIdentity
from dw_dagster.core.ledger import EXPIRED, ledger_for
from dw_dagster.core.models import ChangeSet, utcnow
from dw_dagster.proposals.change_sets import propose

OWNER, BOSS, ONCALL = "dana.ortiz@grocer.example", "head.of.data@grocer.example", "data-oncall@grocer.example"
DOMAINS = Domains.model_validate({"domains": [{
    "name": "store_sales", "assets": [["store_sales_line"]], "approvers": [OWNER], "escalation": [ONCALL],
    "remind_after": "2h", "escalate_after": "6h", "escalation_approvers": [BOSS], "deny_after": "24h",
    "identity": "verified"}]})
H = dt.timedelta(hours=1)


@pytest.fixture(scope="module")
def instance():
    with pytest.MonkeyPatch.context() as mp, dg.instance_for_test() as inst:
        mp.setenv(c.SIGNING_KEY_ENV, "ladder-test-signing-key-0123456789")
        yield inst


def _propose(instance, name: str, created: dt.datetime) -> ChangeSet:
    cs = ChangeSet.seal(id=f"cs-{name}", incident_id=f"inc-{name}", diagnosis_id=f"dg-{name}", domain="store_sales",
                        proposer=c.PROPOSER, created_at=created, expires_at=created + 24 * H, approvers=[OWNER],
                        cause_kind="late_rows_behind_watermark", summary=f"rerun two days ({name})",
                        target_asset=["store_sales_line"], window=["2026-11-26"], diff="", files=[], rebuild_assets=[])
    return propose(instance, cs)[0]


def _who(email: str) -> VerifiedIdentity:
    return VerifiedIdentity(email=email, method="oidc", issuer="https://login.grocer.example", subject=email,
                            verified_at=utcnow(), detail="verified by OIDC (test)")


def _steps(instance, cs: ChangeSet) -> list[tuple[str, str, bool]]:
    return [(s["kind"], s["step"], s["skipped"]) for s in ladder_history(instance, change_set_id=cs.id)]


def _escalations(instance, cs: ChangeSet) -> list[dict]:
    out = []
    for rec in records.iter_observations(instance, dg.AssetKey(cs.target_asset), newest_first=False):
        data = records.metadata_json(rec.asset_observation.metadata, c.ESCALATION_KEY)
        if data and data["change_set_id"] == cs.id:
            out.append(data)
    return out


def test_remind_escalate_and_an_escalation_approver_decides(instance):
    t0 = utcnow()
    cs = _propose(instance, "climb", t0)
    assert climb(instance, DOMAINS, t0 + H).told == []
    tick = climb(instance, DOMAINS, t0 + 2 * H)
    [told] = tick.told
    assert (told["step"], told["to"], told["may_decide"]) == ("remind", [OWNER], [OWNER])
    assert "still waits for a decision" in told["text"]
    assert climb(instance, DOMAINS, t0 + 3 * H).told == []  # once
    with pytest.raises(ApprovalRefused, match="may decide from"):  # not before their time
        decide(instance, cs.id, "approve", _who(BOSS), domains=DOMAINS, version=cs.version, now=t0 + 5 * H)
    [told] = climb(instance, DOMAINS, t0 + 6 * H).told
    assert (told["step"], told["to"], told["may_decide"]) == ("escalate", [BOSS], [OWNER, BOSS])
    assert told["cc"] == [OWNER, ONCALL] and "may now decide" in told["text"]
    with pytest.raises(ApprovalRefused, match="changed since you read it"):  # bound to the version shown
        decide(instance, cs.id, "approve", _who(BOSS), domains=DOMAINS, version="0" * 32, now=t0 + 7 * H)
    approval, _ = decide(instance, cs.id, "approve", _who(BOSS), domains=DOMAINS, version=cs.version, now=t0 + 7 * H)
    assert approval.approver == BOSS and approval.change_set_version == cs.version
    assert climb(instance, DOMAINS, t0 + 25 * H).told == []  # decided: never denied
    assert ledger_for(instance).change_set_row(cs.id).state != EXPIRED
    assert _steps(instance, cs) == [("request", "remind", False), ("request", "escalate", False)]
    assert [e["step"] for e in _escalations(instance, cs)] == ["remind", "escalate"]


def test_automatic_denial_never_grants(instance):
    t0 = utcnow()
    cs = _propose(instance, "deny", t0)
    for hours in (2, 6):
        climb(instance, DOMAINS, t0 + hours * H)
    [told] = climb(instance, DOMAINS, t0 + 24 * H).told
    assert told["step"] == "deny" and told["to"] == [OWNER, BOSS] and told["cc"] == [ONCALL]
    assert "never granted" in told["text"]
    assert ledger_for(instance).change_set_row(cs.id).state == EXPIRED
    with pytest.raises(ApprovalRefused, match="expired"):
        decide(instance, cs.id, "approve", _who(OWNER), domains=DOMAINS, version=cs.version, now=t0 + 25 * H)
    expired = [records.metadata_json(r.asset_observation.metadata, c.EXPIRED_KEY)
               for r in records.iter_observations(instance, dg.AssetKey(cs.target_asset))]
    assert [e["change_set_id"] for e in expired if e] == [cs.id]
    assert [s for _, s, _ in _steps(instance, cs)] == ["remind", "escalate", "deny"]


def test_steps_due_at_once_tell_only_the_latest(instance):
    t0 = utcnow()
    cs = _propose(instance, "late", t0)
    tick = climb(instance, DOMAINS, t0 + 7 * H)  # the sensor was off for seven hours
    assert [t["step"] for t in tick.told] == ["escalate"] and tick.skipped == [f"{cs.id} request remind"]
    assert _steps(instance, cs) == [("request", "remind", True), ("request", "escalate", False)]


def test_two_climbers_at_once_take_each_step_once(instance):
    t0 = utcnow()
    cs = _propose(instance, "race", t0)
    first, second = climb(instance, DOMAINS, t0 + 2 * H), climb(instance, DOMAINS, t0 + 2 * H)
    assert len([t for t in first.told + second.told if t["change_set_id"] == cs.id]) == 1
    assert len(_escalations(instance, cs)) == 1


def test_a_step_recorded_but_not_shown_is_shown_by_the_next_tick(instance, monkeypatch):
    from dw_dagster.approval import ladder

    t0 = utcnow()
    cs = _propose(instance, "crash", t0)
    monkeypatch.setattr(ladder._Climb, "show", lambda self, payload: (_ for _ in ()).throw(RuntimeError("crashed")))
    tick = climb(instance, DOMAINS, t0 + 2 * H)
    assert "RuntimeError: crashed" in tick.summary() and _escalations(instance, cs) == []
    monkeypatch.undo()
    climb(instance, DOMAINS, t0 + 2 * H)
    assert [e["step"] for e in _escalations(instance, cs)] == ["remind"]


def test_a_repair_that_failed_climbs_the_same_ladder(instance):
    led = ledger_for(instance)
    t0 = utcnow()
    cs = _propose(instance, "failed", t0)
    approval, _ = decide(instance, cs.id, "approve", _who(OWNER), domains=DOMAINS, version=cs.version, now=t0)
    ticket = led.issue_ticket(cs.id, cs.version, "receipt", approval.id, "dw_receipts")
    led.bind_ticket(ticket, "run-receipt", "dw_receipts")
    led.complete_stage(ticket, "run-receipt", success=True,
                       result={"verified": False, "outcome": "failed at window-1 (failed: Binder Error)"})
    led.set_change_set_state(cs.id, cs.version, "failed", from_states=["running"])
    ended = dt.datetime.fromtimestamp(led.stages(cs.id, cs.version)["receipt"].finished_at, dt.timezone.utc)
    assert [t for t in climb(instance, DOMAINS, ended + H).told if t["change_set_id"] == cs.id] == []
    [told] = [t for t in climb(instance, DOMAINS, ended + 2 * H).told if t["change_set_id"] == cs.id]
    assert (told["kind"], told["step"], told["to"]) == ("repair", "remind", [OWNER])
    assert "failed at window-1" in told["text"]
    [told] = [t for t in climb(instance, DOMAINS, ended + 6 * H).told if t["change_set_id"] == cs.id]
    assert (told["step"], told["to"]) == ("escalate", [BOSS]) and "undo" in told["text"]
    # someone acts (an undo is proposed, as `dw-dagster undo` records it): the ladder stops
    led.record_change_set(change_set_id=f"{cs.id}-undo", version="u" * 32, content_key="u", target_asset="store_sales_line",
                          incident_id=cs.incident_id, domain="store_sales", expires_at=(ended + 48 * H).timestamp(),
                          body="{}")
    assert [t for t in climb(instance, DOMAINS, ended + 24 * H).told if t["change_set_id"] == cs.id] == []


def test_the_domains_file_names_file_line_and_field(tmp_path):
    from dw_dagster.core.domains import DomainsFileError, load_domains

    path = tmp_path / "domains.yaml"
    path.write_text("domains:\n  - name: s\n    assets: [[a]]\n    approvers: [a@x.example]\n"
                    "    remind_after: 6h\n    escalate_after: 2h\n    escalation_approvers: [b@x.example]\n"
                    "    deny_after: 90\n")
    with pytest.raises(DomainsFileError) as e:
        load_domains(path)
    text = str(e.value)
    assert f"{path}:6: domains.0.escalate_after: must come after remind_after (6h), got 2h" in text
    assert f"{path}:8: domains.0.deny_after: a duration needs a unit (s, m, h, d, w)" in text
    path.write_text("domains:\n  - name: s\n    assets: [[a]]\n    approvers: [a@x.example]\n"
                    "    escalate_after: 2h\n")
    with pytest.raises(DomainsFileError, match=rf"{path}:5: domains.0.escalate_after: needs escalation_approvers"):
        load_domains(path)
    path.write_text("domains:\n  - name: s\n    assets: [[a]]\n    approvers: [a@x.example]\n"
                    "    deny_after: 1d\n    approval_expiry_hours: 12\n")
    with pytest.raises(DomainsFileError, match=rf"{path}:5: domains.0.deny_after: 1d contradicts approval_expiry_hours 12"):
        load_domains(path)


def test_the_change_sets_history_shows_the_ladder(instance):
    import json

    from click.testing import CliRunner

    from dw_dagster.cli import main

    t0 = utcnow()
    cs = _propose(instance, "history", t0)
    climb(instance, DOMAINS, t0 + 7 * H)
    shown = CliRunner().invoke(main, ["change-sets", "show", cs.id, "--json", "--dagster-home", instance.root_directory])
    assert shown.exit_code == 0, shown.output
    ladder = json.loads(shown.output)["ladder"]
    assert [(s["step"], s["skipped"], s["to"]) for s in ladder] == [("remind", True, []), ("escalate", False, [BOSS])]
    text = CliRunner().invoke(main, ["change-sets", "show", cs.id, "--dagster-home", instance.root_directory]).output
    assert "ladder: request escalate at" in text and f"→ {BOSS}" in text and "(skipped: a later step was due)" in text
