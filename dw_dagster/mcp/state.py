"""What every MCP tool shares: the Dagster instance, the workspace, the domains, and the errors.

A tool never answers with a stack trace. Every mistake a caller or a deployment can make is a
:class:`ToolError` (the MCP SDK returns it as a tool result with ``isError: true``) whose message
says what to do: an unknown asset (with the closest names), an unknown incident or change set
(with the known ones), no Dagster instance at the path, an instance with no dw_dagster records, no
workspace, no dbt manifest.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
from mcp.server.mcpserver.exceptions import ToolError

from dw_dagster.core.ledger import Ledger, LedgerError, ledger_for

log = logging.getLogger("dw_dagster.mcp")

MAX_KEY_CHARS = 1000


@dataclass
class ServerSettings:
    """How ``dw-dagster mcp`` finds what it answers from.

    Attributes:
        dagster_home: the Dagster instance directory (default ``$DAGSTER_HOME``).
        workspace: the workspace file whose code locations give the asset graph and the dbt
            manifests (``-w``; None: ``./workspace.yaml`` when it exists; ``""``: none).
        manifests: more dbt ``manifest.json`` files for the lineage tools (``--manifest``).
        domains: the domains file (owners, approvers, autonomy; default ``$DW_DOMAINS_FILE``).
        locations: only these code locations of the workspace (default all).
        check_timeout_s: the longest ``run_quality_check`` waits for its run (seconds).
    """

    dagster_home: str | None = None
    workspace: str | None = None
    manifests: list[str] = field(default_factory=list)
    domains: str | None = None
    locations: list[str] | None = None
    check_timeout_s: float = 600.0


def fail(message: str) -> ToolError:
    """A tool error with ``message`` (raise it): one sentence of what went wrong and what to do."""
    return ToolError(message)


def shown(text: str, limit: int = 120) -> str:
    """A caller's text, quoted and cut to ``limit`` characters, safe to put in a message."""
    text = str(text)
    return repr(text if len(text) <= limit else text[:limit] + "…")


def closest(text: str, candidates: list[str], n: int = 5) -> list[str]:
    """Up to ``n`` candidates closest to ``text``: those containing it first, then by similarity."""
    low = text.lower()
    contains = [x for x in candidates if low and low in x.lower()]
    similar = difflib.get_close_matches(text, candidates, n=n, cutoff=0.3)
    return list(dict.fromkeys(contains + similar))[:n]


def parse_asset_key(text: str | list[str]) -> dg.AssetKey:
    """An asset key from the caller's text: ``a/b`` (slash-separated, as the CLI takes it), a JSON
    list ``["a", "b"]`` in a string, or a list of the parts.

    Raises:
        ToolError: empty, too long, or a JSON list of something else than strings.
    """
    if isinstance(text, list):
        if not text or not all(isinstance(p, str) and p.strip() for p in text):
            raise fail("an asset key given as a list needs non-empty names, e.g. [\"pos_source\", \"sales_line\"]")
        return dg.AssetKey(list(text))
    if not isinstance(text, str) or not text.strip("/ \t\n"):
        raise fail("name an asset key, slash-separated (e.g. store_sales_line or pos_source/sales_line)")
    if len(text) > MAX_KEY_CHARS:
        raise fail(f"an asset key of {len(text)} characters is longer than any this server knows "
                   f"(at most {MAX_KEY_CHARS}); give the key, slash-separated")
    s = text.strip()
    if s.startswith("["):
        try:
            parts = json.loads(s)
        except ValueError:
            parts = None
        if not isinstance(parts, list) or not parts or not all(isinstance(p, str) and p for p in parts):
            raise fail(f"{shown(text)} is neither a slash-separated asset key nor a JSON list of strings")
        return dg.AssetKey(parts)
    return dg.AssetKey([p for p in s.strip("/").split("/") if p])


