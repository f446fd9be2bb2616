"""SingularityEnvironment: one Apptainer/Singularity instance per session, for HPC nodes without Docker.

Each session gets a host workdir ``<root>/raygen-<run>-<session>-XXXX/`` (``home/`` is HOME, ``work/`` the
default cwd) and one instance started with ``apptainer instance start --containall --writable-tmpfs
--home <W>/home --bind <W>:<W> [--net --network none]``: the workdir, at the same path, is the only host
folder the container sees; ``--containall`` gives it private PID/IPC namespaces, a private /tmp and a
clean environment. The rest of the image's file system is writable but lives in memory (the writable
tmpfs) and disappears with the instance. Commands run with ``apptainer --quiet exec --cleanenv --pwd
<cwd> instance://<name> sh -c <command>``; an instance costs one start (~0.8 s measured) and makes each
command about twice as fast as a fresh ``apptainer exec`` of a SIF (see docs/backends.md).

Environment: the row's ``env`` (minus secret values and HOME, which apptainer reserves) reaches commands as
``APPTAINERENV_<NAME>`` variables of the apptainer process, whose own environment is scrubbed: a few host
variables it needs (PATH, HOME, locale) and apptainer's own non-secret settings, nothing else.

Timeouts: each exec carries a unique ``RAYGEN_EXEC_ID`` that its descendants inherit; on timeout a second
exec into the instance SIGKILLs every process carrying it (the Docker backend's script), then the host
process group of the first exec is killed. A cancelled exec does the same in the background; ``close()``
stops the instance (``instance stop --force``), which ends every process in it, then removes the workdir,
on every path, cancellation included.

Files: paths resolve against the cwd inside the container. A path inside the workdir (after resolving
symlinks on the host, so a link pointing out of it is never followed on the host) is read and written on
the host directly; any other path goes through an exec (``cat``, binary-safe through pipes).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import posixpath
import re
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

from raygen.envs.base import Environment, EnvSpec, ExecResult
from raygen.envs.configs import SingularityEnvConfig
from raygen.envs.fleet import SandboxRefused
from raygen.envs.host import make_workdir, remove_tree
from raygen.envs.processes import (
    DRAIN_GRACE_S,
    EXEC_ID_VAR,
    KILL_BY_EXEC_ID_SCRIPT,
    MAX_READ_BYTES,
    kill_group,
    read_regular_file,
    run_captured,
    write_file,
)
from raygen.envs.singularity_images import find_executable, prepare_sif_images, resolve_image
from raygen.envs.singularity_process import exec_outcome, open_instance_process
from raygen.envs.stdio_process import HostProcess
from raygen.errors import SessionFailure
from raygen.formats.scrub import looks_secret

log = logging.getLogger(__name__)

PROCESS_ENV_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "XDG_RUNTIME_DIR")
"""Host variables the apptainer process itself keeps (it finds its helpers and its instances with them)."""
KILL_TIMEOUT_S = 30.0
APPTAINER_FAILED = 255
"""apptainer's own exit code when it cannot run a command (e.g. the instance is gone)."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# read_file outside the workdir: exit codes name the problem; the file itself goes to stdout.
_READ_SCRIPT = f"""
[ -e "$1" ] || exit 2; [ -d "$1" ] && exit 21; [ -f "$1" ] || exit 22; [ -r "$1" ] || exit 13
[ "$(wc -c < "$1")" -le {MAX_READ_BYTES} ] || exit 27
exec cat -- "$1"
"""
# write_file outside the workdir: the data comes on stdin.
_WRITE_SCRIPT = '[ -d "$1" ] && exit 21; mkdir -p -- "$2" || exit 20; cat > "$1" || exit 23'
_FILE_ERRORS = {
    2: (FileNotFoundError, errno.ENOENT, "No such file or directory"),
    13: (PermissionError, errno.EACCES, "Permission denied"),
    20: (NotADirectoryError, errno.ENOTDIR, "cannot create the parent directory"),
    21: (IsADirectoryError, errno.EISDIR, "Is a directory"),
    22: (OSError, errno.EINVAL, "not a regular file"),
    23: (OSError, errno.EIO, "cannot write"),
    27: (OSError, errno.EFBIG, f"file larger than {MAX_READ_BYTES} bytes"),
}


