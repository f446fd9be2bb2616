"""The Model seam: one chat-completion call, OpenAI message format in and out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

SAMPLE_INDEX: ContextVar[int | None] = ContextVar("raygen_sample_index", default=None)
"""Set by the session while it runs one sample of a group (``--samples-per-prompt`` K > 1): the sample's
index. K samples sent with one fixed seed would come back as K copies, so models send
``request_seed(sampling.seed)`` instead of the configured seed."""


def request_seed(configured: int | None) -> int | None:
    """The ``seed`` of a request: the configured one, or for a sample of a group ``(configured or 0) +
    its index`` (the samples differ, and each is reproducible where the provider honours seeds)."""
    index = SAMPLE_INDEX.get()
    return configured if index is None else (configured or 0) + index


@dataclass
class Completion:
    message: dict[str, Any]
    """The assistant message as the provider sent it (``role``, ``content``, ``tool_calls``, and any
    reasoning field such as ``reasoning_content`` or ``reasoning``)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    cached_tokens: int = 0
    """Prompt tokens served from the provider's cache (``usage.prompt_tokens_details.cached_tokens``)."""
    reasoning_tokens: int = 0
    """Completion tokens spent on reasoning (``usage.completion_tokens_details.reasoning_tokens``)."""
    cost_usd: float | None = None
    """The call's cost as the provider reported it (OpenRouter's ``usage.cost``); None when it did not."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Provider details worth keeping (e.g. the OpenRouter provider that served the call)."""
    tokens: TokenCapture | None = None
    """Token ids, logprobs and the model version the response named, when it sent any."""


@dataclass
class TokenCapture:
    """What a response said about tokens and weights besides the message (all optional)."""

    model: str | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokens: list[str] | None = None
    """The text of each token the logprobs name."""
    top_logprobs: list[list[dict[str, Any]]] | None = None
    """Per token: ``[{"token", "logprob"}, ...]``."""


class ChatModel(ABC):
    """Async chat-completions client. Implementations retry transient errors themselves and raise
    ``raygen.errors.SessionFailure`` when a call cannot succeed."""

    name: str

    @abstractmethod
    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
