"""The Environment seam: where a session's tool calls run.

An environment is an ``async with`` resource with a hard lifetime: entering starts it (a workdir, a
container, a sandbox), leaving always tears it down, on success, error and cancellation alike.
Never rely on ``__del__``.

Besides the per-session instance, each backend class answers the questions the driver and the cluster
ask about the backend as a whole (class-level hooks, like inspect_ai's ``task_init``/``cli_cleanup``):
``prepare`` (image pre-flight before any model call), ``build_images`` (task images from Dockerfiles),
``reap`` (a run's leftovers on this node), ``runs_on_node`` (sandboxes on the actor's node, or off it in a
cloud service), ``confines_destructive_rows`` and ``own_root_filesystem``. Callers reach a backend only
through ``raygen.envs.environment_class``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Self, TypeVar

from raygen.config_section import Section
from raygen.errors import ConfigError, SessionFailure

T = TypeVar("T")


@dataclass
class EnvSpec:
    """What a session asks of its environment (from the prompt row and the run)."""

    session_key: str
    """Unique per session attempt; used in names and labels."""
    run_name: str = "raygen"
    image: str | None = None
    cwd: str | None = None
    """Working directory inside the environment; relative paths are taken inside the session's root."""
    env: dict[str, str] = field(default_factory=dict)
    secret_values: list[str] = field(default_factory=list)
    """Values that must never reach a tool's environment or output."""
    binds: list[str] = field(default_factory=list)
    """Host folders shown inside the sandbox at the same path, writable (an agent harness's proxy socket
    and prompt, ``raygen.agents``); only backends with ``supports_binds`` honour them."""

    def env_without_secrets(self) -> dict[str, str]:
        """The row's variables minus any whose value is a secret (the key must not reach a command)."""
        secrets = {value for value in self.secret_values if value}
        return {name: value for name, value in self.env.items() if value not in secrets}


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0


ConfigT = TypeVar("ConfigT", bound=Section)
"""The backend's own config section (``DockerEnvConfig`` for ``DockerEnvironment``, ...)."""


