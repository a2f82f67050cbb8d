import dagster as dg

from dw_dagster import build_dw_definitions

targets = [dg.AssetSpec(["warehouse", "sales_line"]), dg.AssetSpec(["warehouse", "stores"])]
loop = build_dw_definitions(
    {
        "domains": "domains.yaml",
        "databases": {"pos": {"url": POS_URL}, "warehouse": {"url": WAREHOUSE_URL}},
        "migration": {
            "name": "pos_to_warehouse",
            "waves": [{
                "name": "wave1",
                "domain": "store_sales",
                "pairs": [
                    {"source": {"database": "pos", "table": "pos.sales_line"},
                     "target": {"asset": "warehouse/sales_line", "database": "warehouse", "table": "pos.sales_line"},
                     "key": ["sales_line_id"], "slice_by": ["region"], "sums": ["net_sales"]},
                    {"source": {"database": "pos", "table": "pos.stores"},
                     "target": {"asset": "warehouse/stores", "database": "warehouse", "table": "pos.stores"},
                     "key": ["store_id"]},
                ],
            }],
        },
    },
    assets=targets,
)
defs = dg.Definitions.merge(dg.Definitions(assets=targets), loop)
