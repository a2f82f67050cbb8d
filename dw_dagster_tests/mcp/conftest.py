"""Fixtures for the MCP server tests: one store-sales demo instance for the whole session.

``dw-dagster demo store-sales --json --scale 0.002`` runs once (1–3 minutes) into a temporary
folder, as a user would run it; every test then reads that instance through the MCP tools. The
demo's signing key (``<workdir>/dagster_home/approval_signing.key``) is set as
``DW_APPROVAL_SIGNING_KEY`` while these tests run, so receipts and decisions verify.
"""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STORE_SALES_ONLY = """load_from:
  - python_module:
      module_name: dw_dagster_examples.store_sales.definitions
      attribute: defs
      location_name: store_sales
"""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without dw_dagster's and Dagster's settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DW_", "DAGSTER_HOME"))}
    env.update(extra)
    return env


@dataclass
class Demo:
    work: Path
    result: dict
    key: str

    @property
    def home(self) -> Path:
        return self.work / "dagster_home"

    @property
    def store_sales(self) -> Path:
        return self.work / "store_sales"

    @property
    def domains(self) -> Path:
        return self.store_sales / "domains.yaml"


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> Demo:
    """The store-sales demo's instance (late rows behind the watermark, approved, repaired, four receipts).

    ``$DW_TEST_MCP_DEMO`` may name the ``--workdir`` of a demo run made earlier with the same
    command: a copy of it is used instead of running the demo again (the copy keeps the original
    untouched; the tests run checks and a diagnosis on it).
    """
    work = tmp_path_factory.mktemp("mcp_demo")
    earlier = os.environ.get("DW_TEST_MCP_DEMO")
    if earlier:
        shutil.copytree(Path(earlier) / "dagster_home", work / "dagster_home")
        shutil.copytree(Path(earlier) / "store_sales", work / "store_sales", symlinks=True)
        key = (work / "dagster_home" / "approval_signing.key").read_text().strip()
        return Demo(work=work, result={}, key=key)
    proc = subprocess.run([str(BIN / "dw-dagster"), "demo", "store-sales", "--json", "--scale", "0.002", "--workdir", str(work)],
                          capture_output=True, text=True, env=clean_env(), cwd=work, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    key = (work / "dagster_home" / "approval_signing.key").read_text().strip()
    return Demo(work=work, result=json.loads(proc.stdout), key=key)


@pytest.fixture(scope="module")
def demo_env(demo):
    """The demo's signing key, store-sales home and domains file in this process's environment, for one test
    module (restored after it, so the rest of the suite keeps its own settings)."""
    keys = ("DW_APPROVAL_SIGNING_KEY", "DW_STORE_SALES_HOME", "DW_DOMAINS_FILE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({"DW_APPROVAL_SIGNING_KEY": demo.key, "DW_STORE_SALES_HOME": str(demo.store_sales),
                       "DW_DOMAINS_FILE": str(demo.domains)})
    yield demo
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def store_sales_workspace(tmp_path_factory) -> Path:
    """A workspace file with the store-sales code location only (the repository's also loads orders)."""
    path = tmp_path_factory.mktemp("mcp_ws") / "workspace.yaml"
    path.write_text(STORE_SALES_ONLY)
    return path


@pytest.fixture(scope="module")
def server(demo_env, store_sales_workspace):
    """The MCP server on the demo's instance and the store-sales location, workspace loaded."""
    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    srv = build_server(ServerSettings(dagster_home=str(demo_env.home), workspace=str(store_sales_workspace),
                                      domains=str(demo_env.domains)))
    srv.dw_state.workspace()  # loaded here, while DW_STORE_SALES_HOME names the demo's home
    return srv


@pytest.fixture
def anyio_backend():
    return "asyncio"
