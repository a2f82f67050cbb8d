"""The demo harness both examples share: folders, the timeline, playing the people, ticking the repair.

A demo (``dw-dagster demo store-sales``, ``dw-dagster demo orders``) stages an incident on a real
Dagster instance and drives the loop in one process. The pieces here are what every such demo
needs besides its own code location:

- :func:`claim_demo_dir` — a folder the demo may clear (it carries :data:`MARKER`), never someone's data;
- :class:`Timeline` — the printed timeline with elapsed seconds;
- :func:`run_job`, :func:`evaluations` — a job run in process with quiet logs, and what checks it evaluated;
- :func:`demo_login`, :func:`demo_approvals` — the people: refused attempts, then the listed owner
  logging in at the identity provider (authorization code with PKCE) and approving through the
  approval job;
- :func:`owner_merges` — the owner merging a change set's diff in a git working copy;
- :func:`run_repair_stages` — the remediation sensor ticked until the receipt;
- :func:`example_dbt_project`, :func:`write_dbt_profile` — the dbt project the examples ship with
  (in the repository or inside the installed package) and a profile on one DuckDB file;
- :class:`DemoSpec` — what ``dw-dagster demo NAME`` needs from an example's demo module
  (each defines ``DEMO``; the command line loads it by module name).

The identity provider, Lightup and paging stand-ins the demos start are in
:mod:`dw_dagster_dev.services`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from dw_dagster.core.links import REVIEW_URL_ENV  # noqa: F401 - the demos set it
from dw_dagster.core import keys as c
from dw_dagster.core import records
from dw_dagster.core.windows import RANGE_END_TAG, RANGE_START_TAG
from dw_dagster.diagnosis.sink_diagnoser import source_change_sentence
from dw_dagster.integrations.notifications import notifications
from dw_dagster.testing.local_daemon import LocalSensorDaemon

#: the file that marks a folder as made by a demo (cleared at the next run)
MARKER = ".dw_demo_dir"
#: run config that keeps a job's console log to warnings (the demo prints its own timeline)
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
#: the run tag naming the repair stage a run holds (``window-1``, ``rebuild``, ``verify``, ``receipt`` ...)
STAGE_TAG = c.STAGE_TAG
#: who proposes change sets (refused as an approver)
PROPOSER = c.PROPOSER
#: the environment variable holding the key that signs approvals and receipts
SIGNING_KEY_ENV = c.SIGNING_KEY_ENV

__all__ = [
    "MARKER", "PROPOSER", "QUIET", "RANGE_END_TAG", "RANGE_START_TAG", "SIGNING_KEY_ENV", "STAGE_TAG", "DemoDirError",
    "DemoError", "DemoSpec", "Timeline", "claim_demo_dir", "clip", "demo_approvals", "demo_login", "demo_login_for",
    "evaluations",
    "example_dbt_project", "notifications", "owner_merges", "run_job", "run_repair_stages", "source_change_sentence",
    "write_dbt_profile",
]


#: where the demos say the review site is: ``dw-dagster approvals serve``'s default address
REVIEW_URL = "http://127.0.0.1:8770"


class DemoError(RuntimeError):
    """A stage of the demo did not produce what it must; the message names the stage."""


class DemoDirError(RuntimeError):
    """A folder the demo would clear was not made by the demo."""


def claim_demo_dir(path: Path) -> Path:
    """Give the demo an empty ``path``: create it, or clear it if an earlier demo made it.

    Args:
        path: the folder.

    Returns:
        ``path``, empty but for the :data:`MARKER` file.

    Raises:
        DemoDirError: ``path`` exists and is a file, or is not empty and has no demo marker (it
            is someone's data).
    """
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise DemoDirError(f"{path} exists and is not a folder")
        if (path / MARKER).exists():
            shutil.rmtree(path)
        elif any(path.iterdir()):
            raise DemoDirError(f"{path} exists, is not empty and was not made by the demo; "
                               "choose another --workdir or remove it yourself")
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("made by dw-dagster demo; cleared at the next demo run\n")
    return path


def mark_new_home(path: Path) -> None:
    """Create ``path`` with the demo's :data:`MARKER` when it does not exist yet: a home an example's code
    location makes on load (``dagster definitions validate``, ``dagster dev``) is then the demo's to clear,
    and ``dw-dagster demo`` does not refuse it as someone's data. An existing folder is left as it is."""
    path = Path(path)
    if not path.exists():
        path.mkdir(parents=True)
        (path / MARKER).write_text("made by a dw_dagster example's code location; cleared at the next demo run\n")


class Timeline:
    """Prints the timeline with elapsed seconds (to stderr when JSON goes to stdout).

    Args:
        stream: where lines go (default: ``sys.stdout`` as it is when a line is printed, so a
            timeline made while something else had replaced stdout never writes to a closed file).
    """

    def __init__(self, stream=None) -> None:
        self.t0 = time.monotonic()
        self._stream = stream

    @property
    def stream(self):
        """Where lines go now."""
        return self._stream if self._stream is not None else sys.stdout

    def __call__(self, stage: str, msg: str = "") -> None:
        """One line: ``[  12.3s] stage      msg``."""
        print(f"[{time.monotonic() - self.t0:6.1f}s] {stage:<10} {msg}", file=self.stream, flush=True)

    def detail(self, msg: str) -> None:
        """An indented line under the previous one."""
        print(f"{'':20}{msg}", file=self.stream, flush=True)


def clip(text: str, width: int = 110) -> str:
    """``text`` cut to ``width`` characters, with an ellipsis when something was cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def run_job(job: dg.JobDefinition, instance: dg.DagsterInstance, stage: str, **kwargs: Any) -> dg.ExecuteInProcessResult:
    """Run ``job`` in process on ``instance`` with quiet logs (``run_config`` merged over :data:`QUIET`).

    Args:
        job: the job (e.g. ``defs.resolve_job_def(name)``).
        instance: the demo's instance.
        stage: the timeline stage, named in the error.
        **kwargs: passed to ``execute_in_process`` (``run_config``, ``tags``, ``partition_key`` ...).

    Raises:
        DemoError: the run failed.
    """
    config = {**QUIET, **kwargs.pop("run_config", {})}
    result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=config, **kwargs)
    if not result.success:
        raise DemoError(f"{stage}: run {result.run_id} of {job.name} failed")
    return result


def evaluations(instance: dg.DagsterInstance, run_id: str) -> dict[str, dg.AssetCheckEvaluation]:
    """Check name → the evaluation one run recorded (the last one when a name repeats)."""
    out = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        ev = entry.dagster_event.event_specific_data
        out[ev.check_name] = ev
    return out


def run_repair_stages(daemon: LocalSensorDaemon, instance: dg.DagsterInstance, run_ids: dict[str, str], log: Timeline,
                      *, ticks: int, describe: Callable[[str, dg.DagsterRun], str],
                      after_stage: Callable[[str], None] | None = None) -> None:
    """Tick the remediation sensor until it launches nothing more.

    One stage per tick, at most ``ticks`` ticks; each stage's run id is recorded in ``run_ids``
    (stage name → run id) and logged with what ``describe(stage, run)`` adds; then
    ``after_stage(stage)`` plays what a person does between stages (a rerun in Mage).

    Raises:
        DemoError: a run failed, or the verify and receipt stages never ran.
    """
    tick = None
    for _ in range(ticks):
        tick = daemon.tick(c.REMEDIATION_SENSOR)
        if tick.failed_run_ids:
            raise DemoError(f"repair: run {tick.failed_run_ids[0]} failed ({tick.skip_reason})")
        if not tick.run_ids:
            break
        run = instance.get_run_by_id(tick.run_ids[0])
        stage = run.tags.get(STAGE_TAG)
        run_ids[stage] = run.run_id
        log("receipt" if stage == "receipt" else "repair", f"{stage} run {run.run_id[:8]} succeeded{describe(stage, run)}")
        if after_stage is not None:
            after_stage(stage)
    if "verify" not in run_ids or "receipt" not in run_ids:
        raise DemoError(f"repair: stages did not finish ({sorted(run_ids)}; {tick.skip_reason if tick else 'no tick'})")


def demo_login(domains_file: Path, change_set_id: str, email: str, instance: dg.DagsterInstance,
               decision: str = "approve") -> str:
    """An ID token for ``email``'s decision on a change set, through the identity provider's login.

    The authorization code flow with PKCE, a loopback redirect and the decision's nonce, at the
    provider the domains file names. The stand-in provider logs its people in without a
    password: here the demo acts as them.

    Args:
        domains_file: the domains file whose ``identity.oidc`` names the provider.
        change_set_id: the change set decided on.
        email: who logs in.
        instance: where the change set is recorded.
        decision: ``approve`` or ``reject`` (bound into the token's nonce).

    Returns:
        The ID token (a JWT string).
    """
    import httpx

    from dw_dagster.approval.identity import decision_nonce
    from dw_dagster.approval.identity.oidc import login
    from dw_dagster.core.domains import load_domains

    cs = records.find_change_set(instance, change_set_id)
    settings = load_domains(domains_file).identity.oidc
    return login(settings, nonce=decision_nonce(cs.id, cs.version, decision), login_hint=email,
                 open_url=lambda url: httpx.get(url, follow_redirects=True, timeout=30))


def demo_login_for(domains_file: Path, nonce: str, email: str) -> str:
    """An ID token for ``email`` bound to ``nonce`` (an access request's, say), through the identity
    provider's login, as :func:`demo_login` does for a decision."""
    import httpx

    from dw_dagster.approval.identity.oidc import login
    from dw_dagster.core.domains import load_domains

    settings = load_domains(domains_file).identity.oidc
    return login(settings, nonce=nonce, login_hint=email, open_url=lambda url: httpx.get(url, follow_redirects=True, timeout=30))


def demo_approvals(instance: dg.DagsterInstance, daemon: LocalSensorDaemon, change_set_id: str, *, owner: str,
                   not_listed: str, comment: str, refused: list, log: Timeline, owner_role: str,
                   domains_file: Path) -> dict:
    """The approval stage, every attempt through the approval job.

    The proposer, a colleague typing the owner's email and an unlisted person who logged in are
    refused (each appended to ``refused`` as ``{"approver", "reason"}``); nothing runs before an
    approval; then ``owner`` logs in at the identity provider and approves.

    Args:
        domains_file: the code location's domains file (approvers, identity provider); the
            decisions run the approval job on it (:func:`~dw_dagster.approval.job.approve_in_process`).

    Returns:
        How the approver was verified: ``{"email", "method", "issuer", "subject", "approval_id"}``.

    Raises:
        DemoError: a refusal was accepted, a repair ran unapproved, or the owner was refused.
    """
    from dw_dagster.approval.job import approve_in_process

    def approve(cs_id: str, **how: Any) -> tuple[bool, str]:
        return approve_in_process(instance, cs_id, domains=domains_file, **how)

    attempts = [(PROPOSER, dict(approver=PROPOSER)), (f"{owner} (typed, not logged in)", dict(approver=owner)),
                (f"{not_listed} (logged in)", dict(id_token=demo_login(domains_file, change_set_id, not_listed, instance)))]
    for who, how in attempts:
        ok, msg = approve(change_set_id, comment=comment, **how)
        if ok:
            raise DemoError(f"approve: {who} must be refused")
        refused.append({"approver": who, "reason": msg})
        log("approve", f"REFUSED {who}: {clip(msg, 200)}")
    if daemon.tick(c.REMEDIATION_SENSOR).run_ids:
        raise DemoError("approve: a repair ran before any approval")
    token = demo_login(domains_file, change_set_id, owner, instance)
    ok, msg = approve(change_set_id, id_token=token, comment=comment)
    if not ok:
        raise DemoError(f"approve: the listed owner's approval was refused: {msg}")
    (a,) = records.approvals(instance, change_set_id, active_only=True)
    log("approve", f"approved by {a.identity.describe()}, {owner_role} (the demo logs in as the owner)")
    return {"email": a.identity.email, "method": a.identity.method, "issuer": a.identity.issuer,
            "subject": a.identity.subject, "approval_id": a.id}


def owner_merges(change_set, repo: Path, owner: str) -> str:
    """The owner's merge: apply the change set's diff to the git working copy ``repo`` and commit it.

    Returns:
        The new commit id (40 hex digits).

    Raises:
        DemoError: the diff does not apply (the message says why).
    """
    from dw_dagster.proposals.watermark import ProposalError, apply_change_set

    try:
        return apply_change_set(change_set, repo, owner)
    except ProposalError as e:
        raise DemoError(f"merge: {e}") from e


def example_dbt_project() -> Path:
    """The dbt project the examples ship with (models, tests, exposures of both stories).

    It is package data of ``dw_dagster_examples`` (``dw_dagster_examples/dbt_project``), in a
    checkout and in an installed ``dw-dagster-examples`` alike. Examples copy it into their home;
    never write to it.

    Raises:
        FileNotFoundError: it holds no ``dbt_project.yml`` (a broken installation).
    """
    import dw_dagster_examples

    project = Path(dw_dagster_examples.__file__).resolve().parent / "dbt_project"
    if (project / "dbt_project.yml").exists():
        return project
    raise FileNotFoundError(f"the examples' dbt project is missing ({project}); reinstall dw-dagster-examples")


def write_dbt_profile(profiles_dir: Path, *, profile: str, duckdb_path: Path, schema: str = "analytics") -> Path:
    """Write ``profiles_dir/profiles.yml``: dbt ``profile`` on one DuckDB file (rewritten only when it differs).

    A profile per home, instead of one reading an environment variable, lets two code locations
    run dbt in one process on different warehouses.

    Args:
        profiles_dir: the folder (created when missing).
        profile: the profile name ``dbt_project.yml`` uses.
        duckdb_path: the warehouse file.
        schema: the default schema of models.

    Returns:
        The ``profiles.yml`` path.
    """
    profiles_dir.mkdir(parents=True, exist_ok=True)
    text = (f"# Written by dw_dagster's example: dbt builds in this home's warehouse.\n{profile}:\n  target: duckdb\n"
            f"  outputs:\n    duckdb:\n      type: duckdb\n      path: {json.dumps(str(duckdb_path))}\n"
            f"      schema: {schema}\n      threads: 1\n")
    path = profiles_dir / "profiles.yml"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


@dataclass(frozen=True)
class DemoSpec:
    """What ``dw-dagster demo NAME`` needs from an example (its demo module's ``DEMO``).

    The command claims ``--workdir``, makes the signing key, keeps the run logs in a file, calls
    ``run`` and prints the outcome (one JSON object with ``--json``) and how to open the same
    instance in the UI.

    Attributes:
        name: the command's name, e.g. ``store-sales``.
        run: ``run(home=Path, instance=DagsterInstance, scale=float, log=Timeline, result=R) -> R``;
            fills ``result`` stage by stage and raises :class:`DemoError` naming the stage that failed.
        new_result: ``new_result(scale) -> R``, an empty result with ``to_json()``, ``seconds`` and
            ``dagster_home`` attributes.
        home_attr: the result's attribute holding the home folder (a JSON key of ``--json``).
        home_folder: the home's folder name under ``--workdir``.
        instance_folder: the Dagster instance's folder under ``--workdir`` (unless ``$DAGSTER_HOME``).
        log_name: the run log's file name under ``--workdir``.
        home_env: the environment variable the code location reads its home from.
        location_module: the code location's module (``dagster dev -m`` without a workspace file).
        asset: the asset page to look at afterwards.
        events: the event kinds on that page, for the hint.
        default_scale, min_scale, max_scale: the data scale (1.0 = the incident's full size).
    """

    name: str
    run: Callable[..., Any]
    new_result: Callable[[float], Any]
    home_attr: str
    home_folder: str
    instance_folder: str
    log_name: str
    home_env: str
    location_module: str
    asset: str
    events: str
    default_scale: float
    min_scale: float
    max_scale: float


def ladder_after(instance: dg.DagsterInstance, domains_file: Path, change_set_id: str, hours: float) -> list[dict]:
    """Climb the escalation ladder at ``hours`` after the change set's repair ended (its receipt stage),
    on a clock the demo sets: the steps told (``dw/escalation`` payloads). The demo's stand-in for the
    hours a real ladder waits."""
    import datetime as dt

    from dw_dagster.approval.ladder import climb
    from dw_dagster.core.domains import load_domains
    from dw_dagster.core.ledger import ledger_for

    led = ledger_for(instance)
    row = led.change_set_row(change_set_id)
    receipt = led.stages(change_set_id, row.version).get("receipt") if row else None
    if receipt is None or receipt.finished_at is None:
        raise DemoError(f"ladder: change set {change_set_id} has no finished receipt stage")
    now = dt.datetime.fromtimestamp(receipt.finished_at, dt.timezone.utc) + dt.timedelta(hours=hours)
    return [s for s in climb(instance, load_domains(domains_file), now).told if s["change_set_id"] == change_set_id]
