"""The parity checks of one wave, as Dagster asset checks on each pair's target asset.

One multi-asset check per wave (``dw_parity__<migration>__<wave>``) declares, for every pair, one
check per parity kind on the pair's *target* asset: ``parity_schema``, ``parity_counts``,
``parity_key_diff`` and, with a compare metric, ``parity_lightup``. It can be subset (the verify
stage of a repair runs only its asset's checks), evaluates the selected pairs concurrently
(``max_workers``; every query runs in the databases, only aggregates and differing rows come
back), and never fails as a whole: a pair whose table is missing gets failed results naming the
error. Each result's metadata holds the kind, the pair, the values compared and the SQL run
(:meth:`~dw_dagster.migration.parity.KindResult.check_metadata`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from dw_dagster.core import keys as k
from dw_dagster.migration.config import MigrationConfig, PairConfig, WaveConfig, pair_kinds, parity_check_name
from dw_dagster.migration.parity import (
    KindResult,
    _failed,
    counts_parity,
    key_diff_parity,
    lightup_parity,
    schema_parity,
)


def target_key(pair: PairConfig) -> dg.AssetKey:
    return dg.AssetKey.from_user_string(pair.target.asset)


def pair_check_keys(pair: PairConfig, lightup: bool = True) -> list[dg.AssetCheckKey]:
    """The parity check keys of one pair (lightup only with a compare metric and a Lightup resource)."""
    return [dg.AssetCheckKey(target_key(pair), parity_check_name(kind)) for kind in pair_kinds(pair)
            if lightup or kind != k.PARITY_LIGHTUP]


def wave_check_keys(wave: WaveConfig, lightup: bool = True) -> list[dg.AssetCheckKey]:
    return [key for p in wave.pairs for key in pair_check_keys(p, lightup)]


_DESCRIBE = {
    k.PARITY_SCHEMA: "columns present, types mapped across the two engines, nullability, key uniqueness on both sides",
    k.PARITY_COUNTS: "rows and exact sums per slice against the source",
    k.PARITY_KEY_DIFF: "the key diff across the two databases (sampled by key buckets above the configured size)",
    k.PARITY_LIGHTUP: "Lightup's compare metric for the pair: its latest datapoint reads 0",
}


class _CatalogReader:
    """The database's name, dialect and ``fetch_all`` only (read_table_schema asks a database with a
    ``table_schema`` of its own, such as the cache, to answer itself)."""

    def __init__(self, db) -> None:
        self.dialect, self.name, self.fetch_all = db.dialect, db.name, db.fetch_all


class CatalogCache:
    """A database whose catalog is read once per table for one pair's evaluation: schema parity, the
    reconciliation's name resolution and the key diff's plan all take the same read (each kind would
    otherwise read ``information_schema`` again). Everything else goes to the database."""

    def __init__(self, db, anchor=None) -> None:
        self._db, self._schemas, self._anchor = db, {}, anchor
        self.dialect, self.name = db.dialect, db.name
        self._con = None  # a DuckDB file: one connection for the pair's evaluation, not one per query

    def __getattr__(self, name: str):
        return getattr(self._db, name)

    def _duck(self):
        from dw_dagster.databases import DuckDBDatabase

        if not isinstance(self._db, DuckDBDatabase):
            return None
        if self._con is None:  # a cursor of the evaluation's open connection: the file is opened once
            self._con = self._anchor.cursor() if self._anchor is not None else self._db._open()
            self._con.execute("SET TimeZone = 'UTC'")
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def fetch_all(self, sql_text: str) -> list[tuple]:
        con = self._duck()
        if con is None:
            return self._db.fetch_all(sql_text)
        try:
            return con.execute(sql_text).fetchall()
        except Exception as e:  # duckdb raises many error classes
            from dw_dagster.databases.base import DatabaseError, _short

            raise DatabaseError(f"{self.name}: query failed: {e}\n  SQL: {_short(sql_text)}") from e

    def fetch_batches(self, sql_text: str, batch_rows: int = 100_000):
        con = self._duck()
        if con is None:
            yield from self._db.fetch_batches(sql_text, batch_rows)
            return
        try:
            reader = con.sql(sql_text).to_arrow_reader(batch_rows)
        except Exception as e:
            from dw_dagster.databases.base import DatabaseError, _short

            raise DatabaseError(f"{self.name}: query failed: {e}\n  SQL: {_short(sql_text)}") from e
        yield from reader

    def execute(self, sql_text: str) -> None:
        self._db.execute(sql_text)

    def table_schema(self, table: str):
        from dw_dagster.databases.catalog import read_table_schema

        if table not in self._schemas:
            # a DuckDB file's catalog read over the pair's open connection (opening the file per query costs ms)
            reader = self if self._duck() is not None else self._db
            self._schemas[table] = read_table_schema(_CatalogReader(reader), table) if reader is self else \
                read_table_schema(self._db, table)
        return self._schemas[table]

    def column_types(self, table: str):
        from dw_dagster.databases.catalog import ColumnTypes

        if hasattr(self._db, "column_types"):
            return self._db.column_types(table)
        cols = self.table_schema(table).columns
        fix = (lambda t: "REAL" if t == "FLOAT" else t) if self.dialect == "duckdb" else (lambda t: t)  # noqa: E731
        return ColumnTypes({c.name.lower(): fix(c.type.upper()) for c in cols}, {c.name.lower(): c.name for c in cols})


def evaluate_pair(pair: PairConfig, kinds: list[str], src, tgt, *, rule, lightup_client=None,
                  now: dt.datetime | None = None, anchors: dict | None = None) -> list[KindResult]:
    """The selected parity kinds of one pair, in kind order; an unexpected error fails that kind, never the others.

    ``anchors`` maps a DuckDB file's path to a connection held open for the whole evaluation (each pair
    takes a cursor of it instead of opening the file again)."""
    anchors = anchors or {}
    src = CatalogCache(src, anchors.get(getattr(src, "path", None)))
    tgt = CatalogCache(tgt, anchors.get(getattr(tgt, "path", None)))
    try:
        return _evaluate(pair, kinds, src, tgt, rule=rule, lightup_client=lightup_client, now=now)
    finally:
        src.close()
        tgt.close()


def _evaluate(pair: PairConfig, kinds: list[str], src, tgt, *, rule, lightup_client=None,
              now: dt.datetime | None = None) -> list[KindResult]:
    out = []
    for kind in kinds:
        try:
            if kind == k.PARITY_SCHEMA:
                out.append(schema_parity(pair, src, tgt))
            elif kind == k.PARITY_COUNTS:
                out.append(counts_parity(pair, src, tgt, now))
            elif kind == k.PARITY_KEY_DIFF:
                out.append(key_diff_parity(pair, src, tgt, rule))
            elif kind == k.PARITY_LIGHTUP:
                if lightup_client is None:
                    out.append(KindResult(kind, False, "no Lightup resource: the compare metric cannot be read"))
                else:
                    out.append(lightup_parity(pair, lightup_client))
        except Exception as e:  # noqa: BLE001 - one kind's bug never hides the others' results
            out.append(_failed(kind, e))
    return out


def build_wave_parity_check(migration: MigrationConfig, wave: WaveConfig, *,
                            lightup_resource_key: str | None = None) -> dg.AssetChecksDefinition:
    """The wave's parity checks (module docstring) as one subsettable multi-asset check.

    Args:
        migration: the migration (its key diff rule and ``max_workers``).
        wave: the wave.
        lightup_resource_key: the :class:`~dw_dagster.integrations.lightup.LightupResource`'s key;
            None leaves the ``parity_lightup`` checks out.
    """
    lightup = lightup_resource_key is not None
    specs = []
    for p in wave.pairs:
        deps = [dg.AssetKey.from_user_string(p.source.asset)] if p.source.asset else []
        for kind in pair_kinds(p):
            if kind == k.PARITY_LIGHTUP and not lightup:
                continue
            specs.append(dg.AssetCheckSpec(
                name=parity_check_name(kind), asset=target_key(p), additional_deps=deps,
                description=f"Migration {migration.name}, {wave.name}: {_DESCRIBE[kind]} ({p.label}).",
                metadata={k.CHECK_KIND_KEY: "parity", k.PARITY_KIND_KEY: kind, k.MIGRATION_TAG: migration.name,
                          k.WAVE_TAG: wave.name, k.SOURCE_TABLE_KEY: p.source.table, k.TARGET_TABLE_KEY: p.target.table}))
    resources = {p.source.database for p in wave.pairs} | {p.target.database for p in wave.pairs}
    if lightup and any(p.lightup_compare_metric for p in wave.pairs):
        resources.add(lightup_resource_key)

    @dg.multi_asset_check(specs=specs, can_subset=True, required_resource_keys=resources,
                          name=f"{k.MIGRATION_PARITY_OP_PREFIX}{migration.name}__{wave.name}",
                          description=f"Parity of the {len(wave.pairs)} table pairs of wave {wave.name} of "
                          f"migration {migration.name}.")
    def _parity(context):
        selected = set(context.selected_asset_check_keys)
        client = None
        if lightup and any(p.lightup_compare_metric for p in wave.pairs):
            client = getattr(context.resources, lightup_resource_key).get_client()
        work = []
        for p in wave.pairs:
            kinds = [kind for kind in pair_kinds(p)
                     if dg.AssetCheckKey(target_key(p), parity_check_name(kind)) in selected]
            if kinds:
                work.append((p, kinds))

        names = sorted({x for p, _ in work for x in (p.source.database, p.target.database)})
        # one Database per resource for the whole evaluation (an engine and its connection pool, shared by the
        # pairs' threads), and one open connection per DuckDB file
        dbs = {name: getattr(context.resources, name).get_database() for name in names}
        anchors = _anchors(dbs)

        def run(item):
            p, kinds = item
            return evaluate_pair(p, kinds, dbs[p.source.database], dbs[p.target.database],
                                 rule=p.key_diff or migration.key_diff, lightup_client=client, anchors=anchors)

        try:
            with ThreadPoolExecutor(max_workers=min(migration.max_workers, max(1, len(work)))) as pool:
                for (p, _), results in zip(work, pool.map(run, work)):
                    for r in results:
                        yield dg.AssetCheckResult(asset_key=target_key(p), check_name=parity_check_name(r.kind),
                                                  passed=r.passed, severity=dg.AssetCheckSeverity.ERROR,
                                                  description=r.description, metadata=r.check_metadata(p))
        finally:
            for con in anchors.values():
                con.close()
            for db in dbs.values():
                if hasattr(db, "dispose"):
                    db.dispose()

    return _parity


def _anchors(dbs: dict) -> dict:
    """One open connection per DuckDB file the wave reads, held for the evaluation (path → connection)."""
    from dw_dagster.databases import DuckDBDatabase

    out = {}
    for db in dbs.values():
        if isinstance(db, DuckDBDatabase) and db.path not in out:
            try:
                out[db.path] = db._open()
            except Exception:  # noqa: BLE001 - unreachable now: each pair opens it (and reports the error)
                continue
    return out


__all__ = ["build_wave_parity_check", "evaluate_pair", "pair_check_keys", "target_key", "wave_check_keys"]
