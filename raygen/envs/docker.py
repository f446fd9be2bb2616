"""DockerEnvironment: one container per session, through the ``docker`` SDK (``raygen[docker]``).

The container runs a do-nothing keep-alive under Docker's init (``init=True``: PID 1 reaps orphans and
forwards signals), with no network (``network_mode=none``) unless ``env.network``, never privileged, no
host mounts unless ``env.mounts``, CPU/memory/PID limits from the config, and labels naming the run, the
session and the owning process so the reaper can find leftovers. Commands run as ``sh -c`` in the
session's cwd (created by Docker as the container's working directory): through the exec channel
(``docker_channel``: the container's own ``sh``, its stdin attached) unless ``env.exec_channel`` is off,
else with one ``docker exec`` each; the keep-alive is then a ``sleep``.

Timeouts: every exec carries a unique ``RAYGEN_EXEC_ID`` variable in its environment, which every child
inherits, whatever process group or session it moves to. On timeout a second exec SIGKILLs every process
whose ``/proc/<pid>/environ`` holds that id, pass after pass until none is left (children forked during a
pass are caught by the next). Only a process that scrubs its own environment (``env -i``) escapes; those
die with the container. This works with busybox and GNU userlands alike (``tr``, ``grep``, ``kill``),
where ``timeout`` would only kill the direct child.

All blocking SDK calls run on a dedicated thread pool (see ``docker_engine.run_blocking``), so one
worker's event loop keeps serving its other sessions. ``close()`` force-removes the container on every path; a
cancelled caller still waits for the removal to finish.
"""

from __future__ import annotations

import asyncio
import errno
import io
import logging
import os
import posixpath
import re
import secrets
import socket
import tarfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from raygen.envs.base import Environment, EnvSpec, ExecResult, image_names
from raygen.envs.capture import OutputCapture, exec_result
from raygen.envs.configs import DockerEnvConfig
from raygen.envs.docker_attach import DockerProcess
from raygen.envs.docker_channel import CHANNEL_COMMAND, attach_stdin, channel_over
from raygen.envs.docker_engine import (
    build_missing_images,
    container_gone,
    container_options,
    ensure_images,
    get_client_async,
    import_docker,
    reap_containers,
    run_blocking,
)
from raygen.envs.docker_pool import adopt_warm
from raygen.envs.docker_stream import close_stream, drain_exec_stream, open_exec_stream, read_exec_output
from raygen.envs.exec_channel import MAX_CHANNEL_WRITE, ExecChannel, channel_usable_env
from raygen.envs.fleet import SandboxRefused
from raygen.envs.labels import LABEL_OWNER_HOST, LABEL_OWNER_PID, LABEL_RUN, LABEL_SAMPLE
from raygen.envs.processes import (
    EXEC_ID_VAR,
    KILL_BY_EXEC_ID_SCRIPT,
    KILL_GRACE_S,
    MAX_READ_BYTES,
    TIMEOUT_EXIT_CODE,
)
from raygen.errors import SessionFailure

log = logging.getLogger(__name__)

KEEPALIVE_COMMAND = ["sleep", "2147483647"]
"""PID 1's child: sleeps ~68 years; busybox's ``sleep`` has no ``infinity``."""
_MAX_SYMLINK_HOPS = 16
_GO_MODE_DIR = 1 << 31  # Docker reports Go's os.FileMode in the archive stat header
# Prepare a write: create the parent; exit 2 if the target is a directory.
_PREPARE_WRITE_SCRIPT = 'mkdir -p -- "$1" || exit 1; [ -d "$2" ] && exit 2; exit 0'


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "x"


