"""The agent seam: a harness that runs one session inside its environment, its model traffic recorded.

A ``Harness`` hands a session a ``Seat`` (``async with harness.seat(...)``): the host folders the
environment must show (``binds``: the way to raygen's model proxy, the prompt) and ``run(env, timeout_s)``,
which runs the harness in the started environment and returns a ``HarnessRun``: every model call the
proxy recorded, how the process ended and what that means for the session. Harness outcomes never raise;
the session records the traffic first, then fails with ``HarnessRun.failure`` if there is one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from raygen.envs.base import Environment
from raygen.errors import SessionFailure
from raygen.formats.records import AgentInfo
from raygen.model.base import ChatModel


@dataclass
class RecordedCall:
    """One model call of a harness as the proxy saw it, in OpenAI chat format whatever API it came by."""

    api: str
    """``chat`` (OpenAI Chat Completions), ``responses`` (OpenAI Responses) or ``messages`` (Anthropic
    Messages), the last two translated."""
    stream: bool
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    started_s: float
    """Seconds since the seat opened."""
    response: dict[str, Any] | None = None
    """The assistant message answered; None when the call failed or was refused."""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    provider: str | None = None
    duration_s: float = 0.0
    error: str | None = None


@dataclass
class HarnessRun:
    """What a harness session produced."""

    calls: list[RecordedCall]
    info: AgentInfo
    exit_status: str = "completed"
    """``completed`` or ``max_turns`` (the proxy refused a call past ``session.max_turns``)."""
    failure: SessionFailure | None = None
    """Why the session failed (a provider failure of one of its calls, or an ``agent_*`` kind)."""
    late_calls: int = field(default=0)


class Seat(ABC):
    """One session's place at the harness: its binds, then one run."""

    binds: list[str]
    """Host folders the environment must show at the same path (``EnvSpec.binds``)."""
    env: dict[str, str]
    """Variables the environment should hold for every command (none of them a secret)."""

    @abstractmethod
    async def run(self, env: Environment, timeout_s: float) -> HarnessRun:
        """Run the harness in ``env`` (started, with ``binds``) for at most ``timeout_s`` seconds."""


class Harness(ABC):
    """An agent harness (``agent.type`` other than ``builtin``), shared by a runner's sessions."""

    @abstractmethod
    def seat(
        self, *, model: ChatModel, max_calls: int, prompt: str, session_id: str
    ) -> AbstractAsyncContextManager[Seat]:
        """A seat for one session: its calls go to ``model``, at most ``max_calls`` of them."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Stop what the harness shares between sessions (the proxy)."""
