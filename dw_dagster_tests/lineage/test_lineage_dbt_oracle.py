"""dbt itself is the oracle: our downstream set equals ``dbt ls --select X+`` on the example project
and on a generated project of 2,000 models (sources, seeds, a snapshot, generic and relationships
tests, singular tests over two models, unit tests, exposures, a semantic model, metrics, a saved
query, an analysis, ephemeral, disabled and isolated models).

The generated project is written and parsed once per module (about 20 s of ``dbt parse`` on two
cores); dbt's answers for all selectors come from one child process that runs ``dbt ls`` with
dbt's ``dbtRunner`` on the parsed manifest (about 1.5 s per selector), and one selector is also
checked against the ``dbt ls`` command line.
"""

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from dw_dagster.lineage import blast_radius, dbt_ls, dbt_selector, manifest_graph, select_nodes
from dw_dagster_tests.benchmarks.blast_radius import SyntheticProject, dbt_ls_many, write_synthetic_project

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "dw-dagster"


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    d = tmp_path_factory.mktemp("example") / "dbt_project"
    shutil.copytree(REPO / "examples" / "dw_dagster_examples" / "dbt_project", d, ignore=shutil.ignore_patterns("target", "logs", "dbt_packages", ".user.yml"))
    proj = SyntheticProject(project_dir=d, models=3)
    return proj, json.loads(proj.parse().read_text())


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    proj = write_synthetic_project(tmp_path_factory.mktemp("synth") / "synth", models=2000, seed=11)
    return proj, json.loads(proj.parse().read_text())


def _ours(manifest, selector):
    g = manifest_graph(manifest)
    return set(dbt_ls(g, select_nodes(g, selector)))


EXAMPLE_SELECTORS = ["fct_store_sales_daily+", "region_sales_daily+", "region_sales_mtd+", "source:pos.sales_line+",
                     "source:pos+", "exposure:store_pnl+", "marts+", "store_sales+", "region_*+"]


def test_example_project_equals_dbt_ls(example):
    proj, manifest = example
    theirs = dbt_ls_many(proj.project_dir, proj.env(), EXAMPLE_SELECTORS)
    for sel in EXAMPLE_SELECTORS:
        assert _ours(manifest, sel) == theirs[sel], sel
    assert len(theirs["source:pos.sales_line+"]) == 11  # source, 3 models, 6 tests, 1 exposure


def test_cli_json_sets_are_dbt_ls_sets(example, tmp_path):
    """"nodes" ⊎ "tests" ⊎ "exposures" = ``dbt ls --select X+``; "nodes" alone = the same with
    ``--exclude-resource-type test unit_test exposure`` (dbt's command line, not the in-process runner)."""
    proj, manifest = example
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps(manifest))
    out = json.loads(subprocess.run([str(CLI), "blast-radius", "--manifest", str(m), "--select", "source:pos.sales_line", "--json"],
                                    capture_output=True, text=True, check=True, timeout=120).stdout)
    full = proj.ls("source:pos.sales_line+")
    assert set(out["nodes"]) | set(out["tests"]) | set(out["exposures"]) == full == set(out["dbt_ls"])
    assert len(out["nodes"]) + len(out["tests"]) + len(out["exposures"]) == len(full)
    plain = proj.dbt("ls", "--quiet", "--select", "source:pos.sales_line+", "--exclude-resource-type", "test",
                     "--exclude-resource-type", "unit_test", "--exclude-resource-type", "exposure",
                     "--output", "json", "--output-keys", "unique_id").stdout
    assert set(out["nodes"]) == {json.loads(x)["unique_id"] for x in plain.splitlines() if x.startswith("{")}


def test_generated_project_equals_dbt_ls(generated):
    proj, manifest = generated
    g = manifest_graph(manifest)
    n_models = sum(1 for n in manifest["nodes"].values() if n["resource_type"] == "model")
    assert n_models >= 2000 and manifest["unit_tests"] and manifest["disabled"] and manifest["semantic_models"]
    # every kind of root and selector method once (dbt ls costs ~1.5 s per selector)
    skip = {"model_semantic", "wildcard", "saved_query", "source_late"}
    selectors = [v + "+" for k, v in proj.selectors.items() if k not in skip]
    selectors.append(dbt_selector(g, select_nodes(g, proj.selectors["unit_tested_model"])[0]) + "+")  # full fqn
    theirs = dbt_ls_many(proj.project_dir, proj.env(), selectors)
    sizes = {}
    for sel in selectors:
        ours = set(dbt_ls(g, select_nodes(g, sel)))
        assert ours == theirs[sel], (sel, sorted(ours ^ theirs[sel])[:10])
        sizes[sel] = len(ours)
    assert sizes[proj.selectors["model_isolated"] + "+"] <= 3  # itself and its own tests
    assert max(sizes.values()) > 1000
    # dbt's command line agrees with the in-process runner
    sel = proj.selectors["model_mid"] + "+"
    assert proj.ls(sel) == theirs[sel]


def test_generated_project_without_child_map(generated):
    _, manifest = generated
    stripped = {k: v for k, v in manifest.items() if k != "child_map"}
    partial = copy.copy(manifest)
    partial["child_map"] = {k: v for i, (k, v) in enumerate(manifest["child_map"].items()) if i % 2}
    for sel in ("source:synth.src_0.t_0", "seed_regions", "snap_orders"):
        want = _ours(manifest, sel)
        assert _ours(stripped, sel) == want and _ours(partial, sel) == want


def test_relationship_test_is_a_check_not_a_path(generated):
    _, manifest = generated
    g = manifest_graph(manifest)
    found = 0
    for uid, node in manifest["nodes"].items():
        if node["resource_type"] != "test" or not node["name"].startswith("relationships_"):
            continue
        a, b = node["depends_on"]["nodes"]
        for parent, other in ((a, b), (b, a)):
            br = blast_radius(g, [parent])
            assert uid in {t.unique_id for t in br.tests}
            hit = {m.unique_id for m in br.models}
            assert (other in hit) == nx.has_path(g, parent, other)
        found += 1
        if found == 5:
            break
    assert found == 5
