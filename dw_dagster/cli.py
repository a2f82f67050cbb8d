"""``dw-dagster``: the command line for people and scripts.

Commands: ``demo store-sales``, ``approve``, ``change-sets``, ``receipts``, ``blast-radius``.
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

from dw_dagster import constants as c


def _instance(dagster_home: str | None):
    import dagster as dg

    if dagster_home:
        os.environ["DAGSTER_HOME"] = str(Path(dagster_home).resolve())
    if not os.environ.get("DAGSTER_HOME"):
        raise click.UsageError("set DAGSTER_HOME or pass --dagster-home (the instance holding dw_dagster's records)")
    return dg.DagsterInstance.get()


def _workspace_file() -> Path:
    from dw_dagster.examples.store_sales.home import PACKAGE_DIR

    return PACKAGE_DIR.parents[2] / "workspace.yaml"


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
@click.option("--scale", type=float, default=0.01, show_default=True,
              help="Data scale; 1.0 is the incident's full size (212,400 back-dated lines, 64M rows in all).")
@click.option("--workdir", type=click.Path(file_okay=False), default=".dw_demo", show_default=True,
              help="Where the demo keeps its data, working copy, log and (unless $DAGSTER_HOME is set) its Dagster instance.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the outcome (timeline goes to stderr).")
def demo_store_sales(scale: float, workdir: str, as_json: bool) -> None:
    """The grocery store-sales incident: a high-watermark skipped back-dated lines (DESIGN.md §3)."""
    import dagster as dg

    from dw_dagster.examples.store_sales.demo import DemoError, DemoResult, Timeline, run_store_sales_demo

    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    dagster_home = Path(os.environ.get("DAGSTER_HOME") or work / "dagster_home").resolve()
    dagster_home.mkdir(parents=True, exist_ok=True)
    if not (dagster_home / "dagster.yaml").exists():
        (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    key_file = work / "approval_signing.key"
    if not os.environ.get(c.SIGNING_KEY_ENV):
        if not key_file.exists():
            key_file.write_text(secrets.token_hex(32))
            key_file.chmod(0o600)
        os.environ[c.SIGNING_KEY_ENV] = key_file.read_text().strip()
    out = sys.stderr if as_json else sys.stdout
    log = Timeline(out)
    log_file = work / "demo.log"
    home = work / "store_sales"
    t0 = time.monotonic()
    result, error = DemoResult(scale=scale), None
    log("start", f"dw_dagster store-sales demo, scale {scale}; Dagster instance {dagster_home}; run logs in {log_file}")
    with open(log_file, "w") as lf, contextlib.redirect_stdout(lf), contextlib.redirect_stderr(lf):
        try:
            with dg.DagsterInstance.get() as instance:
                result = run_store_sales_demo(home=home, instance=instance, scale=scale, log=log)
        except DemoError as e:
            error = str(e)
        except Exception as e:  # report any stage's crash, with the log for details
            error = f"{type(e).__name__}: {e}"
    result.seconds = round(time.monotonic() - t0, 1)
    result.dagster_home = str(dagster_home)
    result.store_sales_home = str(home)
    if error:
        log("FAILED", f"{error} (details in {log_file})")
    else:
        log("done", f"the whole loop took {result.seconds} s")
        key_hint = f"$(cat {key_file})" if key_file.exists() else f"${c.SIGNING_KEY_ENV}"
        print(
            "\nOpen the same instance in the Dagster UI:\n"
            f"  DAGSTER_HOME={dagster_home} DW_STORE_SALES_HOME={home} \\\n"
            f"  {c.SIGNING_KEY_ENV}={key_hint} \\\n"
            f"  {Path(sys.executable).parent / 'dagster'} dev -w {_workspace_file()}\n"
            "then look at Assets → store_sales_line → Events (dw/change_set, dw/approval, dw/receipt).\n"
            f"Receipts from the command line: DAGSTER_HOME={dagster_home} dw-dagster receipts",
            file=out,
        )
    if as_json:
        data = json.loads(result.to_json())
        if error:
            data["error"] = error
        click.echo(json.dumps(data, indent=2))
    if error:
        sys.exit(1)


@main.command()
@click.argument("change_set_id")
@click.option("--approver", required=True, help="Your email, as listed in the domain's approvers.")
@click.option("--reject", is_flag=True, help="Reject instead of approve (ends the change set).")
@click.option("--comment", default="", help="Why.")
@home_option
def approve(change_set_id: str, approver: str, reject: bool, comment: str, dagster_home: str | None) -> None:
    """Approve (or --reject) a change set by running the approval job against the instance."""
    from dw_dagster.remediation.approval import approve_in_process

    with _instance(dagster_home) as instance:
        ok, msg = approve_in_process(instance, change_set_id, approver, "reject" if reject else "approve", comment)
    if not ok:
        click.echo(f"refused: {msg}", err=True)
        sys.exit(2)
    click.echo(msg)


@main.command("change-sets")
@click.option("--json", "as_json", is_flag=True)
@home_option
def change_sets_cmd(as_json: bool, dagster_home: str | None) -> None:
    """List change sets (newest first) with their decision."""
    from dw_dagster.remediation import records

    with _instance(dagster_home) as instance:
        seen, rows = set(), []
        for cs in records.change_sets(instance):
            if cs.id in seen:
                continue
            seen.add(cs.id)
            decided = records.approvals(instance, cs.id)
            rows.append({"id": cs.id, "version": cs.version, "asset": "/".join(cs.target_asset), "cause": cs.cause_kind,
                         "window": cs.window, "status": decided[0].decision + "d" if decided else "pending",
                         "approvers": cs.approvers, "expires_at": cs.expires_at.isoformat(), "summary": cs.summary})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['id']}  {r['status']:<9} {r['asset']}  {r['cause']}  window {','.join(r['window'])}\n    {r['summary']}")


@main.command()
@click.option("--asset", "asset", default=None, help="Asset key, slash-separated (e.g. store_sales_line).")
@click.option("--json", "as_json", is_flag=True)
@home_option
def receipts(asset: str | None, as_json: bool, dagster_home: str | None) -> None:
    """Print receipts (dw/receipt) from the Dagster instance, newest first."""
    import dagster as dg

    from dw_dagster.remediation import records
    from dw_dagster.remediation.receipts import receipt_markdown

    with _instance(dagster_home) as instance:
        found = records.receipts(instance, dg.AssetKey(asset.split("/")) if asset else None)
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in found], indent=2))
        return
    if not found:
        click.echo("no receipts")
        return
    for r in found:
        click.echo(f"== {'/'.join(r.asset_key)} ==\n{receipt_markdown(r)}\n")


@main.command("blast-radius")
@click.option("--manifest", type=click.Path(exists=True, dir_okay=False), required=True, help="dbt manifest.json")
@click.option("--select", "selector", required=True, help="A unique id or a model/source name.")
@click.option("--json", "as_json", is_flag=True)
def blast_radius_cmd(manifest: str, selector: str, as_json: bool) -> None:
    """Everything downstream of a dbt node, grouped by type, with depth."""
    from dw_dagster.lineage import blast_radius, load_manifest, manifest_graph, resolve_node
    from dw_dagster.lineage.dbt_manifest import UnknownNodeError

    g = manifest_graph(load_manifest(manifest))
    try:
        root = resolve_node(g, selector)
    except UnknownNodeError as e:
        raise click.BadParameter(str(e.args[0]), param_hint="--select") from e
    br = blast_radius(g, [root])
    if as_json:
        click.echo(json.dumps({
            "nodes": [root] + [n.unique_id for n in [*br.models, *br.other]],
            "exposures": [e.unique_id for e in br.exposures],
            "tests": [t.unique_id for t in br.tests],
            "owners": br.owners,
        }, indent=2))
        return
    click.echo(f"downstream of {root}:")
    for title, items in (("models", br.models), ("other", br.other), ("tests", br.tests)):
        if items:
            click.echo(f"  {title}:")
            for n in items:
                click.echo(f"    [{n.depth}] {n.unique_id}")
    if br.exposures:
        click.echo("  exposures:")
        for e in br.exposures:
            click.echo(f"    [{e.depth}] {e.unique_id}  {e.label or e.name} ({e.type}) owner {e.owner_name} <{e.owner_email}> {e.url or ''}")


if __name__ == "__main__":
    main()
