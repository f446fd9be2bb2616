"""ModalEnvironment: one Modal sandbox per session, through the ``modal`` SDK (``raygen[modal]``, 1.6.4).

Each session gets ``modal.Sandbox.create`` from the row's registry image (``Image.from_registry``) in the
configured app, with a hard lifetime (``timeout=env.timeout_s``: Modal ends the sandbox then, so a lost
driver or a killed worker cannot leave one running), CPU and memory requests, no network unless
``block_network: false``, and tags naming the run, the session and the owning process. Credentials are
Modal's own (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or ``~/.modal.toml``); raygen never handles them.

Only the SDK's async API (``.aio``) is used, so one worker's event loop serves all its sessions (the SDK
runs its gRPC calls on its own thread). Commands run as ``sh -c`` via ``Sandbox.exec`` in the session's
cwd; files go through ``Sandbox.filesystem`` (binary-safe, no shell quoting).

Timeouts: each exec carries a unique ``RAYGEN_EXEC_ID`` variable that every child inherits; on timeout a
second exec SIGKILLs every process holding it (the Docker backend's kill script). The exec is also given
Modal's own ``timeout`` a little later, as a backstop that works without raygen. ``close()`` terminates
the sandbox on every path; a cancelled caller still waits for the termination.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import posixpath
import secrets
import socket
import time
from contextlib import suppress
from typing import Any

from raygen.envs.base import Environment, EnvSpec, ExecResult
from raygen.envs.capture import OutputCapture, exec_result
from raygen.envs.configs import ModalEnvConfig
from raygen.envs.fleet import SandboxRefused
from raygen.envs.labels import LABEL_OWNER_HOST, LABEL_OWNER_PID, LABEL_RUN, LABEL_SAMPLE
from raygen.envs.processes import EXEC_ID_VAR, KILL_BY_EXEC_ID_SCRIPT, KILL_GRACE_S, TIMEOUT_EXIT_CODE
from raygen.errors import MissingExtraError, SessionFailure

log = logging.getLogger(__name__)

BACKSTOP_MARGIN_S = 10.0
"""Modal's own exec timeout fires this long after raygen's, in case raygen's kill cannot run."""
KILL_EXEC_TIMEOUT_S = 60
SIGKILL_EXIT_CODE = 128 + 9  # how Modal reports a process its exec timeout killed

_apps: dict[tuple[str, str | None], Any] = {}
"""Per process: (app name, environment) -> the looked-up ``modal.App``."""


def import_modal() -> Any:
    """The ``modal`` SDK module, or MissingExtraError naming the extra that installs it."""
    try:
        import modal
    except ImportError as exc:
        raise MissingExtraError("modal", "modal") from exc
    return modal


def _infra_errors(modal: Any) -> tuple[type[BaseException], ...]:
    """Errors that mean the sandbox or Modal itself failed (not the command or the file)."""
    from grpclib import GRPCError
    from grpclib.exceptions import StreamTerminatedError

    return (modal.exception.Error, OSError, GRPCError, StreamTerminatedError)


async def _lookup_app(modal: Any, config: ModalEnvConfig) -> Any:
    key = (config.app_name, config.environment_name)
    app = _apps.get(key)
    if app is None:
        # Concurrent first lookups may both ask: AppGetOrCreate is idempotent, so that is harmless.
        app = await modal.App.lookup.aio(
            config.app_name, create_if_missing=True, environment_name=config.environment_name
        )
        _apps[key] = app
    return app


