"""``dw-dagster volume-history`` against names it must find: non-ASCII spec ids, LIKE characters, a hand-edited row."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from click.testing import CliRunner

from dw_dagster.cli.main import main
from dw_dagster.detection.volume import VolumeTable
from dw_dagster.detection.volume.history import TableHistory
from dw_dagster.detection.volume.store import store_for


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    spec = VolumeTable("pos.Ümsatz_Straße", "u")
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        st = store_for(instance)
        st.save({spec.id: TableHistory(entries=((None, 3),), recorded_at=1.0, last_status="ok"),
                 "warehouse:pos.a\\b%_c": TableHistory(entries=((None, 4),), recorded_at=1.0, last_status="ok"),
                 "warehouse:pos.broken": TableHistory(entries=((None, 5),), recorded_at=1.0, last_status="ok")})
        with st.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE dw_volume_history SET entries = '[[null, 1e400]]' WHERE spec_id = 'warehouse:pos.broken'")
    return home


def _found(home, text: str) -> list[str]:
    run = CliRunner().invoke(main, ["volume-history", text, "--json", "--dagster-home", str(home)])
    assert run.exit_code == 0, run.output
    out = run.output if run.output.startswith("[") else run.output[run.output.index("\n[") + 1:]  # after any log lines
    return [r["table"] for r in json.loads(out)]


@pytest.mark.parametrize("text", ["Ümsatz", "ümsatz", "ÜMSATZ", "straße"])
def test_a_non_ascii_table_is_found_whatever_the_case(home, text):
    """"TABLE: part of a spec id, case-insensitive": on SQLite, lower() folds ASCII only while the
    pattern was folded by Python, so even the exact spelling "Ümsatz" found nothing."""
    assert _found(home, text) == ["warehouse:pos.Ümsatz_Straße"]


def test_like_characters_and_a_hand_edited_row(home):
    assert _found(home, "a\\b%_") == ["warehouse:pos.a\\b%_c"]
    assert _found(home, "%") == ["warehouse:pos.a\\b%_c"]
    assert _found(home, "broken") == []  # left out, never a traceback
