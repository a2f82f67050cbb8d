"""The query tag dw_dagster's databases put on every statement they issue inside a Dagster step.

Inside a step (an asset, an asset check, an op) each statement carries
``{"app": "dw_dagster", "dagster_run_id": ..., "asset_key": ..., "partition": ...}``:

- appended to the SQL text as a ``/* {...} */`` comment on a line of its own (Snowflake drops a
  *leading* comment from ``QUERY_HISTORY.QUERY_TEXT``, dbt-core#2138; an appended one stays), so
  the query history says which run, asset and partition a query served on every engine, fakesnow
  included (it refuses ``ALTER SESSION SET QUERY_TAG``);
- on Snowflake also as the statement's ``QUERY_TAG`` parameter (no extra round trip);
- on BigQuery also as job labels (lower case, ``[a-z0-9_-]``, 63 characters at most).

:mod:`dw_dagster.cost` reads them back from ``QUERY_HISTORY`` / ``INFORMATION_SCHEMA.JOBS``.
Outside a Dagster step nothing is added. ``asset_key`` is the step's asset (``a/b``) when it
materializes or checks exactly one; ``partition`` is the step's partition key, or ``first..last``
for a single run over a range.
"""

from __future__ import annotations

import json
import re

from dw_dagster.core import keys as c

#: the comment dw_dagster appends starts with this (so a statement is never tagged twice)
COMMENT_START = '/* {"' + c.QUERY_TAG_APP_KEY + '": "' + c.QUERY_TAG_APP + '"'


def current_query_tag() -> dict[str, str] | None:
    """The tag of the Dagster step running in this thread, or None outside one."""
    try:
        from dw_dagster.dagster_private import current_execution_context

        ctx = current_execution_context.get()
    except Exception:  # noqa: BLE001 - another dagster layout: no tag, never a failed query
        return None
    if ctx is None:
        return None
    try:
        op = ctx.op_execution_context
        tag = {c.QUERY_TAG_APP_KEY: c.QUERY_TAG_APP, c.QUERY_TAG_RUN_KEY: op.run_id}
        asset = _one_asset(op)
        if asset:
            tag[c.QUERY_TAG_ASSET_KEY] = asset
        partition = _partition(op)
        if partition:
            tag[c.QUERY_TAG_PARTITION_KEY] = partition
        return tag
    except Exception:  # noqa: BLE001
        return None


def _one_asset(op) -> str | None:
    keys = set(op.selected_asset_keys or ())
    if not keys:
        keys = {k.asset_key for k in (op.selected_asset_check_keys or ())}
    return next(iter(keys)).to_user_string() if len(keys) == 1 else None


def _partition(op) -> str | None:
    if getattr(op, "has_partition_key_range", False):
        rng = op.partition_key_range
        return rng.start if rng.start == rng.end else f"{rng.start}..{rng.end}"
    return op.partition_key if op.has_partition_key else None


def tag_json(tag: dict[str, str]) -> str:
    """The tag as compact JSON (``": "`` between key and value, as dbt writes its query comment)."""
    return json.dumps(tag, ensure_ascii=True)


def with_comment(sql: str, tag: dict[str, str] | None) -> str:
    """``sql`` with the tag appended as a comment on its own line (unchanged without a tag or when
    it already carries one). A ``*/`` inside a value is broken up so the comment cannot end early."""
    if not tag or COMMENT_START in sql:
        return sql
    body = tag_json(tag).replace("*/", "*\\/")
    return f"{sql.rstrip().rstrip(';')}\n{body.join(('/* ', ' */'))}"


def tagged(sql: str) -> tuple[str, dict[str, str] | None]:
    """``sql`` with the current step's tag appended, and the tag (None outside a step)."""
    tag = current_query_tag()
    return with_comment(sql, tag), tag


_LABEL_BAD = re.compile(r"[^a-z0-9_-]")


def bigquery_label(value: str) -> str:
    """A value as a BigQuery label value: lower case, ``[a-z0-9_-]`` (others become ``_``), 63 characters."""
    return _LABEL_BAD.sub("_", value.lower())[:63]


def bigquery_labels(tag: dict[str, str] | None) -> dict[str, str]:
    """The tag as BigQuery job labels (keys and values sanitised; an asset key's ``/`` becomes ``__``)."""
    if not tag:
        return {}
    out = {}
    for k, v in tag.items():
        if k == c.QUERY_TAG_APP_KEY:
            continue
        out[k] = bigquery_label(v.replace("/", "__"))
    return out


__all__ = ["COMMENT_START", "bigquery_label", "bigquery_labels", "current_query_tag", "tag_json", "tagged",
           "with_comment"]
