"""The orders code location's files inside ``$DW_ORDERS_HOME`` (see :mod:`.home` for the home itself).

Besides ``data/warehouse.duckdb`` (:mod:`.home`), the location keeps::

    data/shop_source.duckdb   shop.orders as the orders service holds it (stand-in for MariaDB)
    dbt_project/              copy of the examples' dbt project (the finance_daily models; shipped in the package)
    dbt_profiles/profiles.yml the dbt profile pointing at this home's warehouse file
    domains.yaml              owners and approvers (copied from the package once; edit it there)
    scale                     the replayed stream's scale, written by the demo

The dbt profile lives in the home, so both example locations can run dbt in one process, each
on its own warehouse file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dw_dagster_examples.orders import home as h
from dw_dagster_dev.demo import example_dbt_project, write_dbt_profile

PACKAGE_DIR = Path(__file__).resolve().parent
SCALE_ENV = "DW_ORDERS_SCALE"
#: the replayed stream's scale when neither ``$DW_ORDERS_SCALE`` nor the home's ``scale`` file says
DEFAULT_SCALE = 0.1


def source_path(home: Path) -> Path:
    """The DuckDB stand-in for the orders service's database."""
    return h.data_dir(home) / "shop_source.duckdb"


def dbt_dir(home: Path) -> Path:
    """The home's copy of the dbt project."""
    return home / "dbt_project"


def profiles_dir(home: Path) -> Path:
    """The folder of the home's dbt ``profiles.yml``."""
    return home / "dbt_profiles"


def domains_path(home: Path) -> Path:
    """The home's domains file (owners, approvers, autonomy)."""
    return home / "domains.yaml"


def scale_path(home: Path) -> Path:
    """The file holding the replayed stream's scale."""
    return home / "scale"


def read_scale(home: Path) -> float:
    """``$DW_ORDERS_SCALE``, else the home's ``scale`` file, else :data:`DEFAULT_SCALE`."""
    if os.environ.get(SCALE_ENV):
        return float(os.environ[SCALE_ENV])
    p = scale_path(home)
    return float(p.read_text().strip()) if p.exists() else DEFAULT_SCALE


def write_scale(home: Path, scale: float) -> None:
    """Record the replayed stream's scale in the home (read by :func:`read_scale`)."""
    scale_path(home).write_text(f"{scale}\n")


def prepare_home(home: Path | None = None) -> Path:
    """Create the home's folders, dbt project copy, profile and domains file when missing; returns the home."""
    home = h.ensure_home(home or h.home_dir())
    if not (dbt_dir(home) / "dbt_project.yml").exists():
        shutil.copytree(example_dbt_project(), dbt_dir(home), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("target", "logs", "dbt_packages", ".user.yml"))
    write_dbt_profile(profiles_dir(home), profile="store_sales", duckdb_path=h.warehouse_path(home))
    if not domains_path(home).exists():
        shutil.copy(PACKAGE_DIR / "domains.yaml", domains_path(home))
    return home


__all__ = ["DEFAULT_SCALE", "SCALE_ENV", "dbt_dir", "domains_path", "prepare_home", "profiles_dir", "read_scale",
           "source_path", "write_scale"]
