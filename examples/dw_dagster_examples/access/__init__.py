"""The access-request example: a grocer's analyst asks for a time-bound grant on PostgreSQL.

Two domains own the tables a role opens: ``finance`` the ledger, ``crm`` the customers (with
e-mail and phone columns, which the review's rules find sensitive). Sam asks for Dana; both
owners approve; the grant runs, Sam is reminded, and the grant is revoked and verified at its end.

- :mod:`.definitions` — the code location (``dagster dev -m dw_dagster_examples.access.definitions``);
- :mod:`.demo` — ``dw-dagster demo access`` on the embedded Dagster instance and a PostgreSQL server.
"""
