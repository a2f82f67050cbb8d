"""Uniquely named PostgreSQL roles and a schema per test on the loopback server, dropped afterwards.

Roles are cluster-wide and other developers share the server, so every role a test makes carries
the test's own prefix (``acc_<8 hex>_``) and is dropped (``DROP OWNED BY`` first) when it ends.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import sqlalchemy as sa

from dw_dagster.access.models import COLUMN_PRIVILEGES, TABLE_PRIVILEGES
from dw_dagster_tests.conftest import POSTGRES_URL


class PgWorld:
    """One test's roles and schema. ``role("dana")`` is the real name ``acc_<hex>_dana``."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.prefix = f"acc_{uuid.uuid4().hex[:8]}_"
        self.schema = self.prefix + "s"
        self.roles: list[str] = []
        self.run(f'CREATE SCHEMA "{self.schema}"')

    def role(self, short: str) -> str:
        return short if short.startswith(self.prefix) else self.prefix + short

    def create_role(self, short: str, *options: str) -> str:
        name = self.role(short)
        self.run(f'CREATE ROLE "{name}" {" ".join(options)}')
        self.roles.append(name)
        return name

    def run(self, *statements: str) -> None:
        with self.engine.begin() as con:
            for s in statements:
                con.exec_driver_sql(s)

    def fetch(self, sql: str) -> list[tuple]:
        with self.engine.connect() as con:
            return [tuple(r) for r in con.exec_driver_sql(sql)]

    def t(self, name: str) -> str:
        """``"<schema>".name`` for SQL, and the display form the dry-run uses is ``<schema>.name``."""
        return f'"{self.schema}"."{name}"'

    def drop(self) -> None:
        with self.engine.begin() as con:
            con.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        for name in reversed(self.roles):
            with self.engine.begin() as con:
                exists = con.exec_driver_sql(f"SELECT 1 FROM pg_roles WHERE rolname = '{name}'").first()
                if exists:
                    con.exec_driver_sql(f'DROP OWNED BY "{name}"')
                    con.exec_driver_sql(f'DROP ROLE "{name}"')


@contextmanager
def pg_world():
    engine = sa.create_engine(POSTGRES_URL, poolclass=sa.pool.NullPool)
    world = PgWorld(engine)
    try:
        yield world
    finally:
        world.drop()
        engine.dispose()


def effective_in(con, role: str, schema: str) -> set[tuple[str, str | None, str]]:
    """Everything ``has_table_privilege`` / ``has_column_privilege`` say ``role`` holds in ``schema``,
    asked of the server on connection ``con`` (inside whatever transaction it is in)."""
    out = set()
    rels = con.exec_driver_sql(
        "SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE n.nspname = '{schema}' AND c.relkind IN ('r','p','v','m','f')").all()
    for oid, rel in rels:
        for p in TABLE_PRIVILEGES:
            if con.exec_driver_sql(f"SELECT has_table_privilege('{role}', {oid}::oid, '{p}')").scalar():
                out.add((rel, None, p))
        cols = con.exec_driver_sql(f"SELECT attname FROM pg_attribute WHERE attrelid = {oid} AND attnum > 0 "
                                   "AND NOT attisdropped").scalars().all()
        for c in cols:
            for p in COLUMN_PRIVILEGES:
                if con.exec_driver_sql(f"SELECT has_column_privilege('{role}', {oid}::oid, '{c}', '{p}')").scalar():
                    out.add((rel, c, p))
    return out


def proven_newly(world: PgWorld, role: str, statements: list[str]) -> dict[tuple[str, str], tuple[bool, set[str]]]:
    """Run ``statements`` inside a transaction that is rolled back: what has_*_privilege says
    after minus before, as ``{(table, privilege): (table_level, columns)}``."""
    with world.engine.connect() as con:
        tx = con.begin()
        try:
            before = effective_in(con, role, world.schema)
            for s in statements:
                con.exec_driver_sql(s)
            after = effective_in(con, role, world.schema)
        finally:
            tx.rollback()
    out: dict[tuple[str, str], tuple[bool, set[str]]] = {}
    for rel, col, p in sorted(after - before, key=str):
        level, cols = out.get((rel, p), (False, set()))
        out[(rel, p)] = (level or col is None, cols | ({col} if col else set()))
    return out


def dry_newly(world: PgWorld, run) -> dict[tuple[str, str], tuple[bool, set[str]]]:
    """The dry-run's newly_reachable in the same shape (tables of the test's schema)."""
    out = {}
    for x in run.newly_reachable:
        schema, _, rel = x.table.rpartition(".")
        assert schema.strip('"') == world.schema, f"reaches outside the test's schema: {x.table}"
        out[(rel.strip('"'), x.privilege)] = (x.table_level, set(x.columns))
    return out
