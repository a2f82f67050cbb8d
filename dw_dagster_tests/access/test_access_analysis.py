"""Who owns what a grant opens, its sensitive columns, and what reads those tables downstream:
the analysis around the engine's dry-run, on a Dagster asset graph and a dbt manifest."""

import datetime as dt

import dagster as dg

from dw_dagster.access.dry_run import analyse
from dw_dagster.access.models import EngineDryRun, Reachable
from dw_dagster.core.domains import Domains
from dw_dagster.lineage import lineage_graph

MANIFEST = {
    "metadata": {"adapter_type": "postgres"},
    "nodes": {
        "model.shop.fct_refunds": {
            "unique_id": "model.shop.fct_refunds", "resource_type": "model", "name": "fct_refunds", "schema": "marts",
            "alias": "fct_refunds", "fqn": ["shop", "fct_refunds"], "config": {"enabled": True},
            "depends_on": {"nodes": ["source.shop.crm.customers"]}, "columns": {}},
    },
    "sources": {
        "source.shop.crm.customers": {
            "unique_id": "source.shop.crm.customers", "resource_type": "source", "name": "customers",
            "source_name": "crm", "schema": "crm", "identifier": "customers", "fqn": ["shop", "crm", "customers"],
            "config": {"enabled": True}, "depends_on": {"nodes": []}, "columns": {}},
    },
    "exposures": {
        "exposure.shop.refunds_board": {
            "unique_id": "exposure.shop.refunds_board", "resource_type": "exposure", "name": "refunds_board",
            "label": "Refunds board", "type": "dashboard", "url": "https://bi.grocer.example/refunds",
            "owner": {"name": "Priya", "email": "priya@grocer.example"}, "fqn": ["shop", "refunds_board"],
            "config": {"enabled": True}, "depends_on": {"nodes": ["model.shop.fct_refunds"]}},
    },
    "child_map": {}, "parent_map": {},
}


def _run() -> EngineDryRun:
    return EngineDryRun(
        engine="postgres", grantee_role="dana", role="analyst", statements=['GRANT "analyst" TO "dana"'],
        rollback=['REVOKE "analyst" FROM "dana"'],
        newly_reachable=[Reachable(table="finance.ledger", columns=["id", "amount"], privilege="SELECT", table_level=True),
                         Reachable(table="crm.customers", columns=["id", "email"], privilege="SELECT")],
        also_reachable=[Reachable(table="hr.salaries", columns=["employee_name", "phone_no"], privilege="SELECT",
                                  table_level=True, how="set_role", via="hr_reader")],
        columns={"finance.ledger": [("id", ""), ("amount", "")], "crm.customers": [("id", ""), ("email", "")],
                 "hr.salaries": [("employee_name", ""), ("phone_no", "personal phone")]})


def test_owners_sensitive_columns_and_downstream_readers():
    @dg.asset(key=["finance", "ledger"], metadata={"dagster/table_name": "warehouse.finance.ledger"})
    def ledger():
        ...

    @dg.asset(deps=[ledger])
    def cash_report():
        ...

    defs = dg.Definitions(assets=[ledger, cash_report])
    graph = defs.resolve_asset_graph()
    doms = Domains.model_validate({"domains": [
        {"name": "finance", "assets": [["finance", "ledger"]], "approvers": ["ana@x.example", "sam@x.example"]},
        {"name": "crm", "tables": ["crm.*"], "approvers": ["bo@x.example"]},
        {"name": "hr", "tables": ["hr.salaries"], "approvers": ["hal@x.example"]}]})
    out = analyse(_run(), domains=doms, requester="sam@x.example", grantee="dana@x.example", asset_graph=graph,
                  lineage=lineage_graph(defs, [MANIFEST]))
    by = {d.domain: d for d in out.domains}
    assert sorted(by) == ["crm", "finance", "hr"]  # the asset's owner, a tables pattern, and the SET ROLE reach
    assert by["finance"].eligible == ["ana@x.example"] and by["finance"].tables == ["finance.ledger"]
    assert {(s.table, s.column, s.category) for s in out.sensitive} == {
        ("crm.customers", "email", "email"), ("hr.salaries", "employee_name", "name"), ("hr.salaries", "phone_no", "phone")}
    assert ["finance", "ledger"] in out.assets and ["cash_report"] in [n.asset_key for n in out.downstream]
    assert "fct_refunds" in [n.name for n in out.downstream]
    assert [(x.name, x.owner_email) for x in out.exposures] == [("refunds_board", "priya@grocer.example")]
    assert out.unowned == [] and out.computed_at <= dt.datetime.now(dt.timezone.utc)


def test_a_table_no_domain_owns_is_named():
    doms = Domains.model_validate({"domains": [{"name": "crm", "tables": ["crm.*"], "approvers": ["bo@x.example"]}]})
    out = analyse(_run(), domains=doms, requester="sam@x.example", grantee="dana@x.example")
    assert out.unowned == ["finance.ledger", "hr.salaries"]
