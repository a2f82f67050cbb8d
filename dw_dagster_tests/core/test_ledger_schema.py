"""The ledger's schema version (core/ledger_tables.py): what opening a ledger made by another dw_dagster does.

The ledger records its schema in ``dw_ledger_meta`` (``SCHEMA_VERSION``, 1 today) and migrates by
adding the nullable columns of ``ADDED_COLUMNS`` a ledger made by an earlier dw_dagster lacks
(the stages' ``dispatch``). So:

* a new database gets every table and ``schema = 1``; opening it again changes nothing;
* a ledger of the earlier layout (no ``dispatch``) is migrated in place, its rows read back as before;
* a ledger with a newer schema is refused (upgrade dw_dagster) *before* anything is created in it;
* a table lacking any other column (altered by hand, made by another program) is refused with its
  name and the columns it lacks, instead of a bare "no such column" on the first call.

Each on SQLite and on PostgreSQL.

Cases from the field: Dagster's storage moved its recorded revision without migrating, leaving the
schema "in a weird state" (https://github.com/dagster-io/dagster/issues/4275); an out-of-date
storage surfacing as a raw ``no such table`` from the first query
(https://github.com/dagster-io/dagster/issues/5537).
"""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy as sa

from dw_dagster.core.ledger import Ledger, LedgerError, ledger_for
from dw_dagster.core.ledger_tables import SCHEMA_VERSION, _meta, _sqlite_engine, meta_t, stored_schema
from dw_dagster_tests.core.ledger_world import approve, change_set, issued, postgres_server, write_instance


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path):
    """A ledger database as the ledger opens it: SQLite (``_sqlite_engine``) or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        eng = _sqlite_engine(f"sqlite:///{tmp_path / 'dw_ledger.db'}")
        yield eng
        eng.dispose()
        return
    from dw_dagster_tests.harness.dagster_dev import postgres_database

    with postgres_database(postgres_server()) as url:
        eng = sa.create_engine("postgresql+psycopg2://" + url.removeprefix("postgresql://"))
        yield eng
        eng.dispose()


def _tables(engine) -> set[str]:
    return {t for t in sa.inspect(engine).get_table_names() if t.startswith("dw_ledger_")}


def _schema_rows(engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(meta_t))]


def test_a_new_ledger_records_its_schema_and_reopening_changes_nothing(engine):
    assert stored_schema(engine) is None
    led = Ledger(engine, url="test")
    assert _tables(engine) == {t.name for t in _meta.sorted_tables}
    assert _schema_rows(engine) == [("schema", str(SCHEMA_VERSION))] and SCHEMA_VERSION == 1
    ticket = issued(led)
    Ledger(engine, url="test")  # a second process opening it, or the next start
    again = Ledger(engine, url="test")
    assert _schema_rows(engine) == [("schema", "1")]
    assert again.stage_by_ticket(ticket).state == "issued" and again.change_set_row("cs-1").state == "running"


def test_a_ledger_of_the_earlier_layout_is_migrated_in_place(engine):
    """The stages table of a ledger made before ``dispatch`` existed gets the column; its rows read back as before."""
    led = Ledger(engine, url="test")
    ticket = issued(led)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE dw_ledger_stages DROP COLUMN dispatch")
    assert "dispatch" not in {c["name"] for c in sa.inspect(engine).get_columns("dw_ledger_stages")}
    migrated = Ledger(engine, url="test")
    assert "dispatch" in {c["name"] for c in sa.inspect(engine).get_columns("dw_ledger_stages")}
    row = migrated.stage_by_ticket(ticket)
    assert (row.state, row.dispatch) == ("issued", None)
    assert migrated.bind_ticket(ticket, "run-a", "dw_window").run_id == "run-a"


def test_a_ledger_without_a_schema_row_gets_one(engine):
    Ledger(engine, url="test")
    with engine.begin() as conn:
        conn.execute(meta_t.delete())
    Ledger(engine, url="test")
    assert stored_schema(engine) == SCHEMA_VERSION


def test_a_newer_ledger_is_refused_before_anything_is_created_in_it(engine):
    meta_t.create(engine)
    with engine.begin() as conn:
        conn.execute(meta_t.insert().values(key="schema", value=str(SCHEMA_VERSION + 1)))
    with pytest.raises(LedgerError, match=f"the ledger at test has schema {SCHEMA_VERSION + 1}; this dw_dagster knows "
                                          f"{SCHEMA_VERSION}: upgrade dw_dagster"):
        Ledger(engine, url="test")
    assert _tables(engine) == {"dw_ledger_meta"}  # the newer layout is left as it was


def test_a_table_lacking_a_column_is_refused_by_name(engine):
    led = Ledger(engine, url="test")
    change_set(led)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE dw_ledger_change_sets DROP COLUMN note")
        conn.exec_driver_sql("ALTER TABLE dw_ledger_audit DROP COLUMN body")
    with pytest.raises(LedgerError, match=r"lacks columns this dw_dagster needs \(dw_ledger_audit: body; "
                                          r"dw_ledger_change_sets: note\): its tables were altered"):
        Ledger(engine, url="test")


def test_a_dagster_instance_with_a_newer_ledger_is_refused(tmp_path):
    """Through ``ledger_for``, as every sensor and run opens it: the instance's ``history/dw_ledger.db``."""
    home = write_instance(tmp_path / "home")
    instance = dg.DagsterInstance.from_config(str(home))
    eng = _sqlite_engine(f"sqlite:///{home / 'history' / 'dw_ledger.db'}")
    meta_t.create(eng)
    with eng.begin() as conn:
        conn.execute(meta_t.insert().values(key="schema", value="7"))
    eng.dispose()
    with pytest.raises(LedgerError, match="has schema 7; this dw_dagster knows 1: upgrade dw_dagster"):
        ledger_for(instance)


def test_an_ephemeral_instance_has_its_own_ledger_in_memory():
    first, second = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    led = ledger_for(first)
    assert led.url == "sqlite:// (in memory)" and ledger_for(first) is led and ledger_for(second) is not led
    change_set(led)
    assert approve(led) and ledger_for(second).change_set_row("cs-1") is None
