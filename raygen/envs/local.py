"""LocalEnvironment: a private working directory per session on this host.

NOT a sandbox unless ``bwrap`` is on: commands run as this process's user and can read, write and reach
whatever that user can. What it does guarantee is hygiene: a fresh workdir per session, a scrubbed
environment (no host secrets), bounded output, timeouts that kill every child, and full cleanup.

Workdir layout (``<root>/raygen-<run>-<session>-XXXX/``): ``home/`` (HOME), ``tmp/`` (TMPDIR, and /tmp
under bwrap) and ``root/``, the session's pseudo filesystem root. There is no real chroot: a relative
``cwd`` and an absolute one are both re-rooted under ``root/`` (``/app`` and ``app`` -> ``root/app``), and
commands see the real host path. File paths given to read_file/write_file are relative to the cwd;
absolute paths are host paths (under bwrap, writes outside the workdir are refused and ``/tmp`` maps to
``tmp/``, matching what commands see).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import platform
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raygen.envs.base import Environment, EnvSpec, ExecResult
from raygen.envs.bwrap import readable, sandbox_argv
from raygen.envs.capture import OutputCapture, exec_result
from raygen.envs.configs import LocalEnvConfig
from raygen.envs.host import make_workdir, remove_small_tree, remove_tree
from raygen.envs.processes import (
    TIMEOUT_EXIT_CODE,
    Captured,
    anyone_inside,
    kill_group,
    kill_process_trees,
    read_regular_file,
    run_captured,
    write_file,
)
from raygen.envs.spawner_client import RequestTooLarge, SpawnerUnavailable, run_spawned
from raygen.envs.stdio_process import HostProcess
from raygen.errors import SessionFailure
from raygen.formats.scrub import looks_secret

log = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BWRAP_FLAGS = ("--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session")

SUBREAPER = str(Path(__file__).with_name("subreaper.py"))
"""The script every command of the bare local backend runs under (see its docstring)."""
_PRCTL_SYSCALL = {"x86_64": 157, "aarch64": 167}
"""prctl's syscall number, for the Perl twin of the script (``subreaper.pl``)."""
USE_SPAWNER = True
"""Start subreaped commands through the actor's long-lived spawner (``spawner.py``, about 1.4 ms of CPU
a command more than bare ``bash -c``); the script in front of each command (``subreaper_prefix``) is the
fallback when the spawner cannot take a request. The tests switch it off to run the scripts."""


@functools.cache
def subreaper_prefix() -> tuple[str, ...]:
    """What goes before ``bash -c COMMAND``: the Perl subreaper where perl exists and the architecture's
    prctl number is known (about 2 ms of CPU a command, with its keeper), else the Python one (about
    18 ms)."""
    perl, number = shutil.which("perl"), _PRCTL_SYSCALL.get(platform.machine())
    if perl and number:
        return (perl, str(Path(__file__).with_name("subreaper.pl")), str(number))
    return (sys.executable, "-I", "-S", SUBREAPER)


_warned: set[str] = set()
"""Which of this module's once-per-process warnings were given."""


def command_environment(
    keep_env: list[str], spec: EnvSpec, home: str, tmpdir: str, host_env: dict[str, str] | None = None
) -> dict[str, str]:
    """The scrubbed environment of a session's commands.

    Only host variables named in ``keep_env`` (never secret-looking names), then the row's own ``env``,
    then HOME/TMPDIR in the workdir; any variable whose value is one of ``spec.secret_values`` is dropped.
    """
    host_env = os.environ if host_env is None else host_env
    env = {name: host_env[name] for name in keep_env if name in host_env and not looks_secret(name)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(spec.env)
    env["HOME"], env["TMPDIR"] = home, tmpdir
    secrets = {value for value in spec.secret_values if value}
    return {name: value for name, value in env.items() if value not in secrets}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def bwrap_problem(bwrap: str | None = None) -> str | None:
    """Why bubblewrap cannot confine commands here (None if it can). Each binary is probed once."""
    bwrap = bwrap or shutil.which("bwrap")
    if bwrap is None:
        return "bwrap (bubblewrap) is not installed or not on PATH"
    return _probe_bwrap(bwrap)


@functools.cache
def _probe_bwrap(bwrap: str) -> str | None:
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *BWRAP_FLAGS, "--", "true"]
    try:
        probe = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not run: {exc}"
    if probe.returncode != 0:
        detail = probe.stderr.decode("utf-8", "replace").strip()[:300]
        return f"bwrap cannot create a sandbox here (exit {probe.returncode}): {detail}"
    return None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "x"


def _warn_once(kind: str, message: str, *args: object) -> None:
    if kind not in _warned:
        _warned.add(kind)
        log.warning(message, *args)


