"""``dw-dagster``: the command line for people and scripts.

Commands: ``approve``, ``approvals``, ``change-sets``, ``receipts``,
``incidents``, ``stop``/``resume``, ``holds``, ``undo``, ``blast-radius``, ``review`` (the deciding ones in
:mod:`dw_dagster.cli.decisions`; ``review`` in :mod:`dw_dagster.cli.review`).
Commands that read Dagster's records use the instance in ``$DAGSTER_HOME`` (or ``--dagster-home``).
``demo NAME`` and the ``fake-*`` servers come with the examples (``dw-dagster-examples``), added
through the :data:`PLUGIN_GROUP` entry points.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from dw_dagster.core import keys as c


def _instance(dagster_home: str | None):
    import dagster as dg

    if dagster_home:
        os.environ["DAGSTER_HOME"] = str(Path(dagster_home).resolve())
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        raise click.UsageError("set DAGSTER_HOME or pass --dagster-home (the instance holding dw_dagster's records)")
    if not Path(home).is_dir():
        raise click.UsageError(f"DAGSTER_HOME {home} is not a directory holding a Dagster instance")
    os.environ["DAGSTER_HOME"] = str(Path(home).resolve())  # Dagster wants it absolute
    try:
        return dg.DagsterInstance.get()
    except Exception as e:  # a broken dagster.yaml or storage: its cause chain, not a traceback
        from dw_dagster.core.explain import explain

        raise click.UsageError(f"cannot open the Dagster instance in {os.environ['DAGSTER_HOME']}: {explain(e)}") from e


home_option = click.option("--dagster-home", type=click.Path(file_okay=False), default=None,
                           help="Dagster instance directory (default: $DAGSTER_HOME).")


@click.group()
@click.version_option(package_name="dw-dagster")
def main() -> None:
    """dw_dagster: find why a table is wrong, propose one change set, repair it through Dagster."""


@main.group(invoke_without_command=True)
@click.option("--asset", "asset", default=None, help="Asset key, slash-separated (e.g. store_sales_line).")
@click.option("--json", "as_json", is_flag=True)
@home_option
@click.pass_context
def receipts(ctx: click.Context, asset: str | None, as_json: bool, dagster_home: str | None) -> None:
    """Print receipts (dw/receipt) from the Dagster instance: per asset, newest first.

    ``dw-dagster receipts verify`` checks every receipt chain for tampering.
    """
    import dagster as dg

    if ctx.invoked_subcommand is not None:
        ctx.obj = {"dagster_home": dagster_home}
        return

    from dw_dagster.core import records
    from dw_dagster.receipts.job import receipt_markdown

    if asset is not None and not asset.strip("/ "):
        raise click.BadParameter("must name an asset key, e.g. store_sales_line", param_hint="--asset")
    with _instance(dagster_home) as instance:
        key = dg.AssetKey(asset.strip("/").split("/")) if asset else None
        if key is not None and key not in set(instance.get_asset_keys()):
            raise click.BadParameter(f"no asset {asset!r} in this instance", param_hint="--asset")
        found = records.receipts(instance, key)
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in found], indent=2))
        return
    if not found:
        click.echo("no receipts")
        return
    for r in found:
        click.echo(f"== {'/'.join(r.asset_key)} ==\n{receipt_markdown(r)}\n")
    click.echo("(verified / signature valid: as recorded when each receipt was written; "
               "`dw-dagster receipts verify` rechecks the chains and signatures now)")


@receipts.command("verify")
@home_option
@click.pass_context
def receipts_verify(ctx: click.Context, dagster_home: str | None) -> None:
    """Check every receipt chain against the ledger; exit 1 naming each altered, removed or unrecorded receipt."""
    from dw_dagster.approval.job import ApprovalRefused
    from dw_dagster.receipts.chain import verify_receipts

    home = dagster_home or (ctx.obj or {}).get("dagster_home")
    with _instance(home) as instance:
        try:
            count, problems = verify_receipts(instance)
        except ApprovalRefused as e:
            raise click.UsageError(f"cannot verify receipts: {e}") from e
    for p in problems:
        click.echo(str(p), err=True)
    if problems:
        click.echo(f"{len(problems)} problem(s) in {count} receipt(s)", err=True)
        unsigned = [p for p in problems if "signature does not verify" in p.detail]
        if count and len(unsigned) >= count:
            click.echo(f"hint: no signature verifies; if nothing was tampered with, ${c.SIGNING_KEY_ENV} is not this "
                       "deployment's key", err=True)
        sys.exit(1)
    if count == 0:
        click.echo(f"no receipts in the instance at {os.environ['DAGSTER_HOME']}: nothing to verify")
        return
    click.echo(f"{count} receipt(s) verified: every chain intact, every hash signed, every receipt the ledger "
               "recorded present in the event log")


@main.command("blast-radius")
@click.option("--manifest", type=click.Path(exists=True, dir_okay=False), required=True, help="dbt manifest.json")
@click.option("--select", "selector", required=True,
              help="A dbt unique id; a model (or any node) name, matched by dbt's fqn rules; source:, exposure:, metric:, "
                   "semantic_model:, saved_query:, unit_test: selectors; or a Dagster asset key (store_sales_line, "
                   "pos_source/sales_line) a source or model carries. A trailing + is implied.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the grouped listing.")
def blast_radius_cmd(manifest: str, selector: str, as_json: bool) -> None:
    """Everything downstream of a dbt node, grouped by resource type, with depth.

    The set is exactly what ``dbt ls --select NODE+`` lists for the same manifest (default resource
    types: analyses are left out). With --json: "nodes" (the selected nodes, then downstream models,
    seeds, snapshots, sources, metrics, semantic models, saved queries, functions; by depth),
    "tests" (data tests and unit tests) and "exposures" are disjoint and together equal dbt ls's
    output, also given whole and sorted as "dbt_ls"; "owners" (of all those, sorted), "depth" (unique id → edges
    from the selected node), "selected" (the unique ids NODE resolved to) and "dbt_selector" (the
    same selection in dbt's syntax).
    """
    from dw_dagster.lineage import blast_radius, dbt_ls, dbt_selector, downstream, load_manifest, manifest_graph, select_nodes
    from dw_dagster.lineage.dbt_manifest import node_owners
    from dw_dagster.lineage.dbt_manifest import UnknownNodeError

    try:
        data = load_manifest(manifest)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--manifest") from e
    if not isinstance(data, dict) or not any(data.get(k) for k in ("nodes", "sources")):
        raise click.BadParameter(f"{manifest} is not a dbt manifest (no nodes or sources)", param_hint="--manifest")
    try:
        g = manifest_graph(data)
    except (AttributeError, TypeError, KeyError) as e:
        raise click.BadParameter(f"{manifest} is not a dbt manifest dw_dagster can read: {type(e).__name__}: {e}",
                                 param_hint="--manifest") from e
    try:
        roots = select_nodes(g, selector)
    except UnknownNodeError as e:
        raise click.BadParameter(str(e.args[0]), param_hint="--select") from e
    br = blast_radius(g, roots)
    depth = downstream(g, roots)
    listed = sorted(dbt_ls(g, roots), key=lambda u: (depth[u], u))
    kind = {u: g.nodes[u]["resource_type"] for u in listed}
    dbt_sel = " ".join(f"{dbt_selector(g, r)}+" for r in roots)
    all_owners = sorted({o for u in listed for o in node_owners(g, u)})
    if as_json:
        click.echo(json.dumps({
            "nodes": [u for u in listed if kind[u] not in ("test", "unit_test", "exposure")],
            "exposures": [u for u in listed if kind[u] == "exposure"],
            "tests": [u for u in listed if kind[u] in ("test", "unit_test")],
            "owners": all_owners,
            "depth": {u: depth[u] for u in listed},
            "selected": roots,
            "dbt_selector": dbt_sel,
            "dbt_ls": sorted(listed),
        }, indent=2))
        return
    exposures = {e.unique_id: e for e in br.exposures}
    click.echo(f"downstream of {', '.join(roots)} ({len(listed)} nodes, as dbt ls --select {dbt_sel}):")
    order = ("source", "seed", "snapshot", "model", "function", "semantic_model", "metric", "saved_query", "exposure",
             "test", "unit_test")
    for rt in sorted(set(kind.values()), key=lambda t: (order.index(t) if t in order else len(order), t)):
        items = [u for u in listed if kind[u] == rt]
        click.echo(f"  {rt} ({len(items)}):")
        for u in items:
            line = f"    [{depth[u]}] {u}"
            if u in exposures:
                e = exposures[u]
                line += f"  {e.label or e.name} ({e.type}) owner {e.owner_name} <{e.owner_email}> {e.url or ''}"
            elif node_owners(g, u):
                line += f"  owner {', '.join(node_owners(g, u))}"
            click.echo(line.rstrip())
    if all_owners:
        click.echo(f"  owners: {', '.join(all_owners)}")


@main.command("undo")
@click.argument("change_set_id")
@home_option
def undo_cmd(change_set_id: str, dagster_home: str | None) -> None:
    """Propose the undo of a repair that ran, as its own change set waiting for approval."""
    from dw_dagster.repair.undo import UndoError, propose, propose_undo

    with _instance(dagster_home) as instance:
        try:
            cs, _ = propose(instance, propose_undo(instance, change_set_id.strip()))
        except UndoError as e:
            click.echo(f"refused: {e}", err=True)
            sys.exit(3)
    click.echo(f"proposed {cs.id}: {cs.summary}\napprove it like any change set: dw-dagster approve {cs.id} --login "
               f"(approvers: {', '.join(cs.approvers)}; expires {cs.expires_at.isoformat()})")


@main.group("incidents", invoke_without_command=True)
@click.option("--asset", "asset", default=None, help="Asset key, slash-separated (e.g. store_sales_line); default: every asset.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of the table.")
@home_option
@click.pass_context
def incidents_cmd(ctx: click.Context, asset: str | None, as_json: bool, dagster_home: str | None) -> None:
    """List incidents, newest first: date, source, state, gap, cause, change set, decision and receipt.

    ``close``, ``reopen`` and ``rediagnose`` change one (a person, with a reason, recorded).
    """
    import dagster as dg

    if ctx.invoked_subcommand is not None:
        return

    from dw_dagster.diagnosis.history import incident_history

    if asset is not None and not asset.strip("/ "):
        raise click.BadParameter("must name an asset key, e.g. store_sales_line", param_hint="--asset")
    with _instance(dagster_home) as instance:
        key = dg.AssetKey(asset.strip("/").split("/")) if asset else None
        if key is not None and key not in set(instance.get_asset_keys()):
            raise click.BadParameter(f"no asset {asset!r} in this instance", param_hint="--asset")
        entries = incident_history(instance, key)
    if as_json:
        click.echo(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    if not entries:
        click.echo("no incidents")
        return
    for e in entries:
        receipt = (f"receipt {e.receipt_id} {'verified' if e.verified else 'NOT verified'}" if e.receipt_id else "no receipt")
        click.echo(f"{e.detected_at.isoformat()[:16]}Z  {e.incident_id}  {'/'.join(e.asset_key)}  {e.source}  "
                   f"{abs(e.gap_rows):,} rows {'short' if e.gap_rows >= 0 else 'over'} ({abs(e.gap_pct):.2f} %)  {e.status}"
                   + (f" [{e.state}]" if e.state else "") + (f" (linked to {e.linked_to})" if e.linked_to else "") + "\n"
                   f"    cause: {e.cause_kind or '(not diagnosed)'}"
                   + (f" ({e.confidence:.0%}, explains {e.explained_rows:,}, unexplained {e.unexplained_rows:,})"
                      if e.confidence is not None else "")
                   + f"\n    change set: {e.change_set_id or 'none'}"
                   + (f" ({e.decision}{' by ' + e.approver if e.approver else ''})" if e.decision else "")
                   + (f" window {e.window[0]}..{e.window[-1]}" if e.window else "") + f"; {receipt}"
                   + "".join(f"\n    not run: {n.words()}" for n in e.not_run))


@main.command("volume-history")
@click.argument("table", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the lines.")
@click.option("--limit", default=200, show_default=True, type=click.IntRange(1, 100_000), help="Tables at most.")
@home_option
def volume_history_cmd(table: str | None, as_json: bool, limit: int, dagster_home: str | None) -> None:
    """The row counts the volume sensors recorded per table (their history store), newest last.

    TABLE: part of a spec id (``warehouse:pos.sales_line``), case-insensitive; default: every table.
    Each table is listed once per volume sensor that watches it. ``--json``: a list of objects
    (sensor, table, counts, recorded_at, last_status, observed_at, unobserved_counts).
    """
    import datetime as dt

    from dw_dagster.detection.volume.store import store_for

    with _instance(dagster_home) as instance:
        found = store_for(instance).search(table, limit=limit)
    if as_json:
        click.echo(json.dumps([{"sensor": sensor, "table": sid,
                                "counts": [{"partition": p, "rows": r} for p, r in h.entries],
                                "recorded_at": h.recorded_at, "last_status": h.last_status,
                                "observed_at": h.observed_at, "unobserved_counts": h.unobserved}
                               for sensor, sid, h in found], indent=2))
        return
    if not found:
        click.echo("no recorded counts" + (f" for a table matching {table!r}" if table else ""))
        return
    for sensor, sid, h in found:
        when = dt.datetime.fromtimestamp(h.recorded_at, dt.timezone.utc).isoformat()[:16] + "Z" if h.recorded_at else "?"
        counts = ", ".join(f"{p}: {r:,}" if p else f"{r:,}" for p, r in h.entries[-10:])
        more = f"{len(h.entries) - 10} earlier, " if len(h.entries) > 10 else ""
        click.echo(f"{sid}  {h.last_status or '?'}  last recorded {when}  (sensor {sensor})\n    {more}{counts}")


from dw_dagster.cli.access import register as register_access  # noqa: E402
from dw_dagster.cli.decisions import register, register_incident_commands  # noqa: E402
from dw_dagster.cli.review import register as register_review  # noqa: E402
from dw_dagster.mcp.command import mcp_command  # noqa: E402
from dw_dagster.cli.cost import cost_command  # noqa: E402
from dw_dagster.cli.migration import migration_group  # noqa: E402

register(main)
register_incident_commands(incidents_cmd)
register_review(main)
register_access(main)
main.add_command(mcp_command)
main.add_command(cost_command)
main.add_command(migration_group)


#: The entry-point group whose commands ``dw-dagster`` adds (name: the command; value: a click command).
PLUGIN_GROUP = "dw_dagster.cli"
#: The commands the examples distribution brings, and how to get them when it is not installed.
EXAMPLE_COMMANDS = ("demo", "fake-lightup", "fake-oidc", "fake-paging")
EXAMPLES_HINT = ("the demos and the fake servers come with the examples: pip install dw-dagster-examples "
                 "(in a checkout of the repository: make install, or pip install -e examples)")


def _missing(name: str) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                           "help_option_names": []}, add_help_option=False)
    def missing() -> None:
        raise click.UsageError(f"dw-dagster {name}: {EXAMPLES_HINT}")

    missing.help = f"(not installed) {EXAMPLES_HINT}"
    missing.short_help = "(needs dw-dagster-examples)"
    return missing


def _add_plugins(group: click.Group) -> None:
    """Add the commands of the :data:`PLUGIN_GROUP` entry points; a placeholder naming the examples
    distribution for each of :data:`EXAMPLE_COMMANDS` none provides. A plugin that fails to load is
    shown as that failure when its command is run, not as a broken ``dw-dagster``."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        if ep.name in group.commands:
            continue
        try:
            command = ep.load()
        except Exception as e:  # noqa: BLE001 - reported when the command runs
            from dw_dagster.core.explain import explain

            error = f"{ep.value} cannot be loaded: {explain(e)}"

            @click.command(ep.name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
            def command(error: str = error) -> None:
                raise click.ClickException(error)
        group.add_command(command, ep.name)
    for name in EXAMPLE_COMMANDS:
        if name not in group.commands:
            group.add_command(_missing(name), name)


_add_plugins(main)

if __name__ == "__main__":
    main()
