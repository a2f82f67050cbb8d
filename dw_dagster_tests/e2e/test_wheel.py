"""The wheel is the library: no examples, fakes or dbt project in it; it installs and imports with its
hard dependencies alone; the examples distribution beside it runs ``dw-dagster demo store-sales``.

Both wheels are built from the working copy (``pip wheel --no-deps``; pip fetches the build
backend, hatchling). The library's wheel is installed with real pip from the package index into a
fresh venv, dependencies resolved (a pip cache under the repository's ``.cache/`` keeps reruns
fast), and every public name is imported there; the optional surfaces' packages are absent and
their modules say which extra to install. The demo part installs both wheels with ``--no-deps``
into another venv that reuses this interpreter's site-packages through a ``.pth`` file (a plain
path: the editable installs' own ``.pth`` there are not processed, so the repository never
reaches ``sys.path``) and runs the demo from an empty folder with no ``PYTHONPATH``: the dbt
project it copies must come from the examples' wheel.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCALE = "0.002"
PIP_CACHE = REPO / ".cache" / "pip"
#: what only an optional surface needs: never a hard dependency of the wheel
OPTIONAL = ("starlette", "uvicorn", "slack_sdk", "dagster_webserver", "dagster_duckdb", "mcp")


def _env(venv: Path) -> dict[str, str]:
    """This environment without dw_dagster's, Dagster's, the integrations' or Python's path settings;
    the venv's ``bin`` first, then this interpreter's (for ``dbt``, which the wheels do not bring)."""
    drop = ("DW_", "DAGSTER_", "LIGHTUP_", "PAGERDUTY_", "SLACK_", "PYTHON")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    return env


def _build(source: Path, dist: Path) -> Path:
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
                           capture_output=True, text=True, timeout=600)
    if build.returncode != 0 and "hatchling" in build.stderr and ("No matching distribution" in build.stderr
                                                                  or "NewConnectionError" in build.stderr):
        pytest.skip(f"the build backend (hatchling) cannot be fetched from PyPI here: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stderr[-3000:]
    return dist


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> tuple[Path, Path]:
    dist = _build(REPO, tmp_path_factory.mktemp("dist"))
    _build(REPO / "examples", dist)
    (library,) = dist.glob("dw_dagster-*.whl")
    (examples,) = dist.glob("dw_dagster_examples-*.whl")
    return library, examples


def test_the_wheel_holds_the_library_alone(wheels):
    library, examples = wheels
    names = zipfile.ZipFile(library).namelist()
    assert [n for n in names if n.startswith("dw_dagster/")], names[:5]
    outside = [n for n in names if "/examples/" in n or "/fakes/" in n or "dbt_project" in n
               or n.startswith(("dw_dagster_examples", "dw_dagster_dev"))]
    assert outside == []
    assert sorted(n for n in names if n.startswith("dw_dagster/testing/")) == ["dw_dagster/testing/__init__.py",
                                                                               "dw_dagster/testing/local_daemon.py"]
    theirs = zipfile.ZipFile(examples).namelist()
    assert "dw_dagster_examples/dbt_project/dbt_project.yml" in theirs
    assert "dw_dagster_dev/fakes/lightup_server.py" in theirs
    assert not [n for n in theirs if "/target/" in n or "/logs/" in n]


def test_the_wheel_installs_and_imports_with_its_hard_dependencies_alone(wheels, tmp_path):
    library, _ = wheels
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    # this interpreter's pip installs into the venv (no ensurepip); no byte-compiling of every dependency
    # (what the probe imports is compiled as it is imported)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-compile", "--cache-dir",
                              str(PIP_CACHE), str(library)],
                             capture_output=True, text=True, timeout=1800, env=_env(venv))
    assert install.returncode == 0, install.stderr[-3000:]
    probe = (
        "import importlib, importlib.util, json, dw_dagster\n"
        "names = {n: type(getattr(dw_dagster, n)).__name__ for n in dw_dagster.__all__}\n"
        "absent = [m for m in %r if importlib.util.find_spec(m) is None]\n"
        "errors = {}\n"
        "for module in ('dw_dagster.approval.server', 'dw_dagster.integrations.slack_direct'):\n"
        "    try:\n"
        "        importlib.import_module(module)\n"
        "    except ImportError as e:\n"
        "        errors[module] = str(e)\n"
        "import dw_dagster.definitions, dw_dagster.cli.main\n"
        "print(json.dumps({'file': dw_dagster.__file__, 'names': names, 'absent': absent, 'errors': errors}))\n"
    ) % (OPTIONAL,)
    out = subprocess.run([py, "-c", probe], cwd=tmp_path, env=_env(venv), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(found["file"]).resolve().is_relative_to(venv.resolve()), found["file"]
    assert len(found["names"]) == len(set(found["names"])) >= 40
    assert found["absent"] == list(OPTIONAL)
    assert "pip install 'dw-dagster[review]'" in found["errors"]["dw_dagster.approval.server"]
    assert "pip install 'dw-dagster[slack]'" in found["errors"]["dw_dagster.integrations.slack_direct"]
    demo = subprocess.run([str(venv / "bin" / "dw-dagster"), "demo", "store-sales"], cwd=tmp_path, env=_env(venv),
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 2 and "pip install dw-dagster-examples" in demo.stderr, demo.stderr[-2000:]


@pytest.fixture(scope="module")
def installed(wheels, tmp_path_factory) -> Path:
    """Both wheels in a venv that reuses this interpreter's site-packages for their dependencies."""
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (purelib,) = (venv / "lib").glob("python3*/site-packages")
    (purelib / "reuse_test_site_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                              "--no-deps", "--no-index", "--no-compile", "-q", *map(str, wheels)], capture_output=True, text=True,
                             timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    return venv


def test_the_examples_carry_the_dbt_project_and_are_what_gets_imported(installed, tmp_path):
    venv = installed
    probe = ("import dw_dagster, dw_dagster_examples, json; from dw_dagster_dev.demo import example_dbt_project; "
             "print(json.dumps({'file': dw_dagster.__file__, 'examples': dw_dagster_examples.__file__, "
             "'dbt': str(example_dbt_project())}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=_env(venv), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout)
    assert Path(found["file"]).resolve().is_relative_to(venv.resolve()), found
    assert Path(found["examples"]).resolve().is_relative_to(venv.resolve()), found
    assert Path(found["dbt"]).resolve() == (Path(found["examples"]).parent / "dbt_project").resolve()
    assert (Path(found["dbt"]) / "models" / "marts" / "fct_store_sales_daily.sql").exists()


def test_the_installed_demo_runs_from_an_empty_folder(installed, tmp_path):
    venv = installed
    work = tmp_path / "empty"
    work.mkdir()
    proc = subprocess.run([str(venv / "bin" / "dw-dagster"), "demo", "store-sales", "--json", "--scale", SCALE],
                          cwd=work, env=_env(venv), capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["ok"] and result["verified"], proc.stderr[-3000:]
    assert result["cause"] == "late_rows_behind_watermark"
    assert result["window"] == ["2026-11-26", "2026-11-27"]
    assert result["gap_before"]["Southwest"] == pytest.approx(1.8, abs=0.01)
    assert set(result["gap_after"].values()) == {0.0}
    assert result["receipt_assets"] == ["fct_store_sales_daily", "region_sales_daily", "region_sales_mtd",
                                        "store_sales_line"]
    # everything landed under the empty folder (the default --workdir), the dbt project copied from the wheel
    home = Path(result["store_sales_home"])
    assert home.is_relative_to(work) and (home / "repo" / "dbt_project" / "dbt_project.yml").exists()
    assert "dagster dev -m dw_dagster_examples.store_sales.definitions" in proc.stderr  # no workspace.yaml here
