"""Domains: who owns which assets, who may approve their changes, and how far dw_dagster may act.

A domains file (YAML) is validated by pydantic; a bad file is refused with one line per problem
naming the file and line (:func:`dw_dagster.core.config_files.read_yaml_model`):

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
        identity: verified          # the default; "unverified" only for a scratch sandbox
        exposures: [store_pnl]      # dbt exposures the domain owns (by name), for pull-request review
        warehouses: [TRANSFORM_WH]  # Snowflake warehouses it owns: drafted setting changes go to its approvers
        tables: ["pos.*"]           # warehouse tables it owns for access requests (schema.table globs)
        autonomous_access: never    # or non_sensitive: see "Access requests" below
        slack_channel: C0123STORE   # the domain's channel: requests, ladder steps, pull-request reviews
        remind_after: 2h            # the escalation ladder: remind the approvers,
        escalate_after: 6h          # then ask these people, who may decide from then on,
        escalation_approvers: [head-of-data@grocer.example]
        deny_after: 24h             # then the request ends expired (never granted)

    review:                         # pull-request review (dw-dagster review, dw_dagster.lineage.review)
      sensitive:
        defaults: true              # keep the built-in rules (dw_dagster.lineage.sensitive.DEFAULT_RULES)
        disable: [free_text]        # built-in rules to leave out, by name
        rules:
          - name: loyalty_card
            category: account_number
            pattern: "(^|_)loyalty_card(_|$)"
            applies_to: [name]      # name, description, tags, meta
            source: "grocer data classification policy, section 3"

    identity:                       # how approvers prove who they are (dw_dagster.approval.identity)
      oidc:
        issuer: https://login.grocer.example          # or {env: DW_OIDC_ISSUER}
        audience: dw-dagster
      slack:
        signing_secret_env: SLACK_SIGNING_SECRET
        bot_token_env: SLACK_BOT_TOKEN
    operators: [data-oncall@grocer.example]           # who may lift an org-wide stop (default: every approver)

    access:                         # access requests (dw_dagster.access)
      role_name: "{email}"          # the database role (PostgreSQL) or user (Snowflake) of a person
      max_hours: 168                # the longest grant anyone may ask for
      remind_before_minutes: 60     # the requester is reminded this long before the grant ends

Any value may be written ``{env: NAME}`` (or ``{env: NAME, default: VALUE}``): it is read from the
environment when the file is read, and a missing variable without a default is an error naming it.

**The escalation ladder.** A change set waiting for a decision is reminded (``remind_after``),
escalated (``escalate_after``: the ``escalation_approvers`` are asked and may decide, verified and
bound to the version exactly like approvers) and finally denied (``deny_after``: the request ends
expired, never granted); a repair that failed, halted or did not verify climbs the same ladder
(:mod:`dw_dagster.approval.ladder`). Durations are written ``2h``, ``30m``, ``1d`` or ``1h30m``.

**Identity.** A decision counts only when its approver's identity was verified by the
organisation's identity provider (an OIDC ID token checked against its JWKS) or by a signed Slack
interaction. A domain may opt into ``identity: unverified`` (typed emails accepted, labelled
UNVERIFIED on every record); never by default.

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

**Access requests** (:mod:`dw_dagster.access`) are change sets of class ``access_grant``, one per
domain whose tables a grant newly opens; every one of those domains must approve. They wait for a
person at every level unless the domain says ``autonomous_access: non_sensitive`` *and* runs at
L3/L4 with ``access_grant`` among its ``allowed_change_classes``: then a grant that opens no
sensitive column of the domain (``review.sensitive``) is approved by dw_dagster; one that opens
any sensitive column always waits for a person.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from dw_dagster.core.config_files import read_yaml_model
from dw_dagster.core.identity import IdentityError, canonical_email
from dw_dagster.core.table_names import table_parts
from dw_dagster.errors import DwDagsterError
from dw_dagster.dagster_private import public

DOMAINS_FILE_ENV = "DW_DOMAINS_FILE"

#: Change classes a change set can hold.
PIPELINE_CODE = "pipeline_code"
RERUN_WINDOW = "rerun_window"
REBUILD_MODELS = "rebuild_models"
REPLAY_DEAD_LETTER = "replay_dead_letter"
SCHEMA_MIGRATION = "schema_migration"
ADD_TEST = "add_test"
#: A warehouse setting (ALTER WAREHOUSE ... SET ...) drafted from measured cost symptoms: always waits for its owner.
WAREHOUSE_SETTING = "warehouse_setting"
#: A time-bound warehouse grant (dw_dagster.access); its undo is the revoke at expiry.
ACCESS_GRANT = "access_grant"
#: The undo of an applied change set: always waits for a person (never in an allowed list's effect).
UNDO = "undo"
#: A migration wave's sign-off (dw_dagster.migration): a person's decision by definition, never unasked.
WAVE_SIGN_OFF = "wave_sign_off"
#: Undone exactly: the partitions' previous content is kept; models rebuild from it; replayed keys are deleted.
REVERSIBLE_CLASSES = frozenset({RERUN_WINDOW, REBUILD_MODELS, REPLAY_DEAD_LETTER, ACCESS_GRANT})
#: Also allowed at L4: they have a tested rollback, but change structure (schema, tests).
REPEATABLE_CLASSES = REVERSIBLE_CLASSES | {SCHEMA_MIGRATION, ADD_TEST}
CHANGE_CLASSES = REPEATABLE_CLASSES | {PIPELINE_CODE, UNDO, WAREHOUSE_SETTING, WAVE_SIGN_OFF}

Level = Literal["L0", "L1", "L2", "L3", "L4"]
#: a duration in the domains file: ``2h``, ``30m``, ``1d``, ``1h30m`` (read by :func:`parse_duration`)
Duration = dt.timedelta


class DomainsFileError(DwDagsterError, ValueError):
    """The domains file is missing or invalid; the message names the file, line and problem."""


@public
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
    earn_after: int | None = Field(None, ge=1, le=1000, description="earned autonomy: after this many verified repairs "
                                   "of a change class in a row (none undone or failed), dw_dagster proposes allowing "
                                   "the class; a failure of an allowed class proposes removing it; None: never")
    approval_expiry_hours: float = Field(24, gt=0, le=24 * 14)
    identity: Literal["verified", "unverified"] = Field(
        "verified", description="verified (OIDC or Slack, the default) or unverified (typed emails; a sandbox only)")
    exposures: list[str] = Field(default_factory=list, description="dbt exposures the domain owns, by name "
                                 "(pull-request review names the domain's people when one is affected)")
    warehouses: list[str] = Field(default_factory=list, description="warehouses the domain owns (Snowflake names); "
                                  "their drafted setting changes go to its approvers (dw_dagster.cost.warehouse)")
    tables: list[str] = Field(default_factory=list, description="warehouse tables the domain owns for access requests: "
                              "schema.table or database.schema.table, * and ? as wildcards, matched case-insensitively")
    autonomous_access: Literal["never", "non_sensitive"] = Field(
        "never", description="non_sensitive: at L3/L4 with access_grant allowed, a grant opening no sensitive column of "
        "the domain is approved by dw_dagster; never (the default): every grant waits for a person")
    slack_channel: str | None = Field(default=None, description="Slack channel (ID, C...) of the domain: approval "
                                      "requests and ladder steps are posted there as well as to each person, and "
                                      "pull-request reviews that reach the domain (dw-dagster review --notify slack)")
    remind_after: Duration | None = Field(default=None, description="after this long without a decision the "
                                          "approvers are reminded (e.g. 2h)")
    escalate_after: Duration | None = Field(default=None, description="after this long the escalation approvers are "
                                            "asked and may decide too (e.g. 6h)")
    escalation_approvers: list[str] = Field(default_factory=list, description="people who may decide once "
                                            "escalate_after has passed (verified, bound to the version like approvers)")
    deny_after: Duration | None = Field(default=None, description="after this long the request ends expired, never "
                                        "granted (e.g. 24h; sets approval_expiry_hours)")

    @field_validator("approvers", "escalation", "escalation_approvers")
    @classmethod
    def _emails(cls, v: list[str]) -> list[str]:
        return _canonical_emails(v)

    @field_validator("remind_after", "escalate_after", "deny_after", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return parse_duration(v)

    @field_validator("escalate_after")
    @classmethod
    def _after_reminder(cls, v: dt.timedelta | None, info: ValidationInfo) -> dt.timedelta | None:
        remind = info.data.get("remind_after")
        if v is not None and remind is not None and v <= remind:
            raise ValueError(f"must come after remind_after ({duration_text(remind)}), got {duration_text(v)}")
        return v

    @field_validator("deny_after")
    @classmethod
    def _last(cls, v: dt.timedelta | None, info: ValidationInfo) -> dt.timedelta | None:
        if v is None:
            return v
        if v > dt.timedelta(days=14):
            raise ValueError(f"at most 14 days, got {duration_text(v)}")
        for earlier in ("escalate_after", "remind_after"):
            e = info.data.get(earlier)
            if e is not None and v <= e:
                raise ValueError(f"must come after {earlier} ({duration_text(e)}), got {duration_text(v)}")
        return v

    @field_validator("assets")
    @classmethod
    def _keys(cls, v: list[list[str]]) -> list[list[str]]:
        for key in v:
            if not key or any(not isinstance(p, str) or not p.strip() for p in key):
                raise ValueError(f"an asset key is a non-empty list of non-empty names, got {key!r}")
        return v

    @field_validator("tables")
    @classmethod
    def _tables(cls, v: list[str]) -> list[str]:
        for t in v:
            parts = table_parts(t) if isinstance(t, str) else []
            if not 1 <= len(parts) <= 3 or any(not p.strip() for p in parts):
                raise ValueError(f"a table is schema.table (or database.schema.table), wildcards * and ?, got {t!r}")
        return v

    def owns_table(self, table: str) -> bool:
        """Whether ``table`` (``schema.table`` or ``database.schema.table``) matches one of :attr:`tables`
        (case-insensitively; a two-part pattern matches a three-part name on its last two parts). Name and
        patterns are read part by part (:func:`~dw_dagster.core.table_names.split_table`): ``dw."sales".orders``
        and ``"my-dw"."Sales.EU"."Order Lines"`` have the owner they have written without needless quotes."""
        import fnmatch

        parts = table_parts(table.casefold())
        for pattern in self.tables:
            want = table_parts(pattern.casefold())
            if fnmatch.fnmatchcase("\x00".join(parts), "\x00".join(want)):  # a part boundary matches "." did
                return True
            if len(want) == 2 and len(parts) == 3 and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts[1:], want)):
                return True
        return False

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
        if WAREHOUSE_SETTING in v:
            raise ValueError("a warehouse setting change always waits for the warehouse owner's approval")
        if WAVE_SIGN_OFF in v:
            raise ValueError("a wave sign-off is the owner's decision: it always waits for a person")
        return v

    @model_validator(mode="after")
    def _level_fits_classes(self) -> Domain:
        if not self.assets and not self.select and not self.exposures and not self.tables and not self.warehouses:
            raise ValueError(f"domain {self.name!r} owns nothing: give assets, select, exposures, tables or warehouses")
        if self.autonomy == "L3":
            extra = sorted(set(self.allowed_change_classes) - REVERSIBLE_CLASSES)
            if extra:
                raise ValueError(f"L3 runs only reversible classes {sorted(REVERSIBLE_CLASSES)} unasked; "
                                 f"{extra} need L4 or an approval")
        if self.autonomy in ("L3", "L4") and not self.allowed_change_classes:
            raise ValueError(f"autonomy {self.autonomy} needs allowed_change_classes (which changes may run unasked)")
        if self.escalation_approvers and self.escalate_after is None:
            raise ValueError("escalation_approvers: they need escalate_after (when they may start to decide)")
        if self.escalate_after is not None and not self.escalation_approvers:
            raise ValueError("escalate_after: needs escalation_approvers (who is asked, and may decide, then)")
        if self.deny_after is not None:
            hours = self.deny_after.total_seconds() / 3600
            if "approval_expiry_hours" in self.model_fields_set and abs(self.approval_expiry_hours - hours) > 1e-9:
                raise ValueError(f"deny_after: {duration_text(self.deny_after)} contradicts approval_expiry_hours "
                                 f"{self.approval_expiry_hours:g}; give one of them")
            self.approval_expiry_hours = hours
        for when in ("remind_after", "escalate_after"):
            step = getattr(self, when)
            if step is not None and step.total_seconds() >= self.approval_expiry_hours * 3600:
                raise ValueError(f"{when}: {duration_text(step)} is not before the request expires "
                                 f"({self.approval_expiry_hours:g} h)")
        return self

    def ladder(self) -> list[tuple[str, dt.timedelta]]:
        """The domain's ladder as ``(step, after)`` pairs in order: ``remind``, ``escalate``, ``deny``
        (``deny`` always: at ``approval_expiry_hours`` when ``deny_after`` is not given)."""
        steps = [(name, getattr(self, f)) for name, f in (("remind", "remind_after"), ("escalate", "escalate_after"))
                 if getattr(self, f) is not None]
        return steps + [("deny", dt.timedelta(hours=self.approval_expiry_hours))]

    def may_decide(self, who: str, proposed_at: dt.datetime, now: dt.datetime) -> bool:
        """Whether ``who`` may decide on a change set proposed at ``proposed_at``, at ``now``: a listed
        approver, or an escalation approver once ``escalate_after`` has passed."""
        if self.may_approve(who):
            return True
        return self.may_escalate(who) and self.escalate_after is not None and now >= proposed_at + self.escalate_after

    def may_escalate(self, who: str) -> bool:
        """Whether ``who`` is a listed escalation approver (who may decide after ``escalate_after``)."""
        try:
            return canonical_email(who) in self.escalation_approvers
        except IdentityError:
            return False

    def owns(self, asset_key: Sequence[str], selected: Iterable[Sequence[str]] = ()) -> bool:
        key = list(asset_key)
        return key in self.assets or key in [list(k) for k in selected]

    def may_approve(self, who: str) -> bool:
        """Whether ``who`` (any spelling; compared canonically) is a listed approver now."""
        try:
            return canonical_email(who) in self.approvers
        except IdentityError:
            return False

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


class SlackIdentity(BaseModel):
    """Slack as a source of verified identities (interactive buttons, ``dw-dagster approvals serve``).

    Attributes:
        signing_secret_env: the environment variable holding the Slack app's signing secret
            (Slack API docs, "Verifying requests from Slack").
        bot_token_env: the environment variable holding the bot token used for ``users.info``.
        team_id: when set, interactions from another workspace are refused.
        api_url: the Web API base (the fake's URL in tests).
    """

    model_config = ConfigDict(extra="forbid")

    signing_secret_env: str = "SLACK_SIGNING_SECRET"
    bot_token_env: str = "SLACK_BOT_TOKEN"
    team_id: str | None = None
    api_url: str = "https://slack.com/api"


class IdentityProviders(BaseModel):
    """How approvers prove who they are: an OIDC provider and/or Slack (see :mod:`dw_dagster.approval.identity`)."""

    model_config = ConfigDict(extra="forbid")

    oidc: Any = Field(default=None, description="dw_dagster.approval.identity.oidc.OidcSettings (issuer, audience, ...)")
    slack: SlackIdentity | None = None

    @field_validator("oidc")
    @classmethod
    def _oidc(cls, v: Any) -> Any:
        if v is None:
            return None
        from dw_dagster.core.identity import OidcSettings

        return v if isinstance(v, OidcSettings) else OidcSettings.model_validate(v)


class SensitiveRule(BaseModel):
    """A rule that makes a new column look sensitive in pull-request review (:mod:`dw_dagster.lineage.sensitive`).

    Attributes:
        name: the rule's name, shown with every match (``[A-Za-z0-9_.-]``).
        category: what kind of data it finds (``email``, ``phone``, ``national_id`` ... or your own).
        pattern: a regular expression (Python ``re``, matched case-insensitively with ``search``)
            against what ``applies_to`` names: the column name normalised to lower snake case
            (``CustomerEMail`` → ``customer_e_mail``), the description, each tag, each ``meta``
            entry as ``key`` and ``key=value`` (entries whose value is false, no, 0 or empty skipped).
        applies_to: which of ``name``, ``description``, ``tags``, ``meta`` the pattern is matched
            against (not ``on``: YAML 1.1 reads that key as ``true``).
        source: where the rule comes from (a regulation, a policy), shown with every match.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    category: str = "custom"
    pattern: str
    applies_to: list[Literal["name", "description", "tags", "meta"]] = Field(default_factory=lambda: ["name"], min_length=1)
    source: str = ""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        import re

        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a regular expression: {e}") from e
        return v


class SensitiveSettings(BaseModel):
    """Which rules flag new columns: the built-in ones (unless ``defaults: false``), minus ``disable``, plus ``rules``."""

    model_config = ConfigDict(extra="forbid")

    defaults: bool = True
    disable: list[str] = Field(default_factory=list, description="built-in rules to leave out, by name")
    rules: list[SensitiveRule] = Field(default_factory=list)


class ReviewSettings(BaseModel):
    """Pull-request review settings (``review:`` in the domains file)."""

    model_config = ConfigDict(extra="forbid")

    sensitive: SensitiveSettings = Field(default_factory=SensitiveSettings)


class AccessSettings(BaseModel):
    """Access requests (``access:`` in the domains file, :mod:`dw_dagster.access`).

    Attributes:
        role_name: how a person's email becomes their database role (PostgreSQL) or user
            (Snowflake): a template with ``{email}``, ``{local}`` (before the ``@``) and
            ``{local_snake}`` (that, lower snake case). The name is looked up in the engine's
            catalog exactly as the template writes it (quoted: never case-folded).
        max_hours: the longest grant a request may ask for.
        remind_before_minutes: the requester is reminded this long before a grant ends (at most
            half the grant's length).
        revoke_retry_minutes: how long after a failed revoke it is tried again (the incident stays open).
        valid_until: give a PostgreSQL login role ``VALID UNTIL`` the grant's end too (a second line
            should the revoke not happen; it stops password logins only), put back at the revoke.
    """

    model_config = ConfigDict(extra="forbid")

    role_name: str = "{email}"
    max_hours: float = Field(168, gt=0, le=24 * 90)
    remind_before_minutes: float = Field(60, ge=0)
    revoke_retry_minutes: float = Field(5, gt=0)
    valid_until: bool = Field(True, description="PostgreSQL login roles also get VALID UNTIL the grant's end")

    @field_validator("role_name")
    @classmethod
    def _template(cls, v: str) -> str:
        try:
            v.format(email="a@b", local="a", local_snake="a")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"role_name may use {{email}}, {{local}} and {{local_snake}} only: {e}") from e
        return v


