"""fakesnow (Snowflake on DuckDB) with two statements it does not have: ``SHOW WAREHOUSES`` and ``ALTER WAREHOUSE``.

fakesnow answers ``SHOW WAREHOUSES`` with one fixed row and cannot parse ``ALTER WAREHOUSE``. When
the table ``SNOWFLAKE.DW_FAKESNOW.WAREHOUSES`` exists (seeded by
:func:`dw_dagster_dev.cost_workload.create_tables`), :func:`patch_warehouse_emulation` makes
the server answer them from it, as Snowflake would:

- ``SHOW WAREHOUSES [LIKE '<pattern>']``: one row per warehouse, lower-case column names (``name``,
  ``state``, ``type``, ``size`` as ``X-Small`` ..., ``min_cluster_count``, ``max_cluster_count``,
  ``auto_suspend``, ``auto_resume``, ``scaling_policy``); LIKE case-insensitive;
- ``ALTER WAREHOUSE [IF EXISTS] <name> SET <K> = <v>, ...`` for ``WAREHOUSE_SIZE``, ``AUTO_SUSPEND``,
  ``MIN_CLUSTER_COUNT``, ``MAX_CLUSTER_COUNT``, ``SCALING_POLICY``: updates the row; an unknown
  warehouse is error 002003 ("does not exist or not authorized"), an unknown property an error.

This is an emulation of the settings only: nothing is metered differently after a change (the demo
seeds the metering of the period after a change itself). Tests of the real statements' text are
in ``dw_dagster_tests/cost/test_warehouse_changes.py``.

``python -m dw_dagster_dev.fakes.fakesnow_server --port 0`` serves it and prints its port.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading

STATE = "SNOWFLAKE.DW_FAKESNOW.WAREHOUSES"
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_SHOW = re.compile(r"^\s*SHOW\s+WAREHOUSES(?:\s+LIKE\s+'((?:[^']|'')*)')?\s*;?\s*$", re.IGNORECASE)
_ALTER = re.compile(r'^\s*ALTER\s+WAREHOUSE\s+(?:IF\s+EXISTS\s+)?("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)\s+SET\s+(.+?)\s*;?\s*$',
                    re.IGNORECASE | re.DOTALL)
_ITEM = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^']|'')*'|[A-Za-z0-9_.-]+)\s*(?:,|$)")
_COLUMNS = {"WAREHOUSE_SIZE": "SIZE", "AUTO_SUSPEND": "AUTO_SUSPEND", "MIN_CLUSTER_COUNT": "MIN_CLUSTER_COUNT",
            "MAX_CLUSTER_COUNT": "MAX_CLUSTER_COUNT", "SCALING_POLICY": "SCALING_POLICY"}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _show_sql(pattern: str | None) -> str:
    cols = ", ".join(f'{c} AS "{c.lower()}"' for c in ("NAME", "STATE", "TYPE", "SIZE", "MIN_CLUSTER_COUNT",
                                                         "MAX_CLUSTER_COUNT", "AUTO_SUSPEND", "AUTO_RESUME", "SCALING_POLICY"))
    where = f" WHERE UPPER(NAME) LIKE UPPER({_quote(pattern)})" if pattern is not None else ""
    return f"SELECT {cols} FROM {STATE}{where} ORDER BY NAME"


def _alter_sql(name: str, items: str) -> tuple[str, str]:
    """(the warehouse's stored name, the UPDATE), or raise the error Snowflake would."""
    import snowflake.connector.errors as errors

    from dw_dagster.cost.warehouse import SIZES, size_index

    stored = name[1:-1].replace('""', '"') if name.startswith('"') else name.upper()
    sets, pos = [], 0
    for m in _ITEM.finditer(items):
        if m.start() != pos:
            break
        pos = m.end()
        key, raw = m.group(1).upper(), m.group(2)
        value = raw[1:-1].replace("''", "'") if raw.startswith("'") else raw
        if key not in _COLUMNS:
            raise errors.ProgrammingError(msg=f"invalid property '{key}' for 'WAREHOUSE'", errno=1008, sqlstate="22023")
        if key == "WAREHOUSE_SIZE":
            idx = size_index(value)
            if idx is None:
                raise errors.ProgrammingError(msg=f"invalid value '{value}' for property 'WAREHOUSE_SIZE'", errno=1008,
                                              sqlstate="22023")
            value = SIZES[idx][0]
            sets.append(f"SIZE = {_quote(value)}")
        elif key == "SCALING_POLICY":
            sets.append(f"SCALING_POLICY = {_quote(value.upper())}")
        else:
            if not re.fullmatch(r"\d+", value):
                raise errors.ProgrammingError(msg=f"invalid value '{value}' for property '{key}'", errno=1008, sqlstate="22023")
            sets.append(f"{_COLUMNS[key]} = {int(value)}")
    if not sets or pos != len(items):
        raise errors.ProgrammingError(msg=f"SQL compilation error: syntax error near {items[pos:pos + 30]!r}", errno=1003,
                                      sqlstate="42000")
    return stored, f"UPDATE {STATE} SET {', '.join(sets)} WHERE NAME = {_quote(stored)}"


def patch_warehouse_emulation() -> None:
    """Make this process's fakesnow answer SHOW WAREHOUSES / ALTER WAREHOUSE from :data:`STATE` (once)."""
    from fakesnow.cursor import FakeSnowflakeCursor

    if getattr(FakeSnowflakeCursor.execute, "_dw_warehouses", False):
        return
    original = FakeSnowflakeCursor.execute

    def has_state(cur) -> bool:
        try:
            original(cur, f"SELECT 1 FROM {STATE} LIMIT 0")
            return True
        except Exception:  # noqa: BLE001 - no emulated warehouses: fakesnow's own behaviour
            return False

    def execute(self, command, *args, **kwargs):
        text = _COMMENT.sub("", command) if isinstance(command, str) else command
        if isinstance(text, str):
            show, alter = _SHOW.match(text), _ALTER.match(text)
            if show and has_state(self):
                pattern = show.group(1).replace("''", "'") if show.group(1) is not None else None
                return original(self, _show_sql(pattern))
            if alter and has_state(self):
                import snowflake.connector.errors as errors

                stored, update = _alter_sql(alter.group(1), alter.group(2))
                original(self, f"SELECT COUNT(*) FROM {STATE} WHERE NAME = {_quote(stored)}")
                if self.fetchone()[0] == 0:
                    if re.search(r"\bIF\s+EXISTS\b", text, re.IGNORECASE):
                        return original(self, "SELECT 'Statement executed successfully.' AS \"status\"")
                    raise errors.ProgrammingError(msg=f"Warehouse '{stored}' does not exist or not authorized.",
                                                  errno=2003, sqlstate="02000")
                original(self, update)
                return original(self, "SELECT 'Statement executed successfully.' AS \"status\"")
        return original(self, command, *args, **kwargs)

    execute._dw_warehouses = True  # type: ignore[attr-defined]
    FakeSnowflakeCursor.execute = execute


def main(argv: list[str] | None = None) -> None:
    """Serve fakesnow with the warehouse emulation on 127.0.0.1; print the port; stop on SIGTERM."""
    import fakesnow

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    patch_warehouse_emulation()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with fakesnow.server(port=args.port or None, host=args.host) as kwargs:
        print(kwargs["port"], flush=True)
        stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
