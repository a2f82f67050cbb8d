"""``dw-dagster``: the command line for people and scripts.

Commands: ``demo store-sales``, ``demo orders``, ``approve``, ``approvals``, ``change-sets``, ``receipts``,
``incidents``, ``stop``/``resume``, ``holds``, ``undo``, ``blast-radius``, ``review`` (the deciding ones in
:mod:`dw_dagster.cli.decisions`; ``review`` in :mod:`dw_dagster.cli.review`).
Commands that read Dagster's records use the instance in ``$DAGSTER_HOME`` (or ``--dagster-home``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
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


#: ``dw-dagster demo NAME`` → the example's demo module, loaded by name when the command runs.
#: Each defines ``DEMO`` (a :class:`~dw_dagster.testing.demo.DemoSpec`): the command runs an example
#: through that entry point, as Dagster loads a code location by module name, and imports nothing
#: else of it (the examples are not part of the product's import graph).
DEMOS = {"store-sales": "dw_dagster.examples.store_sales.demo", "orders": "dw_dagster.examples.orders.demo",
         "cost": "dw_dagster.examples.store_sales.cost_demo",
         "access": "dw_dagster.examples.access.demo", "migration": "dw_dagster.examples.migration.demo"}


def demo_spec(name: str):
    """The :class:`~dw_dagster.testing.demo.DemoSpec` of the demo ``name`` (a key of :data:`DEMOS`).

    Raises:
        click.ClickException: the example's module cannot be loaded or defines no ``DEMO``.
    """
    import importlib

    from dw_dagster.testing.demo import DemoSpec

    try:
        spec = getattr(importlib.import_module(DEMOS[name]), "DEMO", None)
    except ImportError as e:
        from dw_dagster.core.explain import explain

        raise click.ClickException(f"the {name} demo cannot be loaded from {DEMOS[name]}: {explain(e)}") from e
    if not isinstance(spec, DemoSpec):
        raise click.ClickException(f"{DEMOS[name]} defines no DEMO (a dw_dagster.testing.demo.DemoSpec)")
    return spec


def _open_target(spec) -> str:
    """``-w workspace.yaml`` in a checkout of the repository (both locations), else ``-m`` the location's module."""
    workspace = Path(__file__).resolve().parents[2] / "workspace.yaml"
    if workspace.exists() and spec.location_module in workspace.read_text():
        return f"-w {workspace}"
    return f"-m {spec.location_module}"


def _scale_for(name: str):
    def check(ctx, param, value: float) -> float:
        spec = demo_spec(name)
        if not (spec.min_scale <= value <= spec.max_scale):  # also rejects nan
            raise click.BadParameter(f"must be between {spec.min_scale} and {spec.max_scale}, got {value}")
        return value

    return check


home_option = click.option("--dagster-home", type=click.Path(file_okay=False), default=None,
                           help="Dagster instance directory (default: $DAGSTER_HOME).")


@click.group()
@click.version_option(package_name="dw-dagster")
def main() -> None:
    """dw_dagster: find why a table is wrong, propose one change set, repair it through Dagster."""


@main.group()
def demo() -> None:
    """Run an example incident end to end."""


@demo.command("store-sales")
@click.option("--scale", type=float, default=0.01, show_default=True, callback=_scale_for("store-sales"),
              help="Data scale; 1.0 is the incident's full size (212,400 back-dated lines, 64M rows in all).")
@click.option("--workdir", type=click.Path(file_okay=False), default=".dw_demo", show_default=True,
              help="Where the demo keeps its data, working copy, log and (unless $DAGSTER_HOME is set) its Dagster instance.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the outcome (timeline goes to stderr).")
@click.option("--fail-verify", is_flag=True, help="A straggler store posts more lines while the repair runs: the verify "
              "finds the gap still open; the receipt says NOT verified, the page stays open (re-triggered with the "
              "failing check) and the escalation ladder asks the escalation approver.")
@click.option("--partitions", type=click.Choice(["daily", "hourly", "weekly"]), default="daily", show_default=True,
              help="How the load is partitioned: the same incident found, repaired and verified by the day, the hour "
              "or the week.")
@click.option("--undo", is_flag=True, help="After the verified receipt, undo the repair (approved by the owner): its "
              "receipt is verified against the snapshot, the incident is open again and the change set is re-proposed.")
