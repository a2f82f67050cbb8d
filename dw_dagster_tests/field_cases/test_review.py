"""Field cases of the pull-request review (:func:`~dw_dagster.lineage.review.review_manifests`):
objects that depend on what a change touches through macros — a changed macro called after an
unchanged one, and through another macro — with dbt itself (``dbt ls -s state:modified[+]``) as
the oracle, on a small DuckDB project parsed by dbt."""

import pytest
import yaml

from dw_dagster.lineage.review import review_manifests
from dw_dagster_tests.benchmarks.blast_radius import dbt_ls_many
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.lineage.review_projects import _project

KINDS = [
    kind("review-macro-after-unchanged-macro", "dependencies", "a changed macro called after an unchanged one, or "
         "through another macro, in a model, with an exposure and a child downstream",
         "https://github.com/dbt-labs/dbt-core/issues/4678", "dw_dagster/lineage/state.py",
         "test_models_reaching_a_changed_macro_in_any_order_are_modified", False),
]

MACROS = """{% macro unchanged_macro() %}1{% endmacro %}
{% macro changed_macro() %}BODY{% endmacro %}
{% macro outer_macro() %}{{ changed_macro() }} + 1{% endmacro %}
"""
FILES = {
    "models/unchanged_first.sql": "select {{ unchanged_macro() }} as a, {{ changed_macro() }} as b\n",
    "models/changed_first.sql": "select {{ changed_macro() }} as a, {{ unchanged_macro() }} as b\n",
    "models/through_outer.sql": "select {{ outer_macro() }} as a\n",
    "models/untouched.sql": "select {{ unchanged_macro() }} as a\n",
    "models/child.sql": "select a from {{ ref('unchanged_first') }}\n",
    "models/exposures.yml": yaml.safe_dump({"version": 2, "exposures": [
        {"name": "dash", "type": "dashboard", "owner": {"email": "bi@shop.example"},
         "depends_on": ["ref('changed_first')"]}]}),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("review_macros")
    base = _project(root / "base", "macros", {**FILES, "macros/m.sql": MACROS.replace("BODY", "2")})
    head = _project(root / "head", "macros", {**FILES, "macros/m.sql": MACROS.replace("BODY", "3")})
    for p in (base, head):
        p.parse()
    oracle = dbt_ls_many(head.project_dir, head.env(), ["state:modified", "state:modified+"],
                         extra_args=["--state", str(base.project_dir / "target")])
    return base, head, oracle


def test_models_reaching_a_changed_macro_in_any_order_are_modified(pair):
    """dbt-core #4678 (https://github.com/dbt-labs/dbt-core/issues/4678): a macro change was not
    picked up by ``state:modified+`` when the model called an unchanged macro before the changed
    one. Right answer (dbt 1.11's own ``dbt ls``): the three models reaching ``changed_macro`` —
    first, second, or through ``outer_macro`` — are modified, ``untouched`` is not; the child and
    the exposure are in the blast radius."""
    base, head, oracle = pair
    review = review_manifests(base.project_dir / "target", head.project_dir / "target")
    models = {f"model.macros.{m}" for m in ("unchanged_first", "changed_first", "through_outer")}
    assert {u for u in oracle["state:modified"] if u.startswith("model.")} == models
    assert set(review.state_modified) == oracle["state:modified"]
    assert set(review.state_modified_plus) == oracle["state:modified+"]
    assert {"model.macros.child", "exposure.macros.dash"} <= set(review.state_modified_plus)
    assert "model.macros.untouched" not in review.state_modified_plus
