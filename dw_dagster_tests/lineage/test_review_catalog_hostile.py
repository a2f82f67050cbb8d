"""The review with the warehouse's own columns (``catalog.json`` from ``dbt docs generate`` after ``dbt build``),
without them, and on a project whose node and column names are hostile — each also against dbt's
``state:modified`` selectors."""

import json
import re
import shutil

import pytest

from dw_dagster.lineage.review import review_manifests
from dw_dagster.lineage.review_report import MARKER, review_markdown, review_text
from dw_dagster_tests.lineage.review_projects import HOSTILE_COLUMNS

STG = "model.shop.stg_customers"


def _changes(review, uid):
    (nc,) = [nc for nc in review.columns if nc.unique_id == uid]
    return nc, {c.column: c for c in nc.changes}


def test_catalog_pair_equals_dbt_ls(catalog_pair):
    review = review_manifests(catalog_pair.base, catalog_pair.head)
    assert set(review.state_modified) == catalog_pair.oracle["state:modified"] == catalog_pair.oracle["cli:state:modified"]
    assert set(review.state_modified_plus) == catalog_pair.oracle["state:modified+"]
    assert review.catalogs == {"base": True, "head": True}


def test_with_catalogs_the_warehouse_types_and_positions_are_compared(catalog_pair):
    review = review_manifests(catalog_pair.base, catalog_pair.head)
    nc, by = _changes(review, STG)
    assert nc.columns_from == "catalog"
    assert set(by) == {"id", "full_name", "contact_email"}
    assert (by["id"].change, by["id"].before, by["id"].after, by["id"].breaking) == ("type_changed", "INTEGER", "VARCHAR", True)
    readers = {(u.unique_id, u.how) for u in by["id"].selected_by}
    # customer_ids names it, customers reads it through select *, the not_null test is on it
    assert ("model.shop.customer_ids", "selects") in readers and ("model.shop.customers", "star") in readers
    assert any(how == "test" for _, how in readers)
    rename = by["full_name"]
    assert (rename.change, rename.before, rename.evidence, rename.breaking) == ("renamed", "name", "same type and position", True)
    assert {u.unique_id for u in rename.selected_by} == {"model.shop.customers"}
    assert (by["contact_email"].change, by["contact_email"].breaking) == ("added", False)
    assert {(s.column, s.rule) for s in review.sensitive} == {("contact_email", "email"), ("full_name", "person_name")}
    # compiled_code was there (dbt docs generate compiles): the children were read from it
    assert not any(c.unreadable for c in nc.changes)


def test_without_the_head_catalog_the_sql_is_compared(catalog_pair, tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    shutil.copy(catalog_pair.head / "manifest.json", head / "manifest.json")
    assert not (head / "catalog.json").exists()
    review = review_manifests(catalog_pair.base, head)
    assert review.catalogs == {"base": True, "head": False}
    nc, by = _changes(review, STG)
    assert nc.columns_from == "sql"
    # names only: the base SQL casts nothing, so neither the retype nor a rename by type can be seen
    assert {(c.column, c.change) for c in nc.changes} == {("name", "removed"), ("full_name", "added"),
                                                           ("contact_email", "added")}
    assert by["name"].breaking and {u.how for u in by["name"].selected_by} == {"star"}
    assert set(review.state_modified_plus) == catalog_pair.oracle["state:modified+"]
    # and with neither catalog (manifests as dicts)
    bare = review_manifests(catalog_pair.manifest("base"), catalog_pair.manifest("head"))
    assert bare.catalogs == {"base": False, "head": False} and _changes(bare, STG)[0].columns_from == "sql"


def test_hostile_names_equal_dbt_ls(hostile_pair):
    review = review_manifests(hostile_pair.base, hostile_pair.head)
    assert set(review.state_modified) == hostile_pair.oracle["state:modified"] == hostile_pair.oracle["cli:state:modified"]
    assert set(review.state_modified_plus) == hostile_pair.oracle["state:modified+"]
    assert "model.hostile.modèle_données" in review.state_modified
    (node,) = review.nodes
    assert node.reaches == 2  # order and line-items


def test_hostile_names_are_reported_and_escaped(hostile_pair):
    review = review_manifests(hostile_pair.base, hostile_pair.head)
    nc, by = _changes(review, "model.hostile.modèle_données")
    dropped = by[HOSTILE_COLUMNS[1]]
    assert (dropped.change, dropped.breaking) == ("removed", True)
    assert [u.unique_id for u in dropped.selected_by] == ["model.hostile.order"]
    assert {c.column for c in nc.changes if c.change == "added"} == {
        n for n in HOSTILE_COLUMNS if n != HOSTILE_COLUMNS[1]} | set()
    rules = {(s.column, s.rule) for s in review.sensitive}
    assert {("e-mail | <b>x</b>", "email"), ("Home Address", "address"),
            ("[link](http://evil.example)", "annotated_sensitive")} <= rules
    text = review_markdown(review, review.failures(["breaking", "sensitive"]))
    assert text.startswith(MARKER)
    assert "<script>" not in text and "<b>" not in text and "](http" not in text and "`col`" not in text
    cells, rows = None, 0
    for line in text.splitlines():  # every table row keeps its header's cell count: no pipe from a name leaks
        pipes = len(re.findall(r"(?<!\\)\|", line))
        if line.startswith("|---"):
            continue
        if not line.startswith("| "):
            cells = None
        elif cells is None:
            cells = pipes
        else:
            assert pipes == cells, line
            rows += 1
    assert rows >= 8
    terminal = review_text(review)
    assert "naïve; drop table x; --" in terminal and "\n" not in dropped.why
    json.dumps(review.model_dump(mode="json"))  # JSON-safe as is


def test_a_review_of_nothing_changed(hostile_pair):
    review = review_manifests(hostile_pair.base, hostile_pair.base)
    assert (review.nodes, review.columns, review.sensitive, review.state_modified, review.blast_radius) == ([], [], [], [], None)
    assert review.exit_code(["breaking", "sensitive", "any"]) == 0
    assert "No change" in review_markdown(review)


@pytest.mark.parametrize("bad", ["missing", "not_json", "not_manifest"])
def test_unreadable_inputs_are_refused(tmp_path, hostile_pair, bad):
    p = tmp_path / "manifest.json"
    if bad == "not_json":
        p.write_text("{nope")
    elif bad == "not_manifest":
        p.write_text(json.dumps({"hello": 1}))
    with pytest.raises(FileNotFoundError if bad == "missing" else ValueError):
        review_manifests(p, hostile_pair.head)
