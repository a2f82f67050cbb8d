"""Domains: who owns which assets, who may approve their changes, and how far dw_dagster may act.

A domains file (YAML) is validated by pydantic:

.. code-block:: yaml

    domains:
      - name: store_sales
        assets: [["store_sales_line"], ["fct_store_sales_daily"]]
        approvers: [dana.ortiz@grocer.example]
        escalation: [oncall-data@grocer.example]
        autonomy: L2
        max_window_partitions: 7
        approval_expiry_hours: 24

Autonomy levels follow ``shared/design/DESIGN.md`` §4 (L0 checks only ... L4 autonomous).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dw_dagster.config_files import read_yaml_model

DOMAINS_FILE_ENV = "DW_DOMAINS_FILE"


class DomainsFileError(ValueError):
    """The domains file is missing or invalid; the message names the file and the problem."""


class Domain(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    assets: list[list[str]] = Field(description="asset key paths the domain owns")
    approvers: list[str] = Field(min_length=1, description="people who may approve change sets (emails)")
    escalation: list[str] = Field(default_factory=list)
    autonomy: Literal["L0", "L1", "L2", "L3", "L4"] = "L2"
    max_window_partitions: int = Field(7, ge=1, le=366)
    approval_expiry_hours: float = Field(24, gt=0, le=24 * 14)

    @field_validator("approvers", "escalation")
    @classmethod
    def _lower(cls, v: list[str]) -> list[str]:
        return [x.strip().lower() for x in v]

    def owns(self, asset_key: Sequence[str]) -> bool:
        return list(asset_key) in self.assets

    def may_approve(self, who: str) -> bool:
        return who.strip().lower() in self.approvers


class Domains(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domains: list[Domain]

    def for_asset(self, asset_key: Sequence[str]) -> Domain:
        """The domain owning ``asset_key``.

        Raises:
            KeyError: no domain lists the asset.
        """
        for d in self.domains:
            if d.owns(asset_key):
                return d
        raise KeyError(f"no domain owns asset {'/'.join(asset_key)}")

    def get(self, name: str) -> Domain:
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(f"no domain named {name!r}")


def load_domains(path: str | Path | None = None) -> Domains:
    """Read a domains file (``path``, else ``$DW_DOMAINS_FILE``).

    Raises:
        DomainsFileError: no path given, file missing, not YAML, or invalid.
    """
    path = path or os.environ.get(DOMAINS_FILE_ENV)
    if not path:
        raise DomainsFileError(f"no domains file: pass one or set {DOMAINS_FILE_ENV}")
    return read_yaml_model(path, Domains, DomainsFileError, "domains file")
