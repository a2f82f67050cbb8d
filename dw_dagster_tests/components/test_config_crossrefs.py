"""Cross-references caught when the configuration loads (``dg check yaml``, ``dagster definitions validate``,
``build_dw_definitions``), before any run: the file, the line, the field, and the closest name.

The three mistakes of issue 25's newcomer: a database name not under ``databases``, a plausible typo in an
approver's mail domain, and (through the same path) the domains file's own errors with their lines.
"""

from __future__ import annotations

import pytest

from dw_dagster import DwConfigError, build_dw_definitions, load_dataops_config
from dw_dagster.core.domains import DomainsFileError, load_domains
from dw_dagster_tests.components.test_config_file import CONFIG, folder  # noqa: F401


def test_a_database_name_not_under_databases_names_its_line_and_the_closest(folder):
    """``database: warehose`` → ``dataops.yaml:<its line>: assets.0.database: ... did you mean 'warehouse'?``.

    From the field: validation that passed a configuration referring to names nothing defines
    (https://github.com/dagster-io/dagster/issues/27828: errors should point at the definition)."""
    text = CONFIG.replace("    database: warehouse\n", "    database: warehose\n")
    (folder / "dataops.yaml").write_text(text)
    line = text.splitlines().index("    database: warehose") + 1
    with pytest.raises(DwConfigError) as e:
        load_dataops_config(folder / "dataops.yaml", scope={"home": str(folder)})
    assert str(e.value).startswith(f"{folder / 'dataops.yaml'}:{line}: assets.0.database: 'warehose' is not under "
                                   "databases"), str(e.value)
    assert "did you mean 'warehouse'?" in str(e.value)
    text = CONFIG.replace("{database: source, table: src.sales", "{database: sorce, table: src.sales")
    (folder / "dataops.yaml").write_text(text)
    with pytest.raises(DwConfigError, match=r"assets\.0\.checks\.reconciliation\.source\.database: 'sorce' .* did you "
                                            r"mean 'source'\?"):
        build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})


def test_an_approver_at_a_near_miss_of_the_others_domain_is_refused_at_load(folder):
    """``kim@shop.exmaple`` beside two ``@shop.example`` approvers: the domains file's line and field, with
    the address it probably meant; ``build_dw_definitions`` refuses it before any run.

    From the field: an approval routed to an address nobody reads because of a one-letter typo
    (https://github.com/dagster-io/dagster/issues/13230: a message that points past the real mistake)."""
    (folder / "domains.yaml").write_text(
        "domains:\n  - name: sales\n    assets: [[sales]]\n"
        "    approvers: [ana.silva@shop.example, raj.iyer@shop.example, kim.lee@shop.exmaple]\n")
    with pytest.raises(DomainsFileError) as e:
        load_domains(folder / "domains.yaml")
    assert (f"{folder / 'domains.yaml'}:4: domains.0.approvers.2: 'kim.lee@shop.exmaple': no other address here is at "
            "'shop.exmaple'; did you mean kim.lee@shop.example?") in str(e.value)
    with pytest.raises(DwConfigError, match="did you mean kim.lee@shop.example"):
        build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    # one address at its own, unrelated domain is fine
    (folder / "domains.yaml").write_text(
        "domains:\n  - name: sales\n    assets: [[sales]]\n    approvers: [ana.silva@shop.example, ops@contractor.example]\n")
    assert [d.name for d in load_domains(folder / "domains.yaml").domains] == ["sales"]


def test_a_domains_file_that_is_not_there_names_the_line_and_the_closest_file(folder):
    """``domains: domain.yaml`` beside ``domains.yaml``: refused at load with the line and the file meant.

    From the field: a project whose definitions failed to load on a path that was almost right
    (https://github.com/dagster-io/dagster/issues/9583)."""
    (folder / "dataops.yaml").write_text(CONFIG.replace("domains: domains.yaml", "domains: domain.yaml"))
    with pytest.raises(DwConfigError) as e:
        build_dw_definitions(folder / "dataops.yaml", scope={"home": str(folder)})
    assert str(e.value).startswith(f"{folder / 'dataops.yaml'}:1: domains: ") and "did you mean 'domains.yaml'?" in str(e.value)
