"""The PostgreSQL dry-run against real roles on the loopback server: what a grant really opens.

Every case runs the dry-run (catalog only), then runs its statements inside a transaction that is
rolled back and asks the server ``has_table_privilege`` / ``has_column_privilege`` for every
relation and column of the test's schema before and after: ``newly_reachable`` must be exactly
that difference. Roles are named per test and dropped afterwards (the server is shared).

Failure kinds from public trackers, each a test here:

- default privileges open tables created later, and a grant on "all tables" misses them
  (https://github.com/hashicorp/terraform-provider-postgresql/issues/92,
  https://github.com/crossplane-contrib/provider-sql/issues/117,
  https://github.com/cyrilgdn/terraform-provider-postgresql/issues/533);
- grants to PUBLIC, which every role holds already (https://github.com/thepartly/pgroles/pull/192,
  https://github.com/graphile/graphile.github.io/issues/110);
- the grant option travelling with a role (PostgreSQL docs, GRANT "WITH GRANT OPTION");
- a NOINHERIT member that is a member yet inherits nothing, and can still SET ROLE
  (https://github.com/dam-agents/dam/pull/3649, https://github.com/crossplane-contrib/provider-sql/issues/359);
- column privileges: a column REVOKE does nothing while a table-level grant stands, a table-level
  REVOKE takes the column grants too, and tools reading only ``relacl`` miss column grants
  (https://github.com/supabase/supabase/issues/20780, https://github.com/windmill-labs/windmill/pull/11063);
- case-folded role and table names: unquoted names fold to lower case, so a GRANT built without
  quotes targets another object (https://github.com/puppetlabs/puppetlabs-postgresql/issues/1340,
  https://github.com/xataio/pgstream/pull/944, https://github.com/duyet/grant-rs/issues/65).
"""

import datetime as dt

import pytest

from dw_dagster.access.engines import postgres as pg
from dw_dagster.access.models import AccessError, AccessSpec
from dw_dagster.databases import SqlAlchemyDatabase
from dw_dagster_tests.access.pg_world import dry_newly, pg_world, proven_newly
from dw_dagster_tests.conftest import POSTGRES_URL

LATER = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=8)


@pytest.fixture(scope="module")
def db():
    d = SqlAlchemyDatabase(POSTGRES_URL)
    yield d
    d.dispose()


@pytest.fixture
def w():
    with pg_world() as world:
        yield world


def spec(**kw) -> AccessSpec:
    return AccessSpec(database="warehouse", grantee_email="dana@x.example", duration_s=3600, why="test", **kw)


def _tables(w, *names, cols="a int, email text, note text"):
    for n in names:
        w.run(f"CREATE TABLE {w.t(n)} ({cols})")


def _proof(w, db, grantee, s, **kw):
    run = pg.dry_run(db, s, grantee, expires_at=LATER, valid_until=False, **kw)
    assert dry_newly(w, run) == proven_newly(w, grantee, run.statements)
    return run


def test_nested_roles_and_public(w, db):
    _tables(w, "t1", "t2", "t3", "t4")
    g = w.create_role("g", "INHERIT")
    r1, r2 = w.create_role("r1", "INHERIT"), w.create_role("r2")
    w.run(f'GRANT "{r2}" TO "{r1}"', f'GRANT SELECT (a) ON {w.t("t1")} TO "{r1}"', f'GRANT SELECT ON {w.t("t2")} TO "{r2}"',
          f'GRANT SELECT ON {w.t("t3")} TO PUBLIC', f'GRANT SELECT ON {w.t("t3")} TO "{r2}"',
          f'GRANT UPDATE ON {w.t("t4")} TO "{r2}"')
    run = _proof(w, db, g, spec(role=r1))
    got = {(x.table.split(".")[-1], x.privilege): (x.table_level, x.columns) for x in run.newly_reachable}
    assert got == {("t1", "SELECT"): (False, ["a"]), ("t2", "SELECT"): (True, ["a", "email", "note"]),
                   ("t4", "UPDATE"): (True, ["a", "email", "note"])}  # t3 was readable by PUBLIC before
    assert run.statements == [f'GRANT "{r1}" TO "{g}"'] and run.rollback == [f'REVOKE "{r1}" FROM "{g}"']


def test_noinherit_grantee_gets_nothing_automatically_but_can_set_role(w, db):
    _tables(w, "t1")
    g = w.create_role("g", "NOINHERIT")
    r = w.create_role("r")
    w.run(f'GRANT SELECT ON {w.t("t1")} TO "{r}"')
    run = _proof(w, db, g, spec(role=r))
    assert run.newly_reachable == []
    assert [(x.table.split(".")[-1], x.how, x.via) for x in run.also_reachable] == [("t1", "set_role", r)]
    assert run.statements and any("NOINHERIT" in n for n in run.notes)  # opens something: it is proposed


