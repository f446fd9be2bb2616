"""The Anthropic Messages API, translated to and from the chat-completions form raygen's models speak
(for Claude Code and other harnesses built on Anthropic's SDK).

Request: ``system`` becomes a system message; a user turn's ``tool_result`` blocks become ``tool``
messages (before its text); an assistant turn's ``text``, ``thinking`` and ``tool_use`` blocks become its
content, ``reasoning_content`` and ``tool_calls``; ``tools`` (``input_schema``) become function tools.
Answer: the completion as ``thinking``, ``text`` and ``tool_use`` blocks with ``stop_reason``, as one body or
as Anthropic's event stream.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from raygen.agents.wire import assistant_message
from raygen.model.base import Completion

_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ValueError("message content must be a string or a list of blocks")
    return [b for b in content if isinstance(b, dict)]


def _user_messages(content: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in _blocks(content):
        if block.get("type") == "tool_result":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id", "")),
                    "content": _text(block.get("content")),
                }
            )
        elif block.get("type") == "text":
            texts.append(str(block.get("text", "")))
    if texts:
        messages.append({"role": "user", "content": "\n".join(texts)})
    return messages


def _assistant_message(content: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    texts, thinking, calls = [], [], []
    for block in _blocks(content):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": arguments},
                }
            )
    if texts:
        message["content"] = "".join(texts)
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def request_parts(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) in chat-completions form; ``ValueError`` for a body that is no Messages request."""
    turns = body.get("messages")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise ValueError("messages must be a list of objects")
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for turn in turns:
        if turn.get("role") == "assistant":
            messages.append(_assistant_message(turn.get("content")))
        else:
            messages.extend(_user_messages(turn.get("content")))
    tools = [
        {
            "type": "function",
            "function": {
                "name": str(t.get("name", "")),
                "description": str(t.get("description") or ""),
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
            },
        }
        for t in body.get("tools") or []
        if isinstance(t, dict) and t.get("name")
    ]
    return messages, tools


def _content_blocks(completion: Completion) -> list[dict[str, Any]]:
    message = assistant_message(completion)
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": str(message["content"])})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments = {"_raw_arguments": fn.get("arguments")}  # shown to the harness as it came
        blocks.append(
            {"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""), "input": arguments}
        )
    return blocks


def _usage(completion: Completion) -> dict[str, int]:
    return {"input_tokens": completion.prompt_tokens, "output_tokens": completion.completion_tokens}


def message_body(completion: Completion, model: str) -> dict[str, Any]:
    """A Messages API response body."""
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content_blocks(completion),
        "stop_reason": _STOP_REASONS.get(completion.finish_reason or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": _usage(completion),
    }


def message_events(completion: Completion, model: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of the Messages event stream for the completion, each block in one delta."""
    body = message_body(completion, model)
    start = {**body, "content": [], "stop_reason": None, "usage": {**body["usage"], "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(body["content"]):
        kind = block["type"]
        empty = {"text": ""} if kind == "text" else {"thinking": ""} if kind == "thinking" else {"input": {}}
        opening = {**{k: v for k, v in block.items() if k not in ("text", "thinking", "input")}, **empty}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}
        if kind == "text":
            delta = {"type": "text_delta", "text": block["text"]}
        elif kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps(block["input"], ensure_ascii=False),
            }
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    delta = {"stop_reason": body["stop_reason"], "stop_sequence": None}
    yield (
        "message_delta",
        {"type": "message_delta", "delta": delta, "usage": {"output_tokens": completion.completion_tokens}},
    )
    yield "message_stop", {"type": "message_stop"}


def error_body(message: str, kind: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def count_tokens(body: dict[str, Any]) -> dict[str, int]:
    """``/v1/messages/count_tokens``: an estimate (four characters a token), as raygen's governor makes."""
    return {"input_tokens": max(1, len(json.dumps(body, ensure_ascii=False)) // 4)}
