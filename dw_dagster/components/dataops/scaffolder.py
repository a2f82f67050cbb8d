"""``dg scaffold defs dw_dagster.DataOpsComponent <name>``: a ``defs.yaml`` to fill in, and a domains file."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from dagster.components.component_scaffolding import scaffold_component
from pydantic import BaseModel, Field

DOMAINS_TEMPLATE = """\
# Who owns the watched assets, who may approve their change sets, how far dw_dagster may act.
# Approvers prove who they are through your identity provider (OIDC) or Slack; see the README.
domains:
  - name: {name}
    assets: [[{asset}]]
    approvers: [{approver}]
    autonomy: L2                 # propose; every change waits for an approver
    max_window_partitions: 7
identity:
  oidc:
    issuer: {{env: DW_OIDC_ISSUER}}
    audience: dw-dagster
"""


class DataOpsScaffoldParams(BaseModel):
    """What ``dg scaffold defs dw_dagster.DataOpsComponent NAME --json-params '{...}'`` may set."""

    asset: str = Field("analytics/orders", description="the asset key to watch")
    table: str = Field("analytics.orders", description="its table")
    warehouse_url: str = Field("duckdb:///{{ env.DW_WAREHOUSE_PATH }}", description="the warehouse URL")
    approver: str = Field("owner@example.com", description="who approves its change sets")


class DataOpsScaffolder(dg.Scaffolder[DataOpsScaffoldParams]):
    """Writes ``defs.yaml`` (one watched asset with a volume check) and ``domains.yaml`` beside it."""

    @classmethod
    def get_scaffold_params(cls) -> type[DataOpsScaffoldParams]:
        return DataOpsScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[DataOpsScaffoldParams]) -> None:
        params = request.params or DataOpsScaffoldParams()
        scaffold_component(request, {
            "domains": "domains.yaml",
            "databases": {"warehouse": {"url": params.warehouse_url}},
            "assets": [{"key": params.asset, "table": params.table, "database": "warehouse",
                        "checks": {"volume": {"timestamp_column": "updated_at"}}}],
        })
        target = Path(request.target_path) / "domains.yaml"
        if not target.exists():
            target.write_text(DOMAINS_TEMPLATE.format(name=request.target_path.name.replace("-", "_") or "main",
                                                      asset=", ".join(params.asset.split("/")), approver=params.approver))
