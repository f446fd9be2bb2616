"""The exec channel's host side, shared by the backends that run one long-lived ``sh`` per sandbox
(Docker: the container's own process, attached; Apptainer: one ``apptainer exec`` into the instance):
requests written as shell code (``shell_channel``), replies matched to their callers by tag, timeouts,
kills, file requests. The stream is Docker's multiplexed one (``framed``) or a plain stdout pipe.
Protocol and guarantees: ``docker_channel``'s docstring and docs/backends.md."""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import secrets
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress

from raygen.envs.base import ExecResult
from raygen.envs.capture import OutputCapture, exec_result
from raygen.envs.processes import (
    EXEC_ID_VAR,
    KILL_BY_EXEC_ID_SCRIPT,
    KILL_GRACE_S,
    MAX_READ_BYTES,
    TIMEOUT_EXIT_CODE,
)
from raygen.envs.shell_channel import PRELUDE, Reply, ReplyBuffer, octal, quote, raise_for
from raygen.errors import SessionFailure

log = logging.getLogger(__name__)

KILL_EXEC_TIMEOUT_S = 60.0
MAX_CHANNEL_WRITE = 1 << 20
"""Larger writes take the backend's other path (the octal script would be 4x their size)."""
_FRAME = struct.Struct(">BxxxL")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_WRITE_CHUNK = 16 * 1024


def channel_usable_env(env: Mapping[str, str]) -> bool:
    """Whether every variable name can be set by a shell assignment (else the backend's per-call path)."""
    return all(_NAME.match(name) for name in env)