class Environment(ABC, Generic[ConfigT]):
    backend: ClassVar[str] = ""
    runs_on_node: ClassVar[bool] = True
    """Whether sessions' sandboxes use the node their actor runs on (processes, containers, instances).
    False for a cloud service (Modal): any node can drive them, so no per-node sandbox capacity applies."""
    confined: ClassVar[bool] = False
    """Whether commands cannot reach the host (a container, an instance, a cloud sandbox, or no processes at
    all); False by default, so a new backend must claim it."""
    supports_binds: ClassVar[bool] = False
    """Whether ``EnvSpec.binds`` reach the sandbox (a host folder its commands can use), which an agent
    harness needs to reach raygen's model proxy (docs/agents.md)."""
    own_root_filesystem: ClassVar[bool] = False
    """Whether each session sees a root file system of its own (its image's), so a task may write absolute
    paths such as ``/tests`` without touching the host or another session."""

    # --- class-level hooks: the backend as a whole, not one session ------------------------------------

    @classmethod
    async def prepare(cls, config: ConfigT, images: Iterable[str | None]) -> dict[str, str | None]:
        """Image pre-flight, before any model call: per image, None if sessions can use it, else a message
        saying why not (those rows fail without running). ``None`` among ``images`` (rows naming no image)
        stands for the backend's default image, checked too and reported under its own name.

        Raise SessionFailure("env_start") when the backend itself is unusable (no engine, no executable),
        so a run fails loudly instead of sending every row to ``failed/``. Default: accept every image.
        """
        return dict.fromkeys(image for image in images if image)

    @classmethod
    def build_images(cls, config: ConfigT, contexts: Mapping[str, Path]) -> dict[str, str | None]:
        """Build each image tag from its build context (a folder with a Dockerfile), skipping tags that
        exist; per tag None or why the build failed. Blocking; before any model call. Default: the backend
        builds nothing (its pre-flight then reports images it cannot find)."""
        return dict.fromkeys(contexts)

    @classmethod
    def reap(cls, config: ConfigT, run_name: str | None) -> int:
        """Remove what sessions of ``run_name`` (of every run when None) left on this node after a killed
        worker or driver; returns how many were removed. Blocking; for ``raygen clean`` and the start and
        end of a run. Default: nothing outlives a session (0)."""
        return 0

    @classmethod
    def confines_destructive_rows(cls, config: ConfigT) -> bool:
        """Whether a row marked ``needs_isolation`` cannot harm the host with this configuration (a
        backend whose confinement is optional decides from ``config``). Default: ``confined``."""
        return cls.confined

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self._starting: asyncio.Future | None = None
        """The step that creates the sandbox (container, sandbox, instance), run once and shielded."""
        self._closing: asyncio.Future | None = None
        """The teardown, run once; every ``close()`` waits for the same one."""
        self._background: set[asyncio.Future] = set()

    @abstractmethod
    async def start(self) -> None:
        """Bring the environment up; raise SessionFailure("env_start"|"image_unavailable") if it cannot.
        Backends begin with ``self._refuse_if_closed()`` and run the step that creates something outside
        raygen's process through ``self._start_once(...)``."""

    async def close(self) -> None:
        """Tear everything down, once (``_teardown``): idempotent, safe after a failed or cancelled start,
        and a cancelled caller still waits for the teardown to finish."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._teardown())
        await finish_despite_cancellation(self._closing)

    async def _teardown(self) -> None:
        """What ``close()`` runs, once. Backends that create something override it; they call
        ``_start_outcome()`` first, so a start cancelled half-way is torn down once it completes."""
        self._cancel_background()

    # --- lifecycle helpers shared by every backend ------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (the teardown may still be running)."""
        return self._closing is not None

    def _refuse_if_closed(self) -> None:
        if self._closing is not None:
            raise SessionFailure("env_start", "this environment was already closed")

    async def _start_once(self, creation: Coroutine[Any, Any, T]) -> T:
        """Run ``creation`` (the step that makes a container, sandbox or instance) once, shielded and
        remembered: if the caller is cancelled meanwhile, the creation still completes and ``close()``
        tears down what it made. A second call awaits the first creation."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(creation)
        else:
            creation.close()
        return await asyncio.shield(self._starting)

    @property
    def _started(self) -> bool:
        """Whether the creation step ended and succeeded."""
        starting = self._starting
        if starting is None or not starting.done() or starting.cancelled():
            return False
        return starting.exception() is None

    async def _start_outcome(self) -> asyncio.Future | None:
        """For teardowns: wait for a creation still under way (its errors are the start's business), then
        return it (done), or None if nothing was ever begun."""
        starting = self._starting
        if starting is not None and not starting.done():
            with suppress(BaseException):
                await asyncio.shield(starting)
        return starting

    def _spawn(self, work: Awaitable[Any]) -> None:
        """Run ``work`` in the background (e.g. killing a command whose caller was cancelled), kept alive
        until it ends; dropped once closing, since the teardown ends every command anyway."""
        if self._closing is not None:
            if asyncio.iscoroutine(work):
                work.close()
            return
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()

    @abstractmethod
    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        """Run a shell command in the session's cwd. A timeout kills the command and all its children."""

    async def open_process(self, argv: list[str], env: dict[str, str], cwd: str | None) -> EnvProcess:
        """Start a long-lived process in the session's environment with its stdin and stdout as byte
        streams (an MCP stdio server): ``env`` is added to the session's command environment, ``cwd`` is
        taken like a row's (default the session's cwd). Leaving its ``async with`` (or ``close``) stops
        its whole process group; closing the environment stops it too. Default: not supported."""
        raise ConfigError(
            f"env.type={self.backend} cannot run a stdio MCP server in a session; use local or docker, "
            "or an HTTP server (url)"
        )

    @abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Read a file (relative paths from cwd). Raises FileNotFoundError / IsADirectoryError."""

    @abstractmethod
    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file, creating parent directories (relative paths from cwd)."""

    @property
    def image(self) -> str | None:
        return self.spec.image

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class EnvProcess(ABC):
    """A process started by ``Environment.open_process``: write to its stdin, read its stdout by lines;
    its stderr is kept as a bounded tail for messages. ``close`` is idempotent and stops every process
    the server started, whatever state it is in."""

    @abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes to its stdin; ``ConnectionError`` once it is gone."""

    @abstractmethod
    async def readline(self) -> bytes:
        """The next line of its stdout (with the newline); ``b""`` at its end."""

    @abstractmethod
    def stderr_tail(self) -> str:
        """The last few hundred characters it wrote to stderr (for messages)."""

    @abstractmethod
    def exited(self) -> bool:
        """Whether the process has ended."""

    def exit_code(self) -> int | None:
        """How it ended, where the backend knows (None while it runs or when unknown)."""
        return None

    @abstractmethod
    async def close(self) -> None:
        """Stop it and everything it started."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def image_names(images: Iterable[str | None], default_image: str | None) -> set[str]:
    """The images a pre-flight checks: the rows' images, with ``None`` (a row naming none) standing for
    the backend's default image, if it has one."""
    wanted = set(images)
    names = {image for image in wanted if image}
    if None in wanted and default_image:
        names.add(default_image)
    return names


async def finish_despite_cancellation(teardown: asyncio.Future) -> None:
    """Wait for ``teardown`` to finish even if the caller is cancelled meanwhile, then let the
    cancellation through: a cancelled session must still remove its container, sandbox or instance."""
    cancelled = False
    while not teardown.done():
        try:
            await asyncio.shield(teardown)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
