"""Domains: who owns which assets, who may approve their changes, and how far dw_dagster may act.

A domains file (YAML) is validated by pydantic; a bad file is refused with one line per problem
naming the file and line (:func:`dw_dagster.config_files.read_yaml_model`):

.. code-block:: yaml

    domains:
      - name: store_sales
        assets: [[store_sales_line], [fct_store_sales_daily]]   # explicit asset keys, and/or
        select: ["group:store_sales"]                           # Dagster asset selection strings
        approvers: [dana.ortiz@grocer.example]
        escalation: [data-oncall@grocer.example]                # next contacts, in order
        autonomy: L2
        allowed_change_classes: [rerun_window, rebuild_models]  # what L3/L4 may run unasked
        max_window_partitions: 7
        approval_expiry_hours: 24

**Autonomy levels** (``shared/design/DESIGN.md`` §4), in plain words for an owner:

- **L0 manual** — dw_dagster runs the checks and records incidents. It diagnoses nothing and
  changes nothing.
- **L1 observe** — it also diagnoses and annotates (Lightup comment, page note). It proposes no
  change and nothing changes.
- **L2 propose** — it proposes one change set; every change waits for an approver's decision.
- **L3 act reversibly** — change sets made only of the domain's listed *reversible* classes
  (:data:`REVERSIBLE_CLASSES`, e.g. a bounded rerun of a merged asset) run without waiting for a
  person, with a receipt and an undo. Anything else waits as at L2.
- **L4 autonomous** — also the listed *repeatable* classes (:data:`REPEATABLE_CLASSES`, e.g. a
  schema migration with rollback, a new dbt test) run end to end. Pipeline code changes are
  never autonomous: they go to their owner as a diff at every level.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dw_dagster.config_files import read_yaml_model

DOMAINS_FILE_ENV = "DW_DOMAINS_FILE"

#: Change classes a change set can hold.
PIPELINE_CODE = "pipeline_code"
RERUN_WINDOW = "rerun_window"
REBUILD_MODELS = "rebuild_models"
REPLAY_DEAD_LETTER = "replay_dead_letter"
SCHEMA_MIGRATION = "schema_migration"
ADD_TEST = "add_test"
#: The undo of an applied change set: always waits for a person (never in an allowed list's effect).
UNDO = "undo"
#: Undone exactly: the partitions' previous content is kept; models rebuild from it; replayed keys are deleted.
REVERSIBLE_CLASSES = frozenset({RERUN_WINDOW, REBUILD_MODELS, REPLAY_DEAD_LETTER})
#: Also allowed at L4: they have a tested rollback, but change structure (schema, tests).
REPEATABLE_CLASSES = REVERSIBLE_CLASSES | {SCHEMA_MIGRATION, ADD_TEST}
CHANGE_CLASSES = REPEATABLE_CLASSES | {PIPELINE_CODE, UNDO}

Level = Literal["L0", "L1", "L2", "L3", "L4"]


class DomainsFileError(ValueError):
    """The domains file is missing or invalid; the message names the file, line and problem."""


class Domain(BaseModel):
    """One domain of ownership (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    assets: list[list[str]] = Field(default_factory=list, description="asset key paths the domain owns")
    select: list[str] = Field(default_factory=list, description="Dagster asset selection strings (group:..., key:..., tag:...)")
    approvers: list[str] = Field(min_length=1, description="people who may approve change sets (emails)")
    escalation: list[str] = Field(default_factory=list, description="who is told, in order, when a request goes unanswered")
    autonomy: Level = "L2"
    allowed_change_classes: list[str] = Field(default_factory=list, description="classes L3/L4 may run without approval")
    max_window_partitions: int = Field(7, ge=1, le=366)
    approval_expiry_hours: float = Field(24, gt=0, le=24 * 14)

    @field_validator("approvers", "escalation")
    @classmethod
    def _emails(cls, v: list[str]) -> list[str]:
        out = [x.strip().lower() for x in v]
        bad = [x for x in out if "@" not in x or " " in x]
        if bad:
            raise ValueError(f"not email addresses: {bad}")
        return out

    @field_validator("assets")
    @classmethod
    def _keys(cls, v: list[list[str]]) -> list[list[str]]:
        for key in v:
            if not key or any(not isinstance(p, str) or not p.strip() for p in key):
                raise ValueError(f"an asset key is a non-empty list of non-empty names, got {key!r}")
        return v

    @field_validator("allowed_change_classes")
    @classmethod
    def _classes(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - CHANGE_CLASSES)
        if unknown:
            raise ValueError(f"unknown change classes {unknown}; known: {sorted(CHANGE_CLASSES)}")
        if PIPELINE_CODE in v:
            raise ValueError("pipeline_code can never run without its owner: it always goes to them as a diff")
        if UNDO in v:
            raise ValueError("undo always waits for a person's approval")
        return v

    @model_validator(mode="after")
    def _level_fits_classes(self) -> Domain:
        if not self.assets and not self.select:
            raise ValueError(f"domain {self.name!r} owns nothing: give assets or select")
        if self.autonomy == "L3":
            extra = sorted(set(self.allowed_change_classes) - REVERSIBLE_CLASSES)
            if extra:
                raise ValueError(f"L3 runs only reversible classes {sorted(REVERSIBLE_CLASSES)} unasked; "
                                 f"{extra} need L4 or an approval")
        if self.autonomy in ("L3", "L4") and not self.allowed_change_classes:
            raise ValueError(f"autonomy {self.autonomy} needs allowed_change_classes (which changes may run unasked)")
        return self

    def owns(self, asset_key: Sequence[str], selected: Iterable[Sequence[str]] = ()) -> bool:
        key = list(asset_key)
        return key in self.assets or key in [list(k) for k in selected]

    def may_approve(self, who: str) -> bool:
        return who.strip().lower() in self.approvers

    def autonomous(self, change_classes: Iterable[str]) -> bool:
        """Whether a change set of ``change_classes`` may run without a person's approval.

        Pipeline code changes are left out: they reach the target only through the owner's
        merge, which is their approval.
        """
        classes = set(change_classes) - {PIPELINE_CODE}
        if self.autonomy not in ("L3", "L4") or not classes:
            return False
        return classes <= set(self.allowed_change_classes) and classes <= (
            REVERSIBLE_CLASSES if self.autonomy == "L3" else REPEATABLE_CLASSES)

    @property
    def diagnoses(self) -> bool:
        """L1 and up diagnose; L0 only checks."""
        return self.autonomy != "L0"

    @property
    def proposes(self) -> bool:
        """L2 and up propose change sets; L0/L1 change nothing."""
        return self.autonomy in ("L2", "L3", "L4")


class Domains(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domains: list[Domain]

    @model_validator(mode="after")
    def _unique(self) -> Domains:
        names = [d.name for d in self.domains]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"domain names must be unique; repeated: {dup}")
        seen: dict[tuple[str, ...], str] = {}
        for d in self.domains:
            for k in d.assets:
                other = seen.setdefault(tuple(k), d.name)
                if other != d.name:
                    raise ValueError(f"asset {'/'.join(k)} is in two domains: {other} and {d.name}")
        return self

    def for_asset(self, asset_key: Sequence[str], asset_graph=None) -> Domain:
        """The domain owning ``asset_key`` (explicit ``assets`` first, then ``select`` resolved on
        ``asset_graph``, a Dagster ``BaseAssetGraph``, when given).

        Raises:
            KeyError: no domain owns the asset.
        """
        for d in self.domains:
            if d.owns(asset_key):
                return d
        if asset_graph is not None:
            import dagster as dg

            for d in self.domains:
                for s in d.select:
                    if dg.AssetKey(list(asset_key)) in dg.AssetSelection.from_string(s).resolve(asset_graph):
                        return d
        raise KeyError(f"no domain owns asset {'/'.join(asset_key)}")

    def get(self, name: str) -> Domain:
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(f"no domain named {name!r}")


def load_domains(path: str | Path | None = None) -> Domains:
    """Read a domains file (``path``, else ``$DW_DOMAINS_FILE``).

    Raises:
        DomainsFileError: no path given, file missing, not YAML, or invalid (``file:line: field: problem``).
    """
    path = path or os.environ.get(DOMAINS_FILE_ENV)
    if not path:
        raise DomainsFileError(f"no domains file: pass one or set {DOMAINS_FILE_ENV}")
    return read_yaml_model(path, Domains, DomainsFileError, "domains file")


def domain_for(asset_key: Sequence[str], path: str | Path | None = None) -> Domain | None:
    """The domain of ``asset_key`` from ``path`` or ``$DW_DOMAINS_FILE``; None when no file is
    configured or no domain owns the asset (callers then behave as L2: propose, wait for approval).

    Raises:
        DomainsFileError: a file is configured but invalid (never silently ignored).
    """
    if not (path or os.environ.get(DOMAINS_FILE_ENV)):
        return None
    try:
        return load_domains(path).for_asset(asset_key)
    except KeyError:
        return None