@public
class Domains(BaseModel):
    """A domains file: the domains, the identity providers decisions are verified with, the operators."""

    model_config = ConfigDict(extra="forbid")

    domains: list[Domain]
    identity: IdentityProviders = Field(default_factory=IdentityProviders)
    review: ReviewSettings = Field(default_factory=ReviewSettings)
    operators: list[str] = Field(default_factory=list, description="who may lift an org-wide stop "
                                 "(default: every domain's approvers)")
    access: AccessSettings = Field(default_factory=AccessSettings)

    @field_validator("operators")
    @classmethod
    def _operators(cls, v: list[str]) -> list[str]:
        return _canonical_emails(v)

    def may_operate(self, who: str) -> bool:
        """Whether ``who`` may lift an org-wide stop: a listed operator, else any domain's approver."""
        try:
            email = canonical_email(who)
        except IdentityError:
            return False
        allowed = self.operators or sorted({a for d in self.domains for a in d.approvers})
        return email in allowed

    @property
    def verified_identity_available(self) -> bool:
        return self.identity.oidc is not None or self.identity.slack is not None

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
        typos = approver_typos(self)
        if typos:
            raise ValueError("; ".join(typos))
        owners: dict[str, str] = {}
        for d in self.domains:
            for w in d.warehouses:
                other = owners.setdefault(w.upper(), d.name)
                if other != d.name:
                    raise ValueError(f"warehouse {w} is in two domains: {other} and {d.name}")
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

    def for_warehouse(self, warehouse: str) -> Domain:
        """The domain owning ``warehouse`` (names compared case-insensitively, as Snowflake does unquoted).

        Raises:
            KeyError: no domain owns it.
        """
        for d in self.domains:
            if warehouse.upper() in (w.upper() for w in d.warehouses):
                return d
        raise KeyError(f"no domain owns warehouse {warehouse}")

    def for_table(self, table: str) -> list[Domain]:
        """The domains whose ``tables`` patterns match ``table`` (an access request's ownership)."""
        return [d for d in self.domains if d.owns_table(table)]

    def get(self, name: str) -> Domain:
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(f"no domain named {name!r}")


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*")


