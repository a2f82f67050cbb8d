"""The records dw_dagster passes between the stages of its loop, as pydantic models.

detect → :class:`Incident`; diagnose → :class:`Diagnosis` (with :class:`CauseFinding` and
:class:`BlastRadius`); propose → :class:`ChangeSet`; approve → :class:`Approval`; receipt →
:class:`Receipt`. Each is stored as JSON in ``dw/`` metadata on an asset and read back from the
Dagster event log, so every field is JSON-serializable. Times are timezone-aware UTC datetimes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dw_dagster.core.identity import VerifiedIdentity
from dw_dagster.errors import DwDagsterError
from dw_dagster.dagster_private import public


def utcnow() -> dt.datetime:
    """The current time as an aware UTC datetime."""
    return dt.datetime.now(dt.timezone.utc)


def stable_hash(payload: Any, length: int = 64) -> str:
    """SHA-256 hex digest of the canonical JSON of ``payload`` (sorted keys), cut to ``length``."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json(self) -> str:
        return self.model_dump_json()


def gap_words(gap_rows: int, gap_pct: float | None = None) -> str:
    """A target's row gap against its source in words, from the target's side.

    Args:
        gap_rows: source rows minus target rows (positive: the target is short).
        gap_pct: the same as a percentage of the source rows, or None.

    Returns:
        ``"2,124 rows short (1.80 %)"``, ``"12 rows over (0.01 %)"`` or ``"no row gap"``.
    """
    if not gap_rows:
        return "no row gap"
    pct = f" ({abs(gap_pct):.2f} %)" if gap_pct is not None else ""
    return f"{abs(gap_rows):,} row{'s' if abs(gap_rows) != 1 else ''} {'short' if gap_rows > 0 else 'over'}{pct}"


class SliceGap(_Record):
    """One slice (e.g. one region) of a source/target reconciliation.

    Counts are rows; sums are exact decimal strings; ``gap_pct`` is (source − target) / source in
    percent (0.0 when both sides are empty).
    """

    slice: dict[str, Any]
    source_rows: int
    target_rows: int
    gap_rows: int
    gap_pct: float
    source_keys: int | None = Field(default=None, description="distinct keys (NULL-safe), when a key is given")
    target_keys: int | None = None
    source_duplicate_keys: int | None = Field(default=None, description="keys held by more than one row")
    target_duplicate_keys: int | None = None
    source_sums: dict[str, str] = Field(default_factory=dict)
    target_sums: dict[str, str] = Field(default_factory=dict)
    sum_gaps: dict[str, str] = Field(default_factory=dict)
    source_nonfinite: dict[str, list[int]] = Field(
        default_factory=dict, description="per measure that can hold them: rows holding [NaN, +Inf, -Inf]; sums are of the finite values")
    target_nonfinite: dict[str, list[int]] = Field(default_factory=dict)
    passed: bool

    def gap_words(self) -> str:
        """The row gap in words: ``2,124 rows short (1.80 %)``, ``12 rows over (0.01 %)`` or ``no row gap``."""
        return gap_words(self.gap_rows, self.gap_pct)


@public
class Incident(_Record):
    """One problem on one asset, created exactly once per failing evaluation."""

    id: str
    asset_key: list[str]
    source: Literal["dw_check", "lightup", "volume_sensor", "manual", "access"]
    check_name: str | None = None
    detected_at: dt.datetime
    summary: str
    slices: list[SliceGap] = Field(default_factory=list)
    gap_rows: int = 0
    gap_pct: float = 0.0
    evaluation_id: int | None = Field(default=None, description="storage id of the failing check evaluation")
    external_id: str | None = Field(default=None, description="the alerting tool's incident id (Lightup incident uuid)")
    external_url: str | None = Field(default=None, description="link to the incident in the alerting tool")
    window_start: dt.datetime | None = Field(default=None, description="start of the affected interval (UTC)")
    window_end: dt.datetime | None = Field(default=None, description="end of the affected interval (UTC, exclusive)")


class Evidence(_Record):
    """One query a person can re-run, and the values dw_dagster saw when it ran it."""

    description: str
    database: str
    sql: str
    values: Any
    key_columns: list[str] = Field(default_factory=list, description="the columns of the key lists in values "
                                   "(``[v1, v2]`` under ``key`` or as rows), so a sensitive key column can be masked")