def demo_store_sales(scale: float, workdir: str, as_json: bool, fail_verify: bool, partitions: str, undo: bool) -> None:
    """The grocery store-sales incident: a high-watermark skipped back-dated lines."""
    options = {**({"fail_verify": True} if fail_verify else {}), **({"undo": True} if undo else {})}
    if partitions != "daily":
        options["partitions"] = partitions
    _run_demo(demo_spec("store-sales"), workdir=workdir, as_json=as_json, scale=scale, options=options or None)


@demo.command("orders")
@click.option("--scale", type=float, default=0.1, show_default=True, callback=_scale_for("orders"),
              help="Data scale; 1.0 is the incident's full size (3,912 parked gift-card orders, about 1.5M orders).")
@click.option("--workdir", type=click.Path(file_okay=False), default=".dw_demo", show_default=True,
              help="Where the demo keeps its data, dbt project and (unless $DAGSTER_HOME is set) its Dagster instance.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the outcome (timeline goes to stderr).")
def demo_orders(scale: float, workdir: str, as_json: bool) -> None:
    """The orders-stream incident: a release wrote NULL into a REQUIRED column; the sink parked the rows."""
    _run_demo(demo_spec("orders"), workdir=workdir, as_json=as_json, scale=scale)


@demo.command("cost")
@click.option("--scale", type=float, default=0.0004, show_default=True, callback=_scale_for("cost"),
              help="Scale of the store-sales runs whose seconds the embedded part reports.")
@click.option("--workdir", type=click.Path(file_okay=False), default=".dw_demo", show_default=True,
              help="Where the demo keeps its data, logs and (unless $DAGSTER_HOME is set) its Dagster instance.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the outcome (timeline goes to stderr).")
def demo_cost(scale: float, workdir: str, as_json: bool) -> None:
    """What runs cost: one report per engine (embedded DuckDB, Snowflake on fakesnow with a seeded month) and a
    drafted warehouse change approved by its owner, applied and verified over the next week's metering."""
    _run_demo(demo_spec("cost"), workdir=workdir, as_json=as_json, scale=scale)


@demo.command("migration")
@click.option("--source", type=click.Choice(["duckdb", "postgres"]), default="duckdb", show_default=True,
              help="The on-premises source: an embedded DuckDB file, or the PostgreSQL server on loopback.")
@click.option("--source-url", default=None, help="With --source postgres: the database (default $DW_TEST_POSTGRES_URL, "
              "else postgresql+psycopg://postgres@127.0.0.1:5432/postgres); the demo makes and drops its schema pos.")
@click.option("--scale", type=float, default=0.01, show_default=True, callback=_scale_for("migration"),
              help="Sales lines per store-day (0.01: 12).")
@click.option("--workdir", type=click.Path(file_okay=False), default=".dw_demo", show_default=True,
              help="Where the demo keeps its data, working copy, log and (unless $DAGSTER_HOME is set) its Dagster instance.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON (waves, parity, repaired, reopened).")
def demo_migration(source: str, source_url: str | None, scale: float, workdir: str, as_json: bool) -> None:
    """A migration in two waves: parity per pair, a failing pair repaired, the owner's sign-off, a reopening."""
    _run_demo(demo_spec("migration"), workdir=workdir, as_json=as_json, scale=scale, options={"source": source,
              "source_url": source_url})


@demo.command("access")
@click.option("--database-url", default=None,
              help="The PostgreSQL server the demo makes its roles and tables on (default $DW_ACCESS_DEMO_URL, else "
                   "postgresql+psycopg://postgres@127.0.0.1:5432/postgres). It drops what it made afterwards.")
@click.option("--workdir", type=click.Path(file_okay=False), default=".dw_demo", show_default=True,
              help="Where the demo keeps its domains file, log and (unless $DAGSTER_HOME is set) its Dagster instance.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the outcome (timeline goes to stderr).")
def demo_access(database_url: str | None, workdir: str, as_json: bool) -> None:
    """An access request: dry-run, two owners approve, grant, reminder, revoke at expiry verified, receipt."""
    if database_url:
        os.environ["DW_ACCESS_DEMO_URL"] = database_url
    spec = demo_spec("access")
    _run_demo(spec, workdir=workdir, as_json=as_json, scale=spec.default_scale)


