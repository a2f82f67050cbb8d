"""The ``dw-dagster`` commands the examples bring: ``demo NAME`` and the ``fake-*`` stand-in servers.

``dw-dagster`` (:mod:`dw_dagster.cli.main`) adds them from the ``dw_dagster.cli`` entry-point group
this distribution (``dw-dagster-examples``) registers; without it installed, ``dw-dagster demo``
says how to install it.
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


#: ``dw-dagster demo NAME`` → the example's demo module, loaded by name when the command runs.
#: Each defines ``DEMO`` (a :class:`~dw_dagster_dev.demo.DemoSpec`): the command runs an example
#: through that entry point, as Dagster loads a code location by module name, and imports nothing
#: else of it (the examples are not part of the product's import graph).
DEMOS = {"store-sales": "dw_dagster_examples.store_sales.demo", "orders": "dw_dagster_examples.orders.demo",
         "cost": "dw_dagster_examples.store_sales.cost_demo",
         "access": "dw_dagster_examples.access.demo", "migration": "dw_dagster_examples.migration.demo"}


def demo_spec(name: str):
    """The :class:`~dw_dagster_dev.demo.DemoSpec` of the demo ``name`` (a key of :data:`DEMOS`).

    Raises:
        click.ClickException: the example's module cannot be loaded or defines no ``DEMO``.
    """
    import importlib

    from dw_dagster_dev.demo import DemoSpec

    try:
        spec = getattr(importlib.import_module(DEMOS[name]), "DEMO", None)
    except ImportError as e:
        from dw_dagster.core.explain import explain

        raise click.ClickException(f"the {name} demo cannot be loaded from {DEMOS[name]}: {explain(e)}") from e
    if not isinstance(spec, DemoSpec):
        raise click.ClickException(f"{DEMOS[name]} defines no DEMO (a dw_dagster_dev.demo.DemoSpec)")
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


@click.group()
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

    from dw_dagster_dev.demo import MARKER, DemoDirError, DemoError, Timeline, claim_demo_dir

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
                "telemetry:\n  enabled: false\nrun_coordinator:\n  module: dw_dagster\n  class: GuardedRunCoordinator\n")
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


@click.command("fake-lightup")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Loopback port (0 = any free one).")
@click.option("--credential-file", type=click.Path(dir_okay=False), default="lightup-api-credential.json", show_default=True,
              help="Where to write the credential file clients use (apiCredential v1 format).")
@click.option("--source-url", default=None, help="Database URL the POS source metrics collect from (duckdb:///path...).")
@click.option("--warehouse-url", default=None, help="Database URL the warehouse metrics collect from.")
@click.option("--access-ttl", type=float, default=300.0, show_default=True, help="Access-token lifetime, seconds.")
def fake_lightup_cmd(port: int, credential_file: str, source_url: str | None, warehouse_url: str | None, access_ttl: float) -> None:
    """Serve a fake Lightup REST API on 127.0.0.1, seeded with the store-sales workspace.

    Prints one JSON line (url, workspace_uuid, credential_file) and serves until interrupted.
    Faults are switched with POST /_fake/faults (see dw_dagster_dev.fakes.lightup_server).
    """
    from dw_dagster_dev.fakes.lightup_server import serve

    if credential_file and not Path(credential_file).resolve().parent.is_dir():
        raise click.BadParameter(f"folder {Path(credential_file).resolve().parent} does not exist", param_hint="--credential-file")
    try:
        serve(port, credential_file, source_url, warehouse_url, access_ttl_s=access_ttl)
    except OSError as e:
        raise click.ClickException(f"cannot serve on 127.0.0.1:{port}: {e.strerror or e}") from e


@click.command("fake-paging")
@click.option("--port", type=click.IntRange(0, 65535), default=8766, show_default=True, help="Loopback port (0 = any free one).")
def fake_paging_cmd(port: int) -> None:
    """Serve fake PagerDuty (Events v2 + REST), Opsgenie and Slack Web APIs on 127.0.0.1."""
    from dw_dagster_dev.fakes.paging_server import main as serve

    try:
        code = serve(["--port", str(port)])
    except OSError as e:
        raise click.ClickException(f"cannot serve on 127.0.0.1:{port}: {e.strerror or e}") from e
    raise SystemExit(code)


@click.command("fake-oidc")
@click.option("--port", type=click.IntRange(0, 65535), default=8767, show_default=True, help="Loopback port (0 = any free one).")
@click.option("--user", "users", multiple=True, help="A person who may log in (email; repeatable). Default: the examples' people.")
@click.option("--client", "clients", multiple=True, help="A client id (repeatable; default dw-dagster).")
def fake_oidc_cmd(port: int, users: tuple[str, ...], clients: tuple[str, ...]) -> None:
    """Serve a stand-in OpenID Connect provider on 127.0.0.1: discovery, JWKS, login (PKCE), tokens.

    Its people log in without a password (a stand-in, for trying the examples under ``dagster dev``);
    the examples' domains files expect it at the default port (``$DW_OIDC_ISSUER`` otherwise).
    """
    from dw_dagster_dev.fakes.oidc_server import main as serve

    people = list(users) or ["dana.ortiz@grocer.example", "sam.lee@grocer.example", "maya.chen@shop.example",
                             "leo.park@shop.example"]
    args = ["--port", str(port)] + [a for u in people for a in ("--user", u)] + [
        a for cl in (clients or ("dw-dagster",)) for a in ("--client", cl)]
    try:
        code = serve(args)
    except OSError as e:
        raise click.ClickException(f"cannot serve on 127.0.0.1:{port}: {e.strerror or e}") from e
    raise SystemExit(code)


#: What the ``dw_dagster.cli`` entry points of this distribution name (``dw-dagster`` adds each).
COMMANDS = {"demo": demo, "fake-lightup": fake_lightup_cmd, "fake-paging": fake_paging_cmd, "fake-oidc": fake_oidc_cmd}