@public
class CauseFinding(_Record):
    """A named cause with its evidence and an honest remainder.

    ``explained_rows`` + ``unexplained_rows`` = the gap the finding looked at. ``confidence`` is
    explained / gap (0.0-1.0).
    """

    kind: str
    summary: str
    confidence: float
    explained_rows: int
    unexplained_rows: int
    window: list[str] = Field(default_factory=list, description="partition keys holding the explained rows")
    details: dict[str, Any] = Field(default_factory=dict)
    evidence: list[Evidence] = Field(default_factory=list)


class ExposureRef(_Record):
    unique_id: str
    name: str
    label: str | None = None
    type: str | None = None
    url: str | None = None
    owner_name: str | None = None
    owner_email: str | None = None
    depth: int
    needed_by: str | None = Field(default=None, description="meta.dw.needed_by: when the dashboard is needed "
                                  "('HH:MM Zone' daily, or a cron with its zone)")
    bi: dict[str, Any] | None = Field(default=None, description="meta.dw.bi: the BI object (tool, workbook or dashboard)")


class ImpactedNode(_Record):
    """One node downstream of a broken one: a dbt node (unique id) or a Dagster asset/check.

    ``depth`` is the fewest graph edges from the broken node; ``owners`` are emails or Dagster
    owner strings (``team:...``); ``url`` is where the node is documented or viewed, when known.
    """

    unique_id: str
    name: str
    resource_type: str
    depth: int
    asset_key: list[str] | None = None
    owners: list[str] = Field(default_factory=list)
    url: str | None = None


@public
class BlastRadius(_Record):
    """Everything downstream of the broken asset: dbt nodes, tests, exposures and their owners."""

    root: str
    models: list[ImpactedNode] = Field(default_factory=list)
    tests: list[ImpactedNode] = Field(default_factory=list)
    exposures: list[ExposureRef] = Field(default_factory=list)
    other: list[ImpactedNode] = Field(default_factory=list)
    owners: list[str] = Field(default_factory=list)
    dagster_assets: list[list[str]] = Field(default_factory=list)
    assets: list[ImpactedNode] = Field(default_factory=list, description="Dagster assets that are not dbt nodes")
    max_depth: int = 0


@public
class Diagnosis(_Record):
    """The answer to "why": the causes found, the blast radius, and what is left unexplained."""

    id: str
    incident_id: str
    asset_key: list[str]
    created_at: dt.datetime
    causes: list[CauseFinding]
    blast_radius: BlastRadius
    gap_rows: int
    unexplained_rows: int

    @property
    def primary(self) -> CauseFinding | None:
        return max(self.causes, key=lambda c: c.explained_rows, default=None)


class FileChange(_Record):
    """One file the change set edits or adds, relative to the pipeline repository root."""

    path: str
    before_sha256: str | None = Field(description="None when the file is new")
    after_sha256: str


class UndoPlan(_Record):
    """How to put a change set's window back (:mod:`dw_dagster.repair.undo`).

    ``table`` is in the database of the ``resource_key`` resource; a window key's rows are read
    from the target asset's own ``PartitionsDefinition`` (a half-open time range on
    ``partition_column``, or ``partition_column = key`` for static and dynamic keys; see
    :mod:`dw_dagster.databases.partitions`), UTC days when the code location does not define the
    asset. ``of_change_set`` is set on an undo change set: the change set it reverses.
    """

    kind: Literal["restore_partitions"] = "restore_partitions"
    resource_key: str
    table: str
    partition_column: str
    window: list[str]
    of_change_set: str | None = None