def parse_duration(v: Any) -> Any:
    """``2h``, ``90m``, ``1d``, ``1h30m``, ``45s``, ``2w`` (or a ``timedelta``) as a ``timedelta``.

    Raises:
        ValueError: a bare number (its unit would be a guess), or text that is not such a duration.
    """
    if v is None or isinstance(v, dt.timedelta):
        return v
    if isinstance(v, bool) or isinstance(v, (int, float)):
        raise ValueError(f"a duration needs a unit (s, m, h, d, w), e.g. '{v}h'; got the bare number {v}")
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"a duration looks like 2h, 30m, 1d or 1h30m; got {v!r}")
    text, total, pos = v.strip().lower(), 0.0, 0
    while pos < len(text):
        m = _DURATION.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"a duration looks like 2h, 30m, 1d or 1h30m; got {v!r}")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if total <= 0:
        raise ValueError(f"a duration must be longer than 0; got {v!r}")
    return dt.timedelta(seconds=total)


def duration_text(d: dt.timedelta) -> str:
    """``6h``, ``1d 2h``, ``90m`` → compact words for messages."""
    secs, parts = int(d.total_seconds()), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if secs >= size:
            parts.append(f"{secs // size}{unit}")
            secs %= size
    return " ".join(parts) or "0s"


def _canonical_emails(v: list[str]) -> list[str]:
    out, bad = [], []
    for x in v:
        try:
            out.append(canonical_email(x))
        except IdentityError:
            bad.append(x)
    if bad:
        raise ValueError(f"not email addresses: {bad}")
    return out


