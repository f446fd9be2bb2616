"""Process plumbing shared by the environment backends that run commands as host processes (local,
singularity) or inside containers (docker, modal, singularity instances)."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from raygen.envs.capture import OutputCapture
from raygen.errors import SessionFailure

TIMEOUT_EXIT_CODE = 124
"""Exit code reported for a command killed by its timeout (as GNU ``timeout`` does)."""
DRAIN_GRACE_S = 0.5
"""After the command exits (or is killed), how long to keep reading pipes that background children hold."""
READ_CHUNK = 64 * 1024
MAX_READ_BYTES = 256 * 1024 * 1024
"""read_file refuses larger files: one session must not be able to exhaust a worker's memory."""
EXEC_ID_VAR = "RAYGEN_EXEC_ID"
"""Set to a unique id for every command run inside a container: all its children inherit it, even those
that leave the process group (``setsid``), so a timeout can find and kill every one of them."""
MAX_KILL_PASSES = 20
KILL_GRACE_S = 5.0
"""After the kill-by-exec-id exec, how long to wait for the killed command's output stream to end."""

# Kill every process carrying EXEC_ID_VAR=$1 in its environment; repeat until a pass finds none.
KILL_BY_EXEC_ID_SCRIPT = f"""
tag="{EXEC_ID_VAR}=$1"; pass=0
while [ "$pass" -lt {MAX_KILL_PASSES} ]; do
  pass=$((pass + 1)); found=0
  for dir in /proc/[0-9]*; do
    pid="${{dir#/proc/}}"
    [ "$pid" = "$$" ] && continue
    if tr '\\0' '\\n' < "$dir/environ" 2>/dev/null | grep -qxF "$tag"; then
      kill -9 "$pid" 2>/dev/null && found=1
    fi
  done
  [ "$found" = 0 ] && exit 0
done
exit 1
"""


class ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    # Python 3.11's Process.wait() only returns once every pipe is closed, so a background child that
    # keeps stdout open would hang it; this future fires when the process itself exits.
    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


def kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def pump_into(stream: asyncio.StreamReader, capture: OutputCapture) -> None:
    while chunk := await stream.read(READ_CHUNK):
        capture.feed(chunk)


@dataclass
class Captured:
    """How a host process ended: its return code (None if it had to be killed and was not reaped), both
    captured streams, and whether its timeout struck. ``pgid`` is its process group."""

    returncode: int | None
    out: OutputCapture
    err: OutputCapture
    timed_out: bool
    pgid: int


async def run_captured(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | Path | None,
    timeout_s: float,
    max_output_chars: int,
    groups: set[int],
    before_kill: Callable[[], Awaitable[None]] | None = None,
    on_cancel: Callable[[], None] | None = None,
    keep_group: bool = True,
    whole_tree: bool = False,
) -> Captured:
    """Run ``argv`` in its own process group (stdin /dev/null), capturing stdout and stderr bounded.

    The group is added to ``groups`` (the caller's record of what ``close()`` must kill). With
    ``keep_group`` it stays there (callers drop it when nothing of it can remain); without, it is dropped
    however the call ends, so a reaped group's id, which the system may reuse, is never killed later.
    On timeout ``before_kill`` runs (e.g. a kill inside a container), then the group is SIGKILLed.
    Background children may hold the pipes after the command exits: they are read for ``DRAIN_GRACE_S``
    more, then no longer. If the caller is cancelled mid-command the group is killed and ``on_cancel``
    called (it must not block). With ``whole_tree``, every kill also takes the group's descendants that
    left it (``kill_process_trees``), first: under a subreaper they are still its descendants.
    """
    transport, protocol = await _start(argv, env=env, cwd=cwd)
    pgid = transport.get_pid()
    groups.add(pgid)
    out, err = OutputCapture(max_output_chars), OutputCapture(max_output_chars)
    pumps = [
        asyncio.create_task(pump_into(protocol.stdout, out)),
        asyncio.create_task(pump_into(protocol.stderr, err)),
    ]
    timed_out = False
    try:
        await asyncio.wait([protocol.exited], timeout=timeout_s)
        if not protocol.exited.done():
            timed_out = True
            if before_kill is not None:
                await before_kill()
            if whole_tree:
                await asyncio.to_thread(kill_process_trees, {pgid})
            kill_group(pgid)
            await asyncio.wait([protocol.exited], timeout=DRAIN_GRACE_S)
        await asyncio.wait(pumps, timeout=DRAIN_GRACE_S)
    finally:
        for pump in pumps:
            pump.cancel()
        if transport.get_returncode() is None:
            if whole_tree:
                kill_process_trees({pgid})  # a /proc scan, in the loop: a cancellation cannot wait
            kill_group(pgid)  # cancelled mid-command: nothing may outlive the caller's interest
            if on_cancel is not None:
                on_cancel()
        else:
            transport.close()
        if not keep_group:
            groups.discard(pgid)
    return Captured(transport.get_returncode(), out, err, timed_out, pgid)


