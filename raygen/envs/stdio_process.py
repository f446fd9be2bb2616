"""A long-lived host process with its stdin and stdout as streams (``Environment.open_process`` of the
local backend, and the shared MCP servers of a session actor).

It runs in a process group of its own; ``close`` stops that group and every descendant that left it
(``kill_process_trees``: under the local backend's subreaper a detached child stays a descendant), so no
process of a server outlives its session, however the session ends.
"""

from __future__ import annotations

import asyncio
import errno
import subprocess
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from raygen.envs.base import EnvProcess
from raygen.envs.processes import READ_CHUNK, kill_group, kill_process_trees
from raygen.errors import SessionFailure

LINE_LIMIT = 32 * 1024 * 1024
"""Longest stdout line read (an MCP message, a tool result in it); a longer one ends the process's use."""
STDERR_TAIL_BYTES = 2048


class StderrTail:
    """The last ``STDERR_TAIL_BYTES`` a process wrote to stderr, read as it comes (so a chatty server never
    blocks on a full pipe)."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size > STDERR_TAIL_BYTES and len(self._chunks) > 1:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        data = b"".join(self._chunks)[-STDERR_TAIL_BYTES:]
        return data.decode("utf-8", "replace").strip()


class HostProcess(EnvProcess):
    """A host process in its own process group (see the module docstring)."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        groups: set[int] | None,
        whole_tree: bool,
        on_close: Callable[[], object] | None = None,
    ):
        self.process = process
        self._on_close = on_close
        self.pgid = process.pid
        self._groups = groups
        self._whole_tree = whole_tree
        self._stderr = StderrTail()
        self._stderr_pump = asyncio.ensure_future(self._pump_stderr())
        self._closed = False

    @classmethod
    async def start(
        cls,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str | Path | None,
        groups: set[int] | None = None,
        whole_tree: bool = True,
        on_close: Callable[[], object] | None = None,
    ) -> HostProcess:
        """Start ``argv``; its group is added to ``groups`` (what the environment's ``close`` kills) and
        removed again when this process is closed; ``on_close`` is called at ``close`` (e.g. to kill what
        it runs inside a container). ``SessionFailure("mcp_server_lost")`` if it cannot start."""
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                limit=LINE_LIMIT,
                start_new_session=True,  # its own group: close() stops everything it started at once
            )
        except OSError as exc:
            detail = "not found" if exc.errno == errno.ENOENT else str(exc)
            raise SessionFailure("mcp_server_lost", f"cannot start {argv[0]!r}: {detail}") from exc
        if groups is not None:
            groups.add(process.pid)
        return cls(process, groups, whole_tree, on_close)

    async def _pump_stderr(self) -> None:
        stream = self.process.stderr
        with suppress(OSError, ValueError):
            while chunk := await stream.read(READ_CHUNK):
                self._stderr.feed(chunk)

    async def write(self, data: bytes) -> None:
        stdin = self.process.stdin
        if self._closed or stdin.is_closing():
            raise ConnectionError("the process's stdin is closed")
        stdin.write(data)
        await stdin.drain()  # ConnectionResetError / BrokenPipeError once the process is gone

    async def readline(self) -> bytes:
        try:
            return await self.process.stdout.readline()
        except ValueError:  # a line over LINE_LIMIT: the stream cannot be resynchronised
            raise ConnectionError(f"the process wrote a line longer than {LINE_LIMIT} bytes") from None

    def stderr_tail(self) -> str:
        return self._stderr.text()

    def exited(self) -> bool:
        return self.process.returncode is not None

    def exit_code(self) -> int | None:
        return self.process.returncode

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._on_close is not None:
            self._on_close()
        with suppress(OSError):
            self.process.stdin.close()
        # No grace period: a session's server holds nothing worth flushing, and a wait per session adds up.
        if self._whole_tree:
            await asyncio.to_thread(kill_process_trees, {self.pgid})
        kill_group(self.pgid)
        with suppress(ProcessLookupError):
            self.process.kill()
        with suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self.process.wait()
        with suppress(TimeoutError):
            async with asyncio.timeout(1):
                await self._stderr_pump
        self._stderr_pump.cancel()
        if self._groups is not None and self.process.returncode is not None:
            # Reaped: its id may be reused, so the environment's close must not signal it any more. The
            # tree kill above already took the descendants that left the group.
            self._groups.discard(self.pgid)
