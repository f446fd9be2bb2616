"""Assemble a streamed chat completion (``stream: true``) into the completion a plain call returns.

Every wait for the next chunk is bounded by ``idle_timeout_s``: a stream that stalls, breaks or ends
without a ``finish_reason`` raises ``StreamStalled``, which the client retries like a timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

from openai import AsyncStream
from openai.types.chat import ChatCompletion, ChatCompletionChunk

_REASONING_FIELDS = ("reasoning_content", "reasoning")


class StreamStalled(Exception):
    """The stream went quiet for too long, broke, or ended without finishing."""


class _Assembly:
    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.content: list[str] = []
        self.reasoning: dict[str, list[str]] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.logprobs: list[dict[str, Any]] = []
        self.token_ids: list[int] | None = None

    def add(self, chunk: ChatCompletionChunk) -> None:
        if not self.head:
            self.head = {"id": chunk.id, "created": chunk.created, "model": chunk.model}
            if provider := (chunk.model_extra or {}).get("provider"):  # OpenRouter names the upstream one
                self.head["provider"] = provider
        if chunk.system_fingerprint and "system_fingerprint" not in self.head:
            self.head["system_fingerprint"] = chunk.system_fingerprint
        if prompt_ids := (chunk.model_extra or {}).get("prompt_token_ids"):  # vLLM: in the first chunk
            self.head["prompt_token_ids"] = prompt_ids
        if chunk.usage is not None:
            self.usage = chunk.usage.model_dump()
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                self.content.append(delta.content)
            for name in _REASONING_FIELDS:
                piece = (delta.model_extra or {}).get(name)
                if isinstance(piece, str):
                    self.reasoning.setdefault(name, []).append(piece)
            for call in delta.tool_calls or ():
                slot = self.calls.setdefault(
                    call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if call.id:
                    slot["id"] = call.id
                if call.function is not None:
                    slot["function"]["name"] += call.function.name or ""
                    slot["function"]["arguments"] += call.function.arguments or ""
            self._add_tokens(choice)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def _add_tokens(self, choice: Any) -> None:
        """Logprobs and (vLLM) token ids come piece by piece with the deltas."""
        if choice.logprobs is not None and choice.logprobs.content:
            self.logprobs.extend(e.model_dump() for e in choice.logprobs.content)
        ids = (choice.model_extra or {}).get("token_ids")
        if isinstance(ids, list):
            self.token_ids = (self.token_ids or []) + ids

    def completion(self) -> ChatCompletion:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        for name, pieces in self.reasoning.items():
            message[name] = "".join(pieces)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        body = {
            "object": "chat.completion",
            **self.head,
            "choices": [
                {"index": 0, "message": message, "finish_reason": self.finish_reason, **self._tokens()}
            ],
            "usage": self.usage,
        }
        return ChatCompletion.model_validate(body)

    def _tokens(self) -> dict[str, Any]:
        tokens: dict[str, Any] = {}
        if self.logprobs:
            tokens["logprobs"] = {"content": self.logprobs}
        if self.token_ids is not None:
            tokens["token_ids"] = self.token_ids
        return tokens


async def assemble(stream: AsyncStream[ChatCompletionChunk], idle_timeout_s: float) -> ChatCompletion:
    """Read ``stream`` (the SDK's ``AsyncStream`` of chunks) to its end; see the module docstring."""
    assembly = _Assembly()
    chunks = stream.__aiter__()
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(chunks.__anext__(), idle_timeout_s)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise StreamStalled(f"no stream chunk within {idle_timeout_s:g} s") from None
            except Exception as exc:  # a connection cut mid-stream: the provider's fault, retried
                raise StreamStalled(f"stream broke: {type(exc).__name__}: {exc}") from None
            assembly.add(chunk)
    finally:
        await stream.close()
    if assembly.finish_reason is None:
        raise StreamStalled("stream ended without a finish_reason")
    return assembly.completion()
