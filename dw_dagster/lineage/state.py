"""dbt's ``state:modified`` selector on two manifests, with the reason each node is selected.

:func:`state_modified` returns the nodes ``dbt ls --select state:modified --state BASE`` selects
when HEAD is the project being listed, computed from the two ``manifest.json`` files alone, the
way dbt-core 1.11 decides (``dbt/graph/selector_methods.py`` ``StateSelectorMethod`` and the
``same_*`` methods of ``dbt/contracts/graph/nodes.py``):

- every enabled graph member of HEAD (models, seeds, snapshots, tests, analyses, sources,
  exposures, metrics, semantic models, saved queries, unit tests, functions) is looked up by
  unique id in BASE (``nodes``, then ``sources``, ``exposures``, ``metrics``,
  ``semantic_models``, ``unit_tests``, ``saved_queries``, ``functions``; BASE's ``disabled``
  section is not looked in, so a node enabled by the pull request is new);
- a node of ``nodes`` (and a function, a unit test) with no BASE entry is modified (``new``); a
  new source, exposure, metric, semantic model or saved query is *not*: their ``same_contents``
  answers "same" when there is no old node (dbt-core 1.11, ``SourceDefinition.same_contents``
  and the others);
- otherwise the node is modified when its contents differ (per resource type, below), when a
  macro it depends on — directly or through other macros — changed, was added or was removed
  (``macro_sql`` compared), or, for a model, when its contract changed (``ModelNode.same_contract``);
- removed nodes are never selected (they are not in HEAD), but are reported by :func:`removed_nodes`.

Contents, by resource type (``ParsedNode.same_contents`` and overrides):

- models, seeds, snapshots, analyses, singular tests, functions: ``raw_code`` (a seed's file
  ``checksum`` instead), config (``unrendered_config`` compared key by key, minus the keys the
  config class excludes from comparison: ``alias``, ``schema``, ``database``, ``tags``,
  ``group``; a test compares only its modifiers ``severity``, ``where``, ``limit``,
  ``fail_calc``, ``warn_if``, ``error_if``, ``store_failures``, ``store_failures_as``), persisted
  descriptions (only when ``persist_docs.relation``/``columns`` is on), ``fqn``, the configured
  ``database``/``schema``/``alias`` (unrendered), and for a model ``latest_version``, ``access``
  and ``deprecation_date``; for a function also ``arguments`` and ``returns``;
- generic tests: the test config modifiers and ``fqn`` only;
- sources: rendered ``database``, ``schema`` and ``identifier`` (the default of the project flag
  ``state_modified_compare_more_unrendered_values``: false), ``fqn``, ``unrendered_config`` (all
  keys, ``meta`` and ``tags`` included), ``quoting``, ``freshness`` + ``loaded_at_field``,
  ``external``;
- exposures: ``fqn``, ``type``, ``owner``, ``maturity``, ``url``, ``description``, ``label``, the
  set of ``depends_on.nodes``, ``unrendered_config``; metrics: ``type``, ``description``,
  ``label``, ``unrendered_config`` minus ``group`` (dbt 1.11 does not compare filters or type
  params); semantic models and saved queries: their fields and rendered ``config``; unit tests:
  their ``checksum``.

Everything here reads plain manifest dicts; nothing imports dbt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

from dw_dagster.lineage.dbt_manifest import index_graph

#: where dbt looks for the BASE node of a HEAD unique id, in order (``StateSelectorMethod.search``)
BASE_LOOKUP = ("nodes", "sources", "exposures", "metrics", "semantic_models", "unit_tests", "saved_queries", "functions")

#: ``unrendered_config`` keys a config class leaves out of ``same_config`` (``CompareBehavior.Exclude``
#: in dbt-core 1.11 ``NodeAndTestConfig``, ``MetricConfig``); sources and exposures exclude none
NODE_CONFIG_EXCLUDED = frozenset({"alias", "schema", "database", "tags", "group"})
METRIC_CONFIG_EXCLUDED = frozenset({"group"})
#: the only keys ``TestConfig.same_contents`` compares
TEST_CONFIG_MODIFIERS = ("severity", "where", "limit", "fail_calc", "warn_if", "error_if", "store_failures",
                         "store_failures_as")
#: resource types that are new (modified) when BASE has no node of that id
NEW_IS_MODIFIED = frozenset({"model", "seed", "snapshot", "analysis", "test", "operation", "sql_operation", "function",
                             "unit_test"})
#: materializations that enforce constraints (``ModelNode.materialization_enforces_constraints``)
CONSTRAINT_MATERIALIZATIONS = frozenset({"table", "incremental"})


@dataclass(frozen=True)
class StateChange:
    """One reason a node is in ``state:modified``.

    ``kind`` is dbt's sub-selector name where there is one (``body``, ``configs``,
    ``persisted_descriptions``, ``relation``, ``macros``, ``contract``), else the compared
    property (``new``, ``fqn``, ``ref_representation``, ``quoting``, ``freshness``, ``owner``, ...);
    ``detail`` says what differs, in one line.
    """

    kind: str
    detail: str


def _short(v: Any, limit: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _missing(d: Mapping[str, Any], key: str) -> bool:
    return key not in d


def _config_diff(new: Mapping[str, Any], old: Mapping[str, Any], excluded: Iterable[str] = (),
                 only: Iterable[str] | None = None) -> list[str]:
    """Keys that differ the way ``BaseConfig.compare_key`` sees it (present on one side only, or unequal)."""
    keys = list(only) if only is not None else sorted(set(new) | set(old), key=str)
    excluded = set(excluded)
    out = []
    for k in keys:
        if k in excluded:
            continue
        if _missing(new, k) and _missing(old, k):
            continue
        if _missing(new, k) or _missing(old, k) or new[k] != old[k]:
            out.append(f"{k}: {_short(old.get(k, '<unset>'))} → {_short(new.get(k, '<unset>'))}")
    return out


def _uc(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return node.get("unrendered_config") or {}


def _cfg(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return node.get("config") or {}


def _same(out: list[StateChange], kind: str, new: Any, old: Any, what: str | None = None) -> None:
    if new != old:
        out.append(StateChange(kind, f"{what or kind}: {_short(old)} → {_short(new)}"))


def _persisted_descriptions(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[StateChange]:
    persist = _cfg(new).get("persist_docs") or {}
    out = []
    if persist.get("relation") and new.get("description") != old.get("description"):
        out.append(StateChange("persisted_descriptions", "description changed (persist_docs.relation)"))
    if persist.get("columns"):
        a = {k: (v or {}).get("description") for k, v in (new.get("columns") or {}).items()}
        b = {k: (v or {}).get("description") for k, v in (old.get("columns") or {}).items()}
        if a != b:
            cols = sorted(set(a) ^ set(b) | {k for k in set(a) & set(b) if a[k] != b[k]}, key=str)
            out.append(StateChange("persisted_descriptions",
                                   f"column descriptions changed (persist_docs.columns): {', '.join(map(str, cols[:10]))}"))
    return out


def _relation(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[StateChange]:
    out = []
    for key in ("database", "schema", "alias"):
        a, b = _uc(new).get(key), _uc(old).get(key)
        if a != b:
            out.append(StateChange("relation", f"configured {key}: {_short(b)} → {_short(a)}"))
    return out


def _parsed_node(new: Mapping[str, Any], old: Mapping[str, Any], rt: str) -> list[StateChange]:
    """``ParsedNode.same_contents`` (+ ``ModelNode.same_ref_representation``, ``FunctionNode``)."""
    out: list[StateChange] = []
    if rt == "seed":
        if new.get("checksum") != old.get("checksum"):
            out.append(StateChange("body", "seed file checksum changed"))
    elif new.get("raw_code") != old.get("raw_code"):
        out.append(StateChange("body", "SQL/Python code changed"))
    if rt == "test":
        diff = _config_diff(_uc(new), _uc(old), only=TEST_CONFIG_MODIFIERS)
    else:
        diff = _config_diff(_uc(new), _uc(old), excluded=NODE_CONFIG_EXCLUDED)
    if diff:
        out.append(StateChange("configs", "; ".join(diff)))
    out += _persisted_descriptions(new, old)
    _same(out, "fqn", new.get("fqn"), old.get("fqn"))
    out += _relation(new, old)
    if rt == "model":
        for key in ("latest_version", "access", "deprecation_date"):
            _same(out, "ref_representation", new.get(key), old.get(key), key)
    if rt == "function":
        _same(out, "arguments", new.get("arguments"), old.get("arguments"))
        _same(out, "returns", new.get("returns"), old.get("returns"))
    return out


def _generic_test(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[StateChange]:
    out = []
    diff = _config_diff(_uc(new), _uc(old), only=TEST_CONFIG_MODIFIERS)
    if diff:
        out.append(StateChange("configs", "; ".join(diff)))
    _same(out, "fqn", new.get("fqn"), old.get("fqn"))
    return out


def _source(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[StateChange]:
    out: list[StateChange] = []
    for key in ("database", "schema", "identifier"):
        _same(out, "relation", new.get(key), old.get(key), key)
    _same(out, "fqn", new.get("fqn"), old.get("fqn"))
    diff = _config_diff(_uc(new), _uc(old))
    if diff:
        out.append(StateChange("configs", "; ".join(diff)))
    _same(out, "quoting", new.get("quoting"), old.get("quoting"))
    _same(out, "freshness", new.get("freshness"), old.get("freshness"))
    _same(out, "freshness", new.get("loaded_at_field"), old.get("loaded_at_field"), "loaded_at_field")
    _same(out, "external", new.get("external"), old.get("external"))
    return out


def _exposure(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[StateChange]:
    out: list[StateChange] = []
    _same(out, "fqn", new.get("fqn"), old.get("fqn"))
    for key in ("type", "owner", "maturity", "url", "description", "label"):
        _same(out, key, new.get(key), old.get(key))
    a = set((new.get("depends_on") or {}).get("nodes") or ())
    b = set((old.get("depends_on") or {}).get("nodes") or ())
    if a != b:
        out.append(StateChange("depends_on", f"depends on: +{sorted(a - b)} -{sorted(b - a)}"))
    diff = _config_diff(_uc(new), _uc(old))
    if diff:
        out.append(StateChange("configs", "; ".join(diff)))
    return out


def _metric(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[StateChange]:
    out: list[StateChange] = []
    for key in ("type", "description", "label"):
        _same(out, key, new.get(key), old.get(key))
    diff = _config_diff(_uc(new), _uc(old), excluded=METRIC_CONFIG_EXCLUDED)
    if diff:
        out.append(StateChange("configs", "; ".join(diff)))
    return out


def _semantic_model(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[StateChange]:
    out: list[StateChange] = []
    for key in ("model", "description", "defaults", "entities", "dimensions", "measures", "primary_entity", "group"):
        _same(out, key, new.get(key), old.get(key))
    _same(out, "configs", new.get("config"), old.get("config"), "config")
    return out


def _exports_differ(new: list, old: list) -> bool:
    if len(new) != len(old):
        return True
    for a, b in zip(old, new):
        if a.get("name") != b.get("name"):
            return True
        for key in ("export_as", "schema", "alias"):
            if (a.get("unrendered_config") or {}).get(key) != (b.get("unrendered_config") or {}).get(key):
                return True
    return False


def _saved_query(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[StateChange]:
    out: list[StateChange] = []
    qa, qb = new.get("query_params") or {}, old.get("query_params") or {}
    for key in ("metrics", "group_by", "where"):
        _same(out, key, qa.get(key), qb.get(key))
    for key in ("description", "label", "group", "tags"):
        _same(out, key, new.get(key), old.get(key))
    _same(out, "configs", new.get("config"), old.get("config"), "config")
    if _exports_differ(list(new.get("exports") or ()), list(old.get("exports") or ())):
        out.append(StateChange("exports", "exports changed"))
    return out


def contents_changes(new: Mapping[str, Any], old: Mapping[str, Any] | None, rt: str) -> list[StateChange]:
    """Why ``new`` does not have the same contents as ``old`` (empty: the same), per resource type.

    ``old`` None: ``[StateChange("new", ...)]`` for the types dbt counts as modified when new
    (:data:`NEW_IS_MODIFIED`), else empty (sources, exposures, metrics, semantic models, saved
    queries: see the module docstring).
    """
    if old is None:
        return [StateChange("new", "not in the base manifest")] if rt in NEW_IS_MODIFIED else []
    if rt == "source":
        return _source(new, old)
    if rt == "exposure":
        return _exposure(new, old)
    if rt == "metric":
        return _metric(new, old)
    if rt == "semantic_model":
        return _semantic_model(new, old)
    if rt == "saved_query":
        return _saved_query(new, old)
    if rt == "unit_test":
        return [] if new.get("checksum") == old.get("checksum") else [StateChange("body", "unit test definition changed")]
    if rt == "test" and new.get("test_metadata") is not None:
        return _generic_test(new, old)
    return _parsed_node(new, old, rt)


# -- macros --------------------------------------------------------------------------------------


def modified_macros(base: Mapping[str, Any], head: Mapping[str, Any]) -> dict[str, str]:
    """Macros whose ``macro_sql`` changed, added or removed: unique id → ``changed``/``added``/``removed``
    (``StateSelectorMethod._macros_modified``)."""
    old, new = base.get("macros") or {}, head.get("macros") or {}
    out = {}
    for uid, m in new.items():
        if uid not in old:
            out[uid] = "added"
        elif (m or {}).get("macro_sql") != (old[uid] or {}).get("macro_sql"):
            out[uid] = "changed"
    for uid in old:
        if uid not in new:
            out[uid] = "removed"
    return out


def macros_reached(node: Mapping[str, Any], head_macros: Mapping[str, Any], modified: Mapping[str, str]) -> list[str]:
    """The modified macros ``node`` depends on, directly or through other macros, in the order found.

    dbt walks ``depends_on.macros`` recursively through HEAD's macros and stops at the first
    modified one (``recursively_check_macros_modified``); the node is modified when this is not empty.
    A macro id HEAD does not define is skipped (dbt fails on it).
    """
    if not modified:
        return []
    found: list[str] = []
    seen: set[str] = set()
    stack = list(reversed((node.get("depends_on") or {}).get("macros") or ()))
    while stack:
        uid = stack.pop()
        if uid is None or uid in seen:
            continue
        seen.add(uid)
        if uid in modified:
            found.append(uid)
        macro = head_macros.get(uid)
        if macro:
            stack.extend(reversed((macro.get("depends_on") or {}).get("macros") or ()))
    return found


# -- contracts -----------------------------------------------------------------------------------


def _base_type(t: str | None) -> str | None:
    """``ModelNode._normalize_data_type_for_comparison``: ``varchar(10)`` → ``varchar``."""
    return t.partition("(")[0].strip().lower() if t else t


def contract_changes(new: Mapping[str, Any], old: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """``ModelNode.same_contract`` for two model entries: (changed, the breaking changes dbt names).

    Changed: enforcement switched on or off, or still enforced with another ``contract.checksum``.
    Breaking (dbt's categories): enforcement removed, a column removed, a column's base data type
    changed (size/precision/scale alone are not breaking), a ``not_null``/``unique``/
    ``primary_key``/``foreign_key``/``check`` constraint removed from a column or the model while
    the old materialization enforces constraints (table, incremental; dbt further limits this to
    the constraints the adapter enforces), or the materialization no longer enforcing them.
    """
    oc, nc = old.get("contract") or {}, new.get("contract") or {}
    oe, ne = bool(oc.get("enforced")), bool(nc.get("enforced"))
    if not oe and not ne:
        return False, []
    if not oe and ne:
        return True, []
    if ne and nc.get("checksum") == oc.get("checksum"):
        return False, []
    breaking: list[str] = []
    if oe and not ne:
        breaking.append("contract enforcement removed")
    new_cols, old_cols = new.get("columns") or {}, old.get("columns") or {}
    enforces = (_cfg(old).get("materialized") in CONSTRAINT_MATERIALIZATIONS)
    col_constraints = False
    for key, oldc in sorted(old_cols.items(), key=lambda kv: str(kv[0])):
        oldc = oldc or {}
        if oldc.get("constraints"):
            col_constraints = True
        if key not in new_cols:
            breaking.append(f"column {oldc.get('name', key)} removed")
            continue
        newc = new_cols[key] or {}
        if oldc.get("data_type") != newc.get("data_type") and _base_type(oldc.get("data_type")) != _base_type(newc.get("data_type")):
            breaking.append(f"column {oldc.get('name', key)} data_type {oldc.get('data_type')} → {newc.get('data_type')}")
        if enforces:
            for c in oldc.get("constraints") or ():
                if c not in (newc.get("constraints") or ()):
                    breaking.append(f"{c.get('type')} constraint removed from column {oldc.get('name', key)}")
    if enforces:
        for c in old.get("constraints") or ():
            if c not in (new.get("constraints") or ()):
                breaking.append(f"model {c.get('type')} constraint on {c.get('columns')} removed")
        if (_cfg(new).get("materialized") not in CONSTRAINT_MATERIALIZATIONS
                and (old.get("constraints") or col_constraints)):
            breaking.append(f"materialization {_cfg(old).get('materialized')} → {_cfg(new).get('materialized')} "
                            "no longer enforces constraints")
    return True, breaking


# -- the selector --------------------------------------------------------------------------------


def base_node(base: Mapping[str, Any], uid: str) -> Mapping[str, Any] | None:
    """The BASE entry dbt compares HEAD's ``uid`` with (:data:`BASE_LOOKUP`), or None."""
    for section in BASE_LOOKUP:
        node = (base.get(section) or {}).get(uid)
        if node is not None:
            return node
    return None


def node_changes(uid: str, new: Mapping[str, Any], base: Mapping[str, Any], head_macros: Mapping[str, Any],
                 macros: Mapping[str, str]) -> list[StateChange]:
    """Every reason HEAD's node ``uid`` is in ``state:modified`` against ``base`` (empty: it is not)."""
    rt = new.get("resource_type") or uid.split(".", 1)[0]
    old = base_node(base, uid)
    out = contents_changes(new, old, rt)
    reached = macros_reached(new, head_macros, macros)
    if reached:
        out.append(StateChange("macros", ", ".join(f"{m} {macros[m]}" for m in reached)))
    if old is not None and rt == "model" and (old.get("resource_type") or uid.split(".", 1)[0]) == "model":
        changed, breaking = contract_changes(new, old)
        if changed:
            out.append(StateChange("contract", "; ".join(breaking) if breaking else
                                   ("contract enforced" if not (old.get("contract") or {}).get("enforced")
                                    else "contract checksum changed (not breaking)")))
    return out


def state_modified(base: Mapping[str, Any], head: Mapping[str, Any], g: nx.DiGraph) -> dict[str, list[StateChange]]:
    """The nodes ``dbt ls -s state:modified --state BASE`` selects on HEAD (before test expansion), with reasons.

    Args:
        base: the BASE ``manifest.json`` (the ``--state`` one), as a dict.
        head: the HEAD ``manifest.json``, as a dict.
        g: ``manifest_graph(head)``; its dbt vertices are the enabled graph members compared.

    Returns:
        unique id → reasons (never empty), in the graph's vertex order.
    """
    macros = modified_macros(base, head)
    head_macros = head.get("macros") or {}
    out: dict[str, list[StateChange]] = {}
    for uid, attrs in g.nodes(data=True):
        if not attrs.get("dbt"):
            continue
        reasons = node_changes(uid, attrs.get("data") or {}, base, head_macros, macros)
        if reasons:
            out[uid] = reasons
    return out


def select_state_modified(g: nx.DiGraph, modified: Iterable[str], descendants: bool = False) -> list[str]:
    """What ``dbt ls -s state:modified`` (``descendants``: ``state:modified+``) prints, sorted.

    The modified nodes, plus (eager indirect selection, ``NodeSelector.expand_selection``) every
    data test or unit test that is a direct child of one of them; with ``descendants``, everything
    downstream (:func:`~dw_dagster.lineage.dbt_manifest.dbt_ls`). Types ``dbt ls`` hides by
    default (analyses) are left out.
    """
    from dw_dagster.lineage.dbt_manifest import dbt_ls

    modified = [u for u in modified if u in g]
    if descendants:
        return dbt_ls(g, modified)
    listable = index_graph(g).listable
    picked = set(modified)
    nodes = g._node
    for u in modified:
        for v in g._succ[u]:
            if nodes[v].get("resource_type") in ("test", "unit_test"):
                picked.add(v)
    return sorted(u for u in picked if u in listable)


__all__ = ["StateChange", "base_node", "contents_changes", "contract_changes", "macros_reached",
           "modified_macros", "node_changes", "select_state_modified", "state_modified"]
