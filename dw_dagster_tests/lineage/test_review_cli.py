"""``dw-dagster review``: exit codes by policy, JSON, the Markdown comment, owners from the domains file, and
``--notify slack`` through the Slack resource against the fake Slack Web API."""

import copy
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dw_dagster.cli.main import main
from dw_dagster.lineage.review import review_manifests
from dw_dagster.lineage.review_models import Review
from dw_dagster.lineage.review_report import MARKER
from dw_dagster_dev.fakes.paging_server import DEFAULT_SLACK_TOKEN, start_paging_server

CHANNEL = "C0DATAOPS1"


def _run(*args, env=None):
    return CliRunner().invoke(main, ["review", *map(str, args)], env=env or {}, catch_exceptions=False)


def _write(tmp_path: Path, name: str, manifest: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


@pytest.fixture(scope="module")
def sensitive_only(small_pair, tmp_path_factory):
    """A head that only adds a customer_email column to one model (the manifest edited, not re-parsed):
    sensitive, not breaking."""
    base = small_pair.manifest("base")
    head = copy.deepcopy(base)
    uid = f"model.synth.{small_pair.picked['body']}"
    head["nodes"][uid]["raw_code"] = head["nodes"][uid]["raw_code"].replace(
        "select id, amount, ts from", "select id, amount, ts, 'x@y.example' as customer_email from")
    tmp = tmp_path_factory.mktemp("sensitive_only")
    return _write(tmp, "base", base), _write(tmp, "head", head), uid


@pytest.mark.parametrize("policy, code", [((), 0), (("breaking",), 1), (("sensitive",), 1), (("any",), 1),
                                          (("breaking", "sensitive"), 1)])
def test_exit_codes_on_the_generated_pair(small_pair, policy, code):
    res = _run("--base", small_pair.base, "--head", small_pair.head, *[a for p in policy for a in ("--fail-on", p)])
    assert res.exit_code == code, res.output
    for p in policy:
        assert f"review failed --fail-on {p}" in res.output


@pytest.mark.parametrize("policy, code", [("breaking", 0), ("sensitive", 1), ("any", 1)])
def test_each_policy_alone(sensitive_only, policy, code):
    base, head, uid = sensitive_only
    res = _run("--base", base, "--head", head, "--fail-on", policy)
    assert res.exit_code == code, res.output
    review = review_manifests(base, head)
    assert [(s.unique_id, s.column) for s in review.sensitive] == [(uid, "customer_email")] and not review.breaking


def test_nothing_changed_passes_every_policy(small_pair):
    res = _run("--base", small_pair.base, "--head", small_pair.base, "--fail-on", "any", "--fail-on", "breaking",
               "--fail-on", "sensitive")
    assert res.exit_code == 0 and "0 modified, 0 added, 0 removed" in res.output


def test_json_and_markdown(small_pair, tmp_path):
    comment = tmp_path / "comment.md"
    res = _run("--base", small_pair.base, "--head", small_pair.head, "--json", "--markdown", comment, "--fail-on", "breaking")
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    review = Review.model_validate(out)
    assert review == review_manifests(small_pair.base, small_pair.head)
    text = comment.read_text()
    assert text.startswith(MARKER) and "**Blocking:** breaking" in text and "#### Columns" in text
    assert "customer\\_email" in text and "NIST SP 800-122" in text


def test_usage_errors_exit_2(tmp_path, small_pair):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(main, ["review", "--base", str(empty), "--head", str(small_pair.head)])
    assert res.exit_code == 2 and "no dbt manifest" in res.output
    bad = tmp_path / "domains.yaml"
    bad.write_text("domains: []\nnope: 1\n")
    res = CliRunner().invoke(main, ["review", "--base", str(small_pair.base), "--head", str(small_pair.head),
                                    "--domains", str(bad)])
    assert res.exit_code == 2 and "--domains" in res.output
    res = CliRunner().invoke(main, ["review", "--base", str(small_pair.base), "--head", str(small_pair.head),
                                    "--fail-on", "everything"])
    assert res.exit_code == 2


def _domains_file(tmp_path, small_pair, review):
    key = review.blast_radius.dagster_assets[0]
    exposure = review.blast_radius.exposures[0].name if review.blast_radius.exposures else "dash_1"
    f = tmp_path / "domains.yaml"
    f.write_text(
        "domains:\n"
        f"  - name: sales\n    assets: [{json.dumps(key)}]\n    approvers: [dana@shop.example]\n"
        f"    escalation: [oncall@shop.example]\n    slack_channel: {CHANNEL}\n"
        f"  - name: bi\n    exposures: [{exposure}, dash_1]\n    approvers: [bi.lead@shop.example]\n"
        f"  - name: everything_else\n    select: ['key:m0000*']\n    approvers: [ops@shop.example]\n")
    return f, key


def test_owners_from_the_domains_file(small_pair, tmp_path):
    review = review_manifests(small_pair.base, small_pair.head)
    f, key = _domains_file(tmp_path, small_pair, review)
    with_domains = review_manifests(small_pair.base, small_pair.head, domains=f)
    by = {d.domain: d for d in with_domains.domains}
    assert by["sales"].assets == [key] and by["sales"].approvers == ["dana@shop.example"]
    assert by["sales"].slack_channel == CHANNEL and by["sales"].escalation == ["oncall@shop.example"]
    assert "dash_1" in by["bi"].exposures
    # a Dagster selection string, resolved on the dbt assets dagster-dbt builds from the head manifest
    assert by["everything_else"].assets and all(k[0].startswith("m0000") for k in by["everything_else"].assets)
    assert {"dana@shop.example", "bi.lead@shop.example", "ops@shop.example"} <= set(with_domains.owners)


@pytest.fixture(scope="module")
def fake_slack():
    server, url = start_paging_server()
    yield server, url
    server.stop()


def test_notify_slack_posts_to_the_domain_channel(small_pair, tmp_path, fake_slack):
    server, url = fake_slack
    server.state.reset()
    review = review_manifests(small_pair.base, small_pair.head)
    f, _ = _domains_file(tmp_path, small_pair, review)
    env = {"SLACK_BOT_TOKEN": DEFAULT_SLACK_TOKEN, "SLACK_API_URL": f"{url}/api", "SLACK_CHANNEL": ""}
    res = _run("--base", small_pair.base, "--head", small_pair.head, "--domains", f, "--notify", "slack", env=env)
    assert res.exit_code == 0, res.output
    (msg,) = server.state.slack_messages(CHANNEL)
    text = json.dumps(msg)
    assert "modified" in text and "breaking" in text and "dana@shop.example" in text
    # no token: the report is made, the notification is not, exit 3
    res = _run("--base", small_pair.base, "--head", small_pair.head, "--domains", f, "--notify", "slack",
               env={"SLACK_BOT_TOKEN": ""})
    assert res.exit_code == 3 and "SLACK_BOT_TOKEN" in res.output
    # a failing policy wins over a failed notification
    res = _run("--base", small_pair.base, "--head", small_pair.head, "--notify", "slack", "--fail-on", "breaking",
               env={"SLACK_BOT_TOKEN": ""})
    assert res.exit_code == 1


def test_the_installed_command(small_pair, tmp_path):
    cli = Path(sys.executable).parent / "dw-dagster"
    proc = subprocess.run([str(cli), "review", "--base", str(small_pair.base), "--head", str(small_pair.head),
                           "--fail-on", "breaking", "--markdown", str(tmp_path / "c.md")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "BREAKING" in proc.stdout and "review failed --fail-on breaking" in proc.stderr
    assert (tmp_path / "c.md").read_text().startswith(MARKER)


SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets"


def test_the_documented_ci_workflow_runs(small_pair, tmp_path, monkeypatch):
    """docs/snippets/ci/github_review.yaml is a valid workflow whose review step, run on two targets, blocks;
    ci/review_cli.sh's flags are the CLI's; ci/review_python.py fails on the same pair."""
    workflow = (SNIPPETS / "ci/github_review.yaml").read_text()
    steps = yaml.safe_load(workflow)["jobs"]["dbt-review"]["steps"]
    parse = next(s for s in steps if s.get("name", "").startswith("dbt parse"))
    assert "base/dbt_project" in parse["run"] and "head/dbt_project" in parse["run"]
    cmd = shlex.split(next(s for s in steps if s.get("name") == "Review")["run"])
    assert cmd[:2] == ["dw-dagster", "review"] and "--fail-on" in cmd
    monkeypatch.chdir(tmp_path)
    shutil.copytree(small_pair.base, "base-target")
    shutil.copytree(small_pair.head, "head-target")
    Path("head").mkdir()
    Path("head/domains.yaml").write_text("domains:\n  - name: all\n    select: ['*']\n    approvers: [a@shop.example]\n")
    res = CliRunner().invoke(main, cmd[1:], catch_exceptions=False)
    assert res.exit_code == 1 and Path("review.md").read_text().startswith(MARKER)
    documented = re.findall(r"--[a-z-]+", (SNIPPETS / "ci/review_cli.sh").read_text())
    help_text = CliRunner().invoke(main, ["review", "--help"]).output
    assert documented and all(flag in help_text for flag in documented)
    Path("domains.yaml").write_text(Path("head/domains.yaml").read_text())
    with pytest.raises(SystemExit) as stop:
        exec(compile((SNIPPETS / "ci/review_python.py").read_text(), "ci/review_python.py", "exec"), {})  # noqa: S102
    assert stop.value.code == 1


def test_the_documented_domains_example_is_valid():
    """docs/snippets/concepts/domains.yaml validates."""
    from dw_dagster.core.domains import Domains

    doc = yaml.safe_load((SNIPPETS / "concepts/domains.yaml").read_text())
    domains = Domains.model_validate(doc)
    assert domains.domains[0].slack_channel and domains.review.sensitive.rules[0].name == "loyalty_card"