class ExecChannel:
    """One container's channel (see the module docstring). ``open`` returns None where it cannot work."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str, framed: bool = True
    ):
        self.name = name
        self._framed = framed
        self._reader = reader
        self._writer = writer
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._ended: BaseException | None = None
        self._pump = asyncio.ensure_future(self._read_replies())

    @property
    def usable(self) -> bool:
        return self._ended is None

    # --- requests ---------------------------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str,
        env: Mapping[str, str],
        timeout_s: float,
        max_output_chars: int,
        root_kill: Callable[[str], Awaitable[None]],
    ) -> ExecResult:
        started = time.monotonic()
        tag = secrets.token_hex(12)
        side = 2 * max(1, max_output_chars)  # OutputCapture's budget per side
        assignments = " ".join(f"{name}={quote(value)}" for name, value in {**env, EXEC_ID_VAR: tag}.items())
        where = quote(cwd)
        script = (
            f"( {{ cd -- {where} || {{ mkdir -p -- {where} && cd -- {where}; }}; }} 2>/dev/null\n"
            f'[ -d "$D" ] || mkdir -p "$D"\n'
            f'{assignments} sh -c {quote(command)} </dev/null >"$D/{tag}.o" 2>"$D/{tag}.e"\n'
            f'rg_reply {tag} $? {side} "$D/{tag}.o" "$D/{tag}.e"; rm -f "$D/{tag}.o" "$D/{tag}.e" ) &\n'
        )
        reply_future = await self._send(tag, script)
        timed_out = False
        try:
            done, _ = await asyncio.wait([reply_future], timeout=timeout_s)
            if not done:
                timed_out = True
                await self._kill(tag)
                done, _ = await asyncio.wait([reply_future], timeout=KILL_GRACE_S)
            if not done:  # the command switched users: the channel could not signal it
                await root_kill(tag)
                await asyncio.wait([reply_future], timeout=KILL_GRACE_S)
        except asyncio.CancelledError:
            self._forget(tag)
            with suppress(Exception):
                self._writer.write(self._kill_script(tag).encode())
            raise
        if not reply_future.done():
            self._forget(tag)
            empty = OutputCapture(1)
            return exec_result(TIMEOUT_EXIT_CODE, empty, empty, True, time.monotonic() - started)
        reply = self._result(reply_future)
        out = reply.parts[0].into(OutputCapture(max_output_chars))
        err = reply.parts[1].into(OutputCapture(max_output_chars))
        exit_code = TIMEOUT_EXIT_CODE if timed_out else reply.code
        return exec_result(exit_code, out, err, timed_out, time.monotonic() - started)

    async def read_file(self, path: str, shown_path: str) -> bytes:
        tag = secrets.token_hex(12)
        script = (
            f"( f={quote(path)}\n"
            f'if [ -d "$f" ]; then c=21; elif [ ! -e "$f" ]; then c=2; elif [ ! -f "$f" ]; then c=22\n'
            f'elif [ ! -r "$f" ]; then c=13; elif [ "$(rg_size "$f")" -gt {MAX_READ_BYTES} ]; then c=27\n'
            f"else c=0; fi\n"
            f'if [ $c = 0 ]; then rg_reply {tag} 0 {MAX_READ_BYTES // 2} "$f" /dev/null\n'
            f"else rg_reply {tag} $c 0 /dev/null /dev/null; fi ) &\n"
        )
        reply = self._result(await self._wait(await self._send(tag, script)))
        if reply.parts[0].tail:  # it grew past the cap while being read
            reply.code = 27
        raise_for(reply, shown_path)
        return reply.parts[0].head

    async def write_file(self, path: str, parent: str, data: bytes, shown_path: str) -> None:
        tag = secrets.token_hex(12)
        chunks = [data[at : at + _WRITE_CHUNK] for at in range(0, len(data), _WRITE_CHUNK)] or [b""]
        writes = "\n".join(
            f"printf '{octal(chunk)}' {'>' if index == 0 else '>>'} \"$f\" || c=5"
            for index, chunk in enumerate(chunks)
        )
        script = (
            f'( f={quote(path)}; c=0; e="$D/{tag}.e"; [ -d "$D" ] || mkdir -p "$D"\n'
            f'if ! mkdir -p -- {quote(parent)} 2>"$e"; then c=20; elif [ -d "$f" ]; then c=21; else\n'
            f'{{\n{writes}\n}} 2>"$e"; fi\n'
            f'rg_reply {tag} $c 4096 /dev/null "$e"; rm -f "$e" ) &\n'
        )
        reply = self._result(await self._wait(await self._send(tag, script)))
        if reply.code == 5:
            detail = reply.parts[1].head.decode("utf-8", "replace").strip()[:300]
            raise OSError(errno.EIO, f"cannot write: {detail}", shown_path)
        raise_for(reply, shown_path)

    async def close(self) -> None:
        """Close stdin (the channel's ``sh`` ends) and stop reading."""
        if self._ended is None:
            self._ended = ConnectionResetError("the exec channel was closed")
        with suppress(Exception):
            self._writer.close()
        self._pump.cancel()
        with suppress(BaseException):
            await self._pump
        self._fail_waiting()

    # --- plumbing ---------------------------------------------------------------------------------------

    def _kill_script(self, tag: str) -> str:
        return f"sh -c {quote(KILL_BY_EXEC_ID_SCRIPT)} raygen-kill {tag} >/dev/null 2>&1 &\n"

    async def _kill(self, tag: str) -> None:
        """Kill every process of command ``tag`` and wait until the kill script is done (as the per-call
        path awaited its kill exec), so nothing of it is left when the timed-out call returns."""
        kill_tag = secrets.token_hex(12)
        script = (
            f"( sh -c {quote(KILL_BY_EXEC_ID_SCRIPT)} raygen-kill {tag} >/dev/null 2>&1\n"
            f"rg_reply {kill_tag} $? 0 /dev/null /dev/null ) &\n"
        )
        try:
            done, _ = await asyncio.wait([await self._send(kill_tag, script)], timeout=KILL_EXEC_TIMEOUT_S)
            code = done.pop().result().code if done else None
        except (SessionFailure, ConnectionError) as exc:
            code = str(exc)
        if code != 0:
            log.warning("exec channel %s: could not kill a timed-out command (%s)", self.name, code)

    async def _send(self, tag: str, script: str) -> asyncio.Future[Reply]:
        if self._ended is not None:
            raise SessionFailure("env_lost", f"container {self.name}: exec channel ended: {self._ended}")
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[tag] = future
        try:
            self._writer.write(script.encode())  # one write: requests never interleave on the stream
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            self._forget(tag)
            raise SessionFailure("env_lost", f"container {self.name}: exec channel: {exc}") from exc
        return future

    async def _wait(self, future: asyncio.Future[Reply]) -> asyncio.Future[Reply]:
        await asyncio.wait([future])
        return future

    def _result(self, future: asyncio.Future[Reply]) -> Reply:
        try:
            return future.result()
        except ConnectionError as exc:
            raise SessionFailure("env_lost", f"container {self.name}: exec channel ended: {exc}") from exc

    def _forget(self, tag: str) -> None:
        future = self._waiting.pop(tag, None)
        if future is not None and not future.done():
            future.cancel()

    def _fail_waiting(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(ConnectionResetError(str(self._ended)))

    async def _read_replies(self) -> None:
        stdout = ReplyBuffer()
        try:
            while True:
                stream_id, payload = await self._frame()
                if stream_id == 2:
                    log.debug("exec channel %s: %r", self.name, payload[:300])
                    continue
                stdout.add(payload)
                while (parsed := stdout.take_reply()) is not None:
                    tag, reply = parsed
                    future = self._waiting.pop(tag, None)
                    if future is not None and not future.done():
                        future.set_result(reply)
        except (asyncio.IncompleteReadError, OSError) as exc:
            self._ended = self._ended or exc
        except asyncio.CancelledError:
            self._ended = self._ended or ConnectionResetError("closed")
        finally:
            self._fail_waiting()

    async def _frame(self) -> tuple[int, bytes]:
        if not self._framed:  # a plain stdout pipe
            payload = await self._reader.read(1 << 16)
            if not payload:
                raise asyncio.IncompleteReadError(b"", None)
            return 1, payload
        header = await self._reader.readexactly(_FRAME.size)
        stream_id, length = _FRAME.unpack(header)
        return stream_id, await self._reader.readexactly(length)


async def open_over(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str, framed: bool
) -> ExecChannel:
    """The channel on a connected ``sh``: the prelude sent, ready for requests."""
    channel = ExecChannel(reader, writer, name, framed)
    writer.write(PRELUDE.encode())
    await writer.drain()
    return channel
