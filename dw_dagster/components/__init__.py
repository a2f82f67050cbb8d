"""The dw_dagster Component: the whole loop from one ``defs.yaml``."""

from dw_dagster.components.dataops.component import DataOpsComponent

__all__ = ["DataOpsComponent"]
