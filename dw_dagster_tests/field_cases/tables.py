"""Small tables from Python values, on any engine of the corpus, and the row diff's answer
worked out in Python from the same values (the independent oracle of ``test_rowdiff.py``)."""

import datetime as dt
import decimal
import math
import uuid


class Raw(str):
    """A literal written as it is (per engine SQL the renderer cannot guess)."""


def _ident(engine, name: str) -> str:
    if engine.name == "mariadb":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


def literal(engine, v) -> str:
    kind = engine.name.rstrip("2")
    if v is None:
        return "NULL"
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, (int, decimal.Decimal)):
        return str(v)
    if isinstance(v, float):
        if math.isfinite(v):
            return repr(v)
        text = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return f"CAST('{text}' AS {'DOUBLE PRECISION' if kind == 'postgres' else 'DOUBLE'})"
    if isinstance(v, bytes):
        return {"duckdb": f"from_hex('{v.hex()}')", "postgres": f"decode('{v.hex()}', 'hex')"}.get(kind, f"X'{v.hex()}'")
    if isinstance(v, list):
        if not v and kind == "postgres":
            return "'{}'"
        inner = ", ".join(literal(engine, x) for x in v)
        return f"ARRAY[{inner}]" if kind == "postgres" else f"[{inner}]"
    if isinstance(v, dt.timedelta):
        return f"INTERVAL '{int(v.total_seconds())} seconds'"
    if isinstance(v, (dt.datetime, dt.date, uuid.UUID)):
        v = v.isoformat(sep=" ") if isinstance(v, dt.datetime) else str(v)
    text = str(v).replace("'", "''")
    if kind == "mariadb":
        text = text.replace("\\", "\\\\")
    return f"'{text}'"


def load(engine, name: str, columns: list[tuple[str, str]], rows: list[tuple]) -> str:
    """Create ``name`` (dropped first) with ``columns`` (name, type) and insert ``rows``; returns
    the table's qualified name."""
    table = engine.table(name)
    engine.db.execute(f"DROP TABLE IF EXISTS {table}")
    engine.db.execute(f"CREATE TABLE {table} ({', '.join(f'{_ident(engine, c)} {t}' for c, t in columns)})")
    if rows:
        values = ", ".join("(" + ", ".join(literal(engine, v) for v in r) + ")" for r in rows)
        engine.db.execute(f"INSERT INTO {table} VALUES {values}")
    return table


def same(a, b) -> bool:
    """Python's equality with NaN equal to NaN (as the diff's float rule)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if (a is None) != (b is None):
        return False
    return a == b


def expected(source: list[tuple], target: list[tuple], columns: list[str], eq=same, key=lambda k: k):
    """(missing, extra, changed, changed_columns) of two unique-keyed row lists: rows are
    ``(key, *values)``; ``key`` normalizes a key, ``eq(a, b)`` (or a per-column dict) says two
    values are equal."""
    s = {key(r[0]): r[1:] for r in source}
    t = {key(r[0]): r[1:] for r in target}
    eqs = eq if isinstance(eq, dict) else {c: eq for c in columns}
    changed, cols = 0, {}
    for k in s.keys() & t.keys():
        diff = [c for c, a, b in zip(columns, s[k], t[k]) if not eqs.get(c, same)(a, b)]
        changed += bool(diff)
        for c in diff:
            cols[c] = cols.get(c, 0) + 1
    return len(s.keys() - t.keys()), len(t.keys() - s.keys()), changed, cols


def answer(result):
    return result.missing, result.extra, result.changed, dict(result.changed_columns)
