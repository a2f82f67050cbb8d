"""``dw-dagster demo store-sales --fail-verify``: the repair runs, its verify finds the gap still open (a
straggler store posted while it ran), and nothing reads "verified": the page is re-triggered with the
failing check and never resolved, Lightup's incident stays open, every message carries the receipt's real
outcome, and the escalation ladder asks the escalation approver (on the demo's clock)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCALE = "0.002"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    work = tmp_path_factory.mktemp("fail_verify")
    p = subprocess.run([str(Path(sys.executable).with_name("dw-dagster")), "demo", "store-sales", "--fail-verify", "--json",
                        "--scale", SCALE, "--workdir", str(work)], capture_output=True, text=True, timeout=1800,
                       env={k: v for k, v in __import__("os").environ.items() if k not in ("DAGSTER_HOME",)})
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout), p.stderr


def test_the_done_when_fields(demo):
    data, _ = demo
    assert data["ok"] is True and data["fail_verify"] is True
    assert data["page_resolved"] is False and data["page_retriggered"] is True and data["receipt_verified"] is False
    assert data["escalated_to"] == ["head.of.data@grocer.example"]
    assert data["approval_dms"] == ["dana.ortiz@grocer.example"]
    assert data["review_page_url"].startswith("http://127.0.0.1:8770/incidents/")
    assert data["outcome_in_messages"] == {"pager": True, "slack": True, "lightup": True}
    assert data["lightup_closed"] is False and data["gap_after"]["Southwest"] > 0


def test_the_timeline_says_what_happened(demo):
    _, timeline = demo
    assert "--fail-verify: a straggler store posted" in timeline
    assert "repair applied but NOT verified" in timeline and "resolved with the receipt" not in timeline
    assert "escalated to head.of.data@grocer.example (who may now decide)" in timeline
