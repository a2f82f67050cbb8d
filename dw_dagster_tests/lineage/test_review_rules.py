"""The rules behind the review, apart from dbt runs: the sensitive-column rules and their configuration in the
domains file, dbt's config-comparison tables read from dbt-core itself, nested macros, contracts."""

import pytest

from dw_dagster.core.domains import Domains, DomainsFileError, load_domains
from dw_dagster.lineage.sensitive import DEFAULT_RULES, match_column, normalise_name, rules_from
from dw_dagster.lineage.state import (
    METRIC_CONFIG_EXCLUDED,
    NODE_CONFIG_EXCLUDED,
    TEST_CONFIG_MODIFIERS,
    contract_changes,
    macros_reached,
    modified_macros,
)

RULES = rules_from(None)


def _rules(name, **kw):
    return [(m.rule.name, m.matched_on) for m in match_column(name, RULES, **kw)]


@pytest.mark.parametrize("name, rule", [
    ("customer_email", "email"), ("EmailAddress", "email"), ("e_mail", "email"), ("contact-e-mail", "email"),
    ("phone_number", "phone"), ("mobileNo", "phone"), ("msisdn", "phone"),
    ("ssn", "national_id"), ("passport_number", "national_id"), ("tax_id", "national_id"), ("drivers_license", "national_id"),
    ("date_of_birth", "birth_date"), ("dob", "birth_date"), ("BirthDate", "birth_date"),
    ("home_address", "address"), ("Home Address", "address"), ("zip_code", "address"), ("postal_code", "address"),
    ("card_number", "card_number"), ("cvv", "card_number"), ("iban", "card_number"),
    ("ip_address", "network_id"), ("client_ip", "network_id"), ("device_id", "network_id"),
    ("first_name", "person_name"), ("customer_name", "person_name"),
    ("notes", "free_text"), ("agent_comments", "free_text"),
    ("ethnicity", "special_category"), ("health_condition", "special_category"),
])
def test_default_rules_flag_personal_data_names(name, rule):
    assert (rule, "name") in _rules(name)


@pytest.mark.parametrize("name", ["id", "amount", "order_total", "created_at", "product_name", "store_id", "emailed_at",
                                  "shipping_method", "tip_amount", "status", "zipper_size"])
def test_default_rules_leave_ordinary_names_alone(name):
    assert _rules(name) == []


def test_an_ip_or_email_address_is_not_a_postal_address():
    assert [r for r, _ in _rules("ip_address")] == ["network_id"]
    assert [r for r, _ in _rules("email_address")] == ["email"]


def test_annotations_and_descriptions_match_and_false_values_do_not():
    assert _rules("x", description="The customer's email address") == [("described_as_personal_data", "description")]
    assert _rules("x", tags=["PII"]) == [("annotated_sensitive", "tags")]
    assert _rules("x", meta={"pii": True}) == [("annotated_sensitive", "meta")]
    assert _rules("x", meta={"classification": "Confidential"}) == [("annotated_sensitive", "meta")]
    assert _rules("x", meta={"governance": {"contains_pii": "yes"}}) == [("annotated_sensitive", "meta")]
    assert _rules("x", meta={"pii": False}) == [] and _rules("x", meta={"pii": "no"}) == []


def test_every_default_rule_names_its_source_and_compiles():
    assert len({r.name for r in DEFAULT_RULES}) == len(DEFAULT_RULES)
    for r in DEFAULT_RULES:
        assert r.source and r.category and r.applies_to


def test_normalise_name():
    assert normalise_name("CustomerEMail") == "customer_e_mail"
    assert normalise_name("  naïve; drop table--") == "naïve_drop_table"
    assert normalise_name('e-mail | <b>x</b>') == "e_mail_b_x_b"


def _domains(tmp_path, review_yaml: str) -> Domains:
    f = tmp_path / "domains.yaml"
    f.write_text("domains:\n  - name: shop\n    assets: [[a]]\n    approvers: [ann@shop.example]\n" + review_yaml)
    return load_domains(f)


def test_rules_from_the_domains_file(tmp_path):
    d = _domains(tmp_path, "review:\n  sensitive:\n    disable: [free_text]\n    rules:\n"
                           "      - {name: loyalty, category: account, pattern: '(^|_)loyalty_card(_|$)', source: policy 3}\n")
    rules = rules_from(d)
    assert "free_text" not in {r.name for r in rules} and rules[-1].name == "loyalty"
    assert [m.rule.name for m in match_column("loyalty_card", rules)] == ["loyalty"]
    assert match_column("notes", rules) == []
    only = rules_from(_domains(tmp_path, "review:\n  sensitive:\n    defaults: false\n"))
    assert only == []


