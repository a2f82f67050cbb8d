"""The review against dbt itself: on generated projects of 40, 400 and ~2,000 models whose head differs
from the base by every change the issue lists (and a few dbt treats specially), the modified set
and the blast radius equal ``dbt ls -s state:modified`` / ``-s state:modified+ --state BASE``, and
each change is reported the way it happened (``review_projects.py`` says what each scenario does)."""

import pytest

from dw_dagster.lineage.review import review_manifests


@pytest.fixture(scope="module")
def reviewed(review_pair):
    return review_pair, review_manifests(review_pair.base, review_pair.head)


def _by_id(review):
    return {n.unique_id: n for n in review.nodes}


def _columns(review, uid):
    (nc,) = [nc for nc in review.columns if nc.unique_id == uid]
    return nc


def test_modified_set_and_blast_radius_equal_dbt_ls(reviewed):
    pair, review = reviewed
    assert set(review.state_modified) == pair.oracle["state:modified"], sorted(
        set(review.state_modified) ^ pair.oracle["state:modified"])[:10]
    assert set(review.state_modified_plus) == pair.oracle["state:modified+"], sorted(
        set(review.state_modified_plus) ^ pair.oracle["state:modified+"])[:10]
    if "cli:state:modified" in pair.oracle:
        assert pair.oracle["cli:state:modified"] == pair.oracle["state:modified"]
    # the nodes the review marks as in state:modified are the ones dbt selects; dbt adds the tests of those
    ours = {n.unique_id for n in review.nodes if n.in_state_modified}
    checks = {u for u in pair.oracle["state:modified"] if u.split(".")[0] in ("test", "unit_test")}
    assert {u for u in ours if u.split(".")[0] not in ("test", "unit_test")} == pair.oracle["state:modified"] - checks
    assert {u for u in ours if u.split(".")[0] in ("test", "unit_test")} <= checks
    # the blast radius report lists everything downstream dbt lists, and nothing else
    br = review.blast_radius
    listed = {x.unique_id for x in br.models + br.tests + br.other} | {e.unique_id for e in br.exposures}
    assert {u for u in listed | ours if not u.startswith("analysis.")} == pair.oracle["state:modified+"]


def test_the_generated_project_has_its_size(review_pair):
    m = review_pair.manifest("head")
    models = sum(1 for n in m["nodes"].values() if n["resource_type"] == "model")
    assert models >= review_pair.size
    if review_pair.size >= 2000:
        assert m["unit_tests"] and m["semantic_models"] and "unit_test" in review_pair.picked


def test_each_scenario_is_reported(reviewed):
    pair, review = reviewed
    nodes = _by_id(review)
    u = {k: f"model.synth.{v}" for k, v in pair.picked.items()}

    assert [r.kind for r in nodes[u["body"]].reasons] == ["body"]
    # a removed column a child selects: breaking, with the child named
    (c,) = _columns(review, u["drop_column"]).changes
    assert (c.change, c.column, c.breaking) == ("removed", "ts", True)
    assert c.selected_by and all(x.how == "selects" for x in c.selected_by)
    assert {x.unique_id for x in c.selected_by} <= set(review.state_modified_plus)
    # the added customer_email: not breaking, sensitive by the email rule
    (c,) = _columns(review, u["add_email"]).changes
    assert (c.change, c.column, c.breaking) == ("added", "customer_email", False)
    hits = [s for s in review.sensitive if s.unique_id == u["add_email"]]
    assert [(s.column, s.rule, s.category, s.matched_on) for s in hits] == [("customer_email", "email", "email", "name")]
    assert "NIST SP 800-122" in hits[0].source
    # the rename: paired by type and position, breaking for the children reading `amount`
    (c,) = _columns(review, u["rename"]).changes
    assert (c.change, c.before, c.column, c.evidence, c.breaking) == ("renamed", "amount", "amount_usd",
                                                                        "same type and position", True)
    # the retype
    (c,) = _columns(review, u["retype"]).changes
    assert (c.change, c.column, c.before, c.after, c.breaking) == ("type_changed", "amount", "DOUBLE", "DECIMAL(18, 2)", True)
    # the removed model: removed, never in dbt's state:modified
    removed = nodes[u["remove_model"]]
    assert (removed.change, removed.in_state_modified) == ("removed", False)
    assert u["remove_model"] not in review.state_modified_plus
    # the contract: dbt's reason and breaking change, and the column's
    assert [r.kind for r in nodes[u["contract"]].reasons] == ["contract"]
    nc = _columns(review, u["contract"])
    assert nc.contract_breaking == ["column amount data_type double → decimal(18,2)"]
    assert [(c.change, c.column, c.breaking) for c in nc.changes] == [("type_changed", "amount", True)]
    # the macro: both models that call it, and only through it; their SQL is Jinja, said so
    for key in ("macro", "macro2"):
        assert [(r.kind, r.detail) for r in nodes[u[key]].reasons] == [("macros", "macro.synth.dw_inner changed")]
        assert "Jinja beyond ref/source/config" in _columns(review, u[key]).note
    assert [r.detail for r in nodes[u["config"]].reasons] == ["materialized: 'view' → 'table'"]
    assert [r.kind for r in nodes[u["meta"]].reasons] == ["configs"]
    # what dbt does not count: tags, an unpersisted description
    assert u["tags_only"] not in nodes and u["description_only"] not in nodes
    assert nodes[u["new_model"]].change == "added" and nodes[u["new_model"]].in_state_modified
    assert nodes["seed.synth.seed_stores"].reasons[0].detail == "seed file checksum changed"
    test = next(n for n in review.nodes if n.resource_type == "test" and n.change == "modified")
    assert pair.picked["test_config"] in test.unique_id and test.reasons[0].detail == "severity: '<unset>' → 'warn'"
    assert [r.kind for r in nodes["exposure.synth.dash_1"].reasons] == ["label"]
    new_exposure, new_source = nodes["exposure.synth.dash_review_new"], nodes["source.synth.src_1.t_review_new"]
    assert new_exposure.change == new_source.change == "added"
    assert not new_exposure.in_state_modified and not new_source.in_state_modified
    assert {r.kind for r in nodes["source.synth.src_1.t_2"].reasons} == {"configs", "freshness"}
    if "unit_test" in pair.picked:
        (ut,) = [n for n in review.nodes if n.resource_type == "unit_test"]
        assert ut.name == pair.picked["unit_test"] and ut.reasons[0].kind == "body"
    # nothing else is modified
    expected = {u[k] for k in ("body", "drop_column", "add_email", "rename", "retype", "contract", "macro", "macro2",
                               "config", "meta")}
    assert {n.unique_id for n in review.nodes if n.change == "modified" and n.resource_type == "model"} == expected
    # breaking findings: the four columns and the contract
    assert sorted({uid for uid, _ in review.breaking}) == sorted(u[k] for k in ("drop_column", "rename", "retype", "contract"))


def test_blast_radius_names_owners_and_assets(reviewed):
    pair, review = reviewed
    br = review.blast_radius
    assert br.dagster_assets and all(isinstance(k, list) for k in br.dagster_assets)
    # a child that reads the dropped column is a Dagster asset of the blast radius, under dagster-dbt's default key
    (c,) = [nc for nc in review.columns if nc.unique_id == f"model.synth.{pair.picked['drop_column']}"][0].changes
    assert [c.selected_by[0].unique_id.split(".")[-1]] in br.dagster_assets
    for e in br.exposures:
        assert e.owner_email and e.owner_email in review.owners
    # the meta owner of the changed model is an owner of the review
    assert "after@corp.example" in review.owners
