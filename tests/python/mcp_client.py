"""Drives a node's /mcp with the official `mcp` Python client (streamable HTTP).

Usage: mcp_client.py URL KEY OPS

URL is the node's MCP endpoint (http://127.0.0.1:PORT/mcp); KEY is a front-door key sent as
`Authorization: Bearer KEY`, or `-` for none; OPS is a JSON list of operations, run in order
on one connection:

    {"op": "list_tools"}
    {"op": "call", "tool": NAME, "args": {...}, "progress": true, "give_up_after_s": 2}

It prints one JSON object: {"results": [...]}, one result per operation:

    list_tools: {"tools": [names], "schemas": {name: inputSchema},
                 "output_schemas": {name: outputSchema or null}}
    call:       {"is_error": bool, "text": "...", "structured": ..., "progress": [messages]}
                or {"mcp_error": {"code": int, "message": str}} for a JSON-RPC error
                or {"gave_up": true, "progress": [...]} when `give_up_after_s` passed first
                (the call is cancelled, as a user stopping it in a client would)

or {"connect_error": "..."} when the connection itself fails (a refused key). The Rust test
(tests/tests/mcp_server.rs) judges the results; this script only reports them.
"""

import asyncio
import json
import sys

import anyio

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


def flatten(error: BaseException) -> str:
    """The messages of an exception and, for a group, of everything in it."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(flatten(e) for e in error.exceptions)
    if isinstance(error, MCPError):
        return f"MCPError {error.code}: {error.error.message} {error.error.data or ''}"
    return f"{type(error).__name__}: {error}"


async def call(client: Client, op: dict) -> dict:
    messages: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    try:
        with anyio.move_on_after(op.get("give_up_after_s", float("inf"))) as scope:
            result = await client.call_tool(
                op["tool"],
                op.get("args", {}),
                progress_callback=progress if op.get("progress") else None,
            )
        if scope.cancelled_caught:
            return {"gave_up": True, "progress": messages}
    except MCPError as e:
        return {"mcp_error": {"code": e.code, "message": e.error.message}}
    text = "".join(block.text for block in result.content if block.type == "text")
    return {
        "is_error": bool(result.is_error),
        "text": text,
        "structured": result.structured_content,
        "progress": messages,
    }


async def run(url: str, key: str, ops: list) -> dict:
    headers = {} if key == "-" else {"Authorization": f"Bearer {key}"}
    results = []
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            for op in ops:
                if op["op"] == "list_tools":
                    listed = await client.list_tools()
                    results.append(
                        {
                            "tools": [tool.name for tool in listed.tools],
                            "schemas": {tool.name: tool.input_schema for tool in listed.tools},
                            "output_schemas": {
                                tool.name: tool.output_schema for tool in listed.tools
                            },
                        }
                    )
                elif op["op"] == "call":
                    results.append(await call(client, op))
                else:
                    raise ValueError(f"unknown op {op['op']!r}")
    return {"results": results}


def main() -> None:
    url, key, ops = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    try:
        answer = asyncio.run(run(url, key, ops))
    except BaseException as e:  # the connection failed: the test says whether it should have
        answer = {"connect_error": flatten(e)}
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
