"""The orders-stream example (DESIGN.md §3): a change stream with a dead-letter queue.

Orders live in a MySQL-compatible ``shop.orders`` (MariaDB); their change stream lands in the
warehouse table ``analytics.orders``, where ``shipping_country`` is REQUIRED. A release on
Tuesday 2026-11-24 09:00 UTC writes NULL there for gift-card orders; the sink parks those rows
in ``analytics.orders_dlq`` and keeps going, and the day lands 9 % short.

- :mod:`.generator` — deterministic order changes with a ``scale`` knob, calibrated with
  :func:`~.generator.plan` / :func:`~.generator.expected` (3,912 parked rows at scale 1.0).
- :mod:`.cdc` — the MariaDB source table, :func:`~.cdc.apply_changes`, the binlog reader
  :class:`~.cdc.BinlogSource` (``mysql-replication``) and the server-less
  :class:`~.cdc.ReplaySource`; both yield :class:`~.cdc.ChangeEvent` s with resumable
  :class:`~.cdc.SourcePosition` s.
- :mod:`.sink` — :class:`~.sink.CdcSink`: validate, park, batched ``MERGE`` on the key.
- :mod:`.home` — where the example keeps its files.
"""

from dw_dagster_examples.orders.cdc import (
    BinlogSource,
    CdcConfigError,
    ChangeEvent,
    MySQLConnection,
    ReplaySource,
    SourcePosition,
    apply_changes,
)
from dw_dagster_examples.orders.sink import (
    ORDERS_TABLE,
    BatchReport,
    CdcSink,
    Column,
    SinkResult,
    SinkTable,
    coerce_row,
    payload_to_row,
    replay_select_sql,
)

__all__ = [
    "ORDERS_TABLE", "BatchReport", "BinlogSource", "CdcConfigError", "CdcSink", "ChangeEvent", "Column",
    "MySQLConnection", "ReplaySource", "SinkResult", "SinkTable", "SourcePosition", "apply_changes", "coerce_row",
    "payload_to_row", "replay_select_sql",
]
