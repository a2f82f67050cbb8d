"""``dw-dagster migration plan`` and ``dw-dagster migration status`` (:mod:`dw_dagster.migration`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.group("migration")
def migration_group() -> None:
    """Plan a migration's waves; show each wave's parity state and sign-off."""


@migration_group.command("plan")
@click.option("--source-url", required=True, help="The source database (duckdb:///..., postgresql+psycopg://..., "
              "ibm_db_sa://...).")
@click.option("--schema", "schemas", multiple=True, required=True, help="A source schema whose tables to plan (repeat).")
@click.option("--manifest", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A dbt manifest.json: tables its models read together go together, before the models built from them.")
@click.option("--module", "module", default=None, help="A Python module with Dagster Definitions (``defs``): assets "
              "reading tables (by dagster/table_name) group them like models.")
@click.option("--budget-mb", type=float, default=1024.0, show_default=True, help="Size budget of one wave, MB.")
@click.option("--max-pairs", type=int, default=25, show_default=True, help="Pairs per wave at most.")
@click.option("--name", "name", default="migration", show_default=True, help="The migration's name.")
@click.option("--domain", default="TODO", show_default=True, help="The owning domain of the waves.")
@click.option("--source-database", default="source", show_default=True, help="The source's name under databases.")
@click.option("--target-database", default="warehouse", show_default=True, help="The target's name under databases.")
@click.option("--asset-prefix", default="", help="Prefix of the target asset keys (e.g. raw/pos/).")
def plan_cmd(source_url: str, schemas: tuple[str, ...], manifest: str | None, module: str | None, budget_mb: float,
             max_pairs: int, name: str, domain: str, source_database: str, target_database: str, asset_prefix: str) -> None:
    """Propose waves from the source catalog, the dbt manifest and the asset graph; print the YAML to paste.

    A plan is a proposal: nothing runs from it and nothing is written.
    """
    from dw_dagster.databases import DatabaseError, database_from_url
    from dw_dagster.migration.plan import manifest_reads, plan_waves, plan_yaml, read_table_info, source_tables

    try:
        db = database_from_url(source_url)
        tables = [t for s in schemas for t in source_tables(db, s)]
        if not tables:
            raise click.ClickException(f"no tables in schema(s) {', '.join(schemas)} of {db.name}")
        infos = [read_table_info(db, t) for t in tables]
    except DatabaseError as e:
        raise click.ClickException(str(e).splitlines()[0]) from e
    groups, upstream = [], {}
    if manifest:
        groups, upstream = manifest_reads(json.loads(Path(manifest).read_text()), tables)
    if module:
        more, up = asset_reads(module, tables)
        groups += more
        for t, u in up.items():
            upstream.setdefault(t, set()).update(u)
    waves = plan_waves(infos, groups, upstream, budget_bytes=int(budget_mb * 1e6), max_pairs=max_pairs)
    click.echo(plan_yaml(waves, migration=name, source_database=source_database, target_database=target_database,
                         domain=domain, asset_prefix=asset_prefix), nl=False)


def asset_reads(module: str, tables: list[str]) -> tuple[list[tuple[str, set[str]]], dict[str, set[str]]]:
    """From a module's Definitions: (asset → planned tables its parents are, table → tables it is built from)."""
    import importlib

    import dagster as dg

    mod = importlib.import_module(module)
    defs = getattr(mod, "defs", None)
    defs = defs() if callable(defs) and not isinstance(defs, dg.Definitions) else defs
    if not isinstance(defs, dg.Definitions):
        raise click.ClickException(f"{module} has no Definitions called defs")
    graph = defs.resolve_asset_graph()
    wanted = {t.lower(): t for t in tables}

    def table_of(key) -> str | None:
        md = graph.get(key).metadata or {}
        t = md.get("dagster/table_name")
        text = str(getattr(t, "value", t) or "").lower()
        return next((wanted[x] for x in wanted if text.endswith(x)), None) if text else None

    groups, upstream = [], {}
    for key in graph.get_all_asset_keys():
        reads = {table_of(p) for p in graph.get(key).parent_keys} - {None}
        if reads:
            groups.append((key.to_user_string(), reads))
        own = table_of(key)
        if own and reads:
            upstream[own] = reads - {own}
    return groups, upstream


@migration_group.command("status")
@click.option("--migration", "migration", default=None, help="Only this migration's waves.")
@click.option("--json", "as_json", is_flag=True, help="The waves as JSON (pairs, states, sign-off, reopening).")
@click.option("--dagster-home", type=click.Path(file_okay=False), default=None,
              help="The Dagster instance directory (default $DAGSTER_HOME).")
def status_cmd(migration: str | None, as_json: bool, dagster_home: str | None) -> None:
    """Each wave's state: pairs and their parity state, the gate, who signed it off and how, any reopening."""
    from dw_dagster.cli.main import _instance
    from dw_dagster.migration.status import migration_status, status_lines

    with _instance(dagster_home) as instance:
        waves = migration_status(instance, migration)
    if as_json:
        click.echo(json.dumps(waves, indent=2, default=str))
    else:
        click.echo("\n".join(status_lines(waves)))
    if migration and not waves:
        sys.exit(1)


__all__ = ["migration_group"]