def _run_demo(spec, *, workdir: str, as_json: bool, scale: float, options: dict | None = None) -> None:
    """What every demo command does around the example's loop: claim the folders, make the signing
    key, keep the run logs in a file, print the timeline (stderr with --json), the outcome and how
    to open the same instance in the UI; exit 1 naming the stage that failed."""
    import dagster as dg

    from dw_dagster.testing.demo import MARKER, DemoDirError, DemoError, Timeline, claim_demo_dir

    name, home_folder, instance_folder, log_name = spec.name, spec.home_folder, spec.instance_folder, spec.log_name
    if not workdir.strip():
        raise click.BadParameter("must name a folder", param_hint="--workdir")
    work = Path(workdir).resolve()
    own_home = not os.environ.get("DAGSTER_HOME")
    dagster_home = Path(os.environ.get("DAGSTER_HOME") or work / instance_folder).resolve()
    # The key that signs approvals and receipts lives with the instance they are recorded in, so
    # runs that share a $DAGSTER_HOME share it (a new key would make the earlier receipts unverifiable).
    key_file = dagster_home / "approval_signing.key"
    if os.environ.get(c.SIGNING_KEY_ENV) is not None and len(os.environ[c.SIGNING_KEY_ENV]) < 16:
        raise click.UsageError(f"${c.SIGNING_KEY_ENV} is set but shorter than 16 characters; set a longer key or unset it "
                               f"(the demo then makes one in {key_file})")
    try:
        work.mkdir(parents=True, exist_ok=True)
        if (work / log_name).exists() and not any((d / MARKER).exists() for d in work.iterdir() if d.is_dir()):
            raise DemoDirError(f"{work / log_name} exists and {work} holds no folder an earlier demo made; "
                               "choose another --workdir")
        home = claim_demo_dir(work / home_folder)
        if own_home:
            # the demo's own instance starts empty each run, like its data; a $DAGSTER_HOME you set is kept
            claim_demo_dir(dagster_home)
        dagster_home.mkdir(parents=True, exist_ok=True)
        if not (dagster_home / "dagster.yaml").exists():  # the deployment the README's threat model asks for
            (dagster_home / "dagster.yaml").write_text(
                "telemetry:\n  enabled: false\nrun_coordinator:\n  module: dw_dagster.guard\n  class: GuardedRunCoordinator\n")
        if not os.environ.get(c.SIGNING_KEY_ENV):
            if not key_file.exists():
                key_file.write_text(secrets.token_hex(32))
                key_file.chmod(0o600)
            os.environ[c.SIGNING_KEY_ENV] = key_file.read_text().strip()
    except (OSError, DemoDirError) as e:
        raise click.UsageError(f"cannot use --workdir {work}: {e}") from e
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    out = sys.stderr if as_json else sys.stdout
    log = Timeline(out)
    log_file = work / log_name
    t0 = time.monotonic()
    result, error = spec.new_result(scale), None
    log("start", f"dw_dagster {name} demo, scale {scale}; Dagster instance {dagster_home}; run logs in {log_file}")
    with open(log_file, "w") as lf, contextlib.redirect_stdout(lf), contextlib.redirect_stderr(lf):
        try:
            with dg.DagsterInstance.get() as instance:
                # fills result stage by stage: a failure keeps what came before
                spec.run(home=home, instance=instance, scale=scale, log=log, result=result, **(options or {}))
        except DemoError as e:
            error = str(e)
        except Exception as e:  # report any stage's crash, with the log for details
            error = f"{type(e).__name__}: {e}"
    result.seconds = round(time.monotonic() - t0, 1)
    result.dagster_home = str(dagster_home)
    setattr(result, spec.home_attr, str(home))
    if error:
        log("FAILED", f"{error} (details in {log_file})")
    else:
        log("done", f"the whole loop took {result.seconds} s")
        key_hint = f"$(cat {key_file})" if key_file.exists() else f"${c.SIGNING_KEY_ENV}"
        print(
            "\nOpen the same instance in the Dagster UI:\n"
            f"  DAGSTER_HOME={dagster_home} {spec.home_env}={home} \\\n"
            f"  {c.SIGNING_KEY_ENV}={key_hint} \\\n"
            f"  {Path(sys.executable).parent / 'dagster'} dev {_open_target(spec)}\n"
            f"then look at Assets → {spec.asset} → Events ({spec.events}).\n"
            f"(A demo: the signing key sits next to the instance and reaches the webserver; the README's threat "
            f"model says where it belongs in a deployment.)\n"
            f"The command line on the same instance (receipts, change-sets, approve ...):\n"
            f"  export DAGSTER_HOME={dagster_home} DW_DOMAINS_FILE={home / 'domains.yaml'} "
            f"{c.SIGNING_KEY_ENV}={key_hint}\n"
            f"  {Path(sys.executable).parent / 'dw-dagster'} receipts verify\n"
            f"Deciding needs the identity provider the domains file names: `dw-dagster fake-oidc &` serves a "
            f"stand-in on its default port, then `dw-dagster approve CS --login` (or `dw-dagster approvals serve`).",
            file=out,
        )
    if as_json:
        data = json.loads(result.to_json())
        if error:
            data["error"] = error
        click.echo(json.dumps(data, indent=2))
    if error:
        sys.exit(1)


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
    from dw_dagster.core.signing import ApprovalRefused
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