def test_bad_rules_are_refused(tmp_path):
    with pytest.raises(DomainsFileError, match="not a regular expression"):
        _domains(tmp_path, "review:\n  sensitive:\n    rules:\n      - {name: bad, pattern: '(unclosed'}\n")
    with pytest.raises(ValueError, match="names no built-in rule"):
        rules_from(_domains(tmp_path, "review:\n  sensitive:\n    disable: [emails]\n"))


def test_domain_exposures_and_slack_channel(tmp_path):
    f = tmp_path / "domains.yaml"
    f.write_text("domains:\n  - name: bi\n    exposures: [dash_0]\n    slack_channel: C0DATAOPS1\n    approvers: [b@x.example]\n")
    d = load_domains(f).domains[0]
    assert (d.exposures, d.slack_channel) == (["dash_0"], "C0DATAOPS1")


# -- dbt's own tables ------------------------------------------------------------------------------


def test_config_comparison_tables_are_dbt_cores():
    """The keys left out of ``same_config`` are dbt-core 1.11's ``CompareBehavior.Exclude`` fields; the test
    modifiers are ``TestConfig.same_contents``'s list."""
    import inspect

    from dbt.artifacts.resources import MetricConfig, ModelConfig, SeedConfig, SnapshotConfig, TestConfig
    from dbt.artifacts.resources.v1.config import NodeConfig
    from dbt_common.contracts.config.base import CompareBehavior

    def excluded(cls):
        return {name for f, name in cls._get_fields() if not CompareBehavior.should_include(f)}

    for cls in (ModelConfig, SeedConfig, SnapshotConfig, NodeConfig):
        assert excluded(cls) == NODE_CONFIG_EXCLUDED, cls
    assert excluded(MetricConfig) == METRIC_CONFIG_EXCLUDED
    src = inspect.getsource(TestConfig.same_contents)
    assert all(f'"{m}"' in src for m in TEST_CONFIG_MODIFIERS)
    assert src.count('",') + src.count('"\n') >= len(TEST_CONFIG_MODIFIERS)


def _macro(sql, deps=()):
    return {"macro_sql": sql, "depends_on": {"macros": list(deps)}}


def test_a_macro_change_reaches_nodes_through_other_macros():
    base = {"macros": {"m.a": _macro("{{ m.b() }}", ["m.b"]), "m.b": _macro("1", ["m.c"]), "m.c": _macro("x"),
                       "m.gone": _macro("y")}}
    head = {"macros": {"m.a": _macro("{{ m.b() }}", ["m.b"]), "m.b": _macro("1", ["m.c"]), "m.c": _macro("x + 1"),
                       "m.new": _macro("z")}}
    changed = modified_macros(base, head)
    assert changed == {"m.c": "changed", "m.new": "added", "m.gone": "removed"}
    assert macros_reached({"depends_on": {"macros": ["m.a"]}}, head["macros"], changed) == ["m.c"]
    assert macros_reached({"depends_on": {"macros": ["m.gone"]}}, head["macros"], changed) == ["m.gone"]
    assert macros_reached({"depends_on": {"macros": ["m.unrelated"]}}, head["macros"], changed) == []
    # a cycle does not loop
    cyc = {"m.x": _macro("", ["m.y"]), "m.y": _macro("", ["m.x"])}
    assert macros_reached({"depends_on": {"macros": ["m.x"]}}, cyc, {"m.z": "changed"}) == []


def _model(enforced, checksum, columns, materialized="table", constraints=()):
    return {"resource_type": "model", "config": {"materialized": materialized},
            "contract": {"enforced": enforced, "checksum": checksum}, "constraints": list(constraints),
            "columns": {c: {"name": c, "data_type": t, "constraints": list(k)} for c, t, k in columns}}


def test_contract_changes_follow_dbt():
    cols = [("id", "integer", [{"type": "not_null"}]), ("name", "varchar(10)", [])]
    old = _model(True, "a", cols)
    assert contract_changes(_model(True, "a", cols), old) == (False, [])
    assert contract_changes(_model(False, None, cols), _model(False, None, cols)) == (False, [])
    assert contract_changes(old, _model(False, None, cols)) == (True, [])  # newly enforced: a change, not breaking
    wider = _model(True, "b", [cols[0], ("name", "varchar(20)", [])])
    assert contract_changes(wider, old) == (True, [])  # size only
    changed, breaking = contract_changes(_model(True, "c", [("id", "bigint", [])]), old)
    assert changed and breaking == ["column id data_type integer → bigint", "not_null constraint removed from column id",
                                    "column name removed"]
    changed, breaking = contract_changes(_model(False, None, cols, materialized="view"), old)
    assert breaking[0] == "contract enforcement removed" and "no longer enforces constraints" in breaking[-1]
