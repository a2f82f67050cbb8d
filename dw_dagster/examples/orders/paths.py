"""The orders code location's files inside ``$DW_ORDERS_HOME`` (see :mod:`.home` for the home itself).

Besides ``data/warehouse.duckdb`` (:mod:`.home`), the location keeps::

    data/shop_source.duckdb   shop.orders as the orders service holds it (stand-in for MariaDB)
    dbt_project/              copy of the repository's dbt_project/ (the finance_daily models)
    dbt_profiles/profiles.yml the dbt profile pointing at this home's warehouse file
    domains.yaml              owners and approvers (copied from the package once; edit it there)
    scale                     the replayed stream's scale, written by the demo

The dbt profile lives in the home (not in ``dbt_project/profiles.yml``, which reads
``$DW_WAREHOUSE_PATH`` for the store-sales location), so both locations can run dbt in one
process without sharing an environment variable.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from dw_dagster.examples.orders import home as h

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


def template_dbt_project() -> Path:
    """The repository's ``dbt_project/`` (the package is installed editable from the repository)."""
    from dw_dagster.examples.store_sales.home import template_dbt_project as store_sales_template

    return store_sales_template()


def profiles_yml(warehouse: Path) -> str:
    """A dbt ``profiles.yml`` for the project's profile (``store_sales``) on one DuckDB file."""
    return ("# Written by dw_dagster's orders example: the finance_daily models build in this home's warehouse.\n"
            "store_sales:\n  target: duckdb\n  outputs:\n    duckdb:\n      type: duckdb\n"
            f"      path: {json.dumps(str(warehouse))}\n      schema: analytics\n      threads: 1\n")


def prepare_home(home: Path | None = None) -> Path:
    """Create the home's folders, dbt project copy, profile and domains file when missing; returns the home."""
    home = h.ensure_home(home or h.home_dir())
    if not (dbt_dir(home) / "dbt_project.yml").exists():
        shutil.copytree(template_dbt_project(), dbt_dir(home), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("target", "logs", "dbt_packages", ".user.yml"))
    profiles_dir(home).mkdir(parents=True, exist_ok=True)
    text = profiles_yml(h.warehouse_path(home))
    prof = profiles_dir(home) / "profiles.yml"
    if not prof.exists() or prof.read_text() != text:
        prof.write_text(text)
    if not domains_path(home).exists():
        shutil.copy(PACKAGE_DIR / "domains.yaml", domains_path(home))
    return home


__all__ = ["DEFAULT_SCALE", "SCALE_ENV", "dbt_dir", "domains_path", "prepare_home", "profiles_dir", "read_scale",
           "source_path", "write_scale"]