class DockerEnvironment(Environment[DockerEnvConfig]):
    """One session's container (see the module docstring for the guarantees and how timeouts kill)."""

    backend = "docker"
    confined = True
    supports_binds = True
    extra_labels: dict[str, str] = {}
    own_root_filesystem = True

    @classmethod
    async def prepare(cls, config: DockerEnvConfig, images: Iterable[str | None]) -> dict[str, str | None]:
        return await ensure_images(config, image_names(images, config.default_image))

    @classmethod
    def build_images(cls, config: DockerEnvConfig, contexts: Mapping[str, Path]) -> dict[str, str | None]:
        return build_missing_images(config, dict(contexts))

    @classmethod
    def reap(cls, config: DockerEnvConfig, run_name: str | None) -> int:
        return reap_containers(config, run_name)

    def __init__(self, config: DockerEnvConfig, spec: EnvSpec):
        super().__init__(spec)
        self.config = config
        self.container_name = (
            f"raygen-{_slug(spec.run_name)}-{_slug(spec.session_key)}-{secrets.token_hex(3)}"
        )
        self.container_id: str | None = None
        self.cwd = posixpath.normpath(posixpath.join(config.workdir, spec.cwd or ""))
        self._env = spec.env_without_secrets()
        self._client: Any = None
        self._docker: Any = None
        self._channel: ExecChannel | None = None

    @property
    def image(self) -> str | None:
        return self.spec.image or self.config.default_image

    # --- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._refuse_if_closed()
        self._docker = import_docker()
        image = self.image
        if not image:
            raise SessionFailure("image_unavailable", "the row names no image and env.default_image is unset")
        self._client = await get_client_async(self.config)
        problem = (await ensure_images(self.config, {image}))[image]
        if problem:
            raise SessionFailure("image_unavailable", problem)
        if self.config.warm_pool and await adopt_warm(self, image):
            return
        # If start() is cancelled while the engine creates the container, close() waits for the creation
        # to finish, then removes the container by name.
        created = await self._start_once(run_blocking(self.config, self._create_container, image))
        self.container_id, attached = created
        if attached is not None:
            self._channel = await channel_over(attached, self.container_name)

    def _create_container(self, image: str) -> tuple[str, socket.socket | None]:
        docker = self._docker
        labels = {
            LABEL_RUN: self.spec.run_name,
            LABEL_SAMPLE: self.spec.session_key,
            LABEL_OWNER_PID: str(os.getpid()),
            LABEL_OWNER_HOST: socket.gethostname(),
            **self.extra_labels,
        }
        options = container_options(self.config, self.container_name, labels, self.cwd, self.spec.binds)
        command = CHANNEL_COMMAND if self.config.exec_channel else KEEPALIVE_COMMAND
        try:
            # create + start, never ``run``: run would pull a missing image behind the pull policy's back.
            container = self._client.containers.create(image, command, **options)
            attached = attach_stdin(self._client.api, container.id) if self.config.exec_channel else None
            container.start()
        except docker.errors.ImageNotFound as exc:
            raise SessionFailure("image_unavailable", f"image {image!r}: {exc.explanation or exc}") from exc
        except (docker.errors.DockerException, OSError) as exc:
            # An overloaded daemon times out: a refusal, which the sandbox governor learns from.
            refused = any(word in str(exc).lower() for word in ("timed out", "timeout", "deadline exceeded"))
            failure = SandboxRefused if refused else SessionFailure
            raise failure("env_start", f"cannot start a container from {image!r}: {exc}") from exc
        return container.id, attached

    async def _teardown(self) -> None:
        if await self._start_outcome() is None:
            return  # nothing was ever created
        if self._channel is not None:
            await self._channel.close()
        try:
            # Removing the container also ends any command still running in it (kills in flight too).
            await run_blocking(self.config, self._remove_container)
        except Exception as exc:  # the reaper (``raygen clean``) catches what is left
            log.warning("could not remove container %s: %s", self.container_name, exc)

    def _remove_container(self) -> None:
        errors = self._docker.errors
        for attempt in range(3):
            try:
                # By name: works even if start() was cancelled before it learned the container's id.
                self._client.api.remove_container(self.container_name, force=True, v=True)
                return
            except errors.NotFound:
                return  # never created, or already gone
            except errors.APIError as exc:
                if exc.status_code == 409 and "already in progress" in str(exc):
                    return
                if attempt == 2:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def _require_running(self) -> str:
        if self.closed:
            raise SessionFailure("env_lost", "the container was already removed (environment closed)")
        if self.container_id is None:
            raise SessionFailure("env_lost", "the environment was not started")
        return self.container_id

    def _lost(self, exc: BaseException) -> SessionFailure:
        return SessionFailure("env_lost", f"container {self.container_name}: {exc}")

    # --- commands ---------------------------------------------------------------------------------------

    async def _exec_create(
        self, argv: list[str], env: dict[str, str] | None = None, user: str = "", internal: bool = False
    ) -> str:
        # ``internal`` helpers (the timeout kill) may still run while close() is underway.
        container_id = self.container_id if internal and self.container_id else self._require_running()
        try:
            created = await run_blocking(
                self.config,
                self._client.api.exec_create,
                container_id,
                argv,
                environment=env,
                workdir=self.cwd,
                user=user,
            )
        except (self._docker.errors.DockerException, OSError) as exc:
            raise self._lost(exc) from exc
        return created["Id"]

    async def _run_quiet(
        self, argv: list[str], user: str = "", internal: bool = False
    ) -> tuple[int | None, bytes]:
        """Run a helper command to its end; its exit code and stdout+stderr."""
        exec_id = await self._exec_create(argv, user=user, internal=internal)
        try:
            output = await run_blocking(self.config, read_exec_output, self._client.api, exec_id)
            info = await run_blocking(self.config, self._client.api.exec_inspect, exec_id)
        except (self._docker.errors.DockerException, OSError) as exc:
            raise self._lost(exc) from exc
        return info.get("ExitCode"), output or b""

    def _open_channel(self) -> ExecChannel | None:
        self._require_running()
        return self._channel if self._channel is not None and self._channel.usable else None

    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        if (channel := self._open_channel()) and channel_usable_env(self._env):
            return await channel.exec(
                command, self.cwd, self._env, timeout_s, max_output_chars, self._kill_exec
            )
        started = time.monotonic()
        exec_tag = secrets.token_hex(12)
        exec_id = await self._exec_create(["sh", "-c", command], {**self._env, EXEC_ID_VAR: exec_tag})
        try:
            stream = await run_blocking(self.config, open_exec_stream, self._client.api, exec_id)
        except (self._docker.errors.DockerException, OSError) as exc:
            raise self._lost(exc) from exc
        out, err = OutputCapture(max_output_chars), OutputCapture(max_output_chars)
        reader = asyncio.ensure_future(run_blocking(self.config, drain_exec_stream, stream, out, err))
        timed_out = stream_closed = False
        try:
            await asyncio.wait([reader], timeout=timeout_s)
            if not reader.done():
                timed_out = True
                await self._kill_exec(exec_tag)
                await asyncio.wait([reader], timeout=KILL_GRACE_S)
        except asyncio.CancelledError:
            # Stop listening now and kill the command in the background (or close() removes it all).
            close_stream(stream)
            self._spawn(self._kill_exec(exec_tag))
            raise
        if not reader.done():
            # Something escaped the kill (it scrubbed its environment) and holds the output open.
            stream_closed = True
            close_stream(stream)
            await asyncio.wait([reader], timeout=KILL_GRACE_S)
        stream_error = reader.result() if reader.done() else None
        if stream_error is not None and not stream_closed:
            raise self._lost(stream_error)
        try:
            info = await run_blocking(self.config, self._client.api.exec_inspect, exec_id)
        except (self._docker.errors.DockerException, OSError) as exc:
            raise self._lost(exc) from exc
        exit_code = info.get("ExitCode")
        if timed_out or exit_code is None:
            exit_code = TIMEOUT_EXIT_CODE
        return exec_result(exit_code, out, err, timed_out, time.monotonic() - started)

    async def _kill_exec(self, exec_tag: str) -> None:
        argv = ["sh", "-c", KILL_BY_EXEC_ID_SCRIPT, "raygen-kill", exec_tag]
        try:
            # As root: the command may have switched users, and the image's user may not be root.
            code, output = await self._run_quiet(argv, user="0", internal=True)
        except SessionFailure as exc:
            code, output = None, str(exc).encode()
        if code != 0 and not self.closed:  # while closing, the container's removal does the killing
            log.warning("could not kill a timed-out command (exit %s): %r", code, output[:300])

    async def open_process(self, argv: list[str], env: dict[str, str], cwd: str | None) -> DockerProcess:
        return await DockerProcess.start(self, argv, {**self._env, **env}, self._absolute(cwd or "."))

    # --- files ------------------------------------------------------------------------------------------

    def _absolute(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    async def read_file(self, path: str) -> bytes:
        container_id = self._require_running()
        target = self._absolute(path)
        if channel := self._open_channel():
            return await channel.read_file(target, path)
        for _ in range(_MAX_SYMLINK_HOPS):
            member, data = await run_blocking(self.config, self._fetch, container_id, target, path)
            if not member.issym():
                return data
            # The engine archives a symlink itself; follow it like open() would.
            target = posixpath.normpath(posixpath.join(posixpath.dirname(target), member.linkname))
        raise OSError(errno.ELOOP, "Too many levels of symbolic links", path)

    def _fetch(self, container_id: str, target: str, shown_path: str) -> tuple[tarfile.TarInfo, bytes]:
        errors = self._docker.errors
        try:
            stream, stat = self._client.api.get_archive(container_id, target)
        except errors.NotFound as exc:
            if container_gone(exc):
                raise self._lost(exc) from exc
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", shown_path) from exc
        except errors.APIError as exc:  # e.g. a path the engine cannot read: the tool's problem
            raise OSError(errno.EIO, f"cannot read: {exc.explanation or exc}", shown_path) from exc
        except (errors.DockerException, OSError) as exc:
            raise self._lost(exc) from exc
        if stat.get("mode", 0) & _GO_MODE_DIR:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", shown_path)
        if stat.get("size", 0) > MAX_READ_BYTES:
            raise OSError(errno.EFBIG, f"file larger than {MAX_READ_BYTES} bytes", shown_path)
        buffer = io.BytesIO()
        try:
            for chunk in stream:
                buffer.write(chunk)
        except (errors.DockerException, OSError) as exc:
            raise self._lost(exc) from exc
        buffer.seek(0)
        with tarfile.open(fileobj=buffer) as archive:
            member = archive.next()
            if member is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", shown_path)
            if member.issym():
                return member, b""
            if not member.isfile():
                raise OSError(errno.EINVAL, "not a regular file", shown_path)
            handle = archive.extractfile(member)
            return member, handle.read() if handle else b""

    async def write_file(self, path: str, data: bytes) -> None:
        container_id = self._require_running()
        target = self._absolute(path)
        parent = posixpath.dirname(target) or "/"
        if (channel := self._open_channel()) and len(data) <= MAX_CHANNEL_WRITE:
            return await channel.write_file(target, parent, data, path)
        code, output = await self._run_quiet(
            ["sh", "-c", _PREPARE_WRITE_SCRIPT, "raygen-write", parent, target]
        )
        if code == 2:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        if code != 0:
            detail = output.decode("utf-8", "replace").strip()[:300]
            raise OSError(errno.ENOTDIR, f"cannot create the parent directory: {detail}", path)
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(target))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        errors = self._docker.errors
        try:
            await run_blocking(
                self.config, self._client.api.put_archive, container_id, parent, archive.getvalue()
            )
        except errors.APIError as exc:  # e.g. a read-only mount: the tool's problem
            if container_gone(exc):
                raise self._lost(exc) from exc
            raise OSError(errno.EIO, f"cannot write: {exc.explanation or exc}", path) from exc
        except (errors.DockerException, OSError) as exc:
            raise self._lost(exc) from exc
