"""Row diff inside one database: one query that joins the two tables on the key.

Inside one database (:func:`row_diff`) the diff is one query pushed down as SQL: each side is
grouped by the key (``GROUP BY`` treats NULL as a value, so keys are NULL-safe and duplicates are
counted), the two are joined with a ``FULL OUTER JOIN ... ON k IS NOT DISTINCT FROM k``, and
only differing keys come back, ordered by key (deterministic output).
"""

from collections.abc import Sequence

import sqlglot

from dw_dagster.checks.rowdiff.rules import (
    JSON_TYPES,
    UNORDERED_TYPES,
    KeyCollision,
    RowDiffEntry,
    RowDiffResult,
    _differs,
    _folds,
    _is,
    _key_expr,
    _Options,
    _options,
    _plan,
    _relabel,
    timestamp_rule,
)
from dw_dagster.databases import Database, sql
from dw_dagster.dagster_private import public


def row_diff_sql(source_table: str, target_table: str, key_columns: Sequence[str], compare_columns: Sequence[str],
                 source_types: dict[str, str], target_types: dict[str, str], *, rel_tolerance: float = 1e-9,
                 abs_tolerance: float = 1e-12, timestamp_precision: str | None = None,
                 case_insensitive_keys: bool = False, timestamp_rounding: str = "tolerate") -> str:
    """The in-database diff query (DuckDB dialect; transpile for others). Returns differing keys only."""
    opts = _options(rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys, timestamp_rounding)
    return _diff_sql(sql.table(source_table).sql("duckdb"), sql.table(target_table).sql("duckdb"), key_columns,
                     compare_columns, source_types, target_types, opts)


def _raw_key(key_columns: Sequence[str], types: dict[str, str], other: dict[str, str], ci: bool, ref=None) -> str | None:
    """The original spelling of the key columns a normalization folds (text, '|'-joined), or None
    when no key column is folded (then no two distinct keys can collide)."""
    ref = ref or (lambda c: sql.identifier(c).sql("duckdb"))
    folded = [c for c in key_columns if _folds(c, types, ci)]
    if not folded:
        return None
    return " || '|' || ".join(f"COALESCE(CAST({ref(c)} AS VARCHAR), '')" for c in folded)


def _diff_sql(src: str, tgt: str, key_columns: Sequence[str], compare_columns: Sequence[str],
              source_types: dict[str, str], target_types: dict[str, str], opts: _Options) -> str:
    q = lambda c: sql.identifier(c).sql("duckdb")  # noqa: E731
    ci = opts.case_insensitive_keys

    def side(rel: str, types: dict[str, str], other: dict[str, str]) -> str:
        key_expr = lambda c: _key_expr(q(c), c, types, other, ci)  # noqa: E731
        keys = ", ".join(f"{key_expr(c)} AS {q(c)}" for c in key_columns)
        # PostgreSQL and BigQuery accept only equalities in a FULL JOIN's condition, so the
        # NULL-safe match is an equality on (key as text with NULL as '', is-NULL flag).
        safe = "".join(f", COALESCE(CAST({key_expr(c)} AS VARCHAR), '') AS dw_kc{i}, "
                       f"CASE WHEN {key_expr(c)} IS NULL THEN 1 ELSE 0 END AS dw_kn{i}"
                       for i, c in enumerate(key_columns))
        raw = _raw_key(key_columns, types, other, ci)
        spellings = f", COUNT(DISTINCT {raw}) AS dw_r" if raw else ", 1 AS dw_r"
        vals = "".join(f", MIN({_orderable(q(c), types.get(c.lower()))}) AS {q(c)}" for c in compare_columns)
        groups = ", ".join(key_expr(c) for c in key_columns)
        return f"SELECT {keys}{safe}, COUNT(*) AS dw_n{spellings}{vals} FROM {rel} AS x GROUP BY {groups}"

    on = " AND ".join(f"s.dw_kc{i} = t.dw_kc{i} AND s.dw_kn{i} = t.dw_kn{i}" for i in range(len(key_columns)))
    flags = [_differs(c, source_types.get(c.lower()), target_types.get(c.lower()), opts.rel_tolerance, opts.abs_tolerance,
                      opts.timestamp_precision, opts.timestamp_rounding) for c in compare_columns]
    sel_keys = ", ".join(f"COALESCE(s.{q(c)}, t.{q(c)}) AS {q(c)}" for c in key_columns)
    sel_flags = "".join(f", {f} AS dw_d{i}" for i, f in enumerate(flags))
    sel_flags += "".join(f", s.{q(c)} AS dw_js{i}, t.{q(c)} AS dw_jt{i}" for i, c in enumerate(compare_columns)
                         if _json(c, source_types, target_types))
    where = " OR ".join(["s.dw_n IS NULL", "t.dw_n IS NULL", "s.dw_n > 1", "t.dw_n > 1", *flags])
    order = ", ".join(f"{i + 1} NULLS FIRST" for i in range(len(key_columns)))
    return (f"WITH s AS ({side(src, source_types, target_types)}), t AS ({side(tgt, target_types, source_types)}) "
            f"SELECT {sel_keys}, s.dw_n AS dw_sn, t.dw_n AS dw_tn, s.dw_r AS dw_sr, t.dw_r AS dw_tr{sel_flags} "
            f"FROM s FULL OUTER JOIN t ON {on} WHERE {where} ORDER BY {order}")


