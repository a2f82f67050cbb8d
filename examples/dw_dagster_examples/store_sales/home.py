"""Where the store-sales example keeps its files: a pipeline repository working copy and data.

Layout of ``$DW_STORE_SALES_HOME`` (default ``.dw_demo/store_sales`` in the repository, else in
the working directory)::

    repo/                     git working copy the change set's diff applies to
      pipelines/store_sales_line.yaml
      dbt_project/            copy of the examples' dbt project (shipped in the package)
    dbt_profiles/profiles.yml the dbt profile on this home's warehouse file
    data/pos_source.duckdb    the POS consolidation database stand-in
    data/warehouse.duckdb     the embedded warehouse (raw pos.* tables and dbt analytics.*)
    domains.yaml              owners and approvers
    partitions                the load's partitions: daily (default), hourly or weekly
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from dw_dagster_dev.demo import example_dbt_project, mark_new_home, write_dbt_profile

HOME_ENV = "DW_STORE_SALES_HOME"
PACKAGE_DIR = Path(__file__).resolve().parent
PIPELINE_FILE = "pipelines/store_sales_line.yaml"


def home_dir() -> Path:
    """``$DW_STORE_SALES_HOME``, else ``.dw_demo/store_sales`` in the repository (where ``make demo`` puts it)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).resolve()
    repo = PACKAGE_DIR.parents[3]
    root = repo if (repo / "workspace.yaml").exists() else Path.cwd()
    return (root / ".dw_demo" / "store_sales").resolve()


def repo_dir(home: Path) -> Path:
    return home / "repo"


def dbt_dir(home: Path) -> Path:
    return repo_dir(home) / "dbt_project"


def profiles_dir(home: Path) -> Path:
    """The folder of the home's dbt ``profiles.yml`` (outside the working copy: it names this machine's file)."""
    return home / "dbt_profiles"


def source_path(home: Path) -> Path:
    return home / "data" / "pos_source.duckdb"


def warehouse_path(home: Path) -> Path:
    return home / "data" / "warehouse.duckdb"


def domains_path(home: Path) -> Path:
    return home / "domains.yaml"


#: the partitions the example's load may use (``dw-dagster demo store-sales --partitions``)
SHAPES = ("daily", "hourly", "weekly")


def partitions_shape(home: Path) -> str:
    """The home's partitions (its ``partitions`` file; ``daily`` without one)."""
    f = home / "partitions"
    shape = f.read_text().strip() if f.exists() else "daily"
    if shape not in SHAPES:
        raise ValueError(f"{f} says {shape!r}; the store-sales load is partitioned {', '.join(SHAPES)}")
    return shape


def set_partitions_shape(home: Path, shape: str) -> None:
    """Make the home's load ``shape``-partitioned (before anything is loaded)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown partitions {shape!r}; use one of {', '.join(SHAPES)}")
    home.mkdir(parents=True, exist_ok=True)
    (home / "partitions").write_text(shape + "\n")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=dw-demo", "-c", "user.email=dw-demo@localhost", *args],
                   cwd=root, check=True, capture_output=True)


def ensure_home(home: Path) -> Path:
    """Create the working copy (a git repository with the pipeline file and the dbt project), the dbt
    profile and the domains file if missing; returns ``home``."""
    mark_new_home(home)
    repo = repo_dir(home)
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        (repo / "pipelines").mkdir(exist_ok=True)
        shutil.copy(PACKAGE_DIR / PIPELINE_FILE, repo / PIPELINE_FILE)
        shutil.copytree(example_dbt_project(), repo / "dbt_project", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("target", "logs", "dbt_packages", ".user.yml"))
        (repo / ".gitignore").write_text("dbt_project/target/\ndbt_project/logs/\n")
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "store-sales pipeline as deployed")
    (home / "data").mkdir(parents=True, exist_ok=True)
    write_dbt_profile(profiles_dir(home), profile="store_sales", duckdb_path=warehouse_path(home))
    if not domains_path(home).exists():
        shutil.copy(PACKAGE_DIR / "domains.yaml", domains_path(home))
    return home
