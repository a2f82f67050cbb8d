"""A code location that fails to load names its whole cause chain and the fix when it is known.

The case from the field (issue 25): the MCP server started as ``.venv/bin/dw-dagster`` by a client
without the venv activated; the location's definitions run ``dbt parse`` and dbt is not on PATH.
The answer used to be the first line ("Error while building definitions").
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dw_dagster.core.explain import explain, known_fix
from dw_dagster.mcp.state import DwState, ServerSettings, ToolError
from dw_dagster.mcp.workspace import load_workspace

LOCATION = '''
import subprocess

import dagster as dg


def _manifest():
    try:
        subprocess.run(["dbt", "parse"], check=True, capture_output=True)
    except FileNotFoundError as e:
        raise dg.DagsterInvalidDefinitionError("Error while building definitions for the component at defs/dataops") from e


_manifest()
defs = dg.Definitions(assets=[])
'''


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    (tmp_path / "loc_without_dbt.py").write_text(LOCATION)
    ws = tmp_path / "workspace.yaml"
    ws.write_text(textwrap.dedent(f"""\
        load_from:
          - python_file:
              relative_path: {tmp_path / 'loc_without_dbt.py'}
              location_name: shop
    """))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # as an MCP client starts the server: no venv bin on PATH
    monkeypatch.delenv("DW_DBT_EXECUTABLE", raising=False)
    return ws


def test_the_load_error_names_its_cause_and_the_fix(workspace):
    """dbt not on PATH: the location's error and the MCP tool error carry the FileNotFoundError under
    Dagster's wrapper and the fix (--dbt-executable or the venv's bin first).

    From the field: "FileNotFoundError: No such file or directory: 'dbt'" behind a code location load
    error (https://github.com/dagster-io/dagster/issues/9583); dbt's output missing from a load error
    (https://github.com/dagster-io/dagster/issues/9425); dagster-dbt's own dbt_executable for a dbt
    not on PATH (https://github.com/dagster-io/dagster/pull/17171)."""
    other = workspace.parent / "loc_without_dbt_2.py"  # a fresh module name: Python caches a half-run import
    other.write_text(LOCATION)
    second = workspace.parent / "workspace2.yaml"
    second.write_text(workspace.read_text().replace("loc_without_dbt.py", "loc_without_dbt_2.py"))
    (loc,) = load_workspace(second).locations
    assert loc.defs is None
    assert loc.error.startswith("DagsterInvalidDefinitionError: Error while building definitions")
    assert "caused by FileNotFoundError: [Errno 2] No such file or directory: 'dbt'" in loc.error
    assert "fix: dbt is not on PATH: pass --dbt-executable" in loc.error and ".venv/bin:$PATH" in loc.error
    with pytest.raises(ToolError) as err:
        DwState(ServerSettings(dagster_home=None, workspace=str(workspace))).workspace()
    assert "no code location" in str(err.value) and "No such file or directory: 'dbt'" in str(err.value)
    assert "pass --dbt-executable" in str(err.value)


def test_a_chain_without_a_known_cause_has_no_fix():
    """Every link is shown; no fix is invented for a cause nobody knows.

    From the field: a collapsed load error that sends the user to --verbose for the cause
    (https://github.com/dagster-io/dagster/pull/29507)."""
    try:
        try:
            int("twelve")
        except ValueError as inner:
            raise RuntimeError("Error while building definitions") from inner
    except RuntimeError as e:
        assert explain(e) == ("RuntimeError: Error while building definitions ← caused by ValueError: invalid literal "
                              "for int() with base 10: 'twelve'")
        assert known_fix(e) is None


def test_mcp_dbt_executable_must_exist(tmp_path):
    """``dw-dagster mcp --dbt-executable`` refuses a path that is not a file before serving anything."""
    dw = str(Path(sys.executable).parent / "dw-dagster")
    out = subprocess.run([dw, "mcp", "--dbt-executable", str(tmp_path / "no-dbt"), "--dagster-home", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no dbt at" in out.stderr
