"""Where the orders example keeps its files.

Layout of ``$DW_ORDERS_HOME`` (default ``.dw_demo/orders`` in the repository)::

    data/warehouse.duckdb     the embedded warehouse: analytics.orders, analytics.orders_dlq,
                              analytics.orders_cdc_state (the sink's position)

The source needs no file: the demo's default path replays the generator's change stream
(:class:`~dw_dagster_examples.orders.cdc.ReplaySource`); a real MariaDB/MySQL source is named by
``DW_ORDERS_SOURCE_URL`` (``mysql://user:password@host:port``, read from the environment only).
"""

from __future__ import annotations

import os
from pathlib import Path

from dw_dagster_dev.demo import mark_new_home

HOME_ENV = "DW_ORDERS_HOME"
SOURCE_URL_ENV = "DW_ORDERS_SOURCE_URL"
PACKAGE_DIR = Path(__file__).resolve().parent


def home_dir() -> Path:
    """``$DW_ORDERS_HOME``, else ``.dw_demo/orders`` in the repository (beside the store-sales demo's home)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).resolve()
    repo = PACKAGE_DIR.parents[3]
    root = repo if (repo / "workspace.yaml").exists() else Path.cwd()
    return (root / ".dw_demo" / "orders").resolve()


def data_dir(home: Path) -> Path:
    return home / "data"


def warehouse_path(home: Path) -> Path:
    """The embedded warehouse file (DuckDB)."""
    return data_dir(home) / "warehouse.duckdb"


def ensure_home(home: Path | None = None) -> Path:
    """Create the home's folders if missing; returns the home."""
    home = home or home_dir()
    mark_new_home(home)
    data_dir(home).mkdir(parents=True, exist_ok=True)
    return home
