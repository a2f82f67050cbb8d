"""The docs table of field cases is generated from the corpus's ``KINDS`` and kept up to date."""

import importlib
import pathlib

from dw_dagster_tests.field_cases.kinds import PAGE, all_kinds, render_page

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_docs_table_is_up_to_date():
    page = (ROOT / PAGE).read_text()
    assert render_page(page) == page, "run: python -m dw_dagster_tests.field_cases.kinds"


def test_every_kind_names_a_test_that_exists_and_links_its_source():
    kinds = all_kinds()
    assert len({k["id"] for k in kinds}) == len(kinds), "kind ids are unique"
    for k in kinds:
        mod = importlib.import_module(f"dw_dagster_tests.field_cases.{k['module']}")
        test = getattr(mod, k["test"], None)
        assert callable(test), k
        assert k["source"] in (test.__doc__ or "") or k["source"] in (mod.__doc__ or ""), \
            f"{k['id']}: the test's docstring links {k['source']}"
        for path in k["handled"].split(", "):
            assert (ROOT / path).exists(), path
