"""Session fixtures for the review tests: generated base/head dbt projects, parsed once, with dbt's answers.

Building a pair runs ``dbt parse`` twice and ``dbt ls --state`` (about a minute for the 2,000-model
pair on two cores); the manifests and dbt's answers are kept in
``$TMPDIR/dw_dagster_review_cache/<hash>`` (the hash covers the generators' code, the sizes and
dbt's version), so later sessions reuse them.
"""

import pytest

from dw_dagster_tests.lineage.review_projects import built

#: (models, seed) of the generated pairs: small, medium, and the ~2,000-model project the issue asks for
SIZES = [(40, 3), (400, 5), (2000, 11)]


@pytest.fixture(scope="session", params=SIZES, ids=[f"{m}_models" for m, _ in SIZES])
def review_pair(request, tmp_path_factory):
    models, seed = request.param
    return built("generated", tmp_path_factory.mktemp(f"review_{models}"), models=models, seed=seed)


@pytest.fixture(scope="session")
def small_pair(tmp_path_factory):
    models, seed = SIZES[0]
    return built("generated", tmp_path_factory.mktemp("review_small"), models=models, seed=seed)


@pytest.fixture(scope="session")
def catalog_pair(tmp_path_factory):
    return built("catalog", tmp_path_factory.mktemp("review_catalog"))


@pytest.fixture(scope="session")
def hostile_pair(tmp_path_factory):
    return built("hostile", tmp_path_factory.mktemp("review_hostile"))
