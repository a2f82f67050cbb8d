"""Field cases of the MCP server's arguments (:mod:`dw_dagster.mcp`): times as AI clients send
them — ISO 8601 with an offset or ``Z`` (JavaScript's ``toISOString``), nanoseconds, an epoch
number — read as the instant they name, or refused naming the text."""

import datetime as dt

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from dw_dagster.mcp.incidents import parse_since
from dw_dagster_tests.field_cases.kinds import kind

KINDS = [
    kind("mcp-since-offsets", "time", "an MCP client's `since` with a UTC offset, Z, nanoseconds or an epoch number",
         "https://github.com/gavdilabs/cap-mcp-plugin/issues/102", "dw_dagster/mcp/incidents.py",
         "test_since_is_the_instant_the_text_names_or_refused", False),
]

UTC = dt.timezone.utc


@pytest.mark.parametrize("text,instant", [
    ("2026-11-26T08:00:00+08:00", dt.datetime(2026, 11, 26, 0, 0, tzinfo=UTC)),
    ("2026-11-26T08:00:00+0800", dt.datetime(2026, 11, 26, 0, 0, tzinfo=UTC)),
    ("2026-11-26T08:00:00.123Z", dt.datetime(2026, 11, 26, 8, 0, 0, 123000, tzinfo=UTC)),
    ("2026-11-26T08:00:00.123456789Z", dt.datetime(2026, 11, 26, 8, 0, 0, 123456, tzinfo=UTC)),
    ("2026-11-26T08:00:00+14:00", dt.datetime(2026, 11, 25, 18, 0, tzinfo=UTC)),
    ("2026-11-26", dt.datetime(2026, 11, 26, tzinfo=UTC)),
])
def test_since_is_the_instant_the_text_names_or_refused(text, instant):
    """cap-mcp-plugin #102 (https://github.com/gavdilabs/cap-mcp-plugin/issues/102): AI agents send
    times "as ISO 8601 strings, e.g. 2026-01-06T16:04:43+08:00", and the tool refused them. Right
    answer (Python's own reading of the offset): ``since`` is that instant in UTC (a date alone
    is its UTC midnight); text that names no instant (an epoch number, a zone name, ``Z`` after a
    bare date) is refused, the message quoting it and the accepted forms."""
    assert parse_since(text) == instant
    for bad in ("1732608000", "2026-11-26 08:00 America/New_York", "2026-11-26Z"):
        with pytest.raises(ToolError, match=r"is not a date: give 2026-11-26, 2026-11-26T08:00:00Z, 7d or 24h") as e:
            parse_since(bad)
        assert bad in str(e.value)
