"""Table names as people write them: ``schema.table``, ``catalog.schema.table``, parts in SQL's double quotes.

One grammar for every place that reads a table name from configuration, an incident or a proposal (the SQL
builder :mod:`dw_dagster.databases.sql`, the catalog lookups, the domains that own tables), so a table has
one meaning however its name is written.
"""

from __future__ import annotations

import re

_QUOTED_PART = re.compile(r'"((?:[^"]|"")*)"')


def split_table(name: str) -> list[tuple[str, bool]]:
    """The parts of a dotted table name with whether each was written in double quotes: ``"a.b"`` is
    ``[("a", False), ("b", False)]``; ``'"my-dw".main."Order Lines"'`` is ``[("my-dw", True), ("main", False),
    ("Order Lines", True)]``. A quoted part is the text between its quotes, dots kept, ``""`` read as one ``"``.

    A name whose double quotes do not each open or close a whole part (``'x"; DROP TABLE keep; --'``) is
    split on its dots as written, its quotes part of the names (and quoted by sqlglot in every statement)."""
    if '"' not in name:
        return [(p, False) for p in name.split(".")]
    try:
        return _split_quoted(name)
    except ValueError:
        return [(p, False) for p in name.split(".")]


def table_parts(name: str) -> list[str]:
    """The parts' names of :func:`split_table` (``'"Sales.EU".t'`` is ``["Sales.EU", "t"]``)."""
    return [part for part, _ in split_table(name)]


def _split_quoted(name: str) -> list[tuple[str, bool]]:
    """:func:`split_table` of a name with double quotes; ``ValueError`` when one does not open or close a whole part."""
    out, i = [], 0
    while True:
        m = _QUOTED_PART.match(name, i) if name.startswith('"', i) else None
        if m:
            out.append((m.group(1).replace('""', '"'), True))
            i = m.end()
        else:
            end = name.find(".", i)
            end = len(name) if end < 0 else end
            if '"' in name[i:end]:
                raise ValueError(name)
            out.append((name[i:end], False))
            i = end
        if i == len(name):
            return out
        if name[i] != ".":
            raise ValueError(name)
        i += 1