def apptainer_environment(host_env: dict[str, str] | None = None) -> dict[str, str]:
    """The scrubbed environment of the apptainer processes of sessions (never the container's own)."""
    host_env = os.environ if host_env is None else host_env
    keep = {name: host_env[name] for name in PROCESS_ENV_NAMES if name in host_env}
    for name, value in host_env.items():
        # apptainer's own settings; APPTAINERENV_* (variables for containers) do not match these prefixes.
        if name.startswith(("APPTAINER_", "SINGULARITY_")) and not looks_secret(name):
            keep[name] = value
    return keep


def container_variables(spec: EnvSpec) -> dict[str, str]:
    """The row's ``env`` as ``APPTAINERENV_*`` variables: secret values, HOME and odd names dropped."""
    return {
        f"APPTAINERENV_{name}": value
        for name, value in spec.env_without_secrets().items()
        if name != "HOME" and _ENV_NAME.match(name)
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:24] or "x"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


class SingularityEnvironment(Environment[SingularityEnvConfig]):
    """One session's apptainer instance (see the module docstring for the guarantees)."""

    backend = "singularity"
    confined = True
    own_root_filesystem = True  # the image's, writable in memory (--writable-tmpfs)

    @classmethod
    async def prepare(
        cls, config: SingularityEnvConfig, images: Iterable[str | None]
    ) -> dict[str, str | None]:
        return await prepare_sif_images(config, images)

    @classmethod
    def reap(cls, config: SingularityEnvConfig, run_name: str | None) -> int:
        return reap_instances(config, run_name)

    def __init__(self, config: SingularityEnvConfig, spec: EnvSpec):
        super().__init__(spec)
        self.config = config
        self.instance_name = f"raygen-{_slug(spec.run_name)}-{_slug(spec.session_key)}-{secrets.token_hex(3)}"
        self.workdir: Path | None = None
        """The session's host workdir, also its path in the container; kept after close() for inspection."""
        self.cwd: str | None = None
        self.image_path: str | None = None
        self._executable = ""
        self._process_env: dict[str, str] = {}
        self._container_vars = container_variables(spec)
        self._process_groups: set[int] = set()

    @property
    def image(self) -> str | None:
        return self.spec.image or self.config.default_image

    # --- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._refuse_if_closed()
        if self._starting is not None:
            return
        self._executable = find_executable(self.config)
        if not self.image:
            raise SessionFailure("image_unavailable", "the row names no image and env.default_image is unset")
        self.image_path = await resolve_image(self.config, self.image)
        self._process_env = apptainer_environment()
        workdir = self._make_workdir()
        # If start() is cancelled meanwhile, close() waits for the start to end, then stops the instance.
        await self._start_once(self._start_instance(workdir))
        if not _inside(self.cwd, str(workdir)):  # an absolute cwd lives in the container's own tmpfs
            code, _, err = await self._run_quiet(self._exec_argv("/", "mkdir", "-p", "--", self.cwd))
            if code != 0:
                detail = err.decode("utf-8", "replace").strip()[-300:]
                raise SessionFailure("env_start", f"cannot create the cwd {self.cwd}: {detail}")

    def _make_workdir(self) -> Path:
        parent = self.config.root or tempfile.gettempdir()
        prefix = f"raygen-{_slug(self.spec.run_name)}-{_slug(self.spec.session_key)}-"
        try:
            self.workdir = make_workdir(parent, prefix, ("home", "work"))
        except OSError as exc:
            raise SessionFailure(
                "env_start", f"cannot create a session workdir under {parent}: {exc}"
            ) from exc
        cwd = self.spec.cwd or ""
        if posixpath.isabs(cwd):
            self.cwd = posixpath.normpath(cwd)
        else:  # normpath on "/" + cwd collapses "..": a relative cwd never climbs out of work/
            inside = posixpath.normpath(posixpath.join("/", cwd)).lstrip("/")
            self.cwd = posixpath.normpath(posixpath.join(str(self.workdir), "work", inside))
            Path(self.cwd).mkdir(parents=True, exist_ok=True)
        return self.workdir

    async def _start_instance(self, workdir: Path) -> None:
        network = [] if self.config.network else ["--net", "--network", "none"]
        argv = [
            self._executable, "instance", "start", "--containall", "--writable-tmpfs",
            "--home", f"{workdir}/home", "--bind", f"{workdir}:{workdir}",
            *network, *self.config.extra_args, self.image_path, self.instance_name,
        ]  # fmt: skip
        try:
            code, out, err = await self._run_quiet(argv, timeout_s=self.config.start_timeout_s)
        except TimeoutError as exc:  # an overloaded node: the sandbox governor learns from it
            raise SandboxRefused(
                "env_start", f"instance start took over {self.config.start_timeout_s}s"
            ) from exc
        if code != 0:
            detail = (err or out).decode("utf-8", "replace").strip()[-500:]
            raise SessionFailure("env_start", f"cannot start an instance of {self.image_path}: {detail}")

    async def _teardown(self) -> None:
        self._cancel_background()
        if await self._start_outcome() is not None:
            # Stopping ends every process of the instance (its PID namespace goes with it).
            stop = [self._executable, "instance", "stop", "--force", self.instance_name]
            try:
                code, _, err = await self._run_quiet(stop, timeout_s=self.config.start_timeout_s)
                if code != 0 and b"no instance found" not in err:
                    log.warning("could not stop instance %s: %s", self.instance_name, err[-300:])
            except Exception as exc:
                log.warning("could not stop instance %s: %s", self.instance_name, exc)
        for pgid in list(self._process_groups):
            kill_group(pgid)
        if self.workdir is not None and not await asyncio.to_thread(remove_tree, self.workdir):
            log.warning("could not remove session workdir %s", self.workdir)

    def _require_running(self) -> None:
        if self.closed:
            raise SessionFailure("env_lost", "the instance was already stopped (environment closed)")
        if not self._started:
            raise SessionFailure("env_lost", "the environment was not started")

    # --- processes -------------------------------------------------------------------------------------

    def _exec_argv(self, cwd: str, *command: str) -> list[str]:
        # --quiet: apptainer's INFO/WARNING lines must not end up in the command's stderr.
        instance = f"instance://{self.instance_name}"
        return [self._executable, "--quiet", "exec", "--cleanenv", "--pwd", cwd, instance, *command]

    async def _run_quiet(
        self, argv: list[str], stdin: bytes | None = None, timeout_s: float = KILL_TIMEOUT_S
    ) -> tuple[int, bytes, bytes]:
        """Run an apptainer command to its end (bounded in time); (exit code, stdout, stderr)."""
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self._process_env, start_new_session=True,
        )  # fmt: skip
        self._process_groups.add(process.pid)
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin), timeout_s)
        finally:
            if process.returncode is None:  # timed out or cancelled
                kill_group(process.pid)
                with suppress(BaseException):  # reap it; SIGKILL makes this quick
                    await asyncio.wait_for(process.wait(), DRAIN_GRACE_S)
            self._process_groups.discard(process.pid)
        return process.returncode, out, err

    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        self._require_running()
        if _inside(self.cwd, str(self.workdir)):  # a command may have deleted its own cwd
            with suppress(OSError):
                Path(self.cwd).mkdir(parents=True, exist_ok=True)
        exec_id = secrets.token_hex(8)
        env = {**self._process_env, **self._container_vars, f"APPTAINERENV_{EXEC_ID_VAR}": exec_id}
        started = time.monotonic()
        done = await run_captured(
            self._exec_argv(self.cwd, "sh", "-c", command),
            env=env,
            cwd=None,
            timeout_s=timeout_s,
            max_output_chars=max_output_chars,
            groups=self._process_groups,
            before_kill=lambda: self._kill_in_instance(exec_id),
            on_cancel=lambda: self._spawn(self._kill_in_instance(exec_id)),
            keep_group=False,  # whatever of the command is left runs in the instance, which close() stops
        )
        returncode, out, err, timed_out = done.returncode, done.out, done.err, done.timed_out
        if returncode == APPTAINER_FAILED and not timed_out and not await self._instance_alive():
            raise SessionFailure(
                "env_lost", f"instance {self.instance_name} is gone: {err.render()[0][-300:]}"
            )
        return exec_outcome(returncode, out, err, timed_out, time.monotonic() - started)

    async def _kill_in_instance(self, exec_id: str) -> None:
        argv = self._exec_argv("/", "sh", "-c", KILL_BY_EXEC_ID_SCRIPT, "raygen-kill", exec_id)
        try:
            await self._run_quiet(argv)
        except Exception as exc:  # the instance stop at close() still ends everything
            log.warning("could not kill command %s in %s: %s", exec_id, self.instance_name, exc)

    async def open_process(self, argv: list[str], env: dict[str, str], cwd: str | None) -> HostProcess:
        return await open_instance_process(self, argv, env, cwd)

    async def _instance_alive(self) -> bool:
        argv = [self._executable, "instance", "list", "--json", self.instance_name]
        try:
            code, out, _ = await self._run_quiet(argv)
            listed = (json.loads(out).get("instances") or []) if code == 0 else []
        except (Exception, ValueError):
            return False
        return any(item.get("instance") == self.instance_name for item in listed)

    # --- files -------------------------------------------------------------------------------------------

    def _container_path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def _host_path(self, target: str) -> Path | None:
        """The host path for ``target`` if it is in the workdir once symlinks are resolved, else None."""
        workdir = str(self.workdir)
        if not _inside(target, workdir):
            return None
        real = os.path.realpath(target)
        return Path(real) if _inside(real, workdir) else None

    async def read_file(self, path: str) -> bytes:
        self._require_running()
        target = self._container_path(path)
        host = self._host_path(target)
        if host is not None:
            return await asyncio.to_thread(read_regular_file, host)
        argv = self._exec_argv("/", "sh", "-c", _READ_SCRIPT, "raygen-read", target)
        code, out, err = await self._run_quiet(argv, timeout_s=self.config.start_timeout_s)
        await self._raise_file_error(code, err, path)
        return out

    async def write_file(self, path: str, data: bytes) -> None:
        self._require_running()
        target = self._container_path(path)
        host = self._host_path(target)
        if host is not None:
            await asyncio.to_thread(write_file, host, data)
            return
        parent = posixpath.dirname(target) or "/"
        argv = self._exec_argv("/", "sh", "-c", _WRITE_SCRIPT, "raygen-write", target, parent)
        code, _, err = await self._run_quiet(argv, stdin=data, timeout_s=self.config.start_timeout_s)
        await self._raise_file_error(code, err, path)

    async def _raise_file_error(self, code: int, err: bytes, path: str) -> None:
        if code == 0:
            return
        if code in _FILE_ERRORS:
            cls, number, message = _FILE_ERRORS[code]
            raise cls(number, message, path)
        if code == APPTAINER_FAILED and not await self._instance_alive():
            raise SessionFailure("env_lost", f"instance {self.instance_name} is gone")
        detail = err.decode("utf-8", "replace").strip()[-300:]
        raise OSError(errno.EIO, f"file transfer failed (exit {code}): {detail}", path)


def reap_instances(config: SingularityEnvConfig, run_name: str | None) -> int:
    """Stop the instances of ``run_name`` (every raygen instance when None) left on this node by a killed
    worker or driver; returns how many were stopped. Blocking: for ``raygen clean`` and run start/end."""
    executable = find_executable(config)
    listing = subprocess.run(
        [executable, "instance", "list", "--json"], capture_output=True, timeout=120, check=False
    )
    if listing.returncode != 0:
        log.warning("apptainer instance list failed: %s", listing.stderr.decode(errors="replace")[-300:])
        return 0
    prefix = "raygen-" + (f"{_slug(run_name)}-" if run_name is not None else "")
    names = [i["instance"] for i in json.loads(listing.stdout or b"{}").get("instances") or []]
    stopped = 0
    for name in (n for n in names if n.startswith(prefix)):
        stop = subprocess.run(
            [executable, "instance", "stop", "--force", name], capture_output=True, timeout=120, check=False
        )
        stopped += stop.returncode == 0
    return stopped