@public
class ChangeStep(_Record):
    """One data change a change set applies in the warehouse, as a stage of its own.

    Steps run in list order after the change set's windows and before its rebuild (see
    :func:`dw_dagster.repair.stages.stage_plan`); each is one run of the step job for its
    ``kind`` (:func:`dw_dagster.repair.steps.build_step_jobs`), launched only after the
    previous stage succeeded and only under a valid approval. Added for change sets that are not
    partition reruns (a schema migration, a replay of parked rows); a change set without steps
    runs exactly the stages it ran before.

    Attributes:
        kind: which runner applies it, e.g. ``migration`` or ``replay`` (letters, digits, ``_``).
        change_class: its class in :mod:`dw_dagster.core.domains` (``schema_migration``,
            ``replay_dead_letter``, ...); also listed in the change set's ``change_classes``.
        summary: one sentence for the owner.
        resource_key: the Dagster resource (a :class:`~dw_dagster.databases.DatabaseResource`)
            of the database it changes.
        spec: what the runner needs, as JSON (for ``migration``: the
            :class:`~dw_dagster.changes.migrations.Migration`; for ``replay``: the replay's selection
            and guard).
        sql: the forward statements as the owner reviews them (informational; the runner builds
            what it runs from ``spec``).
        rollback_sql: how to undo it, as statements (empty when the undo is not SQL).
        expected_rows: rows the step must touch (a replay refuses to run on any other count);
            None when it touches no rows.
    """

    kind: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    change_class: str
    summary: str
    resource_key: str
    spec: dict[str, Any] = Field(default_factory=dict)
    sql: list[str] = Field(default_factory=list)
    rollback_sql: list[str] = Field(default_factory=list)
    expected_rows: int | None = None

    @field_validator("kind")
    @classmethod
    def _kind_is_not_a_stage(cls, v: str) -> str:
        if v in _RESERVED_STAGE_KINDS:
            raise ValueError(f"step kind {v!r} would collide with the remediation stage of that name")
        return v


class ManualStep(_Record):
    """A step a person takes outside dw_dagster, which the verify stage then checks (dw_dagster runs nothing of it).

    For example the rerun of a downstream Mage pipeline once the data steps are done: dw_dagster
    makes no change inside Mage, it names the rerun, gives the call and the link, and its verify
    stage waits (bounded) for a run of that pipeline started after the last data step.

    Attributes:
        kind: what it is, e.g. ``mage_rerun``.
        system: where the person acts, e.g. ``mage``.
        target: what is acted on there (a Mage pipeline's uuid, e.g. ``finance_daily``).
        after: the stages it must follow (``["migration-1", "replay-2"]``).
        summary: one sentence for the engineer ("rerun `finance_daily` in Mage after steps 1–2").
        command: how to do it from a terminal or an agent (``mage-agent`` ``run_pipeline`` call).
        url: where to do it in the system's UI, when known.
        check: ``[*asset key, check name]`` of the verification check that reads its outcome.
    """

    kind: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    system: str
    target: str
    after: list[str] = Field(default_factory=list)
    summary: str
    command: str = ""
    url: str | None = None
    check: list[str] = Field(default_factory=list)


#: stage names of the remediation sensor a step kind may not take
_RESERVED_STAGE_KINDS = frozenset({"window", "snapshot", "restore", "rebuild", "verify", "receipt"})


class PartitionNote(_Record):
    """A partition a cause reaches that a change set does not run, and why.

    ``rows``: the cause's rows in it (late rows missing from the target, say); ``available_at``:
    for a deferred partition, when it will exist or close (aware UTC), else None.
    """

    partition: str
    reason: str = Field(description="'before the first partition', 'does not exist yet', 'still in progress', ...")
    rows: int = 0
    available_at: dt.datetime | None = None

    def words(self) -> str:
        """One line: ``2026-11-30 (3 rows): does not exist yet, until 2026-12-01T00:00:00+00:00``."""
        until = f", until {self.available_at.isoformat()}" if self.available_at is not None else ""
        return f"{self.partition} ({self.rows} row{'s' if self.rows != 1 else ''}): {self.reason}{until}"


#: ChangeSet fields added after records were first sealed: left out of the hash while empty, so
#: the versions of earlier records still verify
_LATER_FIELDS = ("outside_partitions", "deferred_details", "manual_steps", "excluded_approvers", "asset_levels",
                 "hold_only", "steps_first", "diff_merged_in", "earlier_versions")


