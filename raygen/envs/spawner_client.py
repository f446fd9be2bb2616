"""The session actor's side of the command spawner (``spawner.py``): one spawner process per actor
process, started on first use, and ``run_spawned``, which runs one command through it with the
semantics of ``processes.run_captured`` (same ``Captured`` result, same timeout and cancellation).

Why: under the per-command subreaper script every command started an interpreter (perl) and a front
process besides its keeper: ~3.8 ms more CPU than a bare ``bash -c`` and, on a loaded machine, about
twice its wall time (bench/README.md, "Issue 11"). The spawner is already running and small, so a
command costs one fork of it (the keeper) and the command's own fork and exec.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from raygen.envs.capture import OutputCapture
from raygen.envs.processes import (
    DRAIN_GRACE_S,
    READ_CHUNK,
    Captured,
    kill_group,
    kill_process_trees,
)

SPAWNER = str(Path(__file__).with_name("spawner.py"))
MAX_REQUEST_BYTES = 150_000
"""Larger requests take the subreaper script's path: a SOCK_SEQPACKET message must fit the socket's send
buffer (about 200 kB by default)."""
MAX_ARG_BYTES = 128 * 1024 - 1
"""Linux refuses a longer single argument (MAX_ARG_STRLEN); such a command takes the script's path, which
reports it as the caller's error (``ValueError``), not as a failed command."""
START_TIMEOUT_S = 10.0
"""Longest wait for a keeper to report its pid; a spawner that takes longer is taken for wedged and not
used again in this process."""
MAX_START_FAILURES = 3
"""Requests that started nothing (the spawner died before or with them) before this process stops using
the spawner."""


class SpawnerUnavailable(Exception):
    """The spawner could not take the request; the caller runs the command another way."""


class RequestTooLarge(SpawnerUnavailable):
    """Not the spawner's fault: this one request does not fit its socket."""


class _Spawner:
    """The spawner process of this actor process and the socket to it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)  # a full queue (a stopped spawner) must not block the event loop
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", SPAWNER, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # Nothing of the actor's environment (an API key may be in it): each keeper is a copy of
                # this process, and a command can read its parent's /proc/PID/environ. Commands get the
                # environment their request names. The loader's path stays: an interpreter built with a
                # shared libpython may need it to start at all.
                env={k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ},
                start_new_session=True,  # no signal meant for the actor's process group reaches it
            )
        finally:
            theirs.close()
        self.socket = ours

    def send(self, message: bytes, fds: list[int]) -> None:
        socket.send_fds(self.socket, [message], fds)

    def close(self) -> None:
        self.socket.close()  # the spawner ends when it reads end of file
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


_spawner: _Spawner | None = None
_lock = threading.Lock()
_devnull: int | None = None
_start_failures = 0
_disabled: str | None = None
"""Why this process no longer uses the spawner (it was wedged, or kept dying)."""


def _send(message: bytes, out_w: int, err_w: int, status_w: int) -> None:
    """Send one request, starting the spawner first if there is none (or it died: started again once)."""
    global _spawner, _devnull
    with _lock:
        if _disabled is not None:
            raise SpawnerUnavailable(_disabled)
        if _devnull is None:
            _devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)  # every command's stdin
        fds = [_devnull, out_w, err_w, status_w]
        for attempt in range(2):
            if _spawner is None:
                try:
                    _spawner = _Spawner()
                    atexit.register(stop_spawner)  # once per start: a stopped spawner makes it a no-op
                except OSError as exc:
                    raise SpawnerUnavailable(f"cannot start the command spawner: {exc}") from exc
            try:
                _spawner.send(message, fds)
                return
            except BlockingIOError as exc:  # requests queued up: it is alive but behind
                raise SpawnerUnavailable("the command spawner is busy") from exc
            except OSError as exc:
                dead, _spawner = _spawner, None
                with suppress(OSError):
                    dead.close()
                if attempt:
                    _count_failure(wedged=False)
                    raise SpawnerUnavailable(f"the command spawner is gone: {exc}") from exc
    raise AssertionError("unreachable")


def stop_spawner() -> None:
    """End this process's spawner and forget its failures (tests; an actor's ends with the actor)."""
    global _spawner, _start_failures, _disabled
    with _lock:
        if _spawner is not None:
            _spawner.close()
            _spawner = None
        _start_failures, _disabled = 0, None


def _count_failure(wedged: bool) -> None:
    """One more request that started nothing (call with ``_lock`` held): a wedged spawner, or one that
    failed ``MAX_START_FAILURES`` times, is not used again in this process."""
    global _start_failures, _disabled
    _start_failures += 1
    if wedged or _start_failures >= MAX_START_FAILURES:
        _disabled = "the command spawner did not answer" if wedged else "the command spawner keeps dying"


def _not_started(wedged: bool) -> SpawnerUnavailable:
    """A keeper never reported its pid: drop this spawner (a new one starts next time) or, if it is
    wedged or keeps failing, stop using the spawner in this process."""
    global _spawner
    with _lock:
        _count_failure(wedged)
        dead, _spawner = _spawner, None
    if dead is not None:
        with suppress(OSError):
            dead.socket.close()
        with suppress(OSError):
            dead.process.kill()
    return SpawnerUnavailable("the command spawner started nothing")


class _PipeReader:
    """Reads one non-blocking pipe on the event loop, handing each chunk to ``on_data``, until EOF."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, on_data: Callable[[bytes], None]):
        self._loop, self._fd, self._on_data = loop, fd, on_data
        self.ended: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if chunk:
            self._on_data(chunk)
        else:
            self.close()

    def read_now(self, wait_s: float, enough: Callable[[], bool]) -> None:
        """Read synchronously (for a cancellation, which cannot await) until ``enough()``, EOF or
        ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        while self._fd >= 0 and not enough():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._fd], [], [], remaining)[0]:
                return
            self._readable()

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        if not self.ended.done():
            self.ended.set_result(None)


class _Status:
    """The status pipe's two lines: the keeper's pid (its process group), then the command's wait status."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._buffer = b""
        self.nothing_left = False
        """The keeper reported that nothing of the command is left: its group ends with it."""
        self.pgid: asyncio.Future[int] = loop.create_future()
        self.exit: asyncio.Future[int] = loop.create_future()

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        lines = self._buffer.split(b"\n")
        if len(lines) > 1 and not self.pgid.done():
            self.pgid.set_result(int(lines[0]))
        if len(lines) > 2 and not self.exit.done():
            self.nothing_left = lines[1].startswith(b"d")
            self.exit.set_result(os.waitstatus_to_exitcode(int(lines[1][1:])))


