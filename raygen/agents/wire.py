"""The OpenAI Chat Completions wire format the proxy speaks: a request's messages and tools, and a
completion as one JSON body or as server-sent events (``stream: true``; many harnesses always stream)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from raygen.model.base import Completion


def content_text(content: Any) -> str:
    """A message's text, whether its content is a string or a list of parts (``{"text": ...}``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def assistant_message(completion: Completion) -> dict[str, Any]:
    """The completion's message as an OpenAI assistant message (``content`` always present)."""
    message = {k: v for k, v in completion.message.items() if v is not None}
    message["role"] = "assistant"
    message.setdefault("content", None)
    return message


def usage(completion: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


def chat_completion(completion: Completion, model: str) -> dict[str, Any]:
    """A ``chat.completion`` body."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": assistant_message(completion),
                "finish_reason": completion.finish_reason or "stop",
            }
        ],
        "usage": usage(completion),
    }


def chat_chunks(completion: Completion, model: str, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The same completion as ``chat.completion.chunk`` events: text and reasoning, then each tool call
    whole (index, id, name, arguments), then the finish reason, then usage if the request asked."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk"}
    base |= {"created": int(time.time()), "model": model}
    message = assistant_message(completion)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    first: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str):
            first[key] = message[key]
    yield chunk(first)
    calls = message.get("tool_calls") or []
    if calls:
        yield chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]})
    yield chunk({}, completion.finish_reason or "stop")
    if include_usage:
        yield {**base, "choices": [], "usage": usage(completion)}


def sse(event: dict[str, Any], name: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def chat_error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": kind}}


def request_parts(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of a chat request; ``ValueError`` when they are not lists of objects. The
    harness's sampling options are not forwarded: the run's ``sampling`` applies (docs/agents.md)."""
    messages, tools = body.get("messages"), body.get("tools") or []
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages must be a list of objects")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools must be a list of objects")
    return messages, tools
