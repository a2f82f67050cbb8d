"""Migrations: waves of table pairs, parity proven per pair in Dagster, tracked, closed at a gate the owner signs.

- :mod:`.config` — the ``migration:`` section (waves, pairs, key, slices, sums, time column, gate rule);
- :mod:`.resolve` — every name checked against each engine's catalog at load (``file:line: field: problem``);
- :mod:`.parity`, :mod:`.types`, :mod:`.checks` — schema, counts and sums, key diff, Lightup: asset checks on each target;
- :mod:`.state`, :mod:`.wave` — the wave asset ``migration/<name>/<wave>`` and its job;
- :mod:`.gate` — the sign-off through the approval path, its receipts, reopening;
- :mod:`.diagnose` — a failing pair's cause when its target has no pipeline of its own;
- :mod:`.plan`, :mod:`.status` — ``dw-dagster migration plan`` and ``status``.

Guide: ``docs/guides/migrations.md``; the story: ``docs/stories/migration.md``.
"""
