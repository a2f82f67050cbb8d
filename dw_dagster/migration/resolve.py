"""Every table and column a migration names, resolved against each engine's catalog when the definitions load.

A pair's source table is looked up in its database's catalog and its target table in the
target's (Informix through ``systables``/``syscolumns``, the others through their standard
catalogs, :func:`~dw_dagster.databases.catalog.table_columns`); then the key, slice, sum, time and
compared columns on both sides, under each engine's rule for matching names
(:func:`~dw_dagster.databases.catalog.resolve_column`). Each unknown name is one line
``file:line: field: problem`` (the line of the field in the YAML file when the configuration came
from one); all of them are reported at once, and nothing is defined. A target table that does not
exist yet is no error (the pair is ``not_loaded`` until its first load; its columns are checked by
the parity checks then). A database that cannot be reached at load is named in a warning, and its
names are checked when the checks run instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dw_dagster.errors import DwConfigError
from dw_dagster.migration.config import MigrationConfig


@dataclass(frozen=True)
class ConfigSource:
    """Where a configuration was read from, to name lines: the file, its text, and the path of the
    configuration's fields inside it (``("attributes",)`` in a ``defs.yaml``)."""

    path: Path | None
    text: str | None
    prefix: tuple[str, ...] = ()

    def locate(self, loc: Sequence[Any]) -> str:
        """``file:line`` of the field at ``loc`` (the file's first line when the field is not found)."""
        if self.path is None or self.text is None:
            return "build_dw_definitions(config)"
        import yaml

        from dw_dagster.core.config_files import _node_at

        try:
            root = yaml.compose(self.text)
        except yaml.YAMLError:
            return f"{self.path}:1"
        node = _node_at(root, (*self.prefix, *loc))
        return f"{self.path}:{node.start_mark.line + 1 if node is not None else 1}"


def _field(i: int, j: int, *rest: Any) -> tuple:
    return ("migration", "waves", i, "pairs", j, *rest)


def resolve_migration(migration: MigrationConfig, open_database: Callable[[str], Any | None],
                      source: ConfigSource | None = None) -> list[str]:
    """Check every name of ``migration`` against the catalogs (module docstring).

    Args:
        migration: the configuration.
        open_database: database name → an open :class:`~dw_dagster.databases.Database`, or None
            when it is not known at load (a resource the project defines).
        source: where the configuration came from (for line numbers).

    Returns:
        The warnings (unreachable databases).

    Raises:
        DwConfigError: one line per unknown table or column.
    """
    from dw_dagster.databases import DatabaseError
    from dw_dagster.databases.catalog import CatalogError, resolve_column, table_columns

    source = source or ConfigSource(None, None)
    problems, notes, catalogs, dead = [], [], {}, set()

    def columns(db_name: str, table: str, loc: tuple) -> list[str] | None:
        if db_name in dead:
            return None
        if (db_name, table) in catalogs:
            return catalogs[(db_name, table)]
        db = open_database(db_name)
        if db is None:
            dead.add(db_name)
            return None
        try:
            names = [n for n, _ in table_columns(db, table)]
        except (DatabaseError, CatalogError) as e:
            text = str(e).splitlines()[0]
            if loc[-2] == "target" and ("not found" in text or "does not exist" in text or "no columns" in text):
                names = None  # not loaded yet: the wave shows the pair as not_loaded; its columns are checked then
            elif "not found" in text or "does not exist" in text or "no columns" in text:
                problems.append(f"{source.locate(loc)}: {'.'.join(map(str, loc))}: table {table} is not in database "
                                f"{db_name} ({text})")
            else:
                dead.add(db_name)
                notes.append(f"database {db_name} could not be read at load ({text}); its tables and columns are "
                             "checked when the parity checks run")
            names = None
        catalogs[(db_name, table)] = names
        return names

    for i, wave in enumerate(migration.waves):
        for j, p in enumerate(wave.pairs):
            sides = ((p.source.database, p.source.table, _field(i, j, "source", "table"), "source"),
                     (p.target.database, p.target.table, _field(i, j, "target", "table"), "target"))
            for db_name, table, loc, side in sides:
                names = columns(db_name, table, loc)
                if names is None:
                    continue
                dialect = open_database(db_name).dialect
                wanted = [("key", c) for c in p.key] + [("slice_by", c) for c in p.slice_by] + [
                    ("sums", c) for c in p.sums] + ([("time_column", p.time_column)] if p.time_column else []) + [
                    ("compare_columns", c) for c in (p.compare_columns or [])]
                for field, col in wanted:
                    try:
                        found = resolve_column(names, col, dialect, table)
                    except CatalogError as e:
                        problems.append(f"{source.locate(_field(i, j, field))}: {'.'.join(map(str, _field(i, j, field)))}: {e}")
                        continue
                    if found is None:
                        problems.append(f"{source.locate(_field(i, j, field))}: {'.'.join(map(str, _field(i, j, field)))}: "
                                        f"column {col} is not in the {side} table {table} (columns: "
                                        f"{', '.join(names[:20])}{' ...' if len(names) > 20 else ''})")
    if problems:
        raise DwConfigError("the migration names tables or columns the catalogs do not have:\n" + "\n".join(problems))
    for n in notes:
        warnings.warn(n, stacklevel=3)
    return notes


def check_references(migration: MigrationConfig, databases: Sequence[str], domains, source: ConfigSource | None = None,
                     ) -> None:
    """Databases and domains the migration names exist (``file:line: field: problem``).

    Raises:
        DwConfigError: one line per unknown database or domain.
    """
    source = source or ConfigSource(None, None)
    problems = []
    for i, wave in enumerate(migration.waves):
        if domains is not None:
            try:
                domains.get(wave.domain)
            except KeyError:
                loc = ("migration", "waves", i, "domain")
                problems.append(f"{source.locate(loc)}: migration.waves.{i}.domain: domain {wave.domain!r} is not in "
                                f"the domains file ({', '.join(d.name for d in domains.domains)})")
        for j, p in enumerate(wave.pairs):
            for side, ref in (("source", p.source), ("target", p.target)):
                if ref.database not in databases:
                    loc = _field(i, j, side, "database")
                    problems.append(f"{source.locate(loc)}: {'.'.join(map(str, loc))}: {ref.database!r} is not under "
                                    f"databases ({', '.join(sorted(databases))})")
    if problems:
        raise DwConfigError("\n".join(problems))


__all__ = ["ConfigSource", "check_references", "resolve_migration"]
