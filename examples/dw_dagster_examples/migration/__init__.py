"""The migration example: an on-premises POS consolidation database moved to the warehouse in two waves.

``dw-dagster demo migration`` (``make demo-migration``) runs it end to end; ``--source postgres``
uses the PostgreSQL server on loopback as the on-premises source instead of a DuckDB file.
"""
