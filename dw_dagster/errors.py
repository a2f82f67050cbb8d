"""The root of dw_dagster's errors: catch :class:`DwDagsterError` to catch any of them.

Each error says what was wrong and where (the file and field, the table, the change set) and
what to do next; nothing is half-written when one is raised.
"""


class DwDagsterError(Exception):
    """Base class of every error dw_dagster raises on purpose."""


class DwConfigError(DwDagsterError, ValueError):
    """The configuration of the loop does not fit together; the message names the field."""


__all__ = ["DwConfigError", "DwDagsterError"]