class CallSnapshot:
    """The instance as one tool call reads it: each asset's event records are fetched once per call.

    The records helpers a tool combines (:mod:`dw_dagster.core.records`, :func:`incident_history`,
    :func:`verify_receipts`, notifications) each page through the same asset's observations; within
    one call they get the same records from one query (newest-first and oldest-first served from one
    complete read). Every call starts from nothing, so each answer reads the instance as it is at
    that call. Anything else (the ledger, check history, runs) goes to the instance itself.
    """

    #: a first read of an asset's observations asks for up to this many (the records helpers' page size)
    PREFETCH = 500

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self._instance = instance
        self._complete: dict[tuple[str, dg.AssetKey, bool], list] = {}
        self._keys: list | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._instance, name)

    def get_asset_keys(self, *args: Any, **kwargs: Any):
        if args or kwargs:
            return self._instance.get_asset_keys(*args, **kwargs)
        if self._keys is None:
            self._keys = list(self._instance.get_asset_keys())
        return self._keys

    def _fetch(self, kind: str, records_filter: Any, limit: int, cursor: str | None = None, ascending: bool = False):
        from dagster import EventRecordsResult
        from dw_dagster.dagster_private import EventLogCursor

        fetch = getattr(self._instance, f"fetch_{kind}")
        key = records_filter if isinstance(records_filter, dg.AssetKey) else None
        if isinstance(records_filter, dg.AssetRecordsFilter) and records_filter == dg.AssetRecordsFilter(
                asset_key=records_filter.asset_key):
            key = records_filter.asset_key
        if key is None or cursor is not None:
            return fetch(records_filter, limit=limit, cursor=cursor, ascending=ascending)

        def page(rows: list, more: bool) -> EventRecordsResult:  # a first page as the storage gives it
            shown = rows[:limit]
            return EventRecordsResult(records=shown, has_more=more or len(rows) > limit,
                                      cursor=EventLogCursor.from_storage_id(shown[-1].storage_id if shown else -1).to_string())

        for order in (ascending, not ascending):
            found = self._complete.get((kind, key, order))
            if found is not None:
                return page(found if order == ascending else found[::-1], False)
        ask = max(limit, self.PREFETCH) if kind == "observations" else limit  # the dw/ records live on observations
        res = fetch(records_filter, limit=ask, cursor=None, ascending=ascending)
        if not res.has_more:  # the asset's whole history of this kind: later reads in this call share it
            self._complete[(kind, key, ascending)] = list(res.records)
        return page(list(res.records), res.has_more)

    def fetch_observations(self, records_filter: Any, limit: int, cursor: str | None = None, ascending: bool = False):
        return self._fetch("observations", records_filter, limit, cursor, ascending)

    def fetch_materializations(self, records_filter: Any, limit: int, cursor: str | None = None, ascending: bool = False):
        return self._fetch("materializations", records_filter, limit, cursor, ascending)


