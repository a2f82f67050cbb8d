"""Mistakes in a DataOpsComponent's defs.yaml: each is an error on that file, naming the field."""

from __future__ import annotations

import pytest

from dw_dagster_tests.components.test_component import _load_defs, defs_yaml, project  # noqa: F401 - fixture

MISTAKES = {
    # kind: (edit of the working defs.yaml, what the error must name)
    "unknown field": (lambda y: y.replace("slice_by: [region]", "slice_by: [region]\n          colour: red"),
                      ["colour"]),
    "wrong type": (lambda y: y.replace("measures: [amount]", "measures: 5"), ["measures", "defs.yaml:"]),
    "asset that does not exist": (lambda y: y.replace("- key: sales\n", "- key: salez\n"),
                                  ["assets[0].key", "'salez'", "sales"]),
    "domain without approvers": (lambda y: y.replace("approvers: [ana.silva@shop.example]", "approvers: []"),
                                 ["approvers"]),
    "database not defined": (lambda y: y.replace("database: warehouse\n", "database: wherehouse\n"),
                             ["wherehouse", "did you mean 'warehouse'?"]),
    # issue 25: a plausible typo in an approver's mail domain (the others' domain is suggested)
    "approver at a near-miss domain": (lambda y: y.replace(
        "approvers: [ana.silva@shop.example]",
        "approvers: [ana.silva@shop.example, raj.iyer@shop.example, kim.lee@shop.exmaple]"),
        ["kim.lee@shop.exmaple", "did you mean kim.lee@shop.example?"]),
}


def _chain(e: BaseException) -> str:
    out = []
    while e is not None:
        out.append(str(e))
        e = e.__cause__ or e.__context__
    return "\n".join(out)


@pytest.mark.parametrize("kind", list(MISTAKES))
def test_a_mistake_names_the_file_and_the_field(project, kind):  # noqa: F811 - the fixture
    """Each mistake fails the load on defs.yaml, naming the field (and, for a name, the closest one).

    From the field: errors that should point at the definition a user wrote
    (https://github.com/dagster-io/dagster/issues/27828) and at the real mistake rather than a symptom
    (https://github.com/dagster-io/dagster/issues/13230)."""
    edit, named = MISTAKES[kind]
    folder = project / "src" / "shop_data" / "defs" / "dataops"
    folder.mkdir()
    (folder / "defs.yaml").write_text(edit(defs_yaml("http://127.0.0.1:1")))
    with pytest.raises(Exception) as err:
        _load_defs(project)
    text = _chain(err.value)
    assert "defs.yaml" in text and "dataops" in text, text[:2000]
    for part in named:
        assert part in text, (part, text[:3000])


def test_the_working_file_loads(project):  # noqa: F811
    folder = project / "src" / "shop_data" / "defs" / "dataops"
    folder.mkdir()
    (folder / "defs.yaml").write_text(defs_yaml("http://127.0.0.1:1"))
    defs = _load_defs(project)
    assert defs.resolve_job_def("dw_approve_change_set") is not None
