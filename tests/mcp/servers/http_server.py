"""An MCP server built with the official SDK, over streamable HTTP on loopback (for tests and bench).

    python http_server.py PORT [TOKEN] [sse]

Tools: ``add`` (a + b) and ``counter`` (a per-process count: the state a remote server keeps). With a
TOKEN (``-`` for none), requests without ``Authorization: Bearer TOKEN`` get 401. With ``sse``, the older
SSE transport (``/sse``) instead of streamable HTTP (``/mcp``).
"""

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

port = int(sys.argv[1])
token = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
sse = "sse" in sys.argv[3:]
server = MCPServer("raygen-test-http")
calls = {"count": 0}


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def counter() -> str:
    """Count the calls this server has had."""
    calls["count"] += 1
    return f"call {calls['count']}"


app = server.sse_app() if sse else server.streamable_http_app()
if token:
    inner = app

    async def app(scope, receive, send):
        headers = dict(scope.get("headers") or [])
        if scope["type"] == "http" and headers.get(b"authorization") != f"Bearer {token}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await inner(scope, receive, send)


uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
