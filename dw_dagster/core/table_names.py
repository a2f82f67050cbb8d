"""Table names as people write them: ``schema.table``, ``catalog.schema.table``, parts in SQL's double quotes.

One grammar for every place that reads a table name from configuration, an incident or a proposal (the SQL
builder :mod:`dw_dagster.databases.sql`, the catalog lookups, the domains that own tables), so a table has
one meaning however its name is written.
"""

from __future__ import annotations

import re

_QUOTED_PART = re.compile(r'"((?:[^"]|"")*)"')
_UNSAFE_IN_SLUG = re.compile(r"[^A-Za-z0-9_-]")


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


def join_table(parts: list[tuple[str, bool]]) -> str:
    """The name :func:`split_table` reads back as ``parts``: a part written in quotes, or holding a dot or a
    double quote, is written in quotes again (``[("Sales.EU", True), ("t", False)]`` is ``'"Sales.EU".t'``)."""
    return ".".join('"' + p.replace('"', '""') + '"' if quoted or "." in p or '"' in p else p for p, quoted in parts)


def sibling_table(name: str, suffix: str) -> str:
    """A table beside ``name``, in its schema, called its last part's name plus ``suffix``, quoted as that part
    was (``sibling_table('"Sales.EU"."Orders"', "__bak")`` is ``'"Sales.EU"."Orders__bak"'``)."""
    parts = split_table(name)
    last, quoted = parts[-1]
    return join_table([*parts[:-1], (last + suffix, quoted)])


def table_slug(name: str) -> str:
    """The table's parts joined by ``__``, lower case, for file and node names (``dw_<kind>__<slug>.sql``):
    ``analytics.orders`` is ``analytics__orders``; ``'"Sales.EU"."Order Lines"'`` is ``sales_eu__order_lines``
    (a character other than a letter, a digit, ``_`` or ``-`` becomes ``_``)."""
    return "__".join(_UNSAFE_IN_SLUG.sub("_", part) for part in table_parts(name)).lower()


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
