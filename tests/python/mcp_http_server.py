"""A streamable-HTTP MCP server for the mesh's tests, built with the official `mcp` Python SDK.

Usage: python3 mcp_http_server.py CALLS_FILE

It listens on an ephemeral port of 127.0.0.1, prints `port N` on stdout once it does, and
appends every `tools/call` request that reaches it to CALLS_FILE as one JSON line
({"tool": ..., "args": ...}), as the request came, before the SDK checks its arguments: so a
test can tell which calls reached the server and which a node refused before it.
"""

import json
import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

calls_file = sys.argv[1]
server = MCPServer("notes")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def write_note(title: str, text: str) -> str:
    """Store a note under a title."""
    return f"stored note {title!r} ({len(text)} characters)"


class Recorder:
    """ASGI middleware that records each `tools/call` request body as it arrives."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def recording_receive():
            message = await receive()
            if message["type"] == "http.request":
                try:
                    payload = json.loads(message.get("body") or b"null")
                except ValueError:
                    payload = None
                if isinstance(payload, dict) and payload.get("method") == "tools/call":
                    params = payload.get("params") or {}
                    with open(calls_file, "a", encoding="utf-8") as out:
                        line = {"tool": params.get("name"), "args": params.get("arguments")}
                        out.write(json.dumps(line) + "\n")
            return message

        await self.app(scope, recording_receive, send)


sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print(f"port {sock.getsockname()[1]}", flush=True)
uvicorn.Server(uvicorn.Config(Recorder(server.streamable_http_app()), log_level="warning")).run(
    sockets=[sock]
)
