"""The reference pages are what the code says: each equals what :mod:`.reference` generates from it.

When one fails, run ``python -m dw_dagster_tests.docs.reference`` and commit the pages.
"""

import pytest

from dw_dagster_tests.docs import reference


@pytest.mark.parametrize("name", sorted(reference.PAGES))
def test_the_reference_page_is_generated_from_the_code(name):
    page = reference.REFERENCE / name
    assert page.exists(), f"docs/reference/{name} is missing: run python -m dw_dagster_tests.docs.reference"
    assert page.read_text() == reference.PAGES[name](), (
        f"docs/reference/{name} differs from the code: run python -m dw_dagster_tests.docs.reference")


def test_every_public_name_and_every_key_is_on_a_page():
    import dw_dagster
    from dw_dagster.core import keys

    api = (reference.REFERENCE / "api.md").read_text()
    assert all(f"`{name}" in api for name in dw_dagster.__all__)
    listed = (reference.REFERENCE / "metadata-keys.md").read_text()
    constants = [n for n in vars(keys) if n.isupper()]
    assert constants and all(f"`{n}`" in listed for n in constants)


def test_the_configuration_page_names_every_top_level_field():
    from dw_dagster.config import DataOpsConfig

    page = (reference.REFERENCE / "configuration.md").read_text()
    assert all(f"| `{field}` |" in page for field in DataOpsConfig.model_fields)