class LocalEnvironment(Environment[LocalEnvConfig]):
    """One session's private workdir on this host (see the module docstring for what it guarantees)."""

    backend = "local"
    supports_binds = True  # without bwrap every host path is there anyway

    @classmethod
    def confines_destructive_rows(cls, config: LocalEnvConfig) -> bool:
        return config.bwrap  # without bubblewrap, commands have this user's full access to the host

    def __init__(self, config: LocalEnvConfig, spec: EnvSpec):
        super().__init__(spec)
        self.config = config
        self.workdir: Path | None = None
        """The session's workdir; kept after close() (then it no longer exists) for inspection."""
        self.cwd: Path | None = None
        self._bwrap: str | None = None
        self._env: dict[str, str] = {}
        self._process_groups: set[int] = set()

    async def start(self) -> None:
        self._refuse_if_closed()
        if self.workdir is not None:
            return  # already started
        if self.config.bwrap:
            bwrap = shutil.which("bwrap")
            problem = await asyncio.to_thread(bwrap_problem, bwrap)
            if problem:
                raise SessionFailure("env_start", f"env.bwrap is on but unusable: {problem}")
            self._bwrap = bwrap
        else:
            _warn_once(
                "not a sandbox",
                "env.type=local is not a sandbox: commands run with this user's full access to the host; "
                "set env.bwrap: true (bubblewrap) or use a container backend to confine them",
            )
        parent = self.config.root or tempfile.gettempdir()
        prefix = f"raygen-{_slug(self.spec.run_name)}-{_slug(self.spec.session_key)}-"
        try:
            self.workdir = make_workdir(parent, prefix, ("home", "tmp", "root"))
            # normpath on "/" + cwd collapses "..", so a row's cwd can never climb out of the workdir.
            inside = posixpath.normpath(posixpath.join("/", self.spec.cwd or "/")).lstrip("/")
            self.cwd = self.workdir / "root" / inside
            if inside:
                self.cwd.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SessionFailure(
                "env_start", f"cannot create a session workdir under {parent}: {exc}"
            ) from exc
        tmpdir = "/tmp" if self._bwrap else str(self.workdir / "tmp")
        self._env = command_environment(self.config.keep_env, self.spec, str(self.workdir / "home"), tmpdir)

    def _require_open(self) -> Path:
        if self.closed:
            raise SessionFailure("env_lost", "the local environment is closed")
        if self.cwd is None or self.workdir is None:
            raise SessionFailure("env_lost", "the local environment was not started")
        return self.cwd

    def _argv(self, command: str, cwd: Path) -> list[str]:
        if not self._bwrap:
            # Under the subreaper, whatever the command detaches stays findable (bwrap has a PID
            # namespace instead, which ends with the command).
            if self.config.subreaper:
                return [*subreaper_prefix(), "bash", "-c", command]
            return ["bash", "-c", command]
        extra = tuple(self.config.bwrap_ro_binds)
        return [
            *sandbox_argv(
                self._bwrap, str(self.workdir), str(cwd), BWRAP_FLAGS, extra, tuple(self.spec.binds)
            ),
            "bash",
            "-c",
            command,
        ]

    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        cwd = self._require_open()
        # A command may have deleted its own cwd (or HOME, TMPDIR); the next one still needs them. A stat
        # first: on overlay filesystems mkdir of an existing directory costs several times more.
        for needed in (cwd, self.workdir / "tmp", self.workdir / "home"):
            if not os.path.isdir(needed):
                try:
                    needed.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise SessionFailure("env_lost", f"the session workdir is gone: {exc}") from exc
        started = time.monotonic()
        done = await self._run(command, cwd, timeout_s, max_output_chars)
        # Background jobs keep the group alive: close() kills it then. Groups that ended since (the
        # subreaper's keeper leaves a moment after its command) are dropped now, so close() never signals
        # a group id the system has given to someone else meanwhile (pid_max may be only 32768).
        for pgid in [g for g in self._process_groups if not _group_alive(g)]:
            self._process_groups.discard(pgid)
        return self._result(done.returncode, done.out, done.err, done.timed_out, time.monotonic() - started)

    async def _run(self, command: str, cwd: Path, timeout_s: float, max_output_chars: int) -> Captured:
        if USE_SPAWNER and self.config.subreaper and not self._bwrap:
            try:
                return await run_spawned(
                    ["bash", "-c", command],
                    env=self._env,
                    cwd=cwd,
                    timeout_s=timeout_s,
                    max_output_chars=max_output_chars,
                    groups=self._process_groups,
                )
            except RequestTooLarge:
                pass
            except SpawnerUnavailable as exc:
                _warn_once("spawner", "%s; commands start through the subreaper script instead (slower)", exc)
        return await run_captured(
            self._argv(command, cwd),
            env=self._env,
            cwd=cwd,
            timeout_s=timeout_s,
            max_output_chars=max_output_chars,
            groups=self._process_groups,
            whole_tree=not self._bwrap,
        )

    def _result(
        self, returncode: int | None, out: OutputCapture, err: OutputCapture, timed_out: bool, duration: float
    ) -> ExecResult:
        if timed_out or returncode is None:
            exit_code = TIMEOUT_EXIT_CODE
        else:
            exit_code = 128 - returncode if returncode < 0 else returncode  # killed by a signal, like bash
        return exec_result(exit_code, out, err, timed_out, duration)

    async def open_process(self, argv: list[str], env: dict[str, str], cwd: str | None) -> HostProcess:
        """A server process of the session: in its workdir, with the session's scrubbed environment, under
        the subreaper (or inside the session's bubblewrap sandbox), its group stopped at ``close``."""
        where = self._require_open() if cwd is None else self._inside_root(cwd)
        where.mkdir(parents=True, exist_ok=True)
        if self._bwrap:
            full = [*sandbox_argv(self._bwrap, str(self.workdir), str(where), BWRAP_FLAGS,
                                  tuple(self.config.bwrap_ro_binds)), *argv]  # fmt: skip
        else:
            full = [*subreaper_prefix(), *argv] if self.config.subreaper else list(argv)
        # The server's own variables are kept even when secret (a token it needs): they were configured
        # for it, by name (docs/tools.md says what a command of the same session can see).
        return await HostProcess.start(
            full, env={**self._env, **env}, cwd=where, groups=self._process_groups, whole_tree=not self._bwrap
        )

    def _inside_root(self, cwd: str) -> Path:
        # As for a row's cwd: re-rooted under root/, never climbing out of the workdir.
        inside = posixpath.normpath(posixpath.join("/", cwd)).lstrip("/")
        return self.workdir / "root" / inside

    def _host_path(self, path: str, for_write: bool) -> Path:
        cwd = self._require_open()
        target = cwd / path  # an absolute path replaces cwd
        if not self._bwrap:
            # /proc/self here is the worker, not the session (a command's /proc/self is itself).
            if target.resolve().is_relative_to(f"/proc/{os.getpid()}"):
                raise PermissionError(errno.EACCES, "the worker's own /proc entry", path)
            return target
        # File tools see what a command in the sandbox sees: the workdir (writable), /tmp as the
        # workdir's tmp/, and only the read-only mounts of raygen.envs.bwrap; never /proc or the rest of
        # the host. Symlinks are resolved first, so a link planted in the workdir cannot point out.
        workdir = self.workdir
        if not target.is_relative_to(workdir) and target.is_relative_to("/tmp"):
            target = workdir / "tmp" / target.relative_to("/tmp")
        resolved = target.resolve()
        if resolved.is_relative_to(workdir):
            return resolved
        if for_write:
            raise PermissionError(errno.EROFS, "read-only outside the session workdir (bwrap)", path)
        if not readable(resolved, tuple(self.config.bwrap_ro_binds)):
            raise FileNotFoundError(errno.ENOENT, "not in the sandbox (bwrap)", path)
        return resolved

    async def read_file(self, path: str) -> bytes:
        return await asyncio.to_thread(read_regular_file, self._host_path(path, for_write=False))

    async def write_file(self, path: str, data: bytes) -> None:
        await asyncio.to_thread(write_file, self._host_path(path, for_write=True), data)

    async def _teardown(self) -> None:
        groups, self._process_groups = self._process_groups, set()
        # Every process of the session: its commands' groups, all their descendants wherever they went
        # (the subreaper keeps detached daemons among them), and anything working inside the workdir.
        # Repeated until none is left (bounded), so nothing writes into the workdir while it is removed
        # and "closed" means "no process left".
        workdir = str(self.workdir) if self.workdir is not None else None
        # Usually every command's group has ended (its keeper waits for all its descendants) and no
        # process works in the workdir: both are checked here on the loop, in a fraction of a
        # millisecond. A thread hop costs tens of milliseconds on a busy loop (measured: 40 ms for the
        # scan and 50 ms for the removal at 32 sessions per actor), since each of the thread's syscalls
        # waits for the GIL again.
        groups = {pgid for pgid in groups if _group_alive(pgid)}
        if groups or (workdir is not None and anyone_inside(workdir)):
            for _ in range(100):
                if not await asyncio.to_thread(kill_process_trees, groups, workdir):
                    break
                await asyncio.sleep(0.02)
            for pgid in groups:
                kill_group(pgid)
        if self.workdir is not None:
            removed = remove_small_tree(self.workdir)
            if removed is None:
                # Shielded: if the caller is cancelled again, the removal still completes in its thread.
                removed = await asyncio.shield(asyncio.to_thread(remove_tree, self.workdir))
            if not removed:
                log.warning("could not remove session workdir %s", self.workdir)
