"""A process in a session's container with its stdin attached (``DockerEnvironment.open_process``).

docker-py attaches an exec's stdin only through a blocking socket (one thread per server for its whole
life); here the exec is started on the engine's socket by asyncio itself: ``POST /exec/ID/start`` with
``Upgrade: tcp``, after which the connection carries the process's stdin one way and its multiplexed
stdout/stderr frames (8-byte header: stream id, length) the other. Nothing blocks a thread.

The process carries ``RAYGEN_EXEC_ID`` like every command of the backend, so ``close`` kills it and all
it started inside the container (the kill-by-tag script); removing the container ends it too.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import struct
from contextlib import suppress
from typing import Any
from urllib.parse import urlparse

from raygen.envs.base import EnvProcess
from raygen.envs.docker_engine import engine_address, run_blocking
from raygen.envs.processes import EXEC_ID_VAR
from raygen.envs.stdio_process import LINE_LIMIT, StderrTail
from raygen.errors import ConfigError, SessionFailure

_FRAME_HEADER = struct.Struct(">BxxxL")
_STDOUT, _STDERR = 1, 2


async def _connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parsed = urlparse(address)
    if parsed.scheme in ("unix", "http+unix"):
        return await asyncio.open_unix_connection(parsed.path, limit=LINE_LIMIT)
    if parsed.scheme in ("tcp", "http"):
        return await asyncio.open_connection(parsed.hostname, parsed.port or 2375, limit=LINE_LIMIT)
    raise ConfigError(f"stdio MCP servers on Docker need a unix:// or tcp:// engine address, not {address}")


class DockerProcess(EnvProcess):
    """One attached exec (see the module docstring)."""

    def __init__(self, env: Any, exec_tag: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._env = env
        self._tag = exec_tag
        self._socket_reader, self._writer = reader, writer
        self._stdout = asyncio.StreamReader(limit=LINE_LIMIT)
        self._stderr = StderrTail()
        self._demux = asyncio.ensure_future(self._read_frames())
        self._closed = False

    @classmethod
    async def start(cls, env: Any, argv: list[str], variables: dict[str, str], cwd: str) -> DockerProcess:
        """Create and start the exec in ``env``'s container (a ``DockerEnvironment``)."""
        container_id = env._require_running()
        tag = secrets.token_hex(12)
        api = env._client.api
        try:
            created = await run_blocking(
                env.config,
                api.exec_create,
                container_id,
                argv,
                stdin=True,
                environment={**variables, EXEC_ID_VAR: tag},
                workdir=cwd,
            )
            reader, writer = await _connect(engine_address(env.config))
        except (env._docker.errors.DockerException, OSError) as exc:
            detail = f"cannot start {argv[0]!r} in the container: {exc}"
            raise SessionFailure("mcp_server_lost", detail) from exc
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        request = (
            f"POST /v{api._version}/exec/{created['Id']}/start HTTP/1.1\r\nHost: docker\r\n"
            "Content-Type: application/json\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        try:
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            writer.close()
            raise SessionFailure("mcp_server_lost", f"the engine did not start {argv[0]!r}: {exc}") from exc
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if " 101 " not in status and " 200 " not in status:
            writer.close()
            raise SessionFailure("mcp_server_lost", f"the engine refused to start {argv[0]!r}: {status}")
        return cls(env, tag, reader, writer)

    async def _read_frames(self) -> None:
        try:
            while True:
                header = await self._socket_reader.readexactly(_FRAME_HEADER.size)
                stream_id, length = _FRAME_HEADER.unpack(header)
                payload = await self._socket_reader.readexactly(length)
                if stream_id == _STDERR:
                    self._stderr.feed(payload)
                else:
                    self._stdout.feed_data(payload)
        except (asyncio.IncompleteReadError, OSError):
            pass  # the process ended (or we closed the connection)
        finally:
            self._stdout.feed_eof()

    async def write(self, data: bytes) -> None:
        if self._closed or self._writer.is_closing():
            raise ConnectionError("the process's stdin is closed")
        self._writer.write(data)
        await self._writer.drain()

    async def readline(self) -> bytes:
        try:
            return await self._stdout.readline()
        except ValueError:
            raise ConnectionError(f"the process wrote a line longer than {LINE_LIMIT} bytes") from None

    def stderr_tail(self) -> str:
        return self._stderr.text()

    def exited(self) -> bool:
        return self._demux.done()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        self._demux.cancel()
        with suppress(BaseException):
            await self._demux
        # Kill it and whatever it started, in the background (a session need not wait for an extra exec);
        # once the environment is closing, _spawn drops it: the container's removal does the same.
        self._env._spawn(self._env._kill_exec(self._tag))
