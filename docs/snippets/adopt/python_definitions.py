import dagster as dg
from dw_dagster import build_dw_definitions

from shop_data.assets import sales  # your own asset: its partitions give the repair window

# dataops.yaml holds the same fields as the `attributes:` of defs.yaml above
defs = dg.Definitions.merge(
    dg.Definitions(assets=[sales]),
    build_dw_definitions("dataops.yaml", assets=[sales]),
)
