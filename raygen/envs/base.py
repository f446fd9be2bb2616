"""The Environment seam: where a session's tool calls run.

An environment is an ``async with`` resource with a hard lifetime: entering starts it (a workdir, a
container, a sandbox), leaving always tears it down, on success, error and cancellation alike.
Never rely on ``__del__``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Self


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


class Environment(ABC):
    backend: str = ""

    def __init__(self, spec: EnvSpec):
        self.spec = spec

    @abstractmethod
    async def start(self) -> None:
        """Bring the environment up; raise SessionFailure("env_start"|"image_unavailable") if it cannot."""

    @abstractmethod
    async def close(self) -> None:
        """Tear everything down. Must be idempotent and safe to call after a failed start."""

    @abstractmethod
    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        """Run a shell command in the session's cwd. A timeout kills the command and all its children."""

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
