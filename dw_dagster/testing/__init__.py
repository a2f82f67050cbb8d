"""Public test utilities: the in-process sensor runner (:mod:`.local_daemon`).

The fake vendor servers and the demos' harness are in the ``dw-dagster-examples`` distribution
(``dw_dagster_dev``), outside the wheel."""
