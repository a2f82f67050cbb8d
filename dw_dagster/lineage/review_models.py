"""The records of a pull-request review of a dbt project (:func:`dw_dagster.lineage.review.review_manifests`).

All are frozen pydantic models; ``Review.model_dump(mode="json")`` is what ``dw-dagster review
--json`` prints.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dw_dagster.core.models import BlastRadius
from dw_dagster.dagster_private import public

#: ``--fail-on`` policies: ``breaking`` column or contract changes, ``sensitive``-looking new
#: columns, ``any`` change the review reports (a node added, modified or removed, or a column change)
POLICIES = ("breaking", "sensitive", "any")


class _Rec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Reason(_Rec):
    """Why a node is modified: ``kind`` is dbt's sub-selector (``body``, ``configs``,
    ``persisted_descriptions``, ``relation``, ``macros``, ``contract``) or the compared property
    (``new``, ``fqn``, ``ref_representation``, ``owner``, ...); ``detail`` says what differs."""

    kind: str
    detail: str


class NodeChange(_Rec):
    """A node added, modified or removed by the pull request.

    ``in_state_modified``: dbt's ``state:modified`` selects it (a new source, exposure, metric,
    semantic model or saved query is added but not selected by dbt; a removed node never is).
    ``asset_key``: the Dagster asset key dagster-dbt's default translator gives it (None for
    tests, exposures, ephemeral models). ``reaches``: how many nodes ``dbt ls -s NODE+`` lists
    besides the node itself (on the head; 0 for a removed node). ``dependents_in_base``: for a
    removed node, the nodes that depended on it in the base manifest.
    """

    unique_id: str
    name: str
    resource_type: str
    change: Literal["added", "modified", "removed"]
    in_state_modified: bool
    reasons: list[Reason] = Field(default_factory=list)
    asset_key: list[str] | None = None
    owners: list[str] = Field(default_factory=list)
    reaches: int = 0
    dependents_in_base: list[str] = Field(default_factory=list)


class ColumnUse(_Rec):
    """A downstream node that reads a column: ``how`` is ``selects`` (by name), ``unqualified`` (an
    unqualified name attributed to this parent), ``star`` (``select *``), ``test`` (a data test on
    the column), ``relationships_test`` or ``semantic_model`` (an entity, dimension or measure)."""

    unique_id: str
    resource_type: str
    how: str


class Unreadable(_Rec):
    """A downstream node whose column use could not be read, and why (the change may break it)."""

    unique_id: str
    reason: str


class ColumnChange(_Rec):
    """One column change of one node.

    ``change``: ``added``, ``removed``, ``renamed`` (``before`` the old name, ``evidence`` which
    hint paired them: ``meta.renamed_from``, ``description``, ``same type and position``),
    ``type_changed`` (``before``/``after`` the types), ``nullability_changed`` (``before``/
    ``after``: ``nullable`` or ``not null``, from ``not_null`` constraints).
    ``breaking``: a downstream node reads the old column (``selected_by``), or the model's
    enforced contract promised it; a type change is breaking only when the base type differs
    (``varchar(10)`` → ``varchar(20)`` is not), a nullability change only from not null to
    nullable. ``unreadable``: direct children whose use could not be read.
    """

    column: str
    change: Literal["added", "removed", "renamed", "type_changed", "nullability_changed"]
    before: str | None = None
    after: str | None = None
    evidence: str | None = None
    breaking: bool = False
    why: str = ""
    selected_by: list[ColumnUse] = Field(default_factory=list)
    unreadable: list[Unreadable] = Field(default_factory=list)


class NodeColumns(_Rec):
    """The column changes of one node, and where its columns were read from.

    ``columns_from``: ``catalog`` (both sides in ``catalog.json``), ``sql`` (both sides' SQL
    projections), ``yaml`` (both sides' documented columns) or ``none`` (``note`` says why).
    ``contract_breaking``: the breaking changes dbt names for the model's enforced contract.
    """

    unique_id: str
    name: str
    resource_type: str
    columns_from: Literal["catalog", "sql", "yaml", "none"]
    note: str | None = None
    changes: list[ColumnChange] = Field(default_factory=list)
    contract_breaking: list[str] = Field(default_factory=list)


class SensitiveColumn(_Rec):
    """A new column that looks like personal data: the rule that matched, on what, and the rule's source."""

    unique_id: str
    column: str
    rule: str
    category: str
    matched_on: Literal["name", "description", "tags", "meta"]
    matched_text: str
    source: str


class DomainNotice(_Rec):
    """A domain (domains file) whose assets or exposures the pull request reaches, and its people."""

    domain: str
    approvers: list[str]
    escalation: list[str] = Field(default_factory=list)
    slack_channel: str | None = None
    assets: list[list[str]] = Field(default_factory=list)
    exposures: list[str] = Field(default_factory=list)


@public
class Review(_Rec):
    """What a pull request changes in a dbt project (:func:`~dw_dagster.lineage.review.review_manifests`).

    Attributes:
        base, head: where the two manifests were read from (paths, or ``<dict>``).
        adapter: the head manifest's ``adapter_type``.
        catalogs: whether a ``catalog.json`` was used for the base and the head.
        nodes: every node added, modified or removed, by unique id.
        state_modified: what ``dbt ls -s state:modified --state BASE`` prints on the head project
            (modified nodes and their direct data/unit tests, default resource types), sorted.
        state_modified_plus: what ``dbt ls -s state:modified+ --state BASE`` prints, sorted.
        blast_radius: downstream of the modified nodes (depth ≥ 1): models, tests, exposures
            with owners, Dagster asset keys; None when nothing is modified.
        columns: column changes per node.
        sensitive: new columns that look sensitive.
        domains: domains whose assets or exposures are reached, with their people.
        owners: every owner found (dbt owners of the reached nodes, domain approvers), sorted.
        notes: what could not be read or compared.
    """

    base: str
    head: str
    adapter: str | None = None
    catalogs: dict[str, bool] = Field(default_factory=dict)
    nodes: list[NodeChange] = Field(default_factory=list)
    state_modified: list[str] = Field(default_factory=list)
    state_modified_plus: list[str] = Field(default_factory=list)
    blast_radius: BlastRadius | None = None
    columns: list[NodeColumns] = Field(default_factory=list)
    sensitive: list[SensitiveColumn] = Field(default_factory=list)
    domains: list[DomainNotice] = Field(default_factory=list)
    owners: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @property
    def breaking(self) -> list[tuple[str, ColumnChange | str]]:
        """Every breaking finding: (unique id, the column change or the contract change's text)."""
        out: list[tuple[str, ColumnChange | str]] = []
        for nc in self.columns:
            out += [(nc.unique_id, c) for c in nc.changes if c.breaking]
            out += [(nc.unique_id, text) for text in nc.contract_breaking]
        return out

    @property
    def changed(self) -> bool:
        """Whether the pull request changes anything the review sees."""
        return bool(self.nodes) or any(nc.changes or nc.contract_breaking for nc in self.columns)

    def failures(self, fail_on: Iterable[str]) -> list[str]:
        """Why the policies ``fail_on`` (each one of :data:`POLICIES`) fail, one line per policy; empty: they pass.

        Raises:
            ValueError: an unknown policy.
        """
        out = []
        for policy in dict.fromkeys(fail_on):
            if policy not in POLICIES:
                raise ValueError(f"unknown policy {policy!r}; use one of {list(POLICIES)}")
            if policy == "breaking" and self.breaking:
                out.append(f"breaking: {len(self.breaking)} breaking change(s)")
            elif policy == "sensitive" and self.sensitive:
                cols = sorted({(s.unique_id, s.column) for s in self.sensitive})
                out.append(f"sensitive: {len(cols)} new column(s) look sensitive")
            elif policy == "any" and self.changed:
                out.append(f"any: {len(self.nodes)} node(s) added, modified or removed")
        return out

    def exit_code(self, fail_on: Iterable[str]) -> int:
        """1 when a policy in ``fail_on`` fails (:meth:`failures`), else 0."""
        return 1 if self.failures(fail_on) else 0


__all__ = ["POLICIES", "ColumnChange", "ColumnUse", "DomainNotice", "NodeChange", "NodeColumns", "Reason", "Review",
           "SensitiveColumn", "Unreadable"]
