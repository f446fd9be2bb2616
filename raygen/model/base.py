"""The Model seam: one chat-completion call, OpenAI message format in and out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Completion:
    message: dict[str, Any]
    """The assistant message as the provider sent it (``role``, ``content``, ``tool_calls``, and any
    reasoning field such as ``reasoning_content`` or ``reasoning``)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Provider details worth keeping (e.g. the OpenRouter provider that served the call)."""


class ChatModel(ABC):
    """Async chat-completions client. Implementations retry transient errors themselves and raise
    ``raygen.errors.SessionFailure`` when a call cannot succeed."""

    name: str

    @abstractmethod
    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
