"""Run a migration in one direction on a :class:`~dw_dagster.databases.Database` (guards first, then the statements), and verify it took effect against the catalog."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from dw_dagster.databases import Database, sql
from dw_dagster.databases.catalog import TableSchema, read_table_schema
from dw_dagster.changes.migrations.models import Guard, Migration, MigrationCheck, MigrationError, MigrationRefused
from dw_dagster.changes.migrations.types import same_type
from dw_dagster.dagster_private import public

# -- errors ------------------------------------------------------------------------------------


# -- the changes -------------------------------------------------------------------------------


# -- schemas, guards, checks, the migration ----------------------------------------------------


# -- types -------------------------------------------------------------------------------------


# -- names -------------------------------------------------------------------------------------


def check_guards(db: Database, migration: Migration, direction: Literal["forward", "rollback"] = "forward") -> None:
    """Run the guards of one direction.

    Raises:
        MigrationRefused: a guard counted rows (the message says how many and what to do).
        ValueError: ``direction`` is neither ``forward`` nor ``rollback``.
    """
    guards = _direction(migration, direction)[1]
    for g in guards:
        ((n,),) = db.fetch_all(g.sql)
        if int(n or 0):
            raise MigrationRefused(g, int(n))


def _direction(m: Migration, direction: str) -> tuple[list[str], list[Guard], list[MigrationCheck]]:
    if direction == "forward":
        return m.forward, m.forward_guards, m.checks
    if direction == "rollback":
        return m.rollback, m.rollback_guards, m.rollback_checks
    raise ValueError(f"direction is 'forward' or 'rollback', got {direction!r}")


def dependent_views(db: Database, table: str, column: str) -> list[str]:
    """Views of ``db`` whose definition reads ``column`` of ``table`` (by name, or through ``*``),
    from ``information_schema.views`` parsed with sqlglot; [] when the engine lists no views."""
    import sqlglot
    from sqlglot import exp

    name = sql.table_parts(table)[-1].strip('`').lower()
    q = _views_query(db, table)
    try:
        rows = db.fetch_all(q)
    except Exception:  # an engine without the view (the migration then runs as before)
        return []
    found = []
    for schema, view, definition in rows:
        if not definition or name not in definition.lower():
            continue
        try:
            tree = sqlglot.parse_one(definition, read=db.dialect)
        except Exception:
            found.append(f"{schema}.{view}")  # unreadable but it names the table: counted, not guessed away
            continue
        if not any(t.name.lower() == name for t in tree.find_all(exp.Table)):
            continue
        uses = any(c.name.lower() == column.lower() for c in tree.find_all(exp.Column)) or any(True for _ in tree.find_all(exp.Star))
        if uses:
            found.append(f"{schema}.{view}")
    return found


def _views_query(db: Database, table: str) -> str:
    """The query listing views and their definitions: ``information_schema.views``, or on BigQuery the
    ``INFORMATION_SCHEMA.VIEWS`` of the table's dataset (BigQuery has no unqualified one; views in other
    datasets are not seen)."""
    cols = "SELECT table_schema, table_name, view_definition FROM "
    if db.dialect != "bigquery":
        return cols + "information_schema.views WHERE table_schema NOT IN ('information_schema', 'pg_catalog')"
    parts = [x.strip("`") for x in sql.table_parts(table)]
    dataset = parts[-2] if len(parts) >= 2 else getattr(db, "dataset", None)
    project = parts[-3] if len(parts) == 3 else getattr(db, "project", None)
    where = ".".join(f"`{x}`" for x in (project, dataset) if x)
    return cols + (f"{where}.INFORMATION_SCHEMA.VIEWS" if where else "INFORMATION_SCHEMA.VIEWS")


def _touched_column(migration: Migration, direction: str) -> str | None:
    """The column a direction removes, renames or retypes to another family of types (None when
    it only adds one, or widens a type within its family)."""
    ch = migration.change
    kind = getattr(ch, "kind", None)
    if kind == "retype":  # within one family (a wider integer, a longer text) views read it as before
        from dw_dagster.changes.migrations.types import type_info

        if type_info(ch.from_type, migration.dialect).family == type_info(ch.to_type, migration.dialect).family:
            return None
    if direction == "forward":
        return ch.column if kind in ("drop", "rename", "retype") else None
    return {"add": ch.column, "rename": getattr(ch, "new_name", None), "retype": ch.column}.get(kind)


@public
def apply_migration(db: Database, migration: Migration, direction: Literal["forward", "rollback"] = "forward",
                    *, allow_breaking_views: bool = False) -> None:
    """Run one direction of ``migration`` on ``db``: its guards, then its statements in order.

    A direction that drops, renames or retypes a column that a view reads is refused, naming the
    views (a view on the column would stop working, or change meaning, with nothing reporting
    it), unless ``allow_breaking_views``.

    The statements run one by one (each :meth:`~dw_dagster.databases.Database.execute` is its
    own transaction on these databases), so a failure part-way leaves the earlier ones applied;
    the error names the statement. DDL commits implicitly on Snowflake and BigQuery anyway.

    Raises:
        MigrationRefused: a guard found rows that make this direction unsafe, or views read the
            column; nothing ran.
        MigrationError: ``db.dialect`` is not the migration's dialect.
        dw_dagster.databases.DatabaseError: a statement failed.
    """
    if db.dialect != migration.dialect:
        raise MigrationError(f"the migration is for {migration.dialect}, the database is {db.dialect}")
    statements = _direction(migration, direction)[0]
    check_guards(db, migration, direction)
    column = _touched_column(migration, direction)
    views = dependent_views(db, migration.change.table, column) if column and not allow_breaking_views else []
    if views:
        guard = Guard(description="views that read the column", sql="information_schema.views",
                      message=f"{{rows}} view(s) read {migration.change.table}.{column}, which this {direction} "
                              f"changes: {', '.join(views)}; change them with the migration (or pass "
                              "allow_breaking_views=True)")
        raise MigrationRefused(guard, len(views))
    for s in statements:
        db.execute(s)


@public
def verify_migration(db: Database, migration: Migration, direction: Literal["forward", "rollback"] = "forward",
                     *, read_schema: Callable[[Database, str], TableSchema] = read_table_schema) -> list[str]:
    """Compare the catalog with the checks of one direction.

    Args:
        db: the database the migration ran on.
        migration: the migration.
        direction: ``"forward"`` (its :attr:`Migration.checks`) or ``"rollback"``.
        read_schema: how to read a table's schema; :func:`read_table_schema` by default
            (a test can substitute another source for an emulator).

    Returns:
        One line per check that does not hold; empty when the direction took effect.

    Raises:
        dw_dagster.databases.DatabaseError: reading the catalog failed.
    """
    failures: list[str] = []
    schemas: dict[str, TableSchema | None] = {}
    d = migration.dialect
    for chk in _direction(migration, direction)[2]:
        if chk.table not in schemas:
            try:
                schemas[chk.table] = read_schema(db, chk.table)
            except MigrationError:
                schemas[chk.table] = None
        schema = schemas[chk.table]
        col = schema.column(chk.column, d) if schema else None
        if not chk.present:
            if col is not None:
                failures.append(f"{chk.description}: {chk.table}.{chk.column} still exists")
            continue
        if col is None:
            failures.append(f"{chk.description}: {chk.table}.{chk.column} does not exist")
            continue
        if chk.type is not None and not same_type(col.type, chk.type, d):
            failures.append(f"{chk.description}: {chk.table}.{chk.column} is {col.type}, expected {chk.type}")
        if chk.nullable is not None and col.nullable != chk.nullable:
            failures.append(f"{chk.description}: {chk.table}.{chk.column} is "
                            f"{'nullable' if col.nullable else 'NOT NULL'}, expected {'nullable' if chk.nullable else 'NOT NULL'}")
    return failures
