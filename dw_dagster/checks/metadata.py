"""Shared pieces of the check factories: a readable table for the Dagster UI."""

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg


def metadata_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> dg.MetadataValue:
    """A ``MetadataValue.table`` from dicts, with ``columns`` as (name, Dagster column type) in order."""
    names = [n for n, _ in columns]
    return dg.MetadataValue.table(
        [dg.TableRecord({n: r.get(n) for n in names}) for r in rows],
        schema=dg.TableSchema(columns=[dg.TableColumn(n, t) for n, t in columns]),
    )


def column_list(argument: str, value: Any, *, allow_empty: bool = True) -> list[str]:
    """``value`` as a list of column names, refusing a bare string (which would be read letter by letter).

    Raises:
        ValueError: ``value`` is a string, not a sequence, or empty when ``allow_empty`` is False.
    """
    if isinstance(value, str):
        raise ValueError(f"{argument} must be a list of column names, got the string {value!r} (write [{value!r}])")
    try:
        out = list(value)
    except TypeError:
        raise ValueError(f"{argument} must be a list of column names, got {type(value).__name__}") from None
    if not out and not allow_empty:
        raise ValueError(f"{argument} must name at least one column")
    return out


def at_least(argument: str, value: Any, minimum: float, *, strictly: bool = False, whole: bool = False) -> None:
    """Refuse a numeric setting that is not a finite number, is below ``minimum`` (or equal to it
    when ``strictly``), or is not a whole number when ``whole``.

    Raises:
        ValueError: naming the argument, its value and the bound.
    """
    import math

    kind = "a whole number" if whole else "a finite number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (whole and value != int(value)):
        raise ValueError(f"{argument} must be {kind}, got {value!r}")
    if value < minimum or (strictly and value == minimum):
        raise ValueError(f"{argument} must be {'>' if strictly else '≥'} {minimum:g}, got {value!r}")


def source_deps(asset: dg.AssetKey | str | Sequence[str], source_asset: object) -> list[dg.AssetKey]:
    """The check's extra dependency: the source asset, unless there is none or it is the asset itself."""
    if source_asset is None:
        return []
    src = dg.AssetKey.from_coercible(source_asset)
    return [] if src == dg.AssetKey.from_coercible(asset) else [src]
