"""Row counts of many tables from the warehouses' catalogs, scored against each table's baseline.

:mod:`.counts` reads the counts (one catalog query per warehouse where the engine has one),
:mod:`.history` keeps each table's recorded counts between ticks in the process, :mod:`.store`
in the ledger's database, :mod:`.sensor` scores them and opens incidents.
"""

from dw_dagster.detection.volume.counts import TableCount, VolumeTable, days_ago, fetch_row_counts
from dw_dagster.detection.volume.sensor import build_volume_sensor, watched_asset_keys

__all__ = ["TableCount", "VolumeTable", "build_volume_sensor", "days_ago", "fetch_row_counts", "watched_asset_keys"]
