"""The MCP servers of one session, and what a session runner needs to know to give them to it.

A session's servers start at its first call of one of their tools (a session that never calls them pays
nothing), inside the session's environment, and stop with it: ``McpSessionServers.close`` runs before
the environment closes, and the environment's own close stops whatever is left. A row's own
``mcp_servers`` start before the session's first model call instead: their tools must be listed first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raygen.tools.base import ToolContext, Toolset
from raygen.tools.mcp_client import McpConnection
from raygen.tools.mcp_config import McpServerConfig
from raygen.tools.mcp_tools import McpServerListing, mcp_toolset, server_listing, shared_connection


@dataclass
class McpSettings:
    """What a ``SessionRunner`` knows of MCP: the run's servers (as pre-flighted), the driver's values of
    the variables they reference, and the ``tools.mcp_*`` options."""

    listings: dict[str, McpServerListing] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict, repr=False)
    name_format: str = "{server}__{tool}"
    start_timeout_s: float = 60.0
    call_timeout_s: float = 60.0

    @classmethod
    def of(cls, tools: Any, listings: list[McpServerListing], values: Mapping[str, Any]) -> McpSettings:
        """From the ``tools`` config section, the plan's listings and ``mcp_env`` (SecretStr or str)."""
        plain = {k: v.get_secret_value() if hasattr(v, "get_secret_value") else v for k, v in values.items()}
        return cls(
            {listing.name: listing for listing in listings},
            plain,
            tools.mcp_tool_name_format,
            tools.mcp_start_timeout_s,
            tools.mcp_call_timeout_s,
        )

    def for_session(
        self, toolsets: list[str], row_servers: Mapping[str, McpServerConfig] | None
    ) -> McpSessionServers | None:
        """The servers of a session offered ``toolsets`` (None when it has none)."""
        offered = [self.listings[name] for name in toolsets if name in self.listings]
        if not offered and not row_servers:
            return None
        return McpSessionServers(self, offered)


class McpSessionServers:
    """One session's MCP servers: connections started on first use, all stopped by ``close``."""

    def __init__(self, settings: McpSettings, listings: list[McpServerListing]):
        self.settings = settings
        self.call_timeout_s = settings.call_timeout_s
        self.listings = {listing.name: listing for listing in listings}
        self.started: dict[str, McpConnection] = {}
        self._starting: dict[str, asyncio.Future[McpConnection]] = {}

    async def connection(self, name: str, ctx: ToolContext) -> McpConnection:
        """The session's connection to ``name``, started on first use (once, however many calls ask)."""
        if name in self.started:
            return self.started[name]
        settings = self.settings
        server = self.listings[name].config.resolved(settings.values)
        if server.shared:
            return await shared_connection(name, server, settings.start_timeout_s)
        task = self._starting.get(name)
        if task is None:
            task = asyncio.ensure_future(McpConnection.open(name, server, ctx.env, settings.start_timeout_s))
            self._starting[name] = task
        connection = await asyncio.shield(task)
        self.started[name] = connection
        return connection

    async def start_row_servers(
        self, servers: Mapping[str, McpServerConfig], ctx: ToolContext
    ) -> list[Toolset]:
        """Start a row's own servers now and return their toolsets (their tools join the offer)."""
        toolsets = []
        for name, config in servers.items():
            self.listings[name] = McpServerListing(name, config, listing=None)  # type: ignore[arg-type]
            connection = await self.connection(name, ctx)
            listing = server_listing(name, config, connection.listing, self.settings.name_format)
            self.listings[name] = listing
            toolsets.append(mcp_toolset(listing))
        return toolsets

    def records(self) -> list[dict[str, Any]]:
        """The session's servers as its record lists them."""
        return [listing.record() for _, listing in sorted(self.listings.items()) if listing.listing]

    async def close(self) -> None:
        """Stop every server this session started (in parallel), even one still starting. Idempotent."""
        starting, self._starting = self._starting, {}
        for task in starting.values():
            if not task.done():
                task.cancel()
        results = await asyncio.gather(*starting.values(), return_exceptions=True)
        connections = {*self.started.values(), *(r for r in results if isinstance(r, McpConnection))}
        self.started.clear()
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