async def run_spawned(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | Path,
    timeout_s: float,
    max_output_chars: int,
    groups: set[int],
) -> Captured:
    """Run ``argv`` through the spawner: what ``run_captured(..., whole_tree=True)`` does with the
    subreaper script in front. Raises ``SpawnerUnavailable`` (nothing started) if the spawner cannot
    take it."""
    out_r, err_r, status_r = _send_request(_request(argv, env, cwd))
    loop = asyncio.get_running_loop()
    out, err = OutputCapture(max_output_chars), OutputCapture(max_output_chars)
    status = _Status(loop)
    readers = [_PipeReader(loop, out_r, out.feed), _PipeReader(loop, err_r, err.feed)]
    status_reader = _PipeReader(loop, status_r, status.feed)
    readers.append(status_reader)
    try:
        timed_out = await _wait_for_command(status, status_reader, readers, timeout_s, groups)
    finally:
        _let_go(status, status_reader, readers, groups)
    if status.exit.done():
        returncode: int | None = status.exit.result()
    elif timed_out:
        returncode = None
    else:  # the keeper was killed before the command ended (``kill -9 0``): as the scripts report it
        returncode = -signal.SIGKILL
    return Captured(returncode, out, err, timed_out, status.pgid.result())


def _request(argv: list[str], env: dict[str, str], cwd: str | Path) -> bytes:
    """The spawner's request for one command; what it cannot take raises before anything is sent."""
    if any("\0" in a for a in argv) or any("\0" in k or "\0" in v for k, v in env.items()):
        raise ValueError("embedded null byte")  # what starting it directly raises
    if any(len(a) > MAX_ARG_BYTES // 4 and len(a.encode()) > MAX_ARG_BYTES for a in argv):
        raise RequestTooLarge("an argument is longer than the kernel allows")
    message = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
    if len(message) > MAX_REQUEST_BYTES:
        raise RequestTooLarge("request too large for the spawner's socket")
    return message


def _send_request(message: bytes) -> tuple[int, int, int]:
    """Send ``message`` with the write ends of three new pipes; returns their read ends (stdout, stderr,
    status). Only the keeper holds the write ends afterwards."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        _send(message, out_w, err_w, status_w)
    except BaseException:
        for fd in (out_r, err_r, status_r):
            os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, status_w):
            os.close(fd)
    return out_r, err_r, status_r


# The keeper lives while its status pipe is open (nobody else holds the write end); once it hit EOF the
# keeper may be reaped and its id given to another process: never signalled after that.
def _keeper_alive(status_reader: _PipeReader) -> bool:
    return not status_reader.ended.done()


async def _wait_for_command(
    status: _Status,
    status_reader: _PipeReader,
    readers: list[_PipeReader],
    timeout_s: float,
    groups: set[int],
) -> bool:
    """Wait for the keeper's pid, then for the command (killed after ``timeout_s``) and its output.
    Returns whether it timed out."""
    timed_out = False
    await asyncio.wait(
        [status.pgid, status_reader.ended], timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
    )
    if not status.pgid.done():
        # Nothing started: closing the status pipe makes a late keeper fail on its first write,
        # before it starts the command.
        wedged = _keeper_alive(status_reader)
        status_reader.close()
        raise _not_started(wedged)
    groups.add(status.pgid.result())
    ended = [status.exit, status_reader.ended]  # the status, or the keeper was killed
    await asyncio.wait(ended, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if not (status.exit.done() or status_reader.ended.done()):
        timed_out = True
        await asyncio.to_thread(kill_process_trees, {status.pgid.result()})
        if _keeper_alive(status_reader):
            kill_group(status.pgid.result())
        await asyncio.wait(ended, timeout=DRAIN_GRACE_S, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.wait([readers[0].ended, readers[1].ended], timeout=DRAIN_GRACE_S)
    return timed_out


def _let_go(
    status: _Status, status_reader: _PipeReader, readers: list[_PipeReader], groups: set[int]
) -> None:
    """However the wait ended (cancelled too): nothing of a command cut short left running, pipes closed,
    a keeper that is gone no longer in ``groups``."""
    if not status.pgid.done():
        # Cancelled before the pid was read: it may be on its way (then the command starts).
        status_reader.read_now(2.0, status.pgid.done)
    if status.pgid.done() and not status.exit.done() and _keeper_alive(status_reader):
        # Cancelled mid-command: a /proc scan, in the loop (a cancellation cannot wait).
        kill_process_trees({status.pgid.result()})
        kill_group(status.pgid.result())
    for reader in readers:
        reader.close()
    if status.nothing_left:
        # The keeper is ending (or ended) with nothing under it: its id must not be signalled later,
        # when the system may have given it to another process.
        groups.discard(status.pgid.result())
