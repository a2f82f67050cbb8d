"""``build_row_diff_check``: the row-level key diff as an asset check (one database or two, chosen from the resources), with a key sample in the UI."""

import json
import time
from collections.abc import Sequence
from typing import Any

import dagster as dg

from dw_dagster.checks.metadata import at_least, column_list, metadata_table, source_deps
from dw_dagster.checks.reconcile import INCONCLUSIVE_KEY
from dw_dagster.checks.rowdiff.hashdiff import row_diff_across
from dw_dagster.checks.rowdiff.joindiff import row_diff
from dw_dagster.checks.rowdiff.rules import RowDiffResult, _options
from dw_dagster.databases import sql
from dw_dagster.core import keys as _keys
from dw_dagster.dagster_private import public

ROW_DIFF_KIND = "row_diff"
_READ_ATTEMPTS, _READ_WAIT_S = 3, 2.0


def _same_database(resources: Any, source_key: str, target_key: str) -> bool:
    if source_key == target_key:
        return True
    s, t = getattr(resources, source_key), getattr(resources, target_key)
    return getattr(s, "url", None) is not None and getattr(s, "url", None) == getattr(t, "url", None)


def row_diff_summary(result: RowDiffResult) -> str:
    """One line: ``identical``, or the counts and the most changed columns (``2 changed (amount ×2)``)."""
    if result.identical:
        return "identical"
    parts = [f"{n} {what}" for n, what in ((result.missing, "missing"), (result.extra, "extra"), (result.changed, "changed"))
             if n]
    if result.changed:  # "changed" is the last part
        top = sorted(result.changed_columns.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        parts[-1] += " (" + ", ".join(f"{c} ×{n}" for c, n in top) + ")"
    dups = [f"{n} key(s) duplicated in the {side}" for n, side in
            ((result.duplicated_source, "source"), (result.duplicated_target, "target")) if n]
    dups += [f"{n} key(s) colliding after normalization in the {side}" for n, side in
             ((result.collided_source, "source"), (result.collided_target, "target")) if n]
    return ", ".join(parts + dups)


def row_diff_metadata(result: RowDiffResult, key_columns: Sequence[str] = (), rules: Any = None) -> dict[str, Any]:
    """The check result's metadata: counts (keys), per-column change counts, a key sample table the
    Dagster UI renders, warnings and the SQL run. Key values of sensitive key columns (``rules``, default
    the domains file's ``review.sensitive``) are masked in the sample, and the masked columns named."""
    from dw_dagster.lineage.sensitive import mask_keyed, rules_in_force

    keys, masked = mask_keyed([list(e.key) for e in result.sample], list(key_columns),
                              rules if rules is not None else rules_in_force()) if key_columns else \
        ([list(e.key) for e in result.sample], [])
    sample = [{"key": str(k[0]) if len(k) == 1 and k[0] is not None else json.dumps(k, default=str),
               "status": e.status,
               "columns": ", ".join(e.columns), "source_rows": e.source_rows, "target_rows": e.target_rows}
              for k, e in zip(keys, result.sample)]
    meta: dict[str, Any] = {
        _keys.MISSING_KEY: result.missing,
        _keys.EXTRA_KEY: result.extra,
        _keys.CHANGED_KEY: result.changed,
        _keys.DUPLICATED_SOURCE_KEY: result.duplicated_source,
        _keys.DUPLICATED_TARGET_KEY: result.duplicated_target,
        _keys.COLLIDED_SOURCE_KEY: result.collided_source,
        _keys.COLLIDED_TARGET_KEY: result.collided_target,
        _keys.COLLISIONS_KEY: dg.MetadataValue.json([c.model_dump(mode="json") for c in result.collisions]),
        _keys.CHANGED_COLUMNS_KEY: dg.MetadataValue.json(result.changed_columns),
        _keys.KEY_SAMPLE_KEY: metadata_table(sample, [("key", "string"), ("status", "string"), ("columns", "string"),
                                                 ("source_rows", "int"), ("target_rows", "int")]),
        _keys.WARNINGS_KEY: dg.MetadataValue.md("\n".join(f"- {w}" for w in result.warnings) or "none"),
        _keys.QUERIES_KEY: dg.MetadataValue.md("\n\n".join(f"```sql\n{q}\n```" for q in result.queries)),
    }
    if masked:
        from dw_dagster.core.keys import MASKED_COLUMNS_KEY

        meta[MASKED_COLUMNS_KEY] = ", ".join(masked)
    if result.timestamp_rule:
        meta[_keys.TIMESTAMP_RULE_KEY] = result.timestamp_rule
    if result.buckets_compared is not None:
        meta.update({_keys.BUCKETS_COMPARED_KEY: result.buckets_compared, _keys.BUCKETS_DOWNLOADED_KEY: result.buckets_downloaded,
                     _keys.ROWS_DOWNLOADED_KEY: result.rows_downloaded, _keys.DOWNLOAD_PASSES_KEY: result.download_passes,
                     _keys.BYTES_FETCHED_KEY: result.bytes_fetched, _keys.BYTES_SENT_KEY: result.bytes_sent})
    if result.transfer is not None:
        meta.update({_keys.TRANSFER_KEY: result.transfer, _keys.BYTES_FETCHED_KEY: result.bytes_fetched,
                     _keys.BYTES_SENT_KEY: result.bytes_sent, _keys.ROWS_DOWNLOADED_KEY: result.rows_downloaded,
                     _keys.DOWNLOAD_PASSES_KEY: result.download_passes})
    if result.transfer_probe_mbps is not None:
        meta[_keys.TRANSFER_PROBE_MBPS_KEY] = result.transfer_probe_mbps
    return meta


@public
def build_row_diff_check(
    *,
    asset: dg.AssetKey | str | Sequence[str],
    source_asset: dg.AssetKey | str | Sequence[str] | None,
    source_table: str,
    target_table: str,
    key_columns: Sequence[str],
    compare_columns: Sequence[str] | None = None,
    source_resource_key: str = "source_db",
    target_resource_key: str = "warehouse",
    name: str = _keys.ROW_DIFF_CHECK,
    rel_tolerance: float = 1e-9,
    abs_tolerance: float = 1e-12,
    timestamp_precision: str | None = None,
    timestamp_rounding: str = "tolerate",
    case_insensitive_keys: bool = False,
    trim_trailing_blanks: bool = False,
    source_char_columns: Sequence[str] | None = None,
    target_char_columns: Sequence[str] | None = None,
    sample_limit: int = 50,
    max_download_rows: int = 20_000_000,
    transfer: str = "auto",
    blocking: bool = False,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    description: str | None = None,
) -> dg.AssetChecksDefinition:
    """A row-level key diff asset check on the target asset: which keys are missing, extra,
    duplicated or changed, and in which columns.

    When both sides are one database (the same resource key, or two resources with the same
    ``url``) the diff is :func:`row_diff`, one join pushed down; otherwise :func:`row_diff_across`,
    bucketed checksums that download only the differing buckets.

    Args:
        asset: the target asset the check is attached to.
        source_asset: the upstream asset the target copies (an additional dependency of the check);
            ``None`` (or the checked asset itself) when the source table is not a Dagster asset.
        source_table, target_table: ``schema.table`` names (quoted by sqlglot; a name that cannot be
            an identifier is refused when the check is built).
        key_columns: the key (compound keys allowed; NULL-safe).
        compare_columns: columns to compare; default every non-key column both tables have.
        source_resource_key, target_resource_key: keys of the two
            :class:`~dw_dagster.databases.DatabaseResource` resources.
        rel_tolerance, abs_tolerance, timestamp_precision, timestamp_rounding, case_insensitive_keys,
        trim_trailing_blanks, source_char_columns, target_char_columns: the typed comparison, as in
            :func:`row_diff` (names resolved against each side's catalog when the check runs).
        sample_limit: differing keys shown in ``dw/key_sample`` (the counts cover all of them).
        max_download_rows: across databases, refuse to download more rows than this.
        transfer: across databases, ``"stream"`` (every row read once, a PostgreSQL side by binary
            ``COPY``, compared locally), ``"bisect"`` (bucket hashes, then the differing buckets'
            rows) or ``"auto"`` (stream when 200,000 rows or more are compared and a probe of a
            PostgreSQL side's stream takes at most twice its time to hash the same rows);
            see :func:`row_diff_across`.
        blocking: fail the run (and skip downstream) when the check fails with ERROR severity.
        severity: severity of a failed result (default ERROR).

    Returns:
        An ``AssetChecksDefinition`` that passes when the tables hold the same keys with the same
        values. Metadata: ``dw/missing``, ``dw/extra``, ``dw/changed``, ``dw/duplicated_source``,
        ``dw/duplicated_target``, ``dw/collided_source``, ``dw/collided_target`` (keys),
        ``dw/collisions`` (normalized keys with their spellings), ``dw/timestamp_rule`` (with a
        precision), ``dw/changed_columns`` (column → keys), ``dw/key_sample``
        (table), ``dw/warnings``, ``dw/queries``; across databases also ``dw/buckets_compared``,
        ``dw/buckets_downloaded``, ``dw/rows_downloaded``, ``dw/download_passes``,
        ``dw/bytes_fetched``, ``dw/bytes_sent`` and ``dw/transfer`` (the path that ran: ``stream``,
        ``bisect`` or ``download``), with ``dw/transfer_probe_mbps`` when ``auto`` measured the
        rate. Across databases, a table whose row
        count changed between the count and the hashing is read again (3 reads, 2 s apart);
        still changing, the result is a WARN marked ``dw/inconclusive`` that opens no incident.

    Raises:
        UnsafeIdentifierError: a table or column name cannot be used (when the check is built).
        ValueError: an unknown ``transfer``, no key columns, a key column named twice, a bare string where a list of columns
            is expected, a negative or non-finite tolerance, or an unknown ``timestamp_precision``
            or ``timestamp_rounding``.
        (When the check runs, a missing table or column fails it with a ``DatabaseError`` naming them.)
    """
    key_columns = column_list("key_columns", key_columns, allow_empty=False)
    if len({k.lower() for k in key_columns}) != len(key_columns):
        raise ValueError(f"key_columns names a column twice: {key_columns}")
    compare_columns = None if compare_columns is None else column_list("compare_columns", compare_columns)
    at_least("sample_limit", sample_limit, 0)
    at_least("max_download_rows", max_download_rows, 1)
    from dw_dagster.checks.rowdiff.stream import TRANSFERS

    if transfer not in TRANSFERS:
        raise ValueError(f"transfer must be one of {', '.join(TRANSFERS)}, got {transfer!r}")
    _options(rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys, timestamp_rounding)
    source_char_columns = None if source_char_columns is None else column_list("source_char_columns", source_char_columns)
    target_char_columns = None if target_char_columns is None else column_list("target_char_columns", target_char_columns)
    sql.table(source_table), sql.table(target_table)
    for c in [*key_columns, *(compare_columns or ()), *(source_char_columns or ()), *(target_char_columns or ())]:
        sql.identifier(c)

    @dg.asset_check(
        asset=asset,
        name=name,
        additional_deps=source_deps(asset, source_asset),
        blocking=blocking,
        required_resource_keys={source_resource_key, target_resource_key},
        metadata={_keys.CHECK_KIND_KEY: ROW_DIFF_KIND, _keys.SOURCE_TABLE_KEY: source_table, _keys.TARGET_TABLE_KEY: target_table,
                  _keys.KEY_COLUMNS_KEY: ",".join(key_columns)},
        description=description or f"Row-level diff by {', '.join(key_columns)}: {source_table} (source) vs {target_table} (target).",
    )
    def _row_diff(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        src = getattr(context.resources, source_resource_key).get_database()
        opts = dict(compare_columns=compare_columns, rel_tolerance=rel_tolerance, abs_tolerance=abs_tolerance,
                    timestamp_precision=timestamp_precision, timestamp_rounding=timestamp_rounding,
                    case_insensitive_keys=case_insensitive_keys, trim_trailing_blanks=trim_trailing_blanks,
                    source_char_columns=source_char_columns, target_char_columns=target_char_columns,
                    sample_limit=sample_limit)
        if _same_database(context.resources, source_resource_key, target_resource_key):
            result = row_diff(src, source_table, target_table, key_columns, **opts)
        else:
            tgt = getattr(context.resources, target_resource_key).get_database()
            for attempt in range(_READ_ATTEMPTS):  # a table that changed while read is read again
                result = row_diff_across(src, tgt, source_table, target_table, key_columns,
                                         max_download_rows=max_download_rows, transfer=transfer, **opts)
                if not result.unstable:
                    break
                if attempt + 1 < _READ_ATTEMPTS:
                    time.sleep(_READ_WAIT_S)
            if result.unstable:
                return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                           description=f"inconclusive after {_READ_ATTEMPTS} reads: {'; '.join(result.unstable)}",
                                           metadata={**row_diff_metadata(result, key_columns), INCONCLUSIVE_KEY: True})
        return dg.AssetCheckResult(passed=result.identical, severity=severity, description=row_diff_summary(result),
                                   metadata=row_diff_metadata(result, key_columns))

    return _row_diff