@public
class ChangeSet(_Record):
    """One proposal: the code diff for the owner, the bounded window to rerun, what to rebuild.

    ``version`` is the SHA-256 (32 hex digits) of everything else in the record: what will run
    (window, steps with their SQL and specs, files and diff, rebuild order, tests, undo plan) and
    what the owner read (summary, blast radius in the diagnosis it names, expiry, approvers,
    domain). An approval signs the version, so it covers exactly that content; a record whose
    content does not hash to its version is refused as tampered (:meth:`verify_version`). Build
    one with :meth:`seal`. ``steps`` (default none) are warehouse changes applied between the
    window and the rebuild.
    """

    id: str
    version: str
    incident_id: str
    diagnosis_id: str
    domain: str
    proposer: str
    created_at: dt.datetime
    expires_at: dt.datetime
    approvers: list[str]
    cause_kind: str
    summary: str
    target_asset: list[str]
    window: list[str] = Field(description="partition keys, sorted")
    diff: str = Field(description="unified diff against the pipeline repository (git apply -p1)")
    files: list[FileChange]
    rebuild_assets: list[list[str]]
    new_tests: list[str] = Field(default_factory=list)
    verify_checks: list[list[str]] = Field(default_factory=list, description="[asset key path..., check name]")
    expected_recovered_rows: int = 0
    undo: str = ""
    change_classes: list[str] = Field(default_factory=list, description="what the change set does, by class "
                                      "(dw_dagster.core.domains: pipeline_code, rerun_window, rebuild_models, add_test...)")
    undo_plan: UndoPlan | None = Field(default=None, description="how the window is put back, when it can be")
    deferred_partitions: list[str] = Field(default_factory=list, description="partitions the cause reaches that "
                                           "do not exist yet or are still in progress; reported, not run")
    outside_partitions: list[PartitionNote] = Field(default_factory=list, description="partitions the cause reaches "
                                                    "that the asset's definition will never hold, with their rows")
    deferred_details: list[PartitionNote] = Field(default_factory=list, description="the deferred partitions with "
                                                  "their rows and when each will exist or close")
    steps: list[ChangeStep] = Field(default_factory=list, description="warehouse changes (schema migration, "
                                    "replay of parked rows) run in order after the window and before the rebuild")
    manual_steps: list[ManualStep] = Field(default_factory=list, description="steps a person takes outside "
                                           "dw_dagster (a Mage rerun), checked by the verify stage; not stages")
    excluded_approvers: list[str] = Field(default_factory=list, description="people who may not decide on it besides "
                                          "the proposer, e.g. the person an access grant is for (canonical emails)")
    asset_levels: list[list[list[str]]] = Field(default_factory=list, description="the assets each window stage "
                                                "reruns, one level after the other in dependency order (an upstream's "
                                                "partitions, then the assets that read them); empty: the target asset")
    hold_only: bool = Field(default=False, description="the window is held (and kept for undo) but not rerun: "
                            "the steps change it (a duplicated load's partitions replaced in place)")
    steps_first: bool = Field(default=False, description="the steps run before the window (a migration the "
                              "rerun needs), not after it")
    diff_merged_in: str = Field(default="", description="the earlier version whose approval the diff was merged under "
                                "(a re-proposed version carries the original diff, already merged); empty when not merged yet")
    earlier_versions: list[dict[str, Any]] = Field(default_factory=list, description="the versions of this change set "
                                                   "before this one, oldest first: version, state, what happened")

    @staticmethod
    def _hashed(content: dict[str, Any], drop: set[str]) -> dict[str, Any]:
        """``content`` without ``drop``, and without the fields added later (``_LATER_FIELDS``) when
        empty, so change sets recorded before those fields existed keep their version."""
        return {k: v for k, v in content.items() if k not in drop and not (k in _LATER_FIELDS and not v)}

    @staticmethod
    def content_version(content: dict[str, Any]) -> str:
        """32 hex digits of the SHA-256 of ``content`` (every field but ``version``) as canonical
        JSON; nested records and datetimes are serialized the way pydantic dumps them."""
        from pydantic_core import to_jsonable_python

        return stable_hash(to_jsonable_python(ChangeSet._hashed(content, {"version"})), 32)

    @classmethod
    def seal(cls, **content: Any) -> "ChangeSet":
        """A change set whose ``version`` is the hash of ``content`` (all other fields).

        Raises:
            pydantic.ValidationError: a field is missing or malformed.
        """
        draft = cls(version="0" * 32, **content)
        return draft.model_copy(update={"version": cls.content_version(draft.model_dump(mode="json"))})

    def computed_version(self) -> str:
        """The version this record's content hashes to (equal to ``version`` unless it was altered)."""
        return self.content_version(self.model_dump(mode="json"))

    def verify_version(self) -> None:
        """Raise :class:`TamperedRecord` when the content does not hash to ``version``."""
        actual = self.computed_version()
        if actual != self.version:
            raise TamperedRecord(f"change set {self.id}: its content hashes to {actual[:12]}…, not to its version "
                                 f"{self.version[:12]}…; the record was altered after it was proposed")

    def not_run(self) -> list[PartitionNote]:
        """The partitions the cause reaches that this change set does not run: outside the asset's
        definition, then deferred (an older record's bare ``deferred_partitions`` included)."""
        deferred = self.deferred_details or [PartitionNote(partition=k, reason="does not exist yet")
                                             for k in self.deferred_partitions]
        return [*self.outside_partitions, *deferred]

    def not_run_lines(self) -> list[str]:
        """:meth:`not_run` in words, one line per kind: ``outside the asset's partitions: ...``, ``deferred: ...``."""
        lines = []
        if self.outside_partitions:
            lines.append("outside the asset's partitions, not run: " + "; ".join(n.words() for n in self.outside_partitions))
        deferred = self.not_run()[len(self.outside_partitions):]
        if deferred:
            lines.append("deferred, not run: " + "; ".join(n.words() for n in deferred))
        return lines

    def content_key(self) -> str:
        """The hash of the content without its times (``created_at``, ``expires_at``): the same
        proposal made again has the same key, so it is recognised and not renewed."""
        from pydantic_core import to_jsonable_python

        body = self._hashed(self.model_dump(mode="json"), {"version", "created_at", "expires_at"})
        return stable_hash(to_jsonable_python(body), 32)


