"""Proposals: turn a diagnosis into one change set with a real diff, a bounded window and a rebuild.

The watermark fix edits the pipeline file of an incremental load (see :mod:`dw_dagster.pipelines.incremental`)
to read by arrival time with a lookback covering the longest delay seen, and adds a dbt test that
reconciles a model's daily counts against the landed rows, so the same fault fails a test next
time. The diff is a unified diff against the pipeline repository, applied with ``git apply -p1``
by the owner's merge step (:func:`apply_change_set`).
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from dw_dagster.core import keys as c
from dw_dagster.core.domains import PIPELINE_CODE, REBUILD_MODELS, RERUN_WINDOW, Domain
from dw_dagster.core.models import (CauseFinding, ChangeSet, Diagnosis, FileChange, Incident, PartitionNote, UndoPlan,
                                    stable_hash, utcnow)
from dw_dagster.core.windows import WindowSplit, split_window
from dw_dagster.errors import DwDagsterError


class ProposalError(DwDagsterError, ValueError):
    """The change cannot be proposed as asked (file missing, key not found, empty window)."""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def unified_diff(changes: Mapping[str, tuple[str | None, str]]) -> str:
    """A ``git apply -p1`` compatible diff of ``{path: (before or None for a new file, after)}``."""
    parts = []
    for path, (before, after) in sorted(changes.items()):
        a = [] if before is None else before.splitlines(keepends=True)
        b = after.splitlines(keepends=True)
        header = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if before is None else "")
        body = "".join(difflib.unified_diff(a, b, fromfile="/dev/null" if before is None else f"a/{path}", tofile=f"b/{path}"))
        if body:
            parts.append(header + body)
    return "".join(parts)


def set_yaml_scalar(text: str, key: str, value: str) -> str:
    """Replace the value of a top-level ``key: value`` line, keeping comments and layout.

    Raises:
        ProposalError: the key is not a top-level line of the file.
    """
    pattern = re.compile(rf"^({re.escape(key)}:[ \t]*)([^#\n]*?)([ \t]*(#.*)?)$", re.M)
    if not pattern.search(text):
        raise ProposalError(f"no top-level '{key}:' line to change")
    return pattern.sub(lambda m: f"{m.group(1)}{value}{m.group(3)}", text, count=1)


@dataclass(frozen=True)
class DbtCountTest:
    """A singular dbt test: a model's count per group must equal the landed rows' count per group.

    ``group`` maps the model's column to the expression over the source table that yields it,
    e.g. ``{"store_id": "store_id", "sale_date": "cast(sale_ts as date)"}``.
    """

    model: str
    count_column: str
    source_name: str
    source_table: str
    group: Mapping[str, str]

    @property
    def path(self) -> str:
        return f"dbt_project/tests/assert_{self.model}_counts_match_landed_rows.sql"

    def sql(self, change_set_id: str) -> str:
        keys = list(self.group)
        sel = ",\n        ".join(f"{expr} as {col}" for col, expr in self.group.items())
        on = " and ".join(f"l.{k} = m.{k}" for k in keys)
        co = ",\n    ".join(f"coalesce(l.{k}, m.{k}) as {k}" for k in keys)
        return (
            f"-- Added by dw-dagster change set {change_set_id}: {self.model}.{self.count_column} must equal the\n"
            f"-- number of landed rows in source('{self.source_name}', '{self.source_table}') for every "
            f"{', '.join(keys)}.\n"
            f"{{{{ config(meta={{'dagster': {{'ref': {{'name': '{self.model}'}}}}}}) }}}}\n"
            f"with landed as (\n    select\n        {sel},\n        count(*) as landed_rows\n"
            f"    from {{{{ source('{self.source_name}', '{self.source_table}') }}}}\n"
            f"    group by {', '.join(str(i + 1) for i in range(len(keys)))}\n),\n"
            f"modeled as (\n    select {', '.join(keys)}, {self.count_column} as modeled_rows\n"
            f"    from {{{{ ref('{self.model}') }}}}\n)\n"
            f"select\n    {co},\n    l.landed_rows,\n    m.modeled_rows\n"
            f"from landed l\nfull outer join modeled m on {on}\n"
            f"where l.landed_rows is distinct from m.modeled_rows\n"
        )


def partition_notes(split: WindowSplit, finding: CauseFinding) -> tuple[list[PartitionNote], list[PartitionNote]]:
    """(outside, deferred) notes of a window split, each with the finding's rows in that partition.

    The rows are the partition's ``explained_rows`` in ``finding.details["per_partition"]`` (0 when
    the finding has no per-partition breakdown).
    """
    rows = {p["partition"]: int(p.get("explained_rows", 0)) for p in finding.details.get("per_partition", [])}

    def note(k: str) -> PartitionNote:
        return PartitionNote(partition=k, reason=split.reasons.get(k, "not in the window"), rows=rows.get(k, 0),
                             available_at=split.available_at.get(k))

    return [note(k) for k in split.outside], [note(k) for k in split.deferred]


def _not_run_words(outside: Sequence[PartitionNote], deferred: Sequence[PartitionNote]) -> str:
    parts = []
    if outside:
        parts.append(f"{sum(n.rows for n in outside)} row(s) in {len(outside)} partition(s) outside the asset's "
                     f"partitions left as they are ({'; '.join(n.words() for n in outside)})")
    if deferred:
        parts.append(f"{sum(n.rows for n in deferred)} row(s) in {len(deferred)} deferred partition(s) "
                     f"({'; '.join(n.words() for n in deferred)})")
    return ("; not run: " + "; ".join(parts)) if parts else ""


def propose_watermark_fix(
    *,
    incident: Incident,
    diagnosis: Diagnosis,
    finding: CauseFinding,
    domain: Domain,
    pipeline_root: str | Path,
    pipeline_file: str,
    partitions_def: dg.PartitionsDefinition,
    rebuild_assets: Sequence[Sequence[str]],
    verify_checks: Sequence[Sequence[str]],
    dbt_test: DbtCountTest | None = None,
    undo: UndoPlan | None = None,
    proposer: str = c.PROPOSER,
    now: dt.datetime | None = None,
    watermark_key: str = "watermark_column",
    lookback_key: str = "lookback_hours",
) -> ChangeSet:
    """One change set for a ``late_rows_behind_watermark`` finding.

    Args:
        incident, diagnosis, finding: what was found (``finding.window`` gives the partitions and
            ``finding.details`` the arrival column and the proposed lookback in hours).
        domain: the owning domain (approvers, window cap, expiry).
        pipeline_root: the pipeline repository (working copy) the diff applies to.
        pipeline_file: path of the load's pipeline YAML, relative to ``pipeline_root``.
        partitions_def: the target asset's partitions: the window is the finding's keys that exist
            and are closed; keys outside the definition are listed with their rows in
            ``outside_partitions``, keys not existing yet or still in progress (``end_offset``) in
            ``deferred_partitions`` / ``deferred_details`` with when they exist or close; none is run.
        rebuild_assets: downstream asset keys to rebuild after the window, in any order.
        verify_checks: ``[*asset key path, check name]`` of the checks that prove the repair.
        dbt_test: the new dbt test to add, if any.
        watermark_key, lookback_key: the file's top-level keys set to the arrival column and to the
            proposed lookback in hours (a pipeline file's, or an asset's own settings file's).

    Raises:
        ProposalError: no partition to run now, or a window over the domain's cap (the proposal
            is never silently trimmed).
    """
    now = now or utcnow()
    split = split_window(partitions_def, finding.window, domain.max_window_partitions)  # which exist: the clock, as Dagster
    window, outside_notes, deferred_notes = split.window, *partition_notes(split, finding)
    if split.over:
        raise ProposalError(f"window of {len(window) + len(split.over)} partitions exceeds domain {domain.name!r} cap "
                            f"of {domain.max_window_partitions}")
    if not window:
        raise ProposalError("the finding names no partition to rerun now" + (
            ": " + "; ".join(n.words() for n in outside_notes + deferred_notes) if outside_notes or deferred_notes else ""))
    root = Path(pipeline_root)
    path = root / pipeline_file
    if not path.exists():
        raise ProposalError(f"pipeline file not found: {path}")
    before = path.read_text()
    arrival = finding.details["arrival_column"]
    lookback = finding.details["proposed_lookback_hours"]
    after = set_yaml_scalar(set_yaml_scalar(before, watermark_key, arrival), lookback_key, str(lookback))
    provisional_id = "cs-" + stable_hash([incident.id, window, after], 10)
    changes: dict[str, tuple[str | None, str]] = {pipeline_file: (before, after)}
    new_tests = []
    if dbt_test is not None and not (root / dbt_test.path).exists():
        changes[dbt_test.path] = (None, dbt_test.sql(provisional_id))
        new_tests.append(dbt_test.path)
    diff = unified_diff(changes)
    not_run = sum(n.rows for n in outside_notes + deferred_notes)
    recovered = max(0, finding.explained_rows - not_run)
    files = [FileChange(path=p, before_sha256=_sha(b) if b is not None else None, after_sha256=_sha(a)) for p, (b, a) in sorted(changes.items())]
    content = dict(
        id=provisional_id,
        incident_id=incident.id,
        diagnosis_id=diagnosis.id,
        domain=domain.name,
        proposer=proposer,
        created_at=now,
        expires_at=now + dt.timedelta(hours=domain.approval_expiry_hours),
        approvers=list(domain.approvers),
        cause_kind=finding.kind,
        summary=(
            f"Read {'/'.join(incident.asset_key)} by {arrival} with a {lookback} h lookback (was "
            f"{finding.details['watermark_column']} with a strict '>'), rerun {len(window)} partition(s) "
            f"{window[0]}..{window[-1]} to recover {recovered} rows, rebuild "
            f"{len(rebuild_assets)} downstream model(s)" + (f", add {len(new_tests)} dbt test(s)" if new_tests else "")
            + _not_run_words(outside_notes, deferred_notes)
        ),
        target_asset=list(incident.asset_key),
        window=window,
        diff=diff,
        files=files,
        rebuild_assets=[list(k) for k in rebuild_assets],
        new_tests=new_tests,
        verify_checks=[list(k) for k in verify_checks],
        expected_recovered_rows=recovered,
        # the new dbt test travels in the diff, so it is pipeline code, merged by its owner
        deferred_partitions=[n.partition for n in deferred_notes],
        deferred_details=deferred_notes,
        outside_partitions=outside_notes,
        undo_plan=undo.model_copy(update={"window": list(window)}) if undo is not None else None,
        change_classes=[PIPELINE_CODE, RERUN_WINDOW] + ([REBUILD_MODELS] if rebuild_assets else []),
        undo=(
            f"Revert the pipeline change with `git apply -R -p1` of this diff. The rerun merged the source's own "
            f"rows on the key and overwrote nothing; to remove them anyway, delete the target rows of partitions "
            f"{window[0]}..{window[-1]} whose {arrival} is later than each partition's recorded source snapshot."
        ),
    )
    return ChangeSet.seal(**content)


def change_set_markdown(cs: ChangeSet) -> str:
    """The change set as markdown for the asset page, as proposed (its decision is an event of its own)."""
    return "\n".join([
        f"### Change set {cs.id}, proposed {cs.created_at:%Y-%m-%d %H:%M} UTC (version {cs.version})",
        f"{cs.summary}.",
        f"- **Cause**: {cs.cause_kind}; incident {cs.incident_id}",
        f"- **Window**: {', '.join(cs.window)}",
        *(f"- **{line.split(': ', 1)[0].capitalize()}**: {line.split(': ', 1)[1]}" for line in cs.not_run_lines()),
        f"- **Rebuild**: {', '.join('/'.join(k) for k in cs.rebuild_assets)}",
        f"- **New tests**: {', '.join(cs.new_tests) or 'none'}",
        *([f"- **Diff**: already merged with version {cs.diff_merged_in[:12]}… (shown for the record; nothing to merge again)"]
          if cs.diff_merged_in else []),
        *([f"- **Earlier versions**: " + "; ".join(f"{v['version'][:12]}… {v['state']}" + (f" ({v['note'][:120]})" if v.get("note") else "")
                                                  for v in cs.earlier_versions)] if cs.earlier_versions else []),
        f"- **Approvers** ({cs.domain}): {', '.join(cs.approvers)}; expires {cs.expires_at.isoformat()}",
        f"- **Decide**: `dw-dagster approve {cs.id} --login` (or `--reject`), the review page of "
        f"`dw-dagster approvals serve`, or the Launchpad job `dw_approve_change_set` with the config "
        f"`dw-dagster approvals token {cs.id}` prints; its state now: `dw-dagster change-sets show {cs.id}`",
        f"- **Merge**: `dw-dagster change-sets show {cs.id} --patch | git apply -p1` in the pipeline repository",
        "", "```diff", cs.diff.rstrip(), "```",
    ])


def apply_change_set(cs: ChangeSet, repo_root: str | Path, committer: str) -> str:
    """The owner's merge step: apply the diff to a git working copy and commit it.

    Returns:
        The new commit id.

    Raises:
        ProposalError: the working copy is not a git repository, or the diff does not apply.
    """
    root = Path(repo_root)
    if not (root / ".git").exists():
        raise ProposalError(f"{root} is not a git working copy")
    ident = ["-c", f"user.name={committer}", "-c", f"user.email={committer}"]
    for args in (["apply", "--check", "-p1", "-"], ["apply", "-p1", "-"]):
        res = subprocess.run(["git", *args], cwd=root, input=cs.diff, text=True, capture_output=True)
        if res.returncode:
            raise ProposalError(f"change set {cs.id} does not apply to {root}: {res.stderr.strip()}")
    subprocess.run(["git", "add", "-A"], cwd=root, check=True, capture_output=True)
    subprocess.run(["git", *ident, "commit", "-q", "-m", f"Apply dw-dagster change set {cs.id} ({cs.cause_kind})"],
                   cwd=root, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True, text=True).stdout.strip()
