"""BigQuery bytes billed and slot time per query from ``INFORMATION_SCHEMA.JOBS``, in one statement.

- ``total_bytes_billed`` is what on-demand pricing charges, not ``total_bytes_processed`` (rounded
  up per table, 10 MB minimum per query; dbt-labs/dbt-bigquery#560); processed is reported beside.
- A cache hit bills nothing: counted as 0 whatever the row says.
- A script's parent job (``statement_type = 'SCRIPT'``) reports the sum of its child jobs; only the
  children are counted (doitintl/bigquery-optimization-queries#4), each mapped through its own
  comment and labels, else its parent's.
- Cost in USD is bytes billed / 2^40 × the on-demand price per TiB (a setting; 6.25 by default).
  Under capacity (slot) pricing the slot milliseconds are the measure: reported per dimension too.
- ``metered`` is the period's bytes billed; BigQuery on demand has no idle, so ``idle`` is 0 and
  ``unattributed`` is the bytes of jobs that map to nothing.

The view is ``<project>.region-<region>.INFORMATION_SCHEMA.JOBS`` unless ``jobs_view`` names
another (``dataset.table``, e.g. a seeded copy in tests).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from dw_dagster.cost import mapping as m
from dw_dagster.cost import sqlbuild as sb
from dw_dagster.cost.models import CostError, CostReport, Period
from dw_dagster.databases import Database, DatabaseError, sql

TIB = 2 ** 40
#: on-demand USD per TiB billed (the US multi-region list price when this was written; set yours)
DEFAULT_PRICE_PER_TIB = 6.25


def _label(key: str) -> str:
    return f"(SELECT MAX(l.value) FROM UNNEST(labels) AS l WHERE l.key = '{key}')"


def _rx(col: str, key: str) -> str:
    return f"NULLIF(REGEXP_EXTRACT({col}, r'{m.comment_pattern(key)}'), '')"


_JOB_COLUMNS = ", ".join([
    f"{_rx('query', m.KEYS['node'])} AS c_node", f"{_label(m.KEYS['node'])} AS l_node",
    f"{_rx('query', m.KEYS['run'])} AS c_run", f"{_label(m.KEYS['run'])} AS l_run",
    f"{_rx('query', m.KEYS['asset'])} AS c_asset", f"{_label(m.KEYS['asset'])} AS l_asset",
    f"{_label(m.KEYS['invocation'])} AS l_inv",
    f"{_rx('query', m.KEYS['partition'])} AS c_part", f"{_label(m.KEYS['partition'])} AS l_part",
])

TEMPLATE = f"""
WITH j AS (
  SELECT job_id, parent_job_id, statement_type, project_id,
         IF(COALESCE(cache_hit, FALSE), 0, COALESCE(total_bytes_billed, 0)) AS billed,
         COALESCE(total_bytes_processed, 0) AS processed, COALESCE(total_slot_ms, 0) AS slot_ms,
         {_JOB_COLUMNS}
  FROM :jobs
  WHERE creation_time >= :since AND creation_time < :until AND job_type = 'QUERY'
), p AS (
  SELECT job_id, c_node, l_node, c_run, l_run, c_asset, l_asset, l_inv, c_part, l_part FROM j WHERE statement_type = 'SCRIPT'
), c AS (
  SELECT j.job_id, j.project_id, j.billed, j.processed, j.slot_ms,
         COALESCE(j.c_node, ln.node_id, j.l_node, p.c_node, lp.node_id, p.l_node) AS node_id,
         COALESCE(j.c_asset, j.l_asset, p.c_asset, p.l_asset) AS asset_tag,
         COALESCE(j.c_run, j.l_run, p.c_run, p.l_run) AS run_tag,
         COALESCE(j.l_inv, p.l_inv) AS invocation, COALESCE(j.c_part, j.l_part, p.c_part, p.l_part) AS part
  FROM j LEFT JOIN p ON p.job_id = j.parent_job_id
    LEFT JOIN ln ON ln.label = j.l_node
    LEFT JOIN ln AS lp ON lp.label = p.l_node
  WHERE j.statement_type IS NULL OR j.statement_type != 'SCRIPT'
), pm AS (
  SELECT c.job_id, c.project_id AS wh, c.node_id, COALESCE(c.asset_tag, na.asset_key) AS asset,
         COALESCE(c.run_tag, ir.run_id) AS run_id, c.part, c.billed, c.processed, c.slot_ms,
         IF(c.node_id IS NOT NULL OR c.asset_tag IS NOT NULL OR c.run_tag IS NOT NULL OR ir.run_id IS NOT NULL,
            'attributed', 'unattributed') AS mapped
  FROM c LEFT JOIN na ON na.node_id = c.node_id LEFT JOIN ir ON ir.invocation_id = c.invocation
)
SELECT CASE WHEN GROUPING(part) = 0 THEN 'partition' WHEN GROUPING(node_id) = 0 THEN 'model'
            WHEN GROUPING(asset) = 0 THEN 'asset' WHEN GROUPING(run_id) = 0 THEN 'run'
            WHEN GROUPING(wh) = 0 THEN 'warehouse' ELSE 'mapped' END AS dim,
       CASE WHEN GROUPING(part) = 0 THEN asset || CHR(31) || part ELSE COALESCE(node_id, asset, run_id, wh, mapped) END AS key,
       SUM(billed) AS amount, COUNT(*) AS queries, SUM(processed) AS beside, SUM(slot_ms) AS slot_ms