class Answers:
    """A small thread-safe LRU of answers, each keyed by everything it was computed from (so a hit is never stale)."""

    def __init__(self, size: int = 512) -> None:
        from collections import OrderedDict

        self._items: OrderedDict = OrderedDict()
        self._lock, self._size = threading.Lock(), size

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class DwState:
    """The instance, workspace and domains one server answers from; opened lazily, then kept.

    Thread-safe: the SDK runs each tool call in a worker thread.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._lock = threading.RLock()  # the workspace and manifests (a load takes seconds)
        self._instance_lock = threading.Lock()  # the instance: never waits for a workspace load
        self._local = threading.local()
        self._has_records = False
        self._instance: dg.DagsterInstance | None = None
        self._workspace = None
        self._workspace_error: str | None = None
        self._manifests: list[tuple[str, Any]] | None = None
        from dw_dagster.cost.timings import RunTimingsCache

        self.run_timings = RunTimingsCache()  # finished runs' step and dbt node seconds, read once (explain_table's cost)
        self.answers = Answers()  # answers keyed by what they were computed from (e.g. the asset's latest event ids)
        home = settings.dagster_home or os.environ.get("DAGSTER_HOME")
        self.home = str(Path(home).resolve()) if home else None
        ws = settings.workspace
        if ws is None and Path("workspace.yaml").is_file():
            ws = "workspace.yaml"  # as `dagster dev` does; "" means none
        self.workspace_path = str(Path(ws).resolve()) if ws else None
        domains = settings.domains or os.environ.get("DW_DOMAINS_FILE")
        self.domains_path = str(Path(domains).resolve()) if domains else None

    # -- the instance ----------------------------------------------------------------------------

    def instance(self) -> dg.DagsterInstance:
        """The Dagster instance (opened once).

        Raises:
            ToolError: no instance directory is configured, or the path holds no Dagster instance,
                or the instance cannot be opened.
        """
        with self._instance_lock:
            if self._instance is not None:
                return self._instance
            if not self.home:
                raise fail("no Dagster instance: start the server with --dagster-home DIR or set DAGSTER_HOME to the "
                           "instance dw_dagster records in (the demo's is .dw_demo/dagster_home)")
            home = Path(self.home)
            if not home.is_dir() or not any((home / p).exists() for p in ("dagster.yaml", "history", "storage")):
                raise fail(f"no Dagster instance at {home} (no dagster.yaml, history/ or storage/): point --dagster-home "
                           "or DAGSTER_HOME at the instance dw_dagster records in (the demo's is .dw_demo/dagster_home)")
            try:
                self._instance = dg.DagsterInstance.from_config(str(home))
            except Exception as e:  # a broken dagster.yaml or storage: its cause chain, not a traceback
                from dw_dagster.core.explain import explain

                raise fail(f"cannot open the Dagster instance at {home}: {explain(e)}; fix its "
                           "dagster.yaml or point DAGSTER_HOME elsewhere") from e
            return self._instance

    def call_scope(self):
        """A context for one tool call: :meth:`view` reads through one :class:`CallSnapshot` inside it."""
        import contextlib

        @contextlib.contextmanager
        def scope():
            stack = self._local.__dict__.setdefault("snapshots", [])
            stack.append(None)
            try:
                yield
            finally:
                stack.pop()

        return scope()

    def view(self):
        """The instance for reading records in this tool call (a :class:`CallSnapshot`; the instance
        itself outside a call). Runs are launched on :meth:`instance`, never on a view.

        Raises:
            ToolError: as :meth:`instance`.
        """
        inst = self.instance()
        stack = self._local.__dict__.get("snapshots")
        if not stack:
            return inst
        if stack[-1] is None:
            stack[-1] = CallSnapshot(inst)
        return stack[-1]

    def ledger(self) -> Ledger:
        """The instance's ledger (:func:`dw_dagster.core.ledger.ledger_for`).

        Raises:
            ToolError: the instance's storage cannot hold a ledger.
        """
        try:
            return ledger_for(self.instance())
        except LedgerError as e:
            raise fail(f"cannot read dw_dagster's ledger in {self.home}: {e}") from e

    def require_records(self) -> Ledger:
        """The ledger, refusing an instance that holds no dw_dagster records at all.

        Raises:
            ToolError: no incident, change set or receipt was ever recorded in this instance.
        """
        led = self.ledger()
        if self._has_records:  # records are never removed from a ledger: once seen, always there
            return led
        if not led.incidents(limit=1) and not led.change_set_rows(latest_only=False, limit=1) and not led.receipt_heads():
            raise fail(f"the Dagster instance at {self.home} holds no dw_dagster records (no incident, change set or "
                       "receipt): is DAGSTER_HOME the instance the loop writes to? `make demo` fills one in "
                       ".dw_demo/dagster_home")
        self._has_records = True
        return led

    # -- the workspace ---------------------------------------------------------------------------

    def workspace(self):
        """The loaded workspace (:func:`dw_dagster.mcp.workspace.load_workspace`), loaded once.

        Raises:
            ToolError: no workspace file is configured, or it cannot be read, or no location loaded.
        """
        from dw_dagster.mcp.workspace import WorkspaceError, load_workspace

        with self._lock:
            if self._workspace is None and self._workspace_error is None:
                if not self.workspace_path:
                    self._workspace_error = ("no workspace: start the server with -w workspace.yaml (the file "
                                             "`dagster dev -w` reads) to answer from the asset graph and dbt manifest")
                else:
                    try:
                        self._workspace = load_workspace(self.workspace_path, self.settings.locations)
                    except WorkspaceError as e:
                        self._workspace_error = f"{e}; start the server with -w pointing at a workspace file"
                    else:
                        for err in self._workspace.errors():
                            log.warning(f"dw-dagster mcp: code {err}")
            if self._workspace_error:
                raise fail(self._workspace_error)
            if not self._workspace.loaded():
                raise fail(f"no code location of {self.workspace_path} loaded: "
                           + "; ".join(self._workspace.errors()) + "; fix them and restart the server")
            return self._workspace

    def workspace_if_loaded(self):
        """The workspace when it is loaded already, else None (never waits for a load)."""
        return self._workspace

    def preload(self) -> None:
        """Load the workspace now (in a background thread at start-up); errors surface at the first tool call."""
        try:
            if self.workspace_path:
                self.workspace()
        except ToolError:
            pass
        except Exception:  # noqa: BLE001 - a start-up convenience must never kill the server
            log.exception("dw-dagster mcp: preloading the workspace failed")

    def manifests(self) -> list[tuple[str, Any]]:
        """``(where, manifest dict)`` for every dbt manifest: the workspace's ``@dbt_assets``, then ``--manifest`` files.

        Raises:
            ToolError: there is none (no workspace location with ``@dbt_assets`` and no ``--manifest``),
                or a ``--manifest`` file cannot be read.
        """
        from dw_dagster.lineage import load_manifest

        with self._lock:
            if self._manifests is None:
                found: list[tuple[str, Any]] = []
                if self.workspace_path:
                    for loc in self.workspace().loaded():
                        found += [(f"location {loc.name}", m) for m in loc.manifests()]
                for p in self.settings.manifests:
                    try:
                        found.append((str(p), load_manifest(p)))
                    except (OSError, ValueError) as e:
                        raise fail(f"cannot read the dbt manifest {p}: {e}; give --manifest a dbt target/manifest.json") from e
                self._manifests = found
        if not self._manifests:
            raise fail("no dbt manifest: no code location of the workspace has @dbt_assets and no --manifest was given; "
                       "start the server with -w workspace.yaml (a location with dbt) or --manifest target/manifest.json")
        return self._manifests

    # -- domains and keys ------------------------------------------------------------------------

    def domains(self):
        """The domains file as it is now (:func:`dw_dagster.core.domains.load_domains`), or None when none is configured.

        Raises:
            ToolError: the file is configured but malformed.
        """
        from dw_dagster.core.domains import DomainsFileError, load_domains

        if not self.domains_path:
            return None
        try:
            return load_domains(self.domains_path)
        except DomainsFileError as e:
            raise fail(f"the domains file {self.domains_path} is malformed: {e}") from e

    def signing_key_set(self) -> bool:
        """Whether the deployment's signing key is available (receipts and decisions can be verified)."""
        from dw_dagster.core.signing import ApprovalRefused, signing_key

        try:
            signing_key()
            return True
        except ApprovalRefused:
            return False

    def known_asset_keys(self, *, with_workspace: bool) -> list[dg.AssetKey]:
        """Asset keys this server can name: the instance's, the ledger's incidents' and, when
        ``with_workspace`` (or already loaded), the workspace's."""
        keys = dict.fromkeys(self.view().get_asset_keys())
        for r in self.ledger().incidents():
            keys.setdefault(dg.AssetKey(r.asset_key.split("/")), None)
        ws = self.workspace() if with_workspace else self.workspace_if_loaded()
        if ws is not None:
            for k in ws.asset_keys():
                keys.setdefault(k, None)
        return list(keys)

    def asset(self, text: str, *, with_workspace: bool = False) -> dg.AssetKey:
        """The asset key the caller named, known to the instance or the workspace.

        Raises:
            ToolError: unparseable, or unknown (the message lists the closest known keys).
        """
        key = parse_asset_key(text)
        ws = self.workspace_if_loaded()
        if (ws is not None and ws.locations_of(key)) or self.instance().has_asset_key(key):
            return key
        known = self.known_asset_keys(with_workspace=with_workspace)
        if key in known:
            return key
        names = sorted(k.to_user_string() for k in known)
        near = closest(key.to_user_string(), names)
        raise fail(f"no asset {shown(text)} in the instance at {self.home}"
                   + (" or the workspace" if with_workspace or self.workspace_if_loaded() else "")
                   + (f"; the closest are {', '.join(near)}" if near else f"; known assets: {', '.join(names[:10]) or 'none'}")
                   + " (asset keys are slash-separated, e.g. pos_source/sales_line)")

    def incident_row(self, incident_id: str):
        """The ledger row of an incident.

        Raises:
            ToolError: no records at all, or no such incident (the message lists the closest ids).
        """
        led = self.require_records()
        iid = (incident_id or "").strip()
        row = led.incident(iid) if iid and len(iid) <= 200 else None
        if row is None:
            ids = [r.incident_id for r in led.incidents(limit=500)]
            near = closest(iid, ids) or ids[:5]
            raise fail(f"no incident {shown(incident_id)} in the instance at {self.home}"
                       + (f"; known incidents include {', '.join(near)}" if near else "")
                       + " (list_incidents lists them)")
        return row


def asset_of(row_asset: str) -> dg.AssetKey:
    """The ``AssetKey`` of a ledger asset string (``a/b``)."""
    return dg.AssetKey(row_asset.split("/"))


__all__ = ["DwState", "ServerSettings", "ToolError", "asset_of", "closest", "fail", "parse_asset_key", "shown"]
