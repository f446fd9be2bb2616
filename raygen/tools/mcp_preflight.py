"""Before the first model call: start each configured MCP server once, in a sandbox of the run's backend
(or on this host for ``shared`` servers, or by URL), and read its ``tools/list``.

A server that does not start, does not answer ``initialize``, or lists no tools stops the run with one
line naming it and the tail of its stderr; no model call is made. What the servers list becomes their
toolsets (``raygen.tools.mcp_tools.mcp_toolset``) in the driver and, shipped in the worker plan, in every
session actor.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from raygen.envs import Environment, EnvSpec, create_environment, environment_class
from raygen.errors import ConfigError, SessionFailure
from raygen.tools.mcp_client import McpConnection
from raygen.tools.mcp_config import McpServerConfig
from raygen.tools.mcp_tools import ActorHost, McpServerListing, server_listing


async def preflight_servers(
    servers: dict[str, McpServerConfig],
    values: dict[str, str],
    env_config: Any,
    *,
    run_name: str,
    name_format: str,
    start_timeout_s: float,
) -> list[McpServerListing]:
    """The listing of every server, in name order; ConfigError (one line) for the first that fails."""
    async with contextlib.AsyncExitStack() as stack:
        env = None
        if any(s.placement == "session" for s in servers.values()):
            backend = environment_class(env_config.type)
            if backend.open_process is Environment.open_process:  # before starting a sandbox for nothing
                stdio = sorted(n for n, s in servers.items() if s.placement == "session")
                raise ConfigError(
                    f"env.type={env_config.type} cannot run stdio MCP servers in a session "
                    f"({', '.join(stdio)}); use local or docker, an HTTP server (url), or shared: true"
                )
            spec = EnvSpec(session_key="mcp-preflight", run_name=run_name)
            try:
                env = await stack.enter_async_context(create_environment(env_config, spec))
            except SessionFailure as exc:
                raise ConfigError(
                    f"MCP pre-flight: cannot start a {env_config.type} environment: {exc}"
                ) from None
        host = ActorHost() if any(s.placement == "actor" for s in servers.values()) else None
        if host is not None:
            stack.callback(host._kill_all)

        async def one(name: str, server: McpServerConfig) -> McpServerListing:
            where = host if server.placement == "actor" else env
            try:
                connection = await McpConnection.open(name, server.resolved(values), where, start_timeout_s)
            except SessionFailure as exc:
                raise ConfigError(f"{exc.detail} (MCP pre-flight on env.type={env_config.type})") from None
            try:
                listing = server_listing(name, server, connection.listing, name_format)
            finally:
                await connection.close()
            if not listing.tool_names:
                raise ConfigError(
                    f"MCP server {name!r} lists no tools" + (" of its 'tools'" if server.tools else "")
                )
            return listing

        results = await asyncio.gather(
            *(one(n, s) for n, s in sorted(servers.items())), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return list(results)  # type: ignore[arg-type]


def run_preflight(
    servers: dict[str, McpServerConfig], values: dict[str, str], env_config: Any, **options: Any
) -> list[McpServerListing]:
    """``preflight_servers`` from synchronous code (the driver)."""
    if not servers:
        return []
    return asyncio.run(preflight_servers(servers, values, env_config, **options))