FROM pm GROUP BY GROUPING SETS ((node_id), (asset), (run_id), (wh), (mapped), (asset, part))
"""

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


@dataclass
class BigQueryCost:
    """BigQuery's ``INFORMATION_SCHEMA.JOBS`` as a cost source.

    Args:
        db: a :class:`~dw_dagster.databases.bigquery.BigQueryDatabase` (the role needs
            ``bigquery.jobs.listAll`` on the project).
        region: the region qualifier (``us``, ``eu``, ``europe-west3``...).
        project: the project whose jobs are read (default the database's).
        jobs_view: another view or table with the same columns (``dataset.table``) instead.
        price_per_tib: on-demand USD per TiB billed.
        node_assets: dbt node id → Dagster asset key ``a/b``; also used to turn dbt's sanitised
            ``node_id`` job label back into the node id.
        invocation_runs: dbt invocation id → Dagster run id.
    """

    db: Database
    region: str = "us"
    project: str | None = None
    jobs_view: str | None = None
    price_per_tib: float = DEFAULT_PRICE_PER_TIB
    node_assets: Mapping[str, str] = field(default_factory=dict)
    invocation_runs: Mapping[str, str] = field(default_factory=dict)

    engine = "bigquery"
    unit = "bytes_billed"

    def view(self) -> exp.Table:
        """The jobs view: ``jobs_view``, else ``<project>.region-<region>.INFORMATION_SCHEMA.JOBS``.

        Raises:
            CostError: a region or project that is not a BigQuery name.
        """
        if self.jobs_view:
            return sql.table(self.jobs_view)
        region = self.region.lower().removeprefix("region-")
        project = self.project or getattr(self.db, "project", None)
        if not _NAME.fullmatch(region) or (project and not re.fullmatch(r"[a-z0-9.:-]{1,128}", project)):
            raise CostError(f"region {self.region!r} / project {project!r} are not BigQuery names")
        return exp.Table(this=exp.to_identifier("INFORMATION_SCHEMA.JOBS", quoted=True),
                         db=exp.to_identifier(f"region-{region}", quoted=True),
                         catalog=exp.to_identifier(project, quoted=True) if project else None)

    def statement(self, period: Period) -> str:
        labels = m.label_nodes(self.node_assets)
        ctes = {"na": sb.lookup(["node_id", "asset_key"], sorted(self.node_assets.items())),
                "ir": sb.lookup(["invocation_id", "run_id"], sorted(self.invocation_runs.items())),
                "ln": sb.lookup(["label", "node_id"], sorted(labels.items()))}
        tree = sb.build(TEMPLATE, "bigquery", ctes=ctes, jobs=self.view(), since=period.start, until=period.end)
        return tree.sql(dialect=self.db.dialect)

    def report(self, period: Period) -> CostReport:
        """Bytes billed of ``period``, attributed and unattributed, with slot time and USD (one statement).

        Raises:
            CostError: the view is missing or unreadable.
        """
        text = self.statement(period)
        try:
            rows = self.db.fetch_all(text)
        except DatabaseError as e:
            raise CostError(f"the BigQuery cost report failed on {self.db.name}: {str(e).splitlines()[0]}") from e
        return self.from_rows(rows, period, text)

    def from_rows(self, rows: list[tuple], period: Period, text: str) -> CostReport:
        parts = sb.rows_to_parts(r[:5] for r in rows)
        slot = {(str(r[0]), "" if r[1] is None else str(r[1])): int(r[5] or 0) for r in rows}
        mapped = parts.get("mapped", {})
        att, un = mapped.get("attributed", (0.0, 0, 0.0)), mapped.get("unattributed", (0.0, 0, 0.0))
        metered = att[0] + un[0]

        def usd(b: float) -> float:
            return b / TIB * self.price_per_tib

        by = {d: sb.amounts(parts.get(d, {})) for d in ("model", "asset", "run", "warehouse")}
        report = CostReport(
            period=period, engine="bigquery", unit="bytes_billed", metered=metered, attributed=att[0], idle=0.0,
            unattributed=un[0], by_model=by["model"], by_asset=by["asset"], by_run=by["run"], by_warehouse=by["warehouse"],
            by_partition=sb.partitions(parts.get("partition", {})),
            queries={"total": att[1] + un[1], "attributed": att[1], "unattributed": un[1]},
            queries_by={d: sb.counts(parts.get(d, {})) for d in ("model", "asset", "run", "warehouse")},
            unattributed_detail={"jobs_mapping_to_nothing": un[0]},
            beside={"bytes_processed": (att[2] or 0.0) + (un[2] or 0.0),
                    "note": "bytes processed is not what on-demand pricing bills; bytes billed is (rounded up, 10 MB minimum)"},
            extra={"price_per_tib": self.price_per_tib, "usd": usd(metered), "usd_attributed": usd(att[0]),
                   "usd_by_model": {k: usd(v) for k, v in by["model"].items()},
                   "usd_by_asset": {k: usd(v) for k, v in by["asset"].items()},
                   "slot_ms": slot.get(("mapped", "attributed"), 0) + slot.get(("mapped", "unattributed"), 0),
                   "slot_ms_by_model": {k: slot.get(("model", k), 0) for k in by["model"]},
                   "slot_ms_by_asset": {k: slot.get(("asset", k), 0) for k in by["asset"]},
                   "slot_ms_by_run": {k: slot.get(("run", k), 0) for k in by["run"]}},
            sql=text,
            notes=["cache hits bill 0 bytes; a script's parent job is left out and its child jobs counted once",
                   "on demand has no idle; under capacity pricing read the slot milliseconds"])
        return report.sealed()


__all__ = ["DEFAULT_PRICE_PER_TIB", "TEMPLATE", "TIB", "BigQueryCost"]
