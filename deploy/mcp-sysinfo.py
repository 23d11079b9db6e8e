#!/usr/bin/env python3
"""A small MCP server over stdio with one tool, `status`: how the machine it runs on is doing
(host name, uptime, load, memory, disk). Standard library only, so the demo needs no Python
packages; it speaks the MCP subset a tool host needs (initialize, ping, tools/list, tools/call)
as newline-delimited JSON-RPC 2.0 on stdin/stdout.

Use it from a node's config (its tools then count as `read`):

    [[mcp]]
    name = "sysinfo"
    command = "python3"
    args = ["deploy/mcp-sysinfo.py"]
    tier = "read"
"""

import json
import os
import platform
import shutil
import sys

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

STATUS = {
    "name": "status",
    "description": "How this machine is doing: host name, uptime, load, memory and disk use.",
    "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
}


def gib(n):
    return f"{n / 2**30:.1f} GiB"


def status():
    lines = [f"host {platform.node()} ({platform.system()} {platform.machine()})"]
    try:
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        lines.append(f"up {int(up // 86400)} d {int(up % 86400 // 3600)} h {int(up % 3600 // 60)} min")
    except OSError:
        pass
    try:
        load = os.getloadavg()
        lines.append(f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)}
        lines.append(f"memory {gib(info['MemAvailable'])} free of {gib(info['MemTotal'])}")
    except (OSError, KeyError, ValueError):
        pass
    disk = shutil.disk_usage("/")
    lines.append(f"disk / {disk.used * 100 // disk.total}% used, {gib(disk.free)} free")
    return "; ".join(lines)


def answer(request):
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[0],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "mcp-sysinfo", "version": "1.0.0"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": [STATUS]}
    if method == "tools/call":
        if params.get("name") != "status":
            return {"content": [{"type": "text", "text": f"no tool named {params.get('name')!r}"}],
                    "isError": True}
        return {"content": [{"type": "text", "text": status()}], "isError": False}
    raise LookupError(method)


def main():
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
        else:
            if not isinstance(request, dict) or "id" not in request:
                continue  # a notification (initialized, cancelled): nothing to answer
            try:
                reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}
            except LookupError as e:
                reply = {"jsonrpc": "2.0", "id": request["id"],
                         "error": {"code": -32601, "message": f"method not found: {e}"}}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
