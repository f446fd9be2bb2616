"""One connection to one MCP server, through the ``mcp`` SDK's ``ClientSession``.

A stdio server is a process of the session's environment (``Environment.open_process``); its stdout is
read line by line here, so a line that is not JSON-RPC (a server that prints a banner or logs to stdout)
is skipped and remembered for messages instead of ending the connection. HTTP servers use the SDK's
streamable-HTTP and SSE transports.

The SDK's contexts (anyio task groups) must be left by the task that entered them, while a session
calls tools from several tasks: each connection therefore lives in a task of its own, which opens it,
waits until ``close``, and closes it, whatever happened meanwhile.

Failures: a server that does not start, does not answer ``initialize`` in time, dies, or stops answering
(a call timed out and a ping then went unanswered) raises ``SessionFailure("mcp_server_lost")`` with the
tail of its stderr; ``isError`` results and protocol errors of one call are tool failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from raygen.envs.base import Environment, EnvProcess
from raygen.errors import MissingExtraError, SessionFailure
from raygen.tools.mcp_config import McpServerConfig

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 5.0
"""After a call timed out: a server that does not answer a ping within this is taken for hung."""
JUNK_KEPT = 3
"""Non-protocol stdout lines kept for messages."""


def import_mcp() -> Any:
    """The ``mcp`` SDK, or MissingExtraError naming the extra that installs it."""
    try:
        import mcp
        import mcp_types  # noqa: F401  (the SDK's message types)
    except ImportError as exc:
        raise MissingExtraError("mcp", "mcp") from exc
    return mcp


@dataclass
class McpListing:
    """What a server offers: its reported name and version, and its tools (MCP ``Tool`` objects as
    plain dicts: ``name``, ``description``, ``inputSchema``)."""

    server_info: str
    tools: list[dict[str, Any]] = field(default_factory=list)


class McpConnection:
    """A live connection (see the module docstring). ``await McpConnection.open(...)``; ``close()``."""

    def __init__(self, name: str, server: McpServerConfig):
        self.name = name
        self.server = server
        self.listing = McpListing("")
        self.session: Any = None
        self.process: EnvProcess | None = None
        self._junk: deque[str] = deque(maxlen=JUNK_KEPT)
        self._lost: str | None = None
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Read by open(); a failure after nobody waits any more must not be logged as never retrieved.
        self._ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._owner: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, name: str, server: McpServerConfig, env: Environment | None, start_timeout_s: float
    ) -> McpConnection:
        """Start (stdio: inside ``env``) and initialize the server, and read its tools."""
        import_mcp()
        connection = cls(name, server)
        connection._owner = asyncio.create_task(connection._own(env), name=f"mcp-{name}")
        try:
            async with asyncio.timeout(start_timeout_s):
                await asyncio.shield(connection._ready)
        except TimeoutError:
            await connection.close()
            why = f"did not answer initialize and tools/list within {start_timeout_s:g} s"
            raise connection.lost(why) from None
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _own(self, env: Environment | None) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._transport(stack, env)
                from mcp import ClientSession

                self.session = await stack.enter_async_context(ClientSession(read, write))
                initialized = await self.session.initialize()
                info = initialized.server_info
                self.listing = McpListing(
                    f"{info.name} {info.version or ''}".strip(), await self._list_tools()
                )
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                await self._settle()
                if not isinstance(exc, SessionFailure):
                    exc = self.lost(self._ended() if self._gone() else f"did not start: {_describe(exc)}")
                self._ready.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def _transport(self, stack: contextlib.AsyncExitStack, env: Environment | None) -> tuple[Any, Any]:
        server = self.server
        if server.transport == "stdio":
            if env is None:
                raise SessionFailure("mcp_server_lost", f"MCP server {self.name!r}: no environment to run in")
            argv = [str(server.command), *server.args]
            self.process = await env.open_process(argv, dict(server.env), server.cwd)
            stack.push_async_callback(self.process.close)
            return await stack.enter_async_context(_stdio_streams(self.process, self._junk))
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        if server.transport == "sse":
            streams = await stack.enter_async_context(
                sse_client(str(server.url), headers=dict(server.headers))
            )
        else:
            http = await stack.enter_async_context(create_mcp_http_client(headers=dict(server.headers)))
            streams = await stack.enter_async_context(
                streamable_http_client(str(server.url), http_client=http)
            )
        return streams[0], streams[1]

    async def _list_tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor = None
        while True:
            from mcp_types import PaginatedRequestParams

            params = PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self.session.list_tools(params=params)
            tools += [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return tools

    def lost(self, why: str) -> SessionFailure:
        """The failure of a server that is gone or hung, with what it said last."""
        detail = f"MCP server {self.name!r} {why}"
        if self.process is not None:
            tail = self.process.stderr_tail()
            if tail:
                detail += f"; stderr: ...{tail[-300:]}"
        if self._junk:
            detail += f"; it also wrote non-protocol lines to stdout, last: {self._junk[-1][:200]!r}"
        return SessionFailure("mcp_server_lost", detail)

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The SDK's ``CallToolResult``. Raises ``TimeoutError`` (the server still answers pings),
        ``SessionFailure("mcp_server_lost")`` (it is gone or hung), or the SDK's ``MCPError`` (a protocol
        error of this one call, e.g. invalid arguments: the tool's failure)."""
        if self._lost:
            raise self.lost(self._lost)
        try:
            async with asyncio.timeout(timeout_s):
                return await self.session.call_tool(tool, arguments)
        except TimeoutError:
            if not await self._answers_ping():
                self._lost = f"stopped answering (a call ran past {timeout_s:g} s and a ping went unanswered)"
                raise self.lost(self._lost) from None
            raise
        except Exception as exc:
            if _is_protocol_error(exc) and not self._gone():
                raise
            await self._settle()
            self._lost = self._ended() if self._gone() else f"failed: {_describe(exc)}"
            raise self.lost(self._lost) from None

    async def _answers_ping(self) -> bool:
        try:
            async with asyncio.timeout(PING_TIMEOUT_S):
                await self.session.send_ping()
        except Exception:
            return False
        return True

    async def _settle(self, wait_s: float = 1.0) -> None:
        """Its stdout ended: give the process a moment to be seen exiting, so the message can say so."""
        deadline = time.monotonic() + wait_s
        while self.process is not None and not self.process.exited() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def _gone(self) -> bool:
        return self.process is not None and self.process.exited()

    def _ended(self) -> str:
        code = self.process.exit_code() if self.process is not None else None
        if code == 127:
            return "ended at once with exit code 127: its command was not found in the environment"
        return "ended" if code is None else f"ended (exit code {code})"

    async def close(self) -> None:
        """Stop the connection and the server's processes; idempotent, safe after a failed open."""
        self._stop.set()
        if self._owner is None:
            return
        owner, self._owner = self._owner, None
        if not self._ready.done() or self._ready.exception() is not None:
            owner.cancel()  # still starting (or hung in initialize): nothing waits for the stop signal
        try:
            async with asyncio.timeout(10):
                await asyncio.shield(owner)
        except (TimeoutError, asyncio.CancelledError) as exc:
            owner.cancel()
            if self.process is not None:
                await self.process.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("MCP server %s: closing took over 10 s; its process was stopped", self.name)
        except Exception:
            log.debug("MCP server %s: closing failed", self.name, exc_info=True)