class ModalEnvironment(Environment[ModalEnvConfig]):
    """One session's Modal sandbox (see the module docstring for the guarantees)."""

    backend = "modal"
    runs_on_node = False  # sandboxes live in Modal's cloud: any node can drive them
    confined = True
    own_root_filesystem = True
    # ``reap`` stays the default (0): every sandbox has a hard lifetime (``env.timeout_s``), so Modal ends
    # what a killed run left behind.

    def __init__(self, config: ModalEnvConfig, spec: EnvSpec):
        super().__init__(spec)
        self.config = config
        self.cwd = posixpath.normpath(posixpath.join(config.workdir, spec.cwd or ""))
        self._env = spec.env_without_secrets()
        self.sandbox: Any = None
        self._modal: Any = None

    @property
    def image(self) -> str | None:
        return self.spec.image or self.config.default_image

    @property
    def sandbox_id(self) -> str | None:
        return self.sandbox.object_id if self.sandbox is not None else None

    def tags(self) -> dict[str, str]:
        """The tags every sandbox of this session carries (find leftovers with ``Sandbox.list(tags=...)``)."""
        return {
            **self.config.tags,
            LABEL_RUN: self.spec.run_name,
            LABEL_SAMPLE: self.spec.session_key,
            LABEL_OWNER_HOST: socket.gethostname(),
            LABEL_OWNER_PID: str(os.getpid()),
        }

    # --- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._refuse_if_closed()
        self._modal = import_modal()
        image = self.image
        if not image:
            raise SessionFailure("image_unavailable", "the row names no image and env.default_image is unset")
        # If start() is cancelled while Modal creates the sandbox, close() waits for the creation to
        # finish, then terminates the sandbox.
        self.sandbox = await self._start_once(self._create(image))
        await self._make_workdir()

    async def _create(self, image: str) -> Any:
        modal = self._modal
        errors = modal.exception
        config = self.config
        options: dict[str, Any] = {
            "image": modal.Image.from_registry(image),
            "timeout": config.timeout_s,
            "block_network": config.block_network,
            "tags": self.tags(),
        }
        if config.cpu is not None:
            options["cpu"] = config.cpu
        if config.memory is not None:
            options["memory"] = config.memory
        try:
            app = await _lookup_app(modal, config)
            return await modal.Sandbox.create.aio(app=app, **options)
        except errors.ImageBuildError as exc:
            raise SessionFailure("image_unavailable", f"image {image!r}: {exc}") from exc
        except errors.ResourceExhaustedError as exc:  # Modal's creation rate limit: the governor learns
            raise SandboxRefused("env_start", f"Modal refused a sandbox for {image!r}: {exc}") from exc
        except _infra_errors(modal) as exc:
            raise SessionFailure("env_start", f"cannot create a Modal sandbox from {image!r}: {exc}") from exc

    async def _make_workdir(self) -> None:
        try:
            await self.sandbox.filesystem.make_directory.aio(self.cwd, create_parents=True)
        except _infra_errors(self._modal) as exc:
            raise SessionFailure(
                "env_start", f"cannot create the working directory {self.cwd}: {exc}"
            ) from exc

    async def _teardown(self) -> None:
        creating = await self._start_outcome()
        if creating is None:
            return  # nothing was ever created
        if creating.cancelled() or creating.exception() is not None:
            return
        sandbox = creating.result()
        try:
            await sandbox.terminate.aio()
        except Exception as exc:  # it still ends at its hard lifetime
            log.warning("could not terminate Modal sandbox %s: %s", sandbox.object_id, exc)
        with suppress(Exception):
            await sandbox.detach.aio()  # releases the SDK's connection to the sandbox's worker

    def _require_running(self) -> Any:
        if self.closed:
            raise SessionFailure("env_lost", "the sandbox was already terminated (environment closed)")
        if self.sandbox is None:
            raise SessionFailure("env_lost", "the environment was not started")
        return self.sandbox

    def _lost(self, exc: BaseException) -> SessionFailure:
        return SessionFailure("env_lost", f"Modal sandbox {self.sandbox_id}: {exc}")

    # --- commands ---------------------------------------------------------------------------------------

    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        sandbox = self._require_running()
        started = time.monotonic()
        exec_tag = secrets.token_hex(12)
        try:
            process = await sandbox.exec.aio(
                "sh",
                "-c",
                command,
                workdir=self.cwd,
                env={**self._env, EXEC_ID_VAR: exec_tag},
                timeout=math.ceil(timeout_s + BACKSTOP_MARGIN_S),
                text=False,
            )
        except _infra_errors(self._modal) as exc:
            raise self._lost(exc) from exc
        out, err = OutputCapture(max_output_chars), OutputCapture(max_output_chars)
        collector = asyncio.ensure_future(_collect(process, out, err))
        timed_out = False
        try:
            await asyncio.wait([collector], timeout=timeout_s)
            if not collector.done():
                timed_out = True
                await self._kill_exec(exec_tag)
                await asyncio.wait([collector], timeout=KILL_GRACE_S)
        except asyncio.CancelledError:
            # Stop listening now and kill the command in the background (or close() ends it all).
            collector.cancel()
            self._spawn(self._kill_exec(exec_tag))
            raise
        exit_code: int | None = None
        if collector.done():
            try:
                exit_code = collector.result()
            except _infra_errors(self._modal) as exc:
                raise self._lost(exc) from exc
        else:
            # Something escaped the kill (it scrubbed its environment) and holds the output open.
            collector.cancel()
            with suppress(BaseException):
                await collector
        # The backstop ended it when the SDK's own exec deadline passed first (-1) or Modal's exec timeout
        # SIGKILLed the group just before our wait gave up (137 at or past the limit: a race under load).
        past_limit = time.monotonic() - started >= timeout_s
        backstop = exit_code == -1 or (exit_code == SIGKILL_EXIT_CODE and past_limit)
        if timed_out or exit_code is None or backstop:
            timed_out, exit_code = True, TIMEOUT_EXIT_CODE
        return exec_result(exit_code, out, err, timed_out, time.monotonic() - started)

    async def _kill_exec(self, exec_tag: str) -> None:
        if self.closed or self.sandbox is None:
            return  # terminating the sandbox ends every command
        try:
            process = await self.sandbox.exec.aio(
                "sh",
                "-c",
                KILL_BY_EXEC_ID_SCRIPT,
                "raygen-kill",
                exec_tag,
                timeout=KILL_EXEC_TIMEOUT_S,
                text=False,
            )
            code = await process.wait.aio()
            detail = (await process.stderr.read.aio())[:300] if code else b""
        except _infra_errors(self._modal) as exc:
            code, detail = None, str(exc).encode()
        if code != 0 and not self.closed:
            log.warning("could not kill a timed-out command (exit %s): %r", code, detail)

    # --- files ------------------------------------------------------------------------------------------

    def _absolute(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    async def read_file(self, path: str) -> bytes:
        sandbox = self._require_running()
        try:
            return await sandbox.filesystem.read_bytes.aio(self._absolute(path))
        except self._modal.exception.SandboxFilesystemError as exc:
            raise _file_error(self._modal, exc, path) from exc
        except _infra_errors(self._modal) as exc:
            raise self._lost(exc) from exc

    async def write_file(self, path: str, data: bytes) -> None:
        sandbox = self._require_running()
        try:
            await sandbox.filesystem.write_bytes.aio(data, self._absolute(path))
        except self._modal.exception.SandboxFilesystemError as exc:
            raise _file_error(self._modal, exc, path) from exc
        except _infra_errors(self._modal) as exc:
            raise self._lost(exc) from exc


async def _collect(process: Any, out: OutputCapture, err: OutputCapture) -> int:
    """Read both output streams of an exec to their end, then its exit code (128+N for signal N)."""

    async def pump(stream: Any, capture: OutputCapture) -> None:
        async for chunk in stream:
            capture.feed(chunk)

    await asyncio.gather(pump(process.stdout, out), pump(process.stderr, err))
    return await process.wait.aio()


def _file_error(modal: Any, exc: Exception, path: str) -> OSError:
    """The builtin OSError for a Modal filesystem error (a tool's problem, not the sandbox's)."""
    errors = modal.exception
    kinds: list[tuple[type, type[OSError], int, str]] = [
        (errors.SandboxFilesystemNotFoundError, FileNotFoundError, errno.ENOENT, "No such file or directory"),
        (errors.SandboxFilesystemIsADirectoryError, IsADirectoryError, errno.EISDIR, "Is a directory"),
        (errors.SandboxFilesystemNotADirectoryError, NotADirectoryError, errno.ENOTDIR, "Not a directory"),
        (errors.SandboxFilesystemPermissionError, PermissionError, errno.EACCES, "Permission denied"),
        (errors.SandboxFilesystemFileTooLargeError, OSError, errno.EFBIG, "File too large"),
    ]
    for modal_type, builtin_type, code, message in kinds:
        if isinstance(exc, modal_type):
            return builtin_type(code, message, path)
    return OSError(errno.EIO, str(exc), path)