def _orderable(ref: str, ty: str | None) -> str:
    """A column as the grouped diff aggregates it: its text form for a type some engine cannot
    ``MIN()`` (PostgreSQL's jsonb, uuid, boolean, bytea), else as it is."""
    if _is(("BOOLEAN", "BOOL"), ty):
        return f"CAST({ref} AS INTEGER)"
    return f"CAST({ref} AS VARCHAR)" if _is(UNORDERED_TYPES, ty) else ref


def _nested(ty: str | None) -> bool:
    t = (ty or "").upper()
    return t.endswith("]") or t.startswith(("STRUCT", "MAP", "UNION", "LIST"))


def native_hash_parts(ref: str, ty: str | None) -> list[str]:
    """What DuckDB's ``hash()`` is given for one compared column: the value (a nested one as its
    JSON text: ``hash`` gives a NULL list and ``[]``, a NULL struct and ``{'a': NULL}`` one
    value) and an is-NULL flag (``hash`` of a NULL equals that of some empty nested values)."""
    return [f"to_json({ref})" if _nested(ty) else ref, f"({ref} IS NULL)"]


def _json(c: str, st: dict[str, str], tt: dict[str, str]) -> bool:
    return _is(JSON_TYPES, st.get(c.lower())) or _is(JSON_TYPES, tt.get(c.lower()))


_NOT_JSON = object()


def _parsed(v):
    """A JSON value as Python data (text parsed, numbers as ``Decimal``; a driver's dict or list as it is)."""
    if isinstance(v, (bytes, bytearray)):
        v = v.decode()
    if not isinstance(v, str):
        return v
    import json
    from decimal import Decimal

    try:
        return json.loads(v, parse_float=Decimal, parse_int=Decimal)
    except ValueError:
        return _NOT_JSON


