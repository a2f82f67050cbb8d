"""Access requests on Snowflake: the dry-run from SHOW GRANTS and role inheritance, the statements it
builds (parsed as Snowflake SQL by sqlglot), the grant and the verified revoke.

Tables and their columns live in fakesnow (on loopback); ``SHOW GRANTS`` and the role statements,
which fakesnow refuses, are answered by the double in ``snowflake_double.py`` as Snowflake documents
them. Failure kinds from public trackers:

- future grants left in place when a grant is removed, and opening tables created later
  (https://github.com/snowflakedb/terraform-provider-snowflake/pull/4948,
  https://github.com/snowflakedb/terraform-provider-snowflake/issues/1954);
- OWNERSHIP, which holds every privilege and cannot be revoked like one
  (https://github.com/snowflakedb/terraform-provider-snowflake/issues/304);
- names folded to upper case unless quoted (Snowflake docs, "Identifier requirements").
"""

import datetime as dt
import uuid

import pytest
import sqlglot

from dw_dagster.access.engines import snowflake as sf
from dw_dagster.access.models import AccessError, AccessSpec
from dw_dagster_tests.access.snowflake_double import SnowflakeGrants
from dw_dagster_tests.harness.emulators import FAKESNOW_DATABASE

LATER = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=4)
DB = FAKESNOW_DATABASE


@pytest.fixture(scope="module")
def columns_db(fakesnow_server):
    from dw_dagster.databases.snowflake import SnowflakeDatabase

    db = SnowflakeDatabase(**fakesnow_server, database=DB)
    schema = f"ACC_{uuid.uuid4().hex[:8].upper()}"
    db.execute(f"CREATE SCHEMA {DB}.{schema}")
    db.execute(f"CREATE TABLE {DB}.{schema}.CUSTOMERS (ID INT, EMAIL VARCHAR, REGION VARCHAR)")
    db.execute(f"CREATE TABLE {DB}.{schema}.LEDGER (ID INT, AMOUNT NUMBER(12, 2))")
    db.execute(f'CREATE TABLE {DB}.{schema}."Mixed" (ID INT)')
    yield db, schema
    db.execute(f"DROP SCHEMA IF EXISTS {DB}.{schema} CASCADE")


@pytest.fixture
def acct(columns_db):
    db, schema = columns_db
    g = SnowflakeGrants(db, database=DB)
    g.schema = schema
    g.user("DANA")
    for r in ("ANALYST", "READER", "FINANCE"):
        g.role(r)
    g.role_roles["ANALYST"] |= {"READER"}  # READER granted to ANALYST: ANALYST inherits it
    g.grant_priv("READER", "SELECT", f"{DB}.{schema}.CUSTOMERS")
    g.grant_priv("FINANCE", "OWNERSHIP", f"{DB}.{schema}.LEDGER")
    g.grant_priv("PUBLIC", "SELECT", f'{DB}.{schema}."Mixed"')
    return g


def spec(**kw) -> AccessSpec:
    return AccessSpec(database="warehouse", grantee_email="dana@x.example", duration_s=3600, why="test", **kw)


def run(acct, s, request_id="acc-0123456789"):
    return sf.dry_run(acct, s, "DANA", expires_at=LATER, request_id=request_id, database=DB)


def test_role_grant_opens_the_inherited_roles_privileges(acct):
    r = run(acct, spec(role="analyst"))  # unquoted: Snowflake reads ANALYST
    assert r.role == "ANALYST"
    assert [(x.table, x.privilege, x.table_level) for x in r.newly_reachable] == [
        (f"{DB}.{acct.schema}.CUSTOMERS", "SELECT", True)]
    assert r.newly_reachable[0].columns == ["ID", "EMAIL", "REGION"]  # read from fakesnow's information_schema
    assert r.statements == ['GRANT ROLE "ANALYST" TO USER "DANA"'] and r.rollback == ['REVOKE ROLE "ANALYST" FROM USER "DANA"']
    for stmt in r.statements + r.rollback:
        sqlglot.parse_one(stmt, read="snowflake")


