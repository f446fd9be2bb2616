"""The fake's sandboxes: real host processes in a per-sandbox root folder, real files, real exit codes.

A sandbox is a folder ``<base>/<sandbox id>/rootfs`` standing in for the container's filesystem: a
sandbox path ``/srv/app`` is ``rootfs/srv/app`` on the host (exec workdirs and the fs-tools paths are
re-rooted; absolute paths inside shell commands are not, as there is no mount namespace). Each exec is a
process in its own session (process group), with a clean environment: PATH, HOME inside the root,
``MODAL_SANDBOX_ID``/``MODAL_TASK_ID``, the sandbox's and the exec's variables, nothing from the host.

Timeouts are the fake's own, as on Modal: an exec's ``timeout_secs`` SIGKILLs its process group; the
sandbox's ``timeout_secs`` (its hard lifetime) terminates it. Terminating kills every exec's group and
then every host process whose environment carries the sandbox's ``MODAL_SANDBOX_ID`` (processes that
left their group: ``setsid``, daemons), then deletes the root folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fake_modal.fs_tools import host_path

FS_TOOLS_PATH = "/__modal/.bin/modal-sandbox-fs-tools"
FS_TOOLS_SCRIPT = str(Path(__file__).with_name("fs_tools.py"))
CHUNK = 64 * 1024
SANDBOX_ID_VAR = "MODAL_SANDBOX_ID"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# GenericResult statuses (modal_proto.api_pb2.GenericResult), kept as ints so this module has no protos.
STATUS_SUCCESS, STATUS_TERMINATED, STATUS_TIMEOUT = 1, 3, 4


class ExecStartError(Exception):
    """The exec could not start (no such workdir or program)."""


@dataclass
class FakeExec:
    """One exec'd process and everything it printed (kept whole, addressed by byte offset)."""

    exec_id: str
    process: asyncio.subprocess.Process
    output: dict[int, bytearray] = field(default_factory=lambda: {1: bytearray(), 2: bytearray()})
    eof: dict[int, bool] = field(default_factory=lambda: {1: False, 2: False})
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    stdin_written: int = 0
    stdin_closed: bool = False
    timer: asyncio.TimerHandle | None = None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.exited.is_set() else None

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def pump(self, fd: int, stream: asyncio.StreamReader | None) -> None:
        while stream is not None:
            chunk = await stream.read(CHUNK)
            if not chunk:
                break
            async with self.changed:
                self.output[fd] += chunk
                self.changed.notify_all()
        async with self.changed:
            self.eof[fd] = True
            self.changed.notify_all()

    async def watch(self, pumps: list[asyncio.Task]) -> None:
        await self.process.wait()
        if self.timer is not None:
            self.timer.cancel()
        self.exited.set()
        await asyncio.gather(*pumps, return_exceptions=True)


@dataclass
class FakeSandbox:
    """One sandbox: its definition as the client sent it, its state and its execs."""

    sandbox_id: str
    task_id: str
    app_id: str
    image: str
    root: Path
    timeout_secs: int
    tags: dict[str, str]
    env: dict[str, str]
    cpu: float | None = None
    memory_mb: int | None = None
    network_blocked: bool = False
    router_jwt: str = ""
    execs: dict[str, FakeExec] = field(default_factory=dict)
    status: int = 0
    """0 while running, else a GenericResult status."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    lifetime: asyncio.TimerHandle | None = None
    background: set[asyncio.Task] = field(default_factory=set)

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"

    @property
    def running(self) -> bool:
        return self.status == 0

    def start(self) -> None:
        (self.rootfs / "root").mkdir(parents=True)
        (self.rootfs / "tmp").mkdir()
        loop = asyncio.get_running_loop()
        self.lifetime = loop.call_later(
            self.timeout_secs, lambda: self._spawn(self.terminate(STATUS_TIMEOUT))
        )

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def start_exec(
        self, exec_id: str, argv: list[str], workdir: str, env: dict[str, str], timeout_secs: int
    ) -> FakeExec:
        if argv and argv[0] == FS_TOOLS_PATH:
            argv = [sys.executable, "-I", FS_TOOLS_SCRIPT, str(self.rootfs), *argv[1:]]
        cwd = host_path(str(self.rootfs), workdir or "/")
        full_env = {
            "PATH": DEFAULT_PATH,
            "HOME": str(self.rootfs / "root"),
            "TMPDIR": str(self.rootfs / "tmp"),
            SANDBOX_ID_VAR: self.sandbox_id,
            "MODAL_TASK_ID": self.task_id,
            **self.env,
            **env,
        }
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=full_env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise ExecStartError(f"cannot exec {argv[:1]} in {workdir or '/'}: {exc}") from exc
        fake_exec = FakeExec(exec_id, process)
        if timeout_secs:
            fake_exec.timer = asyncio.get_running_loop().call_later(timeout_secs, fake_exec.kill_group)
        pumps = [
            asyncio.ensure_future(fake_exec.pump(1, process.stdout)),
            asyncio.ensure_future(fake_exec.pump(2, process.stderr)),
        ]
        self._spawn(fake_exec.watch(pumps))
        self.execs[exec_id] = fake_exec
        return fake_exec

    async def terminate(self, status: int = STATUS_TERMINATED) -> None:
        """End the sandbox like a container's death: every process, then its filesystem."""
        if not self.running:
            return
        self.status = status
        if self.lifetime is not None:
            self.lifetime.cancel()
        for fake_exec in self.execs.values():
            fake_exec.kill_group()
        await asyncio.to_thread(kill_tagged, f"{SANDBOX_ID_VAR}={self.sandbox_id}")
        for fake_exec in self.execs.values():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(fake_exec.exited.wait(), 10)
            # A process that escaped every kill must not keep readers waiting forever.
            async with fake_exec.changed:
                fake_exec.eof = {1: True, 2: True}
                fake_exec.changed.notify_all()
        await asyncio.to_thread(remove_tree, self.root)
        self.done.set()


def kill_tagged(tag: str, passes: int = 10) -> None:
    """SIGKILL every host process whose environment holds ``tag``, pass after pass until none is left."""
    needle = tag.encode()
    for _ in range(passes):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if needle not in handle.read().split(b"\0"):
                        continue
                os.kill(int(entry), signal.SIGKILL)
                found = True
            except (OSError, ValueError):
                continue
        if not found:
            return


def remove_tree(path: Path) -> None:
    def make_writable_and_retry(function, failed_path, _exc_info) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed_path), 0o700)
            os.chmod(failed_path, 0o700)
            function(failed_path)

    shutil.rmtree(path, onerror=make_writable_and_retry)