def _canon(v):
    """JSON data in a form where equal documents are equal Python values: objects by key (order
    dropped), numbers by value (``1`` = ``1.0``), booleans never equal to numbers."""
    from decimal import Decimal

    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, (int, float, Decimal)):
        return ("number", Decimal(repr(v)) if isinstance(v, float) else Decimal(v))
    if isinstance(v, dict):
        return ("object", frozenset((k, _canon(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return ("array", tuple(_canon(x) for x in v))
    return ("other", repr(v))


def json_equal(a, b) -> bool:
    """Whether two JSON documents are equal as data: object key order, white space and the
    spelling of a number (``1`` / ``1.0``) do not matter, array order and value types do (as
    PostgreSQL's ``jsonb`` equality). Text that is not JSON is compared as text."""
    if a is None or b is None:
        return a is None and b is None
    pa, pb = _parsed(a), _parsed(b)
    if pa is _NOT_JSON or pb is _NOT_JSON:
        return a == b
    return _canon(pa) == _canon(pb)


def _counts_and_null_keys(db: Database, rel: str, key_columns: Sequence[str], side: str,
                          labels: dict[str, str] | None = None) -> tuple[int, list[str], str]:
    """Row count of the relation ``rel`` (DuckDB dialect) and the NULL-key warnings, in one pushed-down query."""
    parts = "".join(f", COUNT(*) - COUNT({sql.identifier(c).sql('duckdb')})" for c in key_columns)
    q = sqlglot.transpile(f"SELECT COUNT(*){parts} FROM {rel} AS x", read="duckdb", write=db.dialect)[0]
    (row,) = db.fetch_all(q)
    labels = labels or {}
    return int(row[0]), [_null_key_warning(labels.get(c, c), n, side) for c, n in zip(key_columns, row[1:]) if n], q


def _null_key_warning(column: str, nulls: int, side: str) -> str:
    return f"key column {column} has {nulls} NULL(s) on the {side} side; compared NULL-safely"


def _collisions(db: Database, rel: str, key_columns: Sequence[str], side: str, types: dict[str, str],
                other: dict[str, str], case_insensitive: bool, limit: int = 20) -> tuple[list[KeyCollision], int, str | None]:
    """Normalized keys of one side held by two or more distinct original keys (the first ``limit``,
    with the first and last spelling) and how many there are in all, from one pushed-down query;
    ([], 0, None) when no key column is normalized."""
    q_ = lambda c: sql.identifier(c).sql("duckdb")  # noqa: E731
    raw = _raw_key(key_columns, types, other, case_insensitive)
    if raw is None:
        return [], 0, None
    norm = ", ".join(_key_expr(q_(c), c, types, other, case_insensitive) for c in key_columns)
    q = sqlglot.transpile(
        f"SELECT {norm}, MIN({raw}), MAX({raw}), COUNT(DISTINCT {raw}), COUNT(*) OVER () FROM {rel} AS x GROUP BY {norm} "
        f"HAVING COUNT(DISTINCT {raw}) > 1 ORDER BY {', '.join(str(i + 1) for i in range(len(key_columns)))} LIMIT {int(limit)}",
        read="duckdb", write=db.dialect)[0]
    n = len(key_columns)
    rows = db.fetch_all(q)
    return ([KeyCollision(side=side, key=list(r[:n]), spellings=[r[n], r[n + 1]], count=int(r[n + 2])) for r in rows],
            int(rows[0][n + 3]) if rows else 0, q)


def _collision_warning(c: KeyCollision) -> str:
    return (f"{c.side} keys collide after normalization: {c.spellings[0]!r} and {c.spellings[1]!r}"
            f"{f' (and {c.count - 2} more)' if c.count > 2 else ''} are both {c.key}; not paired with the other side")


def _tally(result: RowDiffResult, key: list, sn: int | None, tn: int | None, sr: int | None, tr: int | None,
           flags: Sequence[bool], compare_columns: Sequence[str], sample_limit: int) -> None:
    sn, tn = int(sn or 0), int(tn or 0)
    s_collides, t_collides = int(sr or 0) > 1, int(tr or 0) > 1
    collided = s_collides or t_collides
    cols = [c for c, f in zip(compare_columns, flags) if f] if sn and tn and not collided else []
    result.duplicated_source += sn > 1 and not collided
    result.duplicated_target += tn > 1 and not collided
    if collided:  # two distinct keys folded into one: neither a duplicate nor a pair
        status = "collision"
        result.collided_source += s_collides
        result.collided_target += t_collides
    elif not tn:
        status = "missing"
        result.missing += 1
    elif not sn:
        status = "extra"
        result.extra += 1
    elif cols:
        status = "changed"
        result.changed += 1
        for c in cols:
            result.changed_columns[c] = result.changed_columns.get(c, 0) + 1
    else:
        status = "duplicate"
    if len(result.sample) < sample_limit:
        result.sample.append(RowDiffEntry(key=key, status=status, columns=cols, source_rows=sn, target_rows=tn))


def _duckdb_single_pass(db, src, tgt, key_columns, compare_columns, st, tt, opts: _Options,
                        sample_limit) -> "RowDiffResult | None":
    """DuckDB fast path, one statement in two steps. First the two tables are joined on the key
    carrying only a 64-bit hash of the compared columns (about half the cost of joining the rows
    themselves at 10M rows): that gives the join's side counts, the NULL keys, and the candidate
    keys (unmatched, or a different hash). Then only the candidates' rows are joined again and
    compared with the typed rules. Equal hashes are taken as equal rows: every typed rule only
    makes more values equal, so a hash difference can never hide a difference the rules would
    report (a 2^-64 collision aside). Valid only when no key is duplicated; returns None (use
    the grouped query) when the counts or the list show a duplicate."""
    q = lambda c: sql.identifier(c).sql("duckdb")  # noqa: E731
    if any(_json(c, st, tt) for c in compare_columns):
        return None  # JSON columns are compared as data, row by row, by the grouped query's reader

    def key_expr(alias: str, c: str, types: dict[str, str]) -> str:
        return _key_expr(f"{alias}.{q(c)}", c, types, tt if types is st else st, opts.case_insensitive_keys)

    n = len(key_columns)
    flags = [_differs(c, st.get(c.lower()), tt.get(c.lower()), opts.rel_tolerance, opts.abs_tolerance,
                      opts.timestamp_precision, opts.timestamp_rounding) for c in compare_columns]
    on = " AND ".join(f"{key_expr('s', c, st)} IS NOT DISTINCT FROM {key_expr('t', c, tt)}" for c in key_columns)
    fields = [f"'k{i}': COALESCE({key_expr('s', c, st)}, {key_expr('t', c, tt)})" for i, c in enumerate(key_columns)]
    fields += ["'sm': s.dw_m", "'tm': t.dw_m"] + [f"'d{i}': {f}" for i, f in enumerate(flags)]
    cond = " OR ".join(["s.dw_m IS NULL", "t.dw_m IS NULL", *flags])
    order = ", ".join(f"COALESCE({key_expr('s', c, st)}, {key_expr('t', c, tt)}) NULLS FIRST" for c in key_columns)

    def hashed(table: str, types: dict[str, str]) -> str:
        keys = ", ".join(f"{key_expr('x', c, types)} AS dw_k{i}" for i, c in enumerate(key_columns))
        parts = [p for c in compare_columns for p in native_hash_parts("x." + q(c), types.get(c.lower()))]
        row_hash = f"hash({', '.join(parts)})" if parts else "0"
        return f"(SELECT {keys}, {row_hash} AS dw_h FROM {table} AS x)"  # dw_h is never NULL: it marks the side

    def candidates_of(table: str, types: dict[str, str]) -> str:
        match = " AND ".join(f"dw_c.k{i} IS NOT DISTINCT FROM {key_expr('x', c, types)}" for i, c in enumerate(key_columns))
        return f"(SELECT x.*, 1 AS dw_m FROM {table} AS x WHERE EXISTS (SELECT 1 FROM dw_c WHERE {match}))"

    hk = " AND ".join(f"s.dw_k{i} IS NOT DISTINCT FROM t.dw_k{i}" for i in range(n))
    null_cols = [f"COUNT(CASE WHEN {a}.dw_h IS NOT NULL AND {a}.dw_k{i} IS NULL THEN 1 END) AS dw_n{a}{i}"
                 for a in ("s", "t") for i in range(n)]
    cand = "{" + ", ".join(f"'k{i}': COALESCE(s.dw_k{i}, t.dw_k{i})" for i in range(n)) + "}"
    step1 = (f"SELECT COUNT(s.dw_h) AS dw_js, COUNT(t.dw_h) AS dw_jt, {', '.join(null_cols)}, "
             f"LIST({cand}) FILTER (WHERE s.dw_h IS DISTINCT FROM t.dw_h) AS dw_cand "
             f"FROM {hashed(src, st)} AS s FULL OUTER JOIN {hashed(tgt, tt)} AS t ON {hk}")
    unnest = ", ".join(f"u.c.k{i} AS k{i}" for i in range(n))
    nulls = "".join(f", (SELECT dw_n{a}{i} FROM dw_p)" for a in ("s", "t") for i in range(n))
    query = (f"WITH dw_p AS ({step1}), dw_c AS (SELECT {unnest} FROM (SELECT UNNEST(dw_cand) AS c FROM dw_p) AS u) "
             f"SELECT (SELECT COUNT(*) FROM {src} AS x), (SELECT COUNT(*) FROM {tgt} AS x), (SELECT dw_js FROM dw_p), (SELECT dw_jt FROM dw_p), "
             f"LIST({{{', '.join(fields)}}} ORDER BY {order}) FILTER (WHERE {cond}){nulls} "
             f"FROM {candidates_of(src, st)} AS s FULL OUTER JOIN {candidates_of(tgt, tt)} AS t ON {on}")
    # Arrow, not Python objects: the list of differing rows can hold millions of entries.
    import pyarrow as pa

    tbl = pa.Table.from_batches(list(db.fetch_batches(query)))
    head = [tbl.column(i)[0].as_py() for i in range(4)]
    null_counts = [tbl.column(i)[0].as_py() for i in range(5, tbl.num_columns)]
    n_src, n_tgt, joined_s, joined_t = head
    if joined_s != n_src or joined_t != n_tgt:
        return None  # a matched key is duplicated on some side
    listed = tbl.column(4).combine_chunks()
    structs = None if listed.null_count else listed.flatten()
    count = 0 if structs is None else len(structs)
    result = RowDiffResult(queries=[query])
    for (side, c), k in zip(((side, c) for side in ("source", "target") for c in key_columns), null_counts):
        if k:
            result.warnings.append(_null_key_warning(c, k, side))
    if not count:
        return result
    # Counted with Arrow compute (the list can hold millions of differing keys); Python objects
    # only for the sample.
    import pyarrow.compute as pc

    keys = [structs.field(f"k{i}") for i in range(n)]
    if count > 1:
        same = None
        for arr in keys:  # keys arrive sorted: an unmatched duplicated key sits next to itself
            a, b = arr.slice(0, count - 1), arr.slice(1)
            eq = pc.fill_null(pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b))), False)
            same = eq if same is None else pc.and_(same, eq)
        if pc.any(same).as_py():
            return None
    in_s, in_t = pc.is_valid(structs.field("sm")), pc.is_valid(structs.field("tm"))
    both = pc.and_(in_s, in_t)
    result.missing = int(pc.sum(pc.invert(in_t)).as_py() or 0)
    result.extra = int(pc.sum(pc.invert(in_s)).as_py() or 0)
    result.changed = int(pc.sum(both).as_py() or 0)  # a matched key is listed only when a column differs
    for i, c in enumerate(compare_columns):
        changed = int(pc.sum(pc.and_(both, pc.fill_null(structs.field(f"d{i}"), False))).as_py() or 0)
        if changed:
            result.changed_columns[c] = changed
    head = structs.slice(0, sample_limit)
    cols = {name: head.field(name).to_pylist() for name in [f"k{i}" for i in range(n)] + ["sm", "tm"]
            + [f"d{i}" for i in range(len(compare_columns))]}
    for j in range(len(head)):
        sn, tn = int(cols["sm"][j] or 0), int(cols["tm"][j] or 0)
        changed_cols = [c for i, c in enumerate(compare_columns) if cols[f"d{i}"][j]] if sn and tn else []
        status = "missing" if not tn else "extra" if not sn else "changed"
        result.sample.append(RowDiffEntry(key=[cols[f"k{i}"][j] for i in range(n)], status=status, columns=changed_cols,
                                          source_rows=sn, target_rows=tn))
    return result


@public
def row_diff(db: Database, source_table: str, target_table: str, key_columns: Sequence[str],
             compare_columns: Sequence[str] | None = None, *, rel_tolerance: float = 1e-9, abs_tolerance: float = 1e-12,
             timestamp_precision: str | None = None, timestamp_rounding: str = "tolerate",
             case_insensitive_keys: bool = False, trim_trailing_blanks: bool = False,
             source_char_columns: Sequence[str] | None = None, target_char_columns: Sequence[str] | None = None,
             sample_limit: int = 100) -> RowDiffResult:
    """Diff two tables in the same database by key (see the module docstring and :mod:`.rules`).

    Args:
        db: the database holding both tables.
        source_table, target_table: ``schema.table`` names.
        key_columns: the key (compound keys allowed; NULL-safe). Every name is resolved against
            the catalog (exact, then the engine's folding rule, then a unique case-insensitive
            match) and quoted as the catalog spells it.
        compare_columns: columns to compare; default every non-key column the two tables share.
        rel_tolerance, abs_tolerance: for floating-point columns only.
        timestamp_precision: unit timestamps are compared at (``"millisecond"``...), or None (exact).
        timestamp_rounding: with a precision, ``"tolerate"`` (default: truncations within one
            unit), ``"floor"`` or ``"round"``; the rule used is ``result.timestamp_rule``.
        case_insensitive_keys: compare text keys with ``LOWER``; colliding keys are reported.
        trim_trailing_blanks: compare every text column and key with trailing blanks trimmed, as
            ``CHAR`` columns always are. Hides a real trailing-blank change in a ``VARCHAR``:
            prefer ``source_char_columns`` / ``target_char_columns``.
        source_char_columns, target_char_columns: columns (keys or compared) with ``CHAR``
            semantics on that side, where the engine reports a padded export as ``VARCHAR``
            (DuckDB has no padded ``CHAR`` type): only those are trimmed.
        sample_limit: how many differing keys to keep (the counts cover all of them).

    Returns:
        A :class:`RowDiffResult`; ``queries`` holds the SQL run. Key collisions after
        normalization are ``collided_source``/``collided_target`` and ``collisions`` (with spellings).

    Raises:
        DatabaseError: a table or a key, compared or declared column is missing, or a query fails.
        CatalogError: a configured column name matches two columns differing only in case.
    """
    opts = _options(rel_tolerance, abs_tolerance, timestamp_precision, case_insensitive_keys, timestamp_rounding)
    plan = _plan(db, db, source_table, target_table, key_columns, compare_columns, trim_trailing_blanks,
                 source_char_columns, target_char_columns)
    keys, cols, st, tt = plan.keys, plan.columns, plan.st, plan.tt
    result, fast = _diff_typed(db, plan.source_rel, plan.target_rel, keys, cols, st, tt, opts, sample_limit)
    result.warnings += plan.warnings
    for rel, side, own, other in ((plan.source_rel, "source", st, tt), (plan.target_rel, "target", tt, st)):
        if not fast:  # the single pass already counted NULL keys
            _, w, wq = _counts_and_null_keys(db, rel, keys, side, plan.labels)
            result.warnings += w
            result.queries.append(wq)
        if not fast or result.collided_source or result.collided_target:
            found, _, cq = _collisions(db, rel, keys, side, own, other, case_insensitive_keys)
            result.collisions += found
            result.warnings += [_collision_warning(c) for c in found]
            if cq:
                result.queries.append(cq)
    result.timestamp_rule = timestamp_rule(timestamp_precision, timestamp_rounding)
    return _relabel(result, plan.labels)


def _diff_typed(db: Database, src: str, tgt: str, key_columns: Sequence[str],
                compare_columns: Sequence[str], st: dict[str, str], tt: dict[str, str], opts: _Options,
                sample_limit: int) -> tuple[RowDiffResult, bool]:
    """The diff of two relations (DuckDB-dialect ``FROM`` items) with the column types given
    (``st``/``tt`` may come from other databases than ``db``: :func:`row_diff_across` passes the
    types of the tables the rows were downloaded from). Returns the result and whether DuckDB's
    single pass produced it (it counts NULL keys itself, and finds no collision: a collision makes
    a normalized key repeat, which sends the diff to the grouped query)."""
    if db.dialect == "duckdb":
        result = _duckdb_single_pass(db, src, tgt, key_columns, compare_columns, st, tt, opts, sample_limit)
        if result is not None:
            return result, True
    q = sqlglot.transpile(_diff_sql(src, tgt, key_columns, compare_columns, st, tt, opts), read="duckdb",
                          write=db.dialect)[0]
    result = RowDiffResult(queries=[q])
    n, m = len(key_columns), len(compare_columns)
    jsons = [i for i, c in enumerate(compare_columns) if _json(c, st, tt)]
    formatting = dict.fromkeys(jsons, 0)
    for batch in db.fetch_batches(q):
        for row in zip(*(c.to_pylist() for c in batch.columns)):
            flags = list(row[n + 4 : n + 4 + m])
            for j, i in enumerate(jsons):  # text differs: equal as JSON data?
                a, b = row[n + 4 + m + 2 * j], row[n + 4 + m + 2 * j + 1]
                if flags[i] and row[n] and row[n + 1] and json_equal(a, b):
                    flags[i] = False
                    formatting[i] += 1
            if row[n] == 1 and row[n + 1] == 1 and not any(flags) and (row[n + 2] or 1) <= 1 and (row[n + 3] or 1) <= 1:
                continue  # only JSON formatting differed
            _tally(result, list(row[:n]), row[n], row[n + 1], row[n + 2], row[n + 3], flags, compare_columns, sample_limit)
    result.warnings += [f"column {compare_columns[i]}: {k} row(s) differ only in JSON formatting (object key order, "
                        "white space); compared as JSON data, equal" for i, k in formatting.items() if k]
    return result, False


# ---- across two databases: bucketed checksums -------------------------------------------------

# md5 as lower-case hex text, per dialect (``{s}``: the row string).
_MD5_HEX = {"duckdb": "MD5({s})", "postgres": "MD5({s})", "snowflake": "MD5({s})", "bigquery": "TO_HEX(MD5({s}))",
            "mysql": "MD5({s})"}  # MySQL/MariaDB: lower-case hex too (the undo checksum; no 48-bit bucket hash there)

# The first 12 hex digits (48 bits) of an md5 hex column ``{h}`` as an integer, the same number on
# every engine. Snowflake's ``TO_NUMBER(h, 'XXXXXXXXXXXX')`` would do, but fakesnow (the test
# emulator) lacks a format argument, so Snowflake adds the 12 digits' values positionally.
_HEX48 = {
    "duckdb": "CAST(('0x' || SUBSTRING({h}, 1, 12)) AS BIGINT)",
    "postgres": "('x' || SUBSTRING({h}, 1, 12))::BIT(48)::BIGINT",
    "snowflake": " + ".join(f"(POSITION(SUBSTR({{h}}, {i + 1}, 1), '0123456789abcdef') - 1) * {16 ** (11 - i)}" for i in range(12)),
    "bigquery": "CAST(CONCAT('0x', SUBSTR({h}, 1, 12)) AS INT64)",
}


# ---- the asset check -----------------------------------------------------------------------------


