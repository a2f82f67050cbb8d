"""sqlglot helpers the cost statements share: templates, lookup tables, and one long result shape.

Every report is one statement. Its result is long: rows of ``(dim, key, amount, queries, beside)``
where ``dim`` names what the row is (``model``, ``asset``, ``run``, ``warehouse``, ``mapped``,
``idle``, ``total``) and ``key`` the node, asset, run, warehouse or total it belongs to;
:func:`rows_to_parts` folds them back into maps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import sqlglot
from sqlglot import exp

from dw_dagster.databases import sql


@lru_cache(maxsize=32)
def _parse(template: str, read: str) -> exp.Expression:
    return sqlglot.parse_one(template, read=read)


def build(template: str, read: str, *, ctes: Mapping[str, exp.Expression] | None = None,
          **values: object) -> exp.Expression:
    """Parse ``template`` (dialect ``read``), fill its ``:name`` placeholders (tables from
    :func:`dw_dagster.databases.sql.table`, values as literals) and put ``ctes`` first in its WITH."""
    tree = exp.replace_placeholders(_parse(template, read).copy(),
                                    **{k: v if isinstance(v, exp.Expression) else sql.literal(v) for k, v in values.items()})
    if ctes:
        with_ = tree.args.get("with_") or tree.args.get("with")
        first = [exp.CTE(this=body, alias=exp.TableAlias(this=exp.to_identifier(name))) for name, body in ctes.items()]
        if with_ is None:
            tree.set("with_", exp.With(expressions=first))
        else:
            with_.set("expressions", first + list(with_.expressions))
    return tree


def lookup(columns: Sequence[str], rows: Iterable[Sequence[Any]], types: Sequence[str] | None = None) -> exp.Select:
    """``SELECT <columns> FROM (VALUES ...) AS v(<columns>)`` (text columns unless ``types`` says);
    one all-NULL row when ``rows`` is empty (it matches nothing in an equality join)."""
    rows = [tuple(r) for r in rows]
    types = list(types or ["VARCHAR"] * len(columns))
    tuples = ([exp.tuple_(*(exp.cast(sql.literal(None if v is None else str(v)), "VARCHAR") for v in r)) for r in rows]
              or [exp.tuple_(*(exp.cast(exp.Null(), t) for t in types))])
    values = exp.Values(expressions=tuples, alias=exp.TableAlias(this=exp.to_identifier("v"),
                                                                  columns=[exp.to_identifier(c) for c in columns]))
    return exp.select(*columns).from_(values)


#: one row of the long result: (dim, key, amount, queries, beside)
Row = tuple[str, Any, Any, Any, Any]


def rows_to_parts(rows: Iterable[Sequence[Any]]) -> dict[str, dict[str, tuple[float, int, float | None]]]:
    """dim → key → (amount, queries, beside); a NULL key becomes ``""``."""
    out: dict[str, dict[str, tuple[float, int, float | None]]] = {}
    for dim, key, amount, queries, beside in rows:
        out.setdefault(str(dim), {})[("" if key is None else str(key))] = (
            float(amount or 0), int(queries or 0), None if beside is None else float(beside))
    return out


def amounts(part: Mapping[str, tuple[float, int, float | None]], *, skip_blank: bool = True) -> dict[str, float]:
    """key → amount, largest first (the blank key, what maps to nothing on this dimension, left out)."""
    items = [(k, v[0]) for k, v in part.items() if not (skip_blank and k == "")]
    return dict(sorted(items, key=lambda kv: (-kv[1], kv[0])))


def partitions(part: Mapping[str, tuple[float, int, float | None]]) -> dict[str, dict[str, float]]:
    """asset → partition → amount, from keys ``asset + CHR(31) + partition`` (a blank key: no partition)."""
    out: dict[str, dict[str, float]] = {}
    for key, (amount, _, _) in sorted(part.items()):
        asset, sep, partition = key.partition("\x1f")
        if sep:
            out.setdefault(asset, {})[partition] = amount
    return out


def counts(part: Mapping[str, tuple[float, int, float | None]], *, skip_blank: bool = True) -> dict[str, int]:
    """key → query count, in the order of :func:`amounts`."""
    return {k: part[k][1] for k in amounts(part, skip_blank=skip_blank)}


__all__ = ["Row", "amounts", "build", "counts", "lookup", "partitions", "rows_to_parts"]