def test_with_admin_option_deep_in_the_granted_role(w, db):
    """r1 administers x but does not inherit it: has_table_privilege shows nothing of x's, yet the
    grantee could grant itself x (PostgreSQL 15: any member chain can also SET ROLE x)."""
    _tables(w, "secret")
    g = w.create_role("g", "INHERIT")
    r1, x = w.create_role("r1", "NOINHERIT"), w.create_role("x")
    w.run(f'GRANT "{x}" TO "{r1}" WITH ADMIN OPTION', f'GRANT SELECT ON {w.t("secret")} TO "{x}"')
    run = _proof(w, db, g, spec(role=r1))
    assert run.newly_reachable == []
    (also,) = run.also_reachable
    assert also.table.endswith("secret") and also.how in ("set_role", "admin") and also.via in (r1, x)


def test_column_privileges_and_their_rollback(w, db):
    _tables(w, "customers")
    g = w.create_role("g")
    run = _proof(w, db, g, spec(tables=[f"{w.schema}.customers"], columns=["a", "email"]))
    (x,) = run.newly_reachable
    assert (x.columns, x.table_level, x.privilege) == (["a", "email"], False, "SELECT")
    assert run.statements == [f'GRANT SELECT("a", "email") ON TABLE "{w.schema}"."customers" TO "{g}"']
    assert run.rollback == [f'REVOKE SELECT("a", "email") ON TABLE "{w.schema}"."customers" FROM "{g}"']


def test_default_privileges_open_future_tables(w, db):
    owner, g, r = w.create_role("owner"), w.create_role("g"), w.create_role("r")
    w.run(f'GRANT ALL ON SCHEMA "{w.schema}" TO "{owner}"',
          f'ALTER DEFAULT PRIVILEGES FOR ROLE "{owner}" IN SCHEMA "{w.schema}" GRANT SELECT ON TABLES TO "{r}"')
    run = _proof(w, db, g, spec(role=r))
    assert run.newly_reachable == [] and run.statements  # nothing today, but tables created later by owner
    (f,) = run.future_tables
    assert (f.schema_name, f.creator, f.privilege, f.via) == (w.schema, owner, "SELECT", r)


def test_a_grant_already_held_directly_or_through_a_role_opens_nothing(w, db):
    _tables(w, "t1", "t2")
    g, r = w.create_role("g", "INHERIT"), w.create_role("r")
    w.run(f'GRANT SELECT ON {w.t("t1")} TO "{g}"', f'GRANT SELECT ON {w.t("t2")} TO "{r}"', f'GRANT "{r}" TO "{g}"')
    direct = pg.dry_run(db, spec(tables=[f"{w.schema}.t1"]), g, expires_at=LATER)
    assert (direct.statements, direct.rollback, direct.newly_reachable) == ([], [], [])
    assert direct.already_held == [f"SELECT on {w.schema}.t1"]
    via_role = pg.dry_run(db, spec(tables=[f"{w.schema}.t2"]), g, expires_at=LATER)
    assert via_role.newly_reachable == [] and via_role.statements == []  # has_table_privilege already says yes
    again = pg.dry_run(db, spec(role=r), g, expires_at=LATER)
    assert again.statements == [] and again.already_held == [f"member of role {r}"]


def test_public_table_opens_nothing(w, db):
    _tables(w, "open")
    g = w.create_role("g")
    w.run(f'GRANT SELECT ON {w.t("open")} TO PUBLIC')
    run = pg.dry_run(db, spec(tables=[f"{w.schema}.open"]), g, expires_at=LATER)
    assert run.newly_reachable == [] and run.statements == []


def test_case_folded_names_are_resolved_exactly(w, db):
    w.run(f'CREATE TABLE "{w.schema}"."Orders" (a int)', f'CREATE TABLE "{w.schema}".orders (a int)')
    g = w.create_role("g")
    upper, lower = w.create_role("Analyst"), w.create_role("analyst")
    w.run(f'GRANT SELECT ON "{w.schema}"."Orders" TO "{upper}"', f'GRANT SELECT ON "{w.schema}".orders TO "{lower}"')
    folded = pg.dry_run(db, spec(role=upper), g, expires_at=LATER)  # typed unquoted: PostgreSQL folds it
    assert folded.role == lower and [x.table for x in folded.newly_reachable] == [f"{w.schema}.orders"]
    exact = _proof(w, db, g, spec(role=f'"{upper}"'))
    assert exact.role == upper and [x.table for x in exact.newly_reachable] == [f'{w.schema}."Orders"']
    assert exact.statements == [f'GRANT "{upper}" TO "{g}"']
    with pytest.raises(AccessError, match="did you mean"):
        pg.dry_run(db, spec(tables=[f'{w.schema}."ORDERS"']), g, expires_at=LATER)
    t = pg.dry_run(db, spec(tables=[f'{w.schema}."Orders"']), g, expires_at=LATER)
    assert t.statements == [f'GRANT SELECT ON TABLE "{w.schema}"."Orders" TO "{g}"']


