"""The engines access requests run on: PostgreSQL (:mod:`.postgres`) and Snowflake (:mod:`.snowflake`).

Each offers the same four calls, chosen by the database's dialect: ``dry_run`` (catalog only,
nothing runs), ``apply_grant`` (the approved statements, then a check on the engine),
``apply_revoke`` (the rollback, live sessions ended when asked, then :func:`verify_revoked`) and
``verify_revoked``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from dw_dagster.access.models import AccessError, AccessSpec, EngineDryRun
from dw_dagster.databases import Database

ENGINES = ("postgres", "snowflake")


def _module(dialect: str):
    if dialect == "postgres":
        from dw_dagster.access.engines import postgres

        return postgres
    if dialect == "snowflake":
        from dw_dagster.access.engines import snowflake

        return snowflake
    raise AccessError(f"access requests run on PostgreSQL and Snowflake; this database is {dialect}")


def dry_run(db: Database, spec: AccessSpec, grantee: str, *, expires_at: dt.datetime, request_id: str,
            valid_until: bool = True, taking_over: Sequence[EngineDryRun] = ()) -> EngineDryRun:
    """The engine's dry-run of ``spec`` for ``grantee`` (a role or user name, exactly)."""
    mod = _module(db.dialect)
    if db.dialect == "postgres":
        return mod.dry_run(db, spec, grantee, expires_at=expires_at, valid_until=valid_until, taking_over=taking_over)
    return mod.dry_run(db, spec, grantee, expires_at=expires_at, request_id=request_id,
                       database=_snowflake_database(db), taking_over=taking_over)


def _snowflake_database(db: Database) -> str | None:
    """The connection's database (``snowflake:<account>/<database>/<schema>`` is how it names itself)."""
    given = getattr(db, "database", None)
    if given:
        return str(given)
    parts = str(getattr(db, "name", "")).split(":", 1)[-1].split("/")
    return parts[1] if len(parts) > 1 and parts[1] else None


def apply_grant(db: Database, run: EngineDryRun, statements: Sequence[str]) -> dict[str, Any]:
    return _module(run.engine).apply_grant(db, run, statements)


def apply_revoke(db: Database, run: EngineDryRun, *, end_sessions: bool) -> dict[str, Any]:
    return _module(run.engine).apply_revoke(db, run, end_sessions=end_sessions)


def verify_revoked(db: Database, run: EngineDryRun) -> dict[str, Any]:
    return _module(run.engine).verify_revoked(db, run)


__all__ = ["ENGINES", "apply_grant", "apply_revoke", "dry_run", "verify_revoked"]
