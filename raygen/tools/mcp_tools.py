"""MCP servers as toolsets: each server is a toolset named after it, each of its tools a ``Tool``
offered as ``<server>__<tool>`` with the server's own JSON schema.

A session's servers start at its first call of one of their tools (a session that never calls them
pays nothing), inside the session's environment, and stop with it (``McpSessionServers.close``, before
the environment closes). ``shared: true`` servers run once per session actor process, on its host, and
serve every session of the process (``shared_connection``).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from raygen.envs.processes import kill_group, kill_process_trees
from raygen.envs.stdio_process import HostProcess
from raygen.errors import SessionFailure
from raygen.tools.base import Tool, ToolContext, ToolResult, Toolset
from raygen.tools.mcp_client import McpConnection, McpListing
from raygen.tools.mcp_config import McpServerConfig, tool_name


@dataclass
class McpServerListing:
    """A configured server as the driver's pre-flight found it: what the session actors build its toolset
    from (picklable; ``config`` still holds ``${VAR}`` references, resolved where the server starts)."""

    name: str
    config: McpServerConfig
    listing: McpListing
    tool_names: dict[str, str] = field(default_factory=dict)
    """Offered name -> the server's own tool name."""

    def record(self) -> dict[str, Any]:
        """How a record lists the server: name, transport, placement, what it reported, the tools."""
        return {
            "name": self.name,
            "transport": self.config.transport,
            "placement": self.config.placement,
            "server_info": self.listing.server_info,
            "tools": sorted(self.tool_names),
        }


class McpTool(Tool):
    """One tool of one MCP server."""

    def __init__(self, server: str, offered_name: str, spec: dict[str, Any]):
        self.server = server
        self.mcp_name = str(spec["name"])
        self.name = offered_name
        self.description = str(spec.get("description") or spec.get("title") or self.mcp_name)
        schema = spec.get("inputSchema")
        self.parameters = schema if isinstance(schema, dict) else {"type": "object", "properties": {}}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        servers = ctx.mcp  # raygen.tools.mcp_session.McpSessionServers
        if servers is None:
            return ToolResult.error(f"MCP server {self.server!r} is not available in this session")
        connection = await servers.connection(self.server, ctx)
        try:
            result = await connection.call(self.mcp_name, args, servers.call_timeout_s)
        except TimeoutError:
            return ToolResult.error(f"{self.name} timed out after {servers.call_timeout_s:g} s", "timeout")
        except SessionFailure:
            raise
        except Exception as exc:  # the SDK's MCPError: the server refused this one call
            return ToolResult.error(f"{self.name}: {exc}", "execution")
        return mcp_result(result)


def mcp_result(result: Any) -> ToolResult:
    """A ``CallToolResult`` as the tool message: text parts joined; structured content as JSON when
    there is no text; images, audio and binary resources as a placeholder line (the message is text);
    ``isError`` a tool failure."""
    parts: list[str] = []
    for item in result.content or ():
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind in ("image", "audio"):
            size = len(item.data) * 3 // 4 - item.data[-2:].count("=")  # base64
            parts.append(f"[{kind} {item.mime_type}, {size} bytes: not shown, text-only transcript]")
        elif kind == "resource_link":
            parts.append(f"[resource {item.uri}]")
        elif kind == "resource":
            text = getattr(item.resource, "text", None)
            parts.append(text if text is not None else f"[binary resource {item.resource.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if result.is_error:
        return ToolResult.json(
            {"error": text or "the tool reported an error"}, ok=False, error_kind="execution"
        )
    return ToolResult(ok=True, content=text)


def mcp_toolset(listing: McpServerListing) -> Toolset:
    """The toolset of a pre-flighted server."""
    specs = {str(spec["name"]): spec for spec in listing.listing.tools}
    tools = [McpTool(listing.name, offered, specs[real]) for offered, real in listing.tool_names.items()]
    return Toolset(
        listing.name, tools, description=f"MCP server {listing.name} ({listing.listing.server_info})"
    )


def server_listing(
    name: str, config: McpServerConfig, listing: McpListing, name_format: str
) -> McpServerListing:
    """Name the server's tools for the model (only those of ``config.tools``, if given)."""
    wanted = set(config.tools) if config.tools is not None else None
    names = {
        tool_name(name_format, name, str(spec["name"])): str(spec["name"])
        for spec in listing.tools
        if wanted is None or spec["name"] in wanted
    }
    return McpServerListing(name, config, listing, names)


class ActorHost:
    """Where ``shared`` servers run: host processes of the session actor in a scratch folder, with only
    PATH, HOME and the server's own variables; their groups are killed when the process exits."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="raygen-mcp-shared-")
        self.groups: set[int] = set()
        atexit.register(self._kill_all)

    async def open_process(self, argv: list[str], env: dict[str, str], cwd: str | None) -> HostProcess:
        base = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": self.folder}
        where = os.path.join(self.folder, cwd.lstrip("/")) if cwd else self.folder
        os.makedirs(where, exist_ok=True)
        return await HostProcess.start(argv, env={**base, **env}, cwd=where, groups=self.groups)

    def _kill_all(self) -> None:
        kill_process_trees(set(self.groups))
        for pgid in self.groups:
            kill_group(pgid)


_shared: dict[tuple[int, str], asyncio.Task[McpConnection]] = {}
_actor_host: ActorHost | None = None


async def shared_connection(name: str, server: McpServerConfig, start_timeout_s: float) -> McpConnection:
    """This process's connection to a ``shared`` server (per event loop), started on first use; one that
    was lost is started again for the next session that asks."""
    global _actor_host
    key = (id(asyncio.get_running_loop()), name)
    task = _shared.get(key)
    if task is not None and task.done() and (task.exception() is not None or task.result()._lost):
        task = None
    if task is None:
        _actor_host = _actor_host or ActorHost()
        task = asyncio.ensure_future(McpConnection.open(name, server, _actor_host, start_timeout_s))  # type: ignore[arg-type]
        _shared[key] = task
    return await asyncio.shield(task)


async def close_shared() -> None:
    """Stop this process's shared servers (tests; a session actor's end kills them through atexit)."""
    tasks = [task for task in _shared.values() if task.done() and task.exception() is None]
    _shared.clear()
    await asyncio.gather(*(task.result().close() for task in tasks), return_exceptions=True)
