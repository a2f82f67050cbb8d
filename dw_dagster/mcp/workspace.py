"""The code locations of a Dagster workspace file, loaded in this process for the MCP tools.

``dagster definitions validate -w workspace.yaml`` and ``dagster dev`` read the same file: its
``load_from`` entries are parsed by Dagster's own workspace loader
(``dagster._core.workspace.load.location_origins_from_yaml_paths``), and each entry's target is
imported the way Dagster's code pointers import it (``python_module``, ``python_package``,
``python_file``, with ``attribute`` and ``working_directory``). The tools need the objects
themselves: the asset graph (keys, owners, partitions, checks), the dbt manifests carried by
``@dbt_assets`` (``dagster_dbt/manifest`` metadata), the lineage graph
(:func:`dw_dagster.lineage.lineage_graph`) and, for ``run_quality_check`` and ``remediate``, the jobs
to execute. A module imported before in this process is reloaded, so a location reflects the
environment now (as a restarted code server would). A location that fails to load is kept with its
error: the others still answer.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from dw_dagster.errors import DwDagsterError
from dw_dagster.lineage import lineage_graph
from dw_dagster.lineage.graph import DBT_MANIFEST_KEY, _manifest_of


class WorkspaceError(DwDagsterError, RuntimeError):
    """The workspace file cannot be read; the message says which file and why."""


@dataclass
class Location:
    """One code location of the workspace.

    Attributes:
        name: the ``location_name`` (or the module's name when the file gives none).
        target: what the entry names, e.g. ``module dw_dagster_examples.store_sales.definitions:defs``.
        defs: the loaded ``dagster.Definitions``; None when loading failed.
        error: one line saying why it failed to load (None when it loaded).
        seconds: how long loading took.
    """

    name: str
    target: str
    defs: dg.Definitions | None = None
    error: str | None = None
    seconds: float = 0.0
    _graph: Any = field(default=None, repr=False)
    _lineage: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def asset_graph(self):
        """The location's resolved asset graph (``AssetGraph``), cached; None when it did not load."""
        if self.defs is None:
            return None
        with self._lock:
            if self._graph is None:
                self._graph = self.defs.resolve_asset_graph()
            return self._graph

    def lineage(self):
        """The location's Dagster + dbt lineage graph (:func:`dw_dagster.lineage.lineage_graph`), cached."""
        graph = self.asset_graph
        if graph is None:
            return None
        with self._lock:
            if self._lineage is None:
                self._lineage = lineage_graph(graph)
            return self._lineage

    def manifests(self) -> list[Mapping[str, Any]]:
        """The dbt manifests of the location's ``@dbt_assets`` (each once), in asset order."""
        graph = self.asset_graph
        if graph is None:
            return []
        found, seen = [], set()
        for node in graph.asset_nodes:
            meta = node.metadata or {}
            if DBT_MANIFEST_KEY in meta:
                m = _manifest_of(meta[DBT_MANIFEST_KEY])
                if m is not None and id(m) not in seen:
                    seen.add(id(m))
                    found.append(m)
        return found


@dataclass
class Workspace:
    """The loaded locations of one workspace file (see the module docstring)."""

    path: Path
    locations: list[Location]

    def loaded(self) -> list[Location]:
        """The locations that loaded."""
        return [loc for loc in self.locations if loc.defs is not None]

    def errors(self) -> list[str]:
        """``"location NAME: error"`` for each location that failed to load."""
        return [f"location {loc.name}: {loc.error}" for loc in self.locations if loc.error]

    def asset_keys(self) -> list[dg.AssetKey]:
        """Every asset key of every loaded location (each once)."""
        keys: dict[dg.AssetKey, None] = {}
        for loc in self.loaded():
            for k in loc.asset_graph.get_all_asset_keys():
                keys[k] = None
        return list(keys)

    def locations_of(self, key: dg.AssetKey) -> list[Location]:
        """The loaded locations that define ``key`` (materializable or not), in file order."""
        return [loc for loc in self.loaded() if loc.asset_graph.has(key)]


def _target_of(origin: Any) -> tuple[str, Any]:
    """``(description, loader)`` for a location origin from Dagster's workspace parser."""
    from dw_dagster.dagster_private import CodePointer

    lto = getattr(origin, "loadable_target_origin", None)
    if lto is None:
        raise WorkspaceError(f"location {origin.location_name} is a gRPC server ({type(origin).__name__}); "
                             "dw-dagster mcp loads python_module, python_package and python_file locations only")
    wd = lto.working_directory
    if lto.module_name or lto.package_name:
        name = lto.module_name or lto.package_name
        if wd and wd not in sys.path:
            sys.path.insert(0, wd)
        if name in sys.modules:  # the environment may have changed since: a restarted code server reads it anew
            importlib.reload(sys.modules[name])
        if lto.attribute:
            pointer = CodePointer.from_module(name, lto.attribute, wd)
            return f"module {name}:{lto.attribute}", pointer.load_target
        return f"module {name}", lambda: _single_definitions(importlib.import_module(name), name)
    if lto.python_file:
        if lto.attribute:
            pointer = CodePointer.from_python_file(lto.python_file, lto.attribute, wd)
            return f"file {lto.python_file}:{lto.attribute}", pointer.load_target
        from dw_dagster.dagster_private import load_python_file

        return f"file {lto.python_file}", lambda: _single_definitions(load_python_file(lto.python_file, wd), lto.python_file)
    raise WorkspaceError(f"location {origin.location_name}: no module, package or file to load")


def _single_definitions(module: Any, name: str) -> dg.Definitions:
    found = [v for v in vars(module).values() if isinstance(v, dg.Definitions)]
    if len(found) != 1:
        raise WorkspaceError(f"{name} holds {len(found)} dagster.Definitions objects; name one with `attribute:`")
    return found[0]


def _first_line(e: BaseException) -> str:
    """The error with its whole cause chain and the fix when known (:func:`dw_dagster.core.explain.explain`)."""
    from dw_dagster.core.explain import explain

    return explain(e)


def load_workspace(path: str | Path, only: Iterable[str] | None = None) -> Workspace:
    """Load every code location a workspace file names.

    Args:
        path: the workspace YAML (``load_from:`` entries), as ``dagster dev -w`` reads it.
        only: location names to load (default: all).

    Returns:
        A :class:`Workspace`; a location that failed keeps its one-line error in ``error``.

    Raises:
        WorkspaceError: the file is missing or Dagster's parser refuses it.
    """
    from dw_dagster.dagster_private import location_origins_from_yaml_paths

    p = Path(path).resolve()
    if not p.is_file():
        raise WorkspaceError(f"no workspace file at {p}")
    try:
        origins = location_origins_from_yaml_paths([str(p)])
    except Exception as e:  # Dagster's own parser: a bad file is one line for the user
        raise WorkspaceError(f"{p} is not a workspace file Dagster can read: {_first_line(e)}") from e
    wanted = set(only) if only is not None else None
    locations = []
    for origin in origins:
        if wanted is not None and origin.location_name not in wanted:
            continue
        t0 = time.monotonic()
        try:
            target, load = _target_of(origin)
        except Exception as e:  # noqa: BLE001 - an import error is this location's error, not the server's
            locations.append(Location(origin.location_name, "?", error=_first_line(e)))
            continue
        loc = Location(origin.location_name, target)
        try:
            defs = load()
            if callable(defs) and not isinstance(defs, dg.Definitions):
                defs = defs()
            if not isinstance(defs, dg.Definitions):
                raise WorkspaceError(f"{target} is a {type(defs).__name__}, not a dagster.Definitions")
            loc.defs = defs
            loc.asset_graph  # noqa: B018 - resolve now, so a broken graph is this location's load error
        except Exception as e:  # noqa: BLE001 - as dagster dev does: the location shows its error, others load
            loc.defs, loc.error = None, _first_line(e)
        loc.seconds = round(time.monotonic() - t0, 2)
        locations.append(loc)
    return Workspace(p, locations)


__all__ = ["Location", "Workspace", "WorkspaceError", "load_workspace"]