def test_ownership_means_every_privilege_and_public_is_held_already(acct):
    r = run(acct, spec(role="FINANCE"))
    assert {x.privilege for x in r.newly_reachable} == {"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES",
                                                        "TRIGGER"}
    assert all(x.grant_option for x in r.newly_reachable) and r.notes
    held = run(acct, spec(tables=[f'{acct.schema}."Mixed"']))
    assert held.newly_reachable == [] and held.statements == [] and held.already_held == [
        f'SELECT on {DB}.{acct.schema}."Mixed"']


def test_table_request_goes_through_a_role_of_its_own(acct):
    r = run(acct, spec(tables=[f"{acct.schema}.ledger"]), request_id="acc-abc123")
    assert r.statements == [
        'CREATE ROLE IF NOT EXISTS "DW_ACCESS_ACC_ABC123"',
        f'GRANT USAGE ON DATABASE "{DB}" TO ROLE "DW_ACCESS_ACC_ABC123"',
        f'GRANT USAGE ON SCHEMA "{DB}"."{acct.schema}" TO ROLE "DW_ACCESS_ACC_ABC123"',
        f'GRANT SELECT ON TABLE "{DB}"."{acct.schema}"."LEDGER" TO ROLE "DW_ACCESS_ACC_ABC123"',
        'GRANT ROLE "DW_ACCESS_ACC_ABC123" TO USER "DANA"']
    assert r.rollback == ['REVOKE ROLE "DW_ACCESS_ACC_ABC123" FROM USER "DANA"', 'DROP ROLE IF EXISTS "DW_ACCESS_ACC_ABC123"']
    for stmt in r.statements + r.rollback:
        sqlglot.parse_one(stmt, read="snowflake")
    assert [x.table for x in r.newly_reachable] == [f"{DB}.{acct.schema}.LEDGER"]


def test_grant_revoke_and_verify_through_show_grants(acct):
    r = run(acct, spec(tables=[f"{acct.schema}.LEDGER"]), request_id="acc-x1")
    out = sf.apply_grant(acct, r, r.statements)
    assert out["checks"][0]["value"] is True and "DW_ACCESS_ACC_X1" in acct.users["DANA"]
    done = sf.apply_revoke(acct, r, end_sessions=True)
    assert done["verified"] and acct.aborted == ["DANA"] and "DW_ACCESS_ACC_X1" not in acct.roles
    assert all(c["value"] is False for c in done["checks"])


def test_revoke_that_leaves_access_is_not_verified(acct):
    r = run(acct, spec(role="READER"))
    sf.apply_grant(acct, r, r.statements)
    acct.users["DANA"].add("ANALYST")  # someone grants ANALYST (which holds READER) meanwhile
    done = sf.apply_revoke(acct, r, end_sessions=False)
    assert not done["verified"]
    assert [c["check"] for c in done["checks"] if c["value"]] == [f"SELECT on {DB}.{acct.schema}.CUSTOMERS through the roles of DANA"]


def test_future_grants_are_named(acct):
    acct.future["READER"] = {("SELECT", "TABLE", f"{DB}.{acct.schema}.<TABLE>")}
    r = run(acct, spec(role="ANALYST"))
    (f,) = r.future_tables
    assert (f.schema_name, f.privilege, f.via) == (f"{DB}.{acct.schema}", "SELECT", "READER")


def test_refusals(acct):
    with pytest.raises(AccessError, match="whole tables"):
        run(acct, spec(tables=[f"{acct.schema}.LEDGER"], columns=["ID"]))
    with pytest.raises(AccessError, match="does not exist"):
        run(acct, spec(role="NOPE"))
    with pytest.raises(AccessError, match="no table"):
        run(acct, spec(tables=[f'{acct.schema}."ledger"']))  # quoted lower case: another name
    with pytest.raises(AccessError, match="does not exist"):
        sf.dry_run(acct, spec(role="ANALYST"), "NOBODY", expires_at=LATER, request_id="acc-1", database=DB)
