"""Blast radius on a ~100,000-node dbt manifest, against dbt's own selection on the same manifest.

``dbt parse`` of a real 20,000-node project takes ~70 s on the reference machine and ``dbt ls``
as a subprocess ~30 s per selector (``blast_radius_20k``); a real 100,000-node project would take
minutes per call and several GB, so this benchmark does not write 45,000 model files. It *grows*
a manifest instead, from one dbt really parsed:

1. :func:`~dw_dagster_tests.benchmarks.blast_radius.write_synthetic_project` writes a small
   project (200 models) and ``dbt parse`` parses it (not timed);
2. :func:`grow_manifest` clones the nodes dbt wrote — a view model, ``not_null``, ``unique`` and
   ``relationships`` tests, a source table, an exposure — into ``models`` models over
   ``domains`` domains (a source per 8 tables, each domain a random deep DAG; 2 % of refs cross
   to another domain, as marts read shared staging), ~1.0 test per model, one exposure per
   100 models, with ``parent_map``/``child_map`` recomputed. Every field is one dbt wrote, so dbt
   reads the file back (``WritableManifest.read_and_check_versions`` then
   ``Manifest.from_writable_manifest``, what dbt does for ``--state``).

Timed on the grown ``manifest.json``:

- ``build_s``: :func:`dw_dagster.lineage.manifest_graph` on the loaded dict (goal ≤ 10 s;
  ``load_s``, the JSON read, apart);
- ``query_ms``: ``dbt_ls(g, select_nodes(g, X))`` — what ``dbt ls -s X+`` prints — median over a
  sample of roots (a top source of a domain, models early, mid and late in a domain, a shared
  model other domains read, an exposure); goal ≤ 50 ms; ``query_max_ms`` is the slowest root and
  ``queries`` every root's time and downstream size; ``worst_s`` the slowest root, which the goal
  holds to 50 ms too (the widest roots reach a third of the manifest);
- the peer: ``dbt ls --select X+ --output json --output-keys unique_id`` through ``dbtRunner``
  with the grown manifest already in memory (dbt's graph link, selection and output;
  ``peer_load_s`` is dbt reading the file into its ``Manifest``), the same roots, median
  ``peer_s``. ``identical_to_dbt_ls``: every root's set equals dbt's.

``ratio`` = median query / median peer. ``meets_goal``: every root (``worst_s``) ≤ 50 ms, build ≤ 10 s, identical.

Usage: ``python -m dw_dagster_tests.benchmarks.blast_radius_100k [--models N] [--repeat N]``
(``--models 2000`` for a quick look); prints the result object as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from dw_dagster_tests.benchmarks.blast_radius import PROJECT, _ls_inproc, write_synthetic_project

MODELS = 49_000  # with tests, sources and exposures: ~100,000 manifest members
DOMAINS = 50
TABLES_PER_SOURCE = 8


def _prototypes(m: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for node in m["nodes"].values():
        rt = node["resource_type"]
        if rt == "model" and node["config"].get("materialized") == "view" and node["depends_on"]["nodes"]:
            out.setdefault("model", node)
        elif rt == "test" and node.get("test_metadata"):
            out.setdefault(node["test_metadata"]["name"], node)
    out["source"] = next(iter(m["sources"].values()))
    out["exposure"] = next(iter(m["exposures"].values()))
    missing = {"model", "not_null", "unique", "relationships", "source", "exposure"} - set(out)
    if missing:
        raise RuntimeError(f"the template manifest has no {sorted(missing)}")
    return out


def _ref(name: str) -> dict:
    return {"name": name, "package": None, "version": None}


def grow_manifest(template: dict, models: int = MODELS, domains: int = DOMAINS, seed: int = 100) -> tuple[dict, dict[str, str]]:
    """A manifest of ``models`` models (plus tests, sources, exposures) cloned from ``template``'s nodes.

    Args:
        template: a ``manifest.json`` dbt wrote for :func:`write_synthetic_project` (any size).
        models: models in the result; ~2.04 manifest members per model in all.
        domains: independent sub-DAGs (each with its own source), 2 % of refs cross between them.
        seed: the random DAG's seed.

    Returns:
        ``(manifest, roots)``: the manifest dict, and label → unique id of the sample roots.
    """
    rnd = random.Random(seed)
    proto = _prototypes(template)
    nodes: dict[str, dict] = {}
    sources: dict[str, dict] = {}
    exposures: dict[str, dict] = {}
    per = max(20, models // domains)
    dom_models: list[list[str]] = []
    src_of: list[list[str]] = []
    for d in range(domains):
        tabs = []
        for t in range(TABLES_PER_SOURCE):
            s = dict(proto["source"])
            uid = f"source.{PROJECT}.src_{d:03d}.t_{t}"
            s.update(unique_id=uid, source_name=f"src_{d:03d}", name=f"t_{t}", identifier=f"t_{t}", schema=f"raw_{d:03d}",
                     fqn=[PROJECT, f"domain_{d:03d}", f"src_{d:03d}", f"t_{t}"], relation_name=f'"w"."raw_{d:03d}"."t_{t}"')
            sources[uid] = s
            tabs.append(uid)
        src_of.append(tabs)
    pm = proto["model"]
    for d in range(domains):
        names: list[str] = []
        for k in range(per):
            name = f"d{d:03d}_m{k:05d}"
            uid = f"model.{PROJECT}.{name}"
            deps: list[str] = []
            srcs: list[list[str]] = []
            if k < TABLES_PER_SOURCE:
                deps.append(src_of[d][k])
            else:
                for _ in range(rnd.choice((1, 1, 2, 2, 3))):
                    j = k - 1 - int(rnd.expovariate(1 / 30))
                    deps.append(f"model.{PROJECT}.{names[j if j >= 0 else rnd.randrange(k)]}")
                if d and rnd.random() < 0.02:  # a ref into an earlier domain (shared staging)
                    od = rnd.randrange(d)
                    deps.append(f"model.{PROJECT}.{dom_models[od][rnd.randrange(min(per, 200))].split('.')[-1]}")
                if rnd.random() < 0.03:
                    deps.append(rnd.choice(src_of[d]))
            deps = sorted(set(deps))
            refs = [_ref(x.split(".")[-1]) for x in deps if x.startswith("model.")]
            srcs = [[sources[x]["source_name"], sources[x]["name"]] for x in deps if x.startswith("source.")]
            n = dict(pm)
            n.update(unique_id=uid, name=name, alias=name, fqn=[PROJECT, f"domain_{d:03d}", name],
                     path=f"domain_{d:03d}/{name}.sql", original_file_path=f"models/domain_{d:03d}/{name}.sql",
                     checksum={"name": "sha256", "checksum": f"{d:03d}{k:05d}"}, relation_name=f'"w"."main"."{name}"',
                     refs=refs, sources=srcs, depends_on={"macros": [], "nodes": deps}, raw_code="select 1 as id")
            nodes[uid] = n
            names.append(name)
            r = rnd.random()
            tests = (["not_null"] if r < 0.6 else []) + (["unique"] if rnd.random() < 0.3 else [])
            if k > 50 and rnd.random() < 0.12:
                tests.append("relationships")
            for kind in tests:
                t = dict(proto[kind])
                tdeps, kwargs = [uid], {"column_name": "id", "model": f"{{{{ get_where_subquery(ref('{name}')) }}}}"}
                tname = f"{kind}_{name}_id"
                if kind == "relationships":
                    other = names[rnd.randrange(k)]
                    tdeps = sorted({uid, f"model.{PROJECT}.{other}"})
                    kwargs.update(to=f"ref('{other}')", field="id")
                    tname = f"relationships_{name}_id__id__ref_{other}_"
                tuid = f"test.{PROJECT}.{tname}.{hashlib.md5(tname.encode()).hexdigest()[:10]}"
                t.update(unique_id=tuid, name=tname, alias=tname, fqn=[PROJECT, f"domain_{d:03d}", tname], path=f"{tname}.sql",
                         original_file_path=f"models/domain_{d:03d}/schema.yml", file_key_name=f"models.{name}",
                         attached_node=uid, refs=[_ref(x.split(".")[-1]) for x in tdeps],
                         depends_on={"macros": proto[kind]["depends_on"]["macros"], "nodes": tdeps},
                         test_metadata={**proto[kind]["test_metadata"], "kwargs": kwargs})
                nodes[tuid] = t
        dom_models.append([f"model.{PROJECT}.{x}" for x in names])
    pe = proto["exposure"]
    for e in range(max(1, models // 100)):
        d = rnd.randrange(domains)
        deps = sorted(set(rnd.sample(dom_models[d], rnd.choice((1, 2, 3)))))
        x = dict(pe)
        uid = f"exposure.{PROJECT}.dash_{e:05d}"
        x.update(unique_id=uid, name=f"dash_{e:05d}", label=f"Dashboard {e}", fqn=[PROJECT, f"dash_{e:05d}"],
                 depends_on={"macros": [], "nodes": deps}, refs=[_ref(u.split(".")[-1]) for u in deps],
                 url=f"https://bi.corp.example/dashboards/{e}")
        exposures[uid] = x
    parent_map: dict[str, list[str]] = {}
    child_map: dict[str, list[str]] = {u: [] for u in (*nodes, *sources, *exposures)}
    for section in (nodes, exposures):
        for uid, n in section.items():
            parent_map[uid] = list(n["depends_on"]["nodes"])
            for p in parent_map[uid]:
                child_map[p].append(uid)
    for uid in sources:
        parent_map[uid] = []
    manifest = {**{k: v for k, v in template.items() if k in ("metadata", "macros", "docs", "groups", "selectors")},
                "nodes": nodes, "sources": sources, "exposures": exposures, "metrics": {}, "semantic_models": {},
                "saved_queries": {}, "unit_tests": {}, "functions": {}, "disabled": {}, "group_map": {},
                "parent_map": parent_map, "child_map": {k: sorted(v) for k, v in child_map.items()}}
    mid = dom_models[domains // 2]
    roots = {
        "source_top": src_of[0][0],
        "model_early": dom_models[1][TABLES_PER_SOURCE + 2],
        "model_mid": mid[len(mid) // 2],
        "model_late": mid[-5],
        "model_shared": dom_models[0][10],
        "exposure": next(iter(exposures)),
    }
    return manifest, roots


def _selector(uid: str) -> str:
    kind, _, rest = uid.split(".", 2)
    return {"source": f"source:{PROJECT}.{rest}", "exposure": f"exposure:{PROJECT}.{rest}"}.get(kind, rest)


def bench_blast_radius_100k(work: Path, repeat: int, models: int = MODELS) -> dict:
    """Grow a ~100,000-member manifest under ``work`` and time our graph and query against dbt's selection.

    Returns:
        ``{"name": "blast_radius_100k", "ours_s", "peer", "peer_s", "ratio", "goal", "meets_goal",
        "build_s", "build_goal_s", "load_s", "query_ms", "query_max_ms", "queries", "peer_load_s",
        "manifest_nodes", "identical_to_dbt_ls", "template_parse_s", "grow_s", "manifest_mb"}``.
    """
    from dbt.contracts.graph.manifest import Manifest, WritableManifest

    from dw_dagster.lineage import dbt_ls, manifest_graph, select_nodes

    repeat = max(1, repeat)
    tmpl = write_synthetic_project(Path(work) / "synth", models=200, seed=3)
    t = time.perf_counter()
    tmpl_path = tmpl.parse()
    template_parse_s = time.perf_counter() - t
    t = time.perf_counter()
    manifest, roots = grow_manifest(json.loads(tmpl_path.read_text()), models=models)
    big = tmpl.project_dir / "target_big"
    big.mkdir()
    path = big / "manifest.json"
    path.write_text(json.dumps(manifest))
    grow_s = time.perf_counter() - t
    del manifest
    n_nodes = None

    t = time.perf_counter()
    data = json.loads(path.read_text())
    load_s = time.perf_counter() - t
    n_nodes = sum(len(data.get(s) or {}) for s in ("nodes", "sources", "exposures"))
    builds, g = [], None
    for _ in range(repeat):
        g = None
        t = time.perf_counter()
        g = manifest_graph(data)
        builds.append(time.perf_counter() - t)
    ours: dict[str, list[str]] = {}
    times: dict[str, float] = {}
    for label, uid in roots.items():
        sel = _selector(uid)
        runs = []
        for _ in range(max(repeat, 5)):
            t = time.perf_counter()
            ours[label] = dbt_ls(g, select_nodes(g, sel))
            runs.append(time.perf_counter() - t)
        times[label] = statistics.median(runs)

    # the peer: dbt reads the same file into its Manifest and selects with it
    cwd, env = os.getcwd(), {k: os.environ.get(k) for k in tmpl.env()}
    theirs: dict[str, set[str]] = {}
    peer: dict[str, float] = {}
    try:
        os.environ.update({k: v for k, v in tmpl.env().items() if k != "PATH"})
        os.chdir(tmpl.project_dir)
        t = time.perf_counter()
        dbt_manifest = Manifest.from_writable_manifest(WritableManifest.read_and_check_versions(str(path)))
        peer_load_s = time.perf_counter() - t
        for label, uid in roots.items():
            runs = []
            for _ in range(repeat):
                t = time.perf_counter()
                theirs[label] = set(_ls_inproc(dbt_manifest, _selector(uid) + "+"))
                runs.append(time.perf_counter() - t)
            peer[label] = statistics.median(runs)
    finally:
        os.chdir(cwd)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    identical = all(set(ours[k]) == theirs[k] for k in roots)
    query_s, peer_s = statistics.median(times.values()), statistics.median(peer.values())
    build_s = statistics.median(builds)
    slowest = max(times, key=times.get)
    return {
        "name": "blast_radius_100k",
        "ours_s": round(query_s, 4),
        "peer": "dbt ls --select X+ (dbtRunner on the same manifest, already loaded)",
        "peer_s": round(peer_s, 3),
        "ratio": round(query_s / peer_s, 5) if peer_s else None,
        "goal": 0.05,
        "goal_unit": "s",
        "meets_goal": bool(times[slowest] <= 0.05 and build_s <= 10.0 and identical),
        "worst_s": round(times[slowest], 4),
        "worst_goal_s": 0.05,
        "build_s": round(build_s, 3),
        "build_goal_s": 10.0,
        "load_s": round(load_s, 3),
        "query_ms": round(query_s * 1000, 2),
        "query_max_ms": round(times[slowest] * 1000, 2),
        "query_max_root": roots[slowest],
        "queries": {k: {"root": roots[k], "ms": round(times[k] * 1000, 2), "downstream": len(ours[k]),
                        "dbt_s": round(peer[k], 3), "identical": set(ours[k]) == theirs[k]} for k in roots},
        "peer_load_s": round(peer_load_s, 2),
        "manifest_nodes": n_nodes,
        "rows": n_nodes,
        "identical_to_dbt_ls": identical,
        "template_parse_s": round(template_parse_s, 1),
        "grow_s": round(grow_s, 2),
        "manifest_mb": round(path.stat().st_size / 2**20, 1),
    }


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=MODELS)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = bench_blast_radius_100k(Path(d), args.repeat, args.models)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
