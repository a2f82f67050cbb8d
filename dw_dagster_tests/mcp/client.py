"""Calling the MCP server as a client does: the SDK's in-process client (``mcp.Client(server)``)."""

from mcp import Client


async def call(server, name: str, args: dict | None = None):
    """``(structured result, None)`` or ``(None, error text)`` of one tool call."""
    async with Client(server) as c:
        r = await c.call_tool(name, args or {})
    if r.is_error:
        return None, r.content[0].text
    return r.structured_content, None


def assert_clear_error(text: str | None, *must: str) -> None:
    """A tool error that names what is wrong and never shows a stack trace."""
    assert text is not None, "expected a tool error"
    assert "Traceback" not in text and 'File "' not in text, text
    for m in must:
        assert m in text, (m, text)