@main.command("fake-lightup")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Loopback port (0 = any free one).")
@click.option("--credential-file", type=click.Path(dir_okay=False), default="lightup-api-credential.json", show_default=True,
              help="Where to write the credential file clients use (apiCredential v1 format).")
@click.option("--source-url", default=None, help="Database URL the POS source metrics collect from (duckdb:///path...).")
@click.option("--warehouse-url", default=None, help="Database URL the warehouse metrics collect from.")
@click.option("--access-ttl", type=float, default=300.0, show_default=True, help="Access-token lifetime, seconds.")
def fake_lightup_cmd(port: int, credential_file: str, source_url: str | None, warehouse_url: str | None, access_ttl: float) -> None:
    """Serve a fake Lightup REST API on 127.0.0.1, seeded with the store-sales workspace.

    Prints one JSON line (url, workspace_uuid, credential_file) and serves until interrupted.
    Faults are switched with POST /_fake/faults (see dw_dagster.testing.fakes.lightup_server).
    """
    from dw_dagster.testing.fakes.lightup_server import serve

    if credential_file and not Path(credential_file).resolve().parent.is_dir():
        raise click.BadParameter(f"folder {Path(credential_file).resolve().parent} does not exist", param_hint="--credential-file")
    try:
        serve(port, credential_file, source_url, warehouse_url, access_ttl_s=access_ttl)
    except OSError as e:
        raise click.ClickException(f"cannot serve on 127.0.0.1:{port}: {e.strerror or e}") from e


@main.command("fake-paging")
@click.option("--port", type=click.IntRange(0, 65535), default=8766, show_default=True, help="Loopback port (0 = any free one).")
def fake_paging_cmd(port: int) -> None:
    """Serve fake PagerDuty (Events v2 + REST), Opsgenie and Slack Web APIs on 127.0.0.1."""
    from dw_dagster.testing.fakes.paging_server import main as serve

    try:
        code = serve(["--port", str(port)])
    except OSError as e:
        raise click.ClickException(f"cannot serve on 127.0.0.1:{port}: {e.strerror or e}") from e
    raise SystemExit(code)


@main.command("fake-oidc")
@click.option("--port", type=click.IntRange(0, 65535), default=8767, show_default=True, help="Loopback port (0 = any free one).")
@click.option("--user", "users", multiple=True, help="A person who may log in (email; repeatable). Default: the examples' people.")
@click.option("--client", "clients", multiple=True, help="A client id (repeatable; default dw-dagster).")
def fake_oidc_cmd(port: int, users: tuple[str, ...], clients: tuple[str, ...]) -> None:
    """Serve a stand-in OpenID Connect provider on 127.0.0.1: discovery, JWKS, login (PKCE), tokens.

    Its people log in without a password (a stand-in, for trying the examples under ``dagster dev``);
    the examples' domains files expect it at the default port (``$DW_OIDC_ISSUER`` otherwise).
    """
    from dw_dagster.testing.fakes.oidc_server import main as serve

    people = list(users) or ["dana.ortiz@grocer.example", "sam.lee@grocer.example", "maya.chen@shop.example",
                             "leo.park@shop.example"]
    args = ["--port", str(port)] + [a for u in people for a in ("--user", u)] + [
        a for cl in (clients or ("dw-dagster",)) for a in ("--client", cl)]
    try:
        code = serve(args)
    except OSError as e:
        raise click.ClickException(f"cannot serve on 127.0.0.1:{port}: {e.strerror or e}") from e
    raise SystemExit(code)


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

if __name__ == "__main__":
    main()