def approver_typos(domains: "Domains", cutoff: float = 0.85) -> list[str]:
    """Addresses whose mail domain no other address in the file uses while one a single typo away is
    used by two or more (``dana@grocer.exmaple`` beside ``...@grocer.example``): ``domains.<i>.<field>.<j>: ...; did you mean ...?``."""
    import difflib
    from collections import Counter

    fields = ("approvers", "escalation", "escalation_approvers")
    where = [(f"domains.{i}.{f}.{j}", a) for i, d in enumerate(domains.domains) for f in fields
             for j, a in enumerate(getattr(d, f, []) or [])]
    where += [(f"operators.{j}", a) for j, a in enumerate(domains.operators)]
    count = Counter(a.split("@")[1] for _, a in where)
    out = []
    for path, addr in where:
        dom = addr.split("@")[1]
        if count[dom] != 1:
            continue
        close = [c for c in difflib.get_close_matches(dom, [k for k in count if k != dom], n=3, cutoff=cutoff)
                 if count[c] >= 2 and len(dom) >= 10 and _one_typo(dom, c)]
        if close:
            out.append(f"{path}: {addr!r}: no other address here is at {dom!r}; did you mean "
                       f"{addr.split('@')[0]}@{close[0]}?")
    return out


def _one_typo(a: str, b: str) -> bool:
    """Whether ``a`` is ``b`` with one letter added, dropped, changed, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return (a[i + 1:] == b[i + 1:] or a[i + 1:] == b[i:] or a[i:] == b[i + 1:]
            or (a[i + 2:] == b[i + 2:] and a[i:i + 2] == b[i:i + 2][::-1]))


@public
def load_domains(path: str | Path | None = None) -> Domains:
    """Read a domains file (``path``, else ``$DW_DOMAINS_FILE``), resolving ``{env: NAME}`` values.

    Raises:
        DomainsFileError: no path given, file missing, not YAML, an ``{env: NAME}`` that is not
            set, or invalid (``file:line: field: problem``).
    """
    path = path or os.environ.get(DOMAINS_FILE_ENV)
    if not path:
        raise DomainsFileError(f"no domains file: pass one or set {DOMAINS_FILE_ENV}")
    return read_yaml_model(path, Domains, DomainsFileError, "domains file", resolve_env=True)


#: what factories accept as their domains: the model, a file path, a callable returning either,
#: or None for ``$DW_DOMAINS_FILE`` (read when used, so edits to the file apply at once)
DomainsSource = Union["Domains", str, Path, Callable[[], Union["Domains", str, Path]], None]


def resolve_domains(source: DomainsSource) -> Domains | None:
    """The domains as they are now, from a :data:`DomainsSource`; None when nothing is configured.

    Raises:
        DomainsFileError: a file is configured but missing or invalid (never silently ignored).
    """
    if callable(source) and not isinstance(source, Domains):
        source = source()
    if isinstance(source, Domains):
        return source
    if source is None and not os.environ.get(DOMAINS_FILE_ENV):
        return None
    return load_domains(source)


def domain_for(asset_key: Sequence[str], path: DomainsSource = None) -> Domain | None:
    """The domain of ``asset_key`` from ``path`` (any :data:`DomainsSource`) or ``$DW_DOMAINS_FILE``;
    None when nothing is configured or no domain owns the asset (callers then behave as L2:
    propose, wait for approval).

    Raises:
        DomainsFileError: a file is configured but invalid (never silently ignored).
    """
    domains = resolve_domains(path)
    if domains is None:
        return None
    try:
        return domains.for_asset(asset_key)
    except KeyError:
        return None
