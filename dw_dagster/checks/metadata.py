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
