"""The records of an access request: what is asked, what the dry-run found, what was granted and revoked.

An :class:`AccessSpec` is what a person asks for (a role, or tables with columns and a privilege,
for a duration, with a reason). The engine's dry-run (:mod:`dw_dagster.access.engines`) turns it
into an :class:`EngineDryRun`: the statements that would run, their rollback, the privileges the
grantee newly gets (``newly_reachable``: exactly what ``has_table_privilege`` /
``has_column_privilege`` say after minus before), what becomes reachable in other ways (``SET
ROLE``, ``WITH ADMIN``, default privileges on future tables). :mod:`dw_dagster.access.dry_run` adds
who owns each table, the sensitive columns, the downstream assets and exposures: an
:class:`AccessDryRun`. The request as recorded is an :class:`AccessRequest`; its
``content_key`` covers everything but its times.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dw_dagster.dagster_private import public
from dw_dagster.core.identity import VerifiedIdentity
from dw_dagster.core.models import ExposureRef, ImpactedNode, stable_hash
from dw_dagster.errors import DwDagsterError

#: privileges a table request may ask for (PostgreSQL names them so; Snowflake takes the same words)
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
#: privileges PostgreSQL grants on columns (has_column_privilege answers only these)
COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")


class AccessError(DwDagsterError, ValueError):
    """An access request cannot be made or carried out; the message says what and what to do."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@public
class AccessSpec(_Model):
    """What is asked: ``role`` (a role grant) or ``tables`` (+ ``columns``) with ``privilege``.

    Attributes:
        database: a code location's database resource key, or a URL (its password never kept).
        grantee_email: whom it is for (canonical email).
        role: the role to grant, as typed (``analyst``; ``"Analyst"`` quoted keeps its case).
        tables: tables as typed (``schema.table``; quoted parts keep their case).
        columns: columns of those tables (all of them when empty).
        privilege: the table privilege (``SELECT`` unless asked otherwise).
        duration_s: how long, in seconds.
        why: the reason, shown to the owners and kept in the receipt.
        end_sessions: at the revoke, also end the grantee's live sessions (PostgreSQL
            ``pg_terminate_backend``; Snowflake aborts the user's queries).
    """

    database: str
    grantee_email: str
    role: str | None = None
    tables: list[str] = Field(default_factory=list)
    columns: list[str] = Field(default_factory=list)
    privilege: str = "SELECT"
    duration_s: float = Field(gt=0)
    why: str = Field(min_length=1, max_length=2000)
    end_sessions: bool = False

    def key(self) -> str:
        """32 hex digits identifying the content asked for (not who asked or when)."""
        return stable_hash(self.model_dump(mode="json"), 32)


class Reachable(_Model):
    """One privilege on one table the grantee reaches: its columns (all of them for a table-level
    privilege), whether it is table-level, and whether it carries the grant option."""

    table: str
    columns: list[str] = Field(default_factory=list)
    privilege: str
    table_level: bool = False
    grant_option: bool = False
    how: Literal["privilege", "set_role", "admin"] = "privilege"
    via: str | None = Field(default=None, description="the role it comes through (set_role/admin), when known")


class FutureGrant(_Model):
    """Default privileges (PostgreSQL ``ALTER DEFAULT PRIVILEGES``; Snowflake future grants) the
    grantee newly falls under: tables created later in ``schema`` (every schema when None)."""

    schema_name: str | None
    creator: str | None = Field(description="tables created by this role (PostgreSQL); None on Snowflake")
    privilege: str
    via: str


class SensitiveColumn(_Model):
    table: str
    column: str
    category: str
    rule: str
    source: str = ""


class DomainApproval(_Model):
    """One domain whose owners must approve: its approvers now, the tables of it the grant opens."""

    domain: str
    approvers: list[str]
    tables: list[str]
    sensitive: int = 0
    eligible: list[str] = Field(default_factory=list, description="approvers who may decide (neither requester nor grantee)")