def _is_protocol_error(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError

    return isinstance(exc, MCPError) and "closed" not in str(exc).lower()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@contextlib.asynccontextmanager
async def _stdio_streams(process: EnvProcess, junk: deque[str]):
    """The SDK's stream pair over a process's stdin and stdout, one JSON-RPC message per line."""
    import anyio
    from mcp.shared.message import SessionMessage
    from mcp_types import jsonrpc_message_adapter

    to_session, from_server = anyio.create_memory_object_stream(0)
    to_server, from_session = anyio.create_memory_object_stream(0)

    async def read_lines() -> None:
        async with to_session:
            with contextlib.suppress(ConnectionError, anyio.ClosedResourceError, anyio.BrokenResourceError):
                while line := await process.readline():
                    try:
                        message = jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError:
                        if line.strip():
                            junk.append(line.decode("utf-8", "replace").strip())
                        continue  # tolerated: a banner or a log line on stdout is not the server's answer
                    await to_session.send(SessionMessage(message))

    async def write_messages() -> None:
        async with from_session:
            with contextlib.suppress(ConnectionError, anyio.ClosedResourceError, anyio.BrokenResourceError):
                async for item in from_session:
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.write(data.encode())

    pumps = [asyncio.create_task(read_lines()), asyncio.create_task(write_messages())]
    try:
        yield from_server, to_server
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for stream in (from_server, to_server):
            await stream.aclose()
