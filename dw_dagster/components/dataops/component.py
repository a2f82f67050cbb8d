"""``DataOpsComponent``: detect → diagnose → propose → approve → repair → receipt on a project's own assets."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from dw_dagster.dagster_private import public

from dw_dagster.components.dataops.scaffolder import DataOpsScaffolder
from dw_dagster.config import DataOpsConfig


@public
@dg.scaffold_with(DataOpsScaffolder)
class DataOpsComponent(DataOpsConfig, dg.Component):
    """The whole dw_dagster loop on the assets of a Dagster project, from one ``defs.yaml``.

    The assets stay yours (defined in other ``defs`` folders or in Python); this component adds
    the checks that watch them, the incident sensor, the diagnosis job, the approval job, the
    repair jobs and the remediation sensor, verification, receipts, undo, stop/resume, expiry and
    notifications, and the ``dw/control`` asset. Relative paths resolve against the folder of the
    ``defs.yaml``. Fields: :class:`~dw_dagster.config.DataOpsConfig`.

    Scaffold it with ``dg scaffold defs dw_dagster.DataOpsComponent dataops`` and fill in:

    .. code-block:: yaml

        type: dw_dagster.DataOpsComponent
        attributes:
          domains: domains.yaml
          databases:
            source: {url: "{{ env.SOURCE_URL }}"}
            warehouse: {url: "duckdb:///{{ env.DW_WAREHOUSE_PATH }}"}
          assets:
            - key: analytics/orders
              table: analytics.orders
              database: warehouse
              checks:
                reconciliation:
                  source: {database: source, table: shop.orders, asset: shop/orders}
                  slice_by: [region]
                  measures: [amount]
              pipeline:
                incremental_load: {source_database: source, repo: ../../.., file: pipelines/orders.yaml}
          dbt: {project_dir: ../../../dbt_project}

    Partitioned watched assets are found by key in the code location when the jobs resolve; the
    window's partitions are read from them (:func:`~dw_dagster.definitions.build_dw_definitions`
    explains the rules).
    """

    #: the watched assets' partitions, when the repair windows should not take them from the assets:
    #: ``{cadence: daily|hourly|weekly|monthly, start_date: ..., end_date: ..., timezone: ...}``
    partitions: dict | None = None

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from dw_dagster.definitions import build_dw_definitions

        from dw_dagster.migration.resolve import ConfigSource

        self._check_assets_exist(context)
        yaml_file = Path(context.path) / "defs.yaml"
        source = ConfigSource(yaml_file, yaml_file.read_text(), ("attributes",)) if yaml_file.exists() else None
        return build_dw_definitions(self, base_dir=Path(context.path), partitions_def=self._partitions(),
                                    config_source=source)

    def _check_assets_exist(self, context: dg.ComponentLoadContext) -> None:
        """Refuse a watched asset that no other ``defs`` folder defines.

        The other folders' definitions are built through the component tree (Dagster caches them
        and records the dependency), so a misspelt key is an error on this ``defs.yaml`` naming the
        field, not a job that fails to resolve later. Assets defined outside the ``defs`` folder
        (merged in ``definitions.py``) are not seen here: watch those with
        :func:`~dw_dagster.definitions.build_dw_definitions` in Python instead.

        Raises:
            DwConfigError: ``assets[i].key`` names no asset.
        """
        from dw_dagster.errors import DwConfigError

        root, own = Path(context.defs_module_path), Path(context.path).resolve()
        known: set[dg.AssetKey] = set()
        for child in sorted(root.iterdir()):
            if child.name.startswith(("_", ".")) or (child.is_file() and child.suffix not in (".py", ".yaml")):
                continue
            if own == child.resolve() or child.resolve() in own.parents:
                continue
            for a in context.build_defs(child).assets or []:
                known |= set(getattr(a, "keys", None) or [a.key])
        for i, a in enumerate(self.assets):
            if dg.AssetKey.from_user_string(a.key) not in known:
                near = sorted(k.to_user_string() for k in known)[:12]
                raise DwConfigError(f"assets[{i}].key: no asset {a.key!r} in this project's defs folder "
                                    f"(assets there: {', '.join(near) or 'none'})")

    def _partitions(self) -> dg.TimeWindowPartitionsDefinition | None:
        if not self.partitions:
            return None
        p = dict(self.partitions)
        cadence = p.pop("cadence", "daily")
        cls = {"daily": dg.DailyPartitionsDefinition, "hourly": dg.HourlyPartitionsDefinition,
               "weekly": dg.WeeklyPartitionsDefinition, "monthly": dg.MonthlyPartitionsDefinition}[cadence]
        return cls(**p)


__all__ = ["DataOpsComponent"]