class EngineDryRun(_Model):
    """What the engine's catalog says the grant does (see the module docstring)."""

    engine: Literal["postgres", "snowflake"]
    grantee_role: str
    role: str | None = None
    tables: list[str] = Field(default_factory=list, description="the tables asked for, as the catalog names them")
    statements: list[str]
    rollback: list[str]
    already_held: list[str] = Field(default_factory=list, description="what was asked for that is held already")
    newly_reachable: list[Reachable]
    also_reachable: list[Reachable] = Field(default_factory=list, description="through SET ROLE or WITH ADMIN")
    future_tables: list[FutureGrant] = Field(default_factory=list)
    columns: dict[str, list[tuple[str, str]]] = Field(default_factory=dict,
                                                      description="table -> [(column, comment)] of the reachable tables")
    notes: list[str] = Field(default_factory=list)
    state: dict[str, Any] = Field(default_factory=dict, description="what the revoke checks against (oids, previous VALID UNTIL)")
    queries: list[str] = Field(default_factory=list, description="the catalog queries the dry-run ran")

    @property
    def opens_anything(self) -> bool:
        return bool(self.newly_reachable or self.also_reachable or self.future_tables)


class AccessDryRun(_Model):
    """The engine's dry-run plus who owns what it opens, the sensitive columns, and what reads them."""

    engine: EngineDryRun
    sensitive: list[SensitiveColumn] = Field(default_factory=list)
    domains: list[DomainApproval] = Field(default_factory=list)
    unowned: list[str] = Field(default_factory=list, description="reachable tables no domain owns")
    assets: list[list[str]] = Field(default_factory=list, description="the Dagster assets the tables are")
    downstream: list[ImpactedNode] = Field(default_factory=list, description="assets and dbt models reading them")
    exposures: list[ExposureRef] = Field(default_factory=list)
    computed_at: dt.datetime

    @property
    def opens_anything(self) -> bool:
        return self.engine.opens_anything

    def reachable_tables(self) -> list[str]:
        e = self.engine
        return sorted({r.table for r in (*e.newly_reachable, *e.also_reachable)})


@public
class AccessRequest(_Model):
    """An access request as recorded: who asked and how that was verified, the dry-run, the statements,
    the domains' change sets that ask for approval, and when the grant ends."""

    id: str
    spec: AccessSpec
    database_name: str = Field(description="the database as its engine names it (never credentials)")
    requester: str
    requester_identity: VerifiedIdentity | None = None
    requested_at: dt.datetime
    expires_at: dt.datetime
    statements: list[str]
    rollback: list[str]
    dry_run: AccessDryRun
    change_sets: list[str] = Field(default_factory=list)
    extends: str | None = Field(default=None, description="the active grant this one takes over (an extension)")

    @property
    def approvers(self) -> list[str]:
        return sorted({a for d in self.dry_run.domains for a in d.approvers})

    def content_key(self) -> str:
        """The hash of the request without its times and id: the same request made again has the same key."""
        body = self.model_dump(mode="json", exclude={"id", "requested_at", "expires_at", "requester_identity",
                                                     "change_sets"})
        body["dry_run"].pop("computed_at", None)
        return stable_hash(body, 32)

    def summary(self) -> dict[str, Any]:
        """The ``--json`` answer of ``dw-dagster access request`` (see the guide)."""
        e = self.dry_run.engine
        return {
            "request_id": self.id,
            "grantee": self.spec.grantee_email,
            "grantee_role": e.grantee_role,
            "requested_by": self.requester,
            "database": self.database_name,
            "statements": list(self.statements),
            "rollback": list(self.rollback),
            "newly_reachable": [{"table": r.table, "columns": list(r.columns), "privilege": r.privilege,
                                 "table_level": r.table_level, "grant_option": r.grant_option}
                                for r in e.newly_reachable],
            "also_reachable": [r.model_dump(mode="json") for r in e.also_reachable],
            "future_tables": [f.model_dump(mode="json") for f in e.future_tables],
            "sensitive": [{"table": s.table, "column": s.column, "category": s.category, "rule": s.rule}
                          for s in self.dry_run.sensitive],
            "domains": [d.model_dump(mode="json") for d in self.dry_run.domains],
            "approvers": self.approvers,
            "downstream": [n.model_dump(mode="json") for n in self.dry_run.downstream],
            "exposures": [x.model_dump(mode="json") for x in self.dry_run.exposures],
            "already_held": list(e.already_held),
            "notes": list(e.notes),
            "change_sets": list(self.change_sets),
            "extends": self.extends,
            "expires_at": self.expires_at.isoformat(),
            "requested_at": self.requested_at.isoformat(),
        }


__all__ = ["AccessDryRun", "AccessError", "AccessRequest", "AccessSpec", "COLUMN_PRIVILEGES", "DomainApproval",
           "EngineDryRun", "FutureGrant", "Reachable", "SensitiveColumn", "TABLE_PRIVILEGES"]