async def _start(
    argv: list[str], *, env: dict[str, str], cwd: str | Path | None
) -> tuple[asyncio.SubprocessTransport, ExitAwareProtocol]:
    """``argv`` started in its own process group, stdin /dev/null, stdout and stderr piped."""
    loop = asyncio.get_running_loop()
    try:
        return await loop.subprocess_exec(
            lambda: ExitAwareProtocol(READ_CHUNK, loop),
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,  # own process group: a timeout can kill every child at once
        )
    except OSError as exc:
        if exc.errno == errno.E2BIG:  # the caller's (the model's) command is too long: not a lost sandbox
            raise ValueError(f"command line too long to run ({sum(map(len, argv))} characters)") from None
        raise SessionFailure("env_lost", f"cannot start {argv[0]}: {exc}") from exc


def read_regular_file(path: Path) -> bytes:
    # stat first: opening a FIFO would block forever, and /dev/zero would never end.
    info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    if info.st_size > MAX_READ_BYTES:
        raise OSError(errno.EFBIG, f"file larger than {MAX_READ_BYTES} bytes", str(path))
    with open(path, "rb") as handle:
        return handle.read(MAX_READ_BYTES)


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _process_table() -> dict[int, tuple[int, int]]:
    """``{pid: (ppid, pgid)}`` of every live (non-zombie) process on the host, from /proc."""
    table: dict[int, tuple[int, int]] = {}
    try:
        entries = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return table
    for name in entries:
        try:
            # os.open/os.read, not open(): a text file object costs 3x more, and this runs at every close
            # over every process on the host.
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
            fields = raw.rsplit(b")", 1)[1].split()  # comm may contain spaces and ")"
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def _inside(pid: int, workdir: str) -> bool:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return cwd == workdir or cwd.startswith(workdir + "/")


def anyone_inside(workdir: str) -> bool:
    """Whether any process works inside ``workdir`` (its cwd there): one readlink per process."""
    try:
        entries = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True  # cannot tell: the full scan decides
    return any(_inside(int(name), workdir) for name in entries)


def process_trees(pgids: set[int], workdir: str | None = None) -> set[int]:
    """Live processes in these process groups (or working inside ``workdir``) and all their descendants.

    Descendants count whatever group or session they moved to: under the local backend's subreaper
    (raygen/envs/subreaper.py) a detached daemon stays a descendant of its command's keeper."""
    if not pgids and (workdir is None or not anyone_inside(workdir)):
        # The usual case at a session's close: its commands' groups have ended, and one readlink per
        # process (a third of reading the whole table) shows nothing escaped into the workdir.
        return set()
    table = _process_table()
    roots = [
        pid
        for pid, (_, pgid) in table.items()
        if pgid in pgids or (workdir is not None and _inside(pid, workdir))
    ]
    return _with_descendants(table, roots)


def _with_descendants(table: dict[int, tuple[int, int]], roots: list[int]) -> set[int]:
    """``roots`` and every descendant of theirs in ``table`` (``_process_table``), never this process."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    me = os.getpid()
    found: set[int] = set()
    while roots:
        pid = roots.pop()
        if pid not in found and pid != me:
            found.add(pid)
            roots.extend(children.get(pid, ()))
    return found


def kill_process_trees(pgids: set[int], workdir: str | None = None) -> int:
    """SIGKILL every process of ``process_trees``; returns how many were signalled.

    All are stopped first, pass after pass until a pass finds no new one, and only then killed: a killed
    parent's children would otherwise go to init before they were seen, and a stopped process cannot
    fork another."""
    stopped: set[int] = set()
    for _ in range(MAX_KILL_PASSES):
        new = process_trees(pgids, workdir) - stopped
        if not new:
            break
        for pid in new:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(stopped)


def kill_processes_naming(text: str) -> int:
    """SIGKILL every process whose command line contains ``text`` (e.g. a private Ray's temp dir), with
    its descendants (Ray's workers rename themselves, but stay the raylet's children); how many."""
    needle, table = text.encode(), _process_table()
    roots = []
    for pid in table:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if needle in handle.read():
                    roots.append(pid)
        except OSError:
            continue
    doomed = _with_descendants(table, roots)
    for pid in doomed:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(doomed)


def use_pidfd_child_watcher() -> None:
    """On Python 3.11 (what asyncio does by itself from 3.12 on), learn of child exits through pidfds on
    the running loop instead of one waiting thread per child.

    Each of those threads is started by the loop and has to take the GIL back from it to report the exit:
    on a busy session actor that hand-off cost a command tens of milliseconds of wall time. Call from
    the one loop that starts the subprocesses of this process (a session actor's)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        current = asyncio.get_child_watcher()
        if isinstance(current, asyncio.PidfdChildWatcher) and current.is_active():
            return
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            return  # a kernel before 5.3, or a seccomp filter: keep the threads
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)
