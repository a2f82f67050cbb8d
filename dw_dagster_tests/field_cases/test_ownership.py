"""Field cases of ownership that changes between a decision and the work it allows: the domains
file edited after an approval, checked on a real Dagster instance through the approval job and
the rule the remediation sensor applies before every stage (:func:`valid_approval`)."""

import datetime as dt
import textwrap

import dagster as dg
import pytest

from dw_dagster.approval.job import approve_in_process, valid_approval
from dw_dagster.core import keys as c
from dw_dagster.core.models import ChangeSet, FileChange, utcnow
from dw_dagster.proposals.change_sets import propose
from dw_dagster_tests.field_cases.kinds import kind

J = "dw_dagster/approval/job.py"
KINDS = [
    kind("own-asset-moves-domain", "ownership", "the asset moves to another domain after the approval",
         "https://github.com/kubernetes/test-infra/issues/9238", J, "test_approval_stops_counting_when_the_asset_moves_domain", True),
    kind("own-approver-removed", "ownership", "the approver is removed from the domain after approving",
         "https://github.com/ministryofjustice/Claim-for-Crown-Court-Defence/pull/5213", J,
         "test_approval_stops_counting_when_the_approver_is_removed", False),
    kind("own-approver-email-case", "ownership", "an approver listed in the domains file in other letter case than "
         "the identity that approves", "https://github.com/google/oss-fuzz/issues/870", "dw_dagster/core/identity.py",
         "test_an_approver_listed_in_another_letter_case_is_the_same_person", False),
    kind("own-domains-file-broken", "ownership", "the domains file made unparsable (or removed) between the approval "
         "and the work", "https://github.com/istio/operator/pull/159", J,
         "test_a_domains_file_broken_after_the_approval_stops_the_work", False),
]

DANA, SAM = "dana.ortiz@grocer.example", "sam.lee@grocer.example"


def _write(path, sales_assets="[[store_sales_line]]", finance_assets="[[ledger]]", sales_approvers=(DANA,)):
    path.write_text(textwrap.dedent(f"""\
        domains:
          - name: store_sales
            assets: {sales_assets}
            approvers: [{', '.join(sales_approvers)}]
            identity: unverified
          - name: finance
            assets: {finance_assets}
            approvers: [{SAM}]
            identity: unverified
        """))


@pytest.fixture
def setting(tmp_path, monkeypatch):
    path = tmp_path / "domains.yaml"
    _write(path)
    monkeypatch.setenv("DW_DOMAINS_FILE", str(path))
    with dg.instance_for_test() as instance:
        now = utcnow()
        cs = ChangeSet.seal(
            id="cs-field00001", incident_id="inc-1", diagnosis_id="dg-1", domain="store_sales", proposer=c.PROPOSER,
            created_at=now, expires_at=now + dt.timedelta(hours=24), approvers=[DANA], cause_kind="late_rows_behind_watermark",
            summary="s", target_asset=["store_sales_line"], window=["2026-11-26"], diff="",
            files=[FileChange(path="p.yaml", before_sha256="a", after_sha256="b")], rebuild_assets=[["fct"]])
        yield instance, propose(instance, cs)[0], path


def test_approval_stops_counting_when_the_asset_moves_domain(setting):
    """kubernetes/test-infra #9238 (https://github.com/kubernetes/test-infra/issues/9238): an
    approval stayed sticky after the OWNERS that granted it changed. Here ``store_sales_line`` moves
    from ``store_sales`` to ``finance`` after Dana (store_sales) approved; the approval kept letting
    the repair run although finance's owners never decided. Right answer: it stops counting (the
    sensor runs nothing), Dana cannot approve again, and it counts again if the asset moves back."""
    instance, cs, path = setting
    assert approve_in_process(instance, cs.id, approver=DANA)[0]
    assert valid_approval(instance, cs) is not None
    _write(path, sales_assets="[[other]]", finance_assets="[[ledger], [store_sales_line]]")
    assert valid_approval(instance, cs) is None
    ok, msg = approve_in_process(instance, cs.id, approver=DANA)
    assert not ok and "belongs to domain 'finance' now" in msg
    _write(path)
    assert valid_approval(instance, cs) is not None


def test_approval_stops_counting_when_the_approver_is_removed(setting):
    """Claim-for-Crown-Court-Defence PR #5213
    (https://github.com/ministryofjustice/Claim-for-Crown-Court-Defence/pull/5213): "the code
    ownership rules that are applied are the ones currently in the master branch". Dana approves,
    then leaves the domain's approvers. Right answer: the approval no longer lets the work run."""
    instance, cs, path = setting
    _write(path, sales_approvers=(DANA, "lee.chan@grocer.example"))
    assert approve_in_process(instance, cs.id, approver=DANA)[0]
    _write(path, sales_approvers=("lee.chan@grocer.example",))
    assert valid_approval(instance, cs) is None


def test_an_approver_listed_in_another_letter_case_is_the_same_person(setting):
    """oss-fuzz #870 (https://github.com/google/oss-fuzz/issues/870): "You (email=NickRTerrell@gmail.com)
    are not authorized" although the listed contact was the same address in other letters. The
    domains file lists ``Dana.Ortiz@Grocer.Example``; Dana approves as ``DANA.ORTIZ@grocer.example``.
    Right answer (RFC 5321 domains are case-insensitive, and approver addresses are compared in
    one form): the approval counts; an address that only looks alike (another domain) does not."""
    instance, cs, path = setting
    _write(path, sales_approvers=("Dana.Ortiz@Grocer.Example",))
    assert not approve_in_process(instance, cs.id, approver="dana.ortiz@grocer.example.evil")[0]
    assert valid_approval(instance, cs) is None
    assert approve_in_process(instance, cs.id, approver="DANA.ORTIZ@grocer.example")[0]
    approval = valid_approval(instance, cs)
    assert approval is not None and approval.approver == DANA.lower()


def test_a_domains_file_broken_after_the_approval_stops_the_work(setting):
    """istio/operator PR #159 (https://github.com/istio/operator/pull/159): "It appears anyone can
    approve patches if the CODEOWNERS file is misparsed." Dana approves; then the domains file is
    edited into YAML that does not parse, then removed. Right answer: while the file cannot say
    who owns the asset, the approval lets nothing run (the sensor's rule fails closed); once the
    file is whole again the recorded approval counts again (nothing was lost)."""
    instance, cs, path = setting
    assert approve_in_process(instance, cs.id, approver=DANA)[0]
    assert valid_approval(instance, cs) is not None
    path.write_text("domains: [ {name: store_sales, assets: [[store_sales_line]]")
    assert valid_approval(instance, cs) is None
    path.unlink()
    assert valid_approval(instance, cs) is None
    _write(path)
    assert valid_approval(instance, cs) is not None