class TamperedRecord(DwDagsterError, ValueError):
    """A stored record's content does not match its hash or signature; the message names it."""


@public
class Approval(_Record):
    """A recorded decision on one change set version, signed with HMAC-SHA256.

    ``change_set_version`` is the content hash of the change set (:attr:`ChangeSet.version`), so
    the signature covers exactly the content the approver was shown. ``identity`` says how the
    approver was established (:class:`~dw_dagster.approval.identity.VerifiedIdentity`); ``approver`` is its
    canonical email.
    """

    id: str
    change_set_id: str
    change_set_version: str
    decision: Literal["approve", "reject"]
    approver: str
    decided_at: dt.datetime
    comment: str = ""
    run_id: str | None = None
    identity: VerifiedIdentity | None = None
    signature: str

    def signing_payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"signature", "run_id"})

    @property
    def method(self) -> str:
        """How the approver was established: oidc, slack, unverified or autonomy."""
        return self.identity.method if self.identity is not None else "unverified"


class CheckOutcome(_Record):
    asset_key: list[str]
    check_name: str
    passed: bool
    severity: str
    run_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


@public
class Receipt(_Record):
    """What was changed on an asset, by whose approval, and how it was proven. Chained by hash."""

    id: str
    asset_key: list[str]
    change_set_id: str
    change_set_version: str
    incident_id: str
    cause_kind: str
    cause_summary: str
    evidence_summary: dict[str, Any]
    diff: str
    approver: str
    approved_at: dt.datetime
    signature_valid: bool
    partitions: list[str]
    run_ids: dict[str, str]
    rows_before: dict[str, Any]
    rows_after: dict[str, Any]
    checks: list[CheckOutcome]
    verified: bool
    undo: str
    created_at: dt.datetime
    previous_hash: str | None
    outcome: str = Field(default="applied", description="applied, or what happened instead: 'failed at window-1: ...', "
                         "'halted after window-1: autonomy withdrawn ...'")
    approver_identity: str = Field(default="", description="how the approver was verified, in words")
    change_set_stages: dict[str, str] = Field(default_factory=dict, description="stage → its end state in the ledger")
    kind: str = Field(default="change_set", description="what the receipt records: change_set (a repair) or "
                      "wave_sign_off (a migration wave's owner signed it off)")

    def partitions_not_run(self) -> list[PartitionNote]:
        """The partitions the change set named but did not run (outside the definition, deferred),
        as the receipt's ``evidence_summary["partitions_not_run"]`` records them."""
        return [PartitionNote.model_validate(n) for n in self.evidence_summary.get("partitions_not_run", [])]

    def content_hash(self, markdown: str) -> str:
        """SHA-256 of the receipt's JSON *and* its markdown (what the asset page shows), so an edit
        of either is detected."""
        body = self.model_dump(mode="json")
        if body.get("kind") == "change_set":  # receipts recorded before kinds existed keep their hash
            body.pop("kind")
        return stable_hash({"receipt": body, "markdown": markdown})
