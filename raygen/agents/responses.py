"""The OpenAI Responses API (``POST /v1/responses``), translated to and from chat completions (for Codex,
which speaks only this API).

Request: ``instructions`` and ``developer``/``system`` messages become system messages, ``user`` and
``assistant`` messages keep their text, ``function_call`` items become the ``tool_calls`` of an assistant
message (with the ``reasoning`` summary before them as its ``reasoning_content``), ``function_call_output``
items become ``tool`` messages; function tools become chat function tools (other tool types, which only the
provider could run, are not forwarded). Answer: ``reasoning``, ``message`` and ``function_call`` output
items, as one body or as the event stream (``response.created`` ... ``response.completed``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from raygen.agents.wire import assistant_message, content_text
from raygen.model.base import Completion

_SYSTEM_ROLES = ("system", "developer")


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message function calls join: the last message if it is one without a result yet."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": None})
    return messages[-1]


def _item(messages: list[dict[str, Any]], item: dict[str, Any], reasoning: list[str]) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = "system" if item.get("role") in _SYSTEM_ROLES else str(item.get("role", "user"))
        message: dict[str, Any] = {"role": role, "content": content_text(item.get("content"))}
        if role == "assistant" and reasoning:
            message["reasoning_content"] = "\n".join(reasoning)
            reasoning.clear()
        messages.append(message)
    elif kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments", item.get("input", ""))
        call = {"id": str(item.get("call_id", "")), "type": "function"}
        call["function"] = {"name": str(item.get("name", "")), "arguments": str(arguments)}
        target = _assistant(messages)
        target.setdefault("tool_calls", []).append(call)
        if reasoning:
            target["reasoning_content"] = "\n".join(reasoning)
            reasoning.clear()
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        content = output if isinstance(output, str) else content_text(output)
        messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": content})
    elif kind == "reasoning" and item.get("summary"):
        reasoning.append(content_text(item.get("summary")))


def request_parts(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) in chat-completions form; ``ValueError`` for a body that is no Responses request."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError("input must be a string or a list of objects")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    reasoning: list[str] = []
    for item in items:
        _item(messages, item, reasoning)
    tools = [
        {
            "type": "function",
            "function": {
                "name": str(t["name"]),
                "description": str(t.get("description") or ""),
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            },
        }
        for t in body.get("tools") or []
        if isinstance(t, dict) and t.get("type") == "function" and t.get("name")
    ]
    return messages, tools


def _output(completion: Completion) -> list[dict[str, Any]]:
    message = assistant_message(completion)
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        summary = [{"type": "summary_text", "text": reasoning}]
        items.append({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex[:24]}", "summary": summary})
    if message.get("content"):
        text = {"type": "output_text", "text": str(message["content"]), "annotations": []}
        items.append(
            {"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "role": "assistant",
             "status": "completed", "content": [text]}
        )  # fmt: skip
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        items.append(
            {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": call.get("id", ""),
             "name": fn.get("name", ""), "arguments": fn.get("arguments") or "{}", "status": "completed"}
        )  # fmt: skip
    return items


def response_body(completion: Completion, model: str, status: str = "completed") -> dict[str, Any]:
    """A ``response`` object."""
    return {
        "id": f"resp_{uuid.uuid4().hex[:24]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": _output(completion),
        "usage": {
            "input_tokens": completion.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        },
    }


def response_events(completion: Completion, model: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of the Responses event stream: each output item added, its text as one delta,
    done; then ``response.completed`` with the whole response."""
    body = response_body(completion, model)
    started = {**body, "status": "in_progress", "output": []}
    events: list[tuple[str, dict[str, Any]]] = [("response.created", {"response": started})]
    for index, item in enumerate(body["output"]):
        opening = {**item, "content": []} if item["type"] == "message" else item
        events.append(("response.output_item.added", {"output_index": index, "item": opening}))
        if item["type"] == "message":
            part, where = (
                item["content"][0],
                {"item_id": item["id"], "output_index": index, "content_index": 0},
            )
            events.append(("response.content_part.added", {**where, "part": {**part, "text": ""}}))
            events.append(("response.output_text.delta", {**where, "delta": part["text"]}))
            events.append(("response.output_text.done", {**where, "text": part["text"]}))
            events.append(("response.content_part.done", {**where, "part": part}))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    events.append(("response.completed", {"response": body}))
    for number, (name, data) in enumerate(events):
        yield name, {"type": name, "sequence_number": number, **data}


def error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": kind}}
