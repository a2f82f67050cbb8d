"""The ``dw-dagster`` command line (:mod:`.main`; the decision commands in :mod:`.decisions`)."""

from dw_dagster.cli.main import main

__all__ = ["main"]
