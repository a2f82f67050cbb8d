"""Repair: the approved stages, claimed in the ledger, run through Dagster jobs."""