def test_table_level_grant_gives_back_the_grantees_own_column_privileges(w, db):
    _tables(w, "t1")
    g = w.create_role("g")
    w.run(f'GRANT SELECT (a) ON {w.t("t1")} TO "{g}"')
    run = _proof(w, db, g, spec(tables=[f"{w.schema}.t1"]))
    assert run.rollback == [f'REVOKE SELECT ON TABLE "{w.schema}"."t1" FROM "{g}"',
                            f'GRANT SELECT("a") ON TABLE "{w.schema}"."t1" TO "{g}"']
    w.run(*run.statements)
    result = pg.apply_revoke(db, run, end_sessions=False)
    assert result["verified"] is True
    assert w.fetch(f"SELECT has_column_privilege('{g}', '{w.t('t1')}', 'a', 'SELECT'), "
                   f"has_column_privilege('{g}', '{w.t('t1')}', 'email', 'SELECT')") == [(True, False)]


def test_grant_option_through_the_granted_role_is_named(w, db):
    _tables(w, "t1")
    g, r = w.create_role("g"), w.create_role("r")
    w.run(f'GRANT SELECT ON {w.t("t1")} TO "{r}" WITH GRANT OPTION')
    run = _proof(w, db, g, spec(role=r))
    assert all(x.grant_option for x in run.newly_reachable) and any("GRANT OPTION" in n for n in run.notes)


def test_pg_read_all_data_opens_every_table(w, db):
    _tables(w, "a1", "a2")
    g = w.create_role("g")
    run = pg.dry_run(db, spec(role="pg_read_all_data"), g, expires_at=LATER, valid_until=False)
    ours = {x.table.split(".")[-1] for x in run.newly_reachable if x.table.startswith(w.schema + ".")}
    assert ours == {"a1", "a2"}
    proof = proven_newly(w, g, run.statements)
    assert {k for k, v in proof.items()} == {(t, "SELECT") for t in ("a1", "a2")}


def test_a_superuser_reachable_is_refused(w, db):
    g, boss = w.create_role("g"), w.create_role("boss", "SUPERUSER")
    mid = w.create_role("mid")
    w.run(f'GRANT "{boss}" TO "{mid}"')
    with pytest.raises(AccessError, match="superuser"):
        pg.dry_run(db, spec(role=mid), g, expires_at=LATER)
    with pytest.raises(AccessError, match="superuser"):
        pg.dry_run(db, spec(role=boss), g, expires_at=LATER)


def test_login_role_gets_valid_until_and_it_is_put_back(w, db):
    _tables(w, "t1")
    g = w.create_role("g", "LOGIN")
    run = pg.dry_run(db, spec(tables=[f"{w.schema}.t1"]), g, expires_at=LATER)
    assert run.statements[-1].startswith(f'ALTER ROLE "{g}" VALID UNTIL') and run.rollback[-1].endswith("'infinity'")
    pg.apply_grant(db, run, run.statements)
    (until,) = w.fetch(f"SELECT rolvaliduntil FROM pg_roles WHERE rolname = '{g}'")[0]
    assert abs((until - LATER).total_seconds()) < 1
    assert pg.apply_revoke(db, run, end_sessions=False)["verified"]
    assert w.fetch(f"SELECT rolvaliduntil = 'infinity' FROM pg_roles WHERE rolname = '{g}'") == [(True,)]


def test_unknown_grantee_or_column_is_refused_with_a_hint(w, db):
    _tables(w, "t1")
    w.create_role("Dana")
    with pytest.raises(AccessError, match="did you mean"):
        pg.dry_run(db, spec(role="x"), w.role("dana"), expires_at=LATER)
    g = w.create_role("g")
    with pytest.raises(AccessError, match="has no column"):
        pg.dry_run(db, spec(tables=[f"{w.schema}.t1"], columns=["nope"]), g, expires_at=LATER)
    with pytest.raises(AccessError, match="schema"):
        pg.dry_run(db, spec(tables=["t1"]), g, expires_at=LATER)
