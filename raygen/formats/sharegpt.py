"""OpenAI-format messages -> ShareGPT turns (Hermes function-calling style).

- system: the system prompt, followed by the offered tools' JSON schemas in a ``<tools>`` block
  (training data for tool calling needs the tool definitions next to the conversation);
- human: the user's message verbatim;
- gpt: ``<think>reasoning</think>`` (if any), the visible content, then one
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` per call;
- tool: consecutive tool results merged into one turn of ``<tool_response>{...}</tool_response>`` blocks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from raygen.formats.limits import stored_arguments
from raygen.formats.reasoning import split_reasoning


def _maybe_json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def tools_block(tool_schemas: list[dict[str, Any]]) -> str:
    """The ``<tools>`` block of the system turn ("" when no tool is offered)."""
    if not tool_schemas:
        return ""
    return "<tools>\n" + _dumps([s["function"] for s in tool_schemas]) + "\n</tools>"


def to_sharegpt(
    messages: list[dict[str, Any]], tool_schemas: list[dict[str, Any]], block: str | None = None
) -> list[dict[str, str]]:
    """``block``: ``tools_block(tool_schemas)`` if the caller already has it (the session runner keeps
    one per set of offered tools: a few kB of JSON, otherwise encoded again for every record)."""
    turns: list[dict[str, str]] = []
    system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
    block = tools_block(tool_schemas) if block is None else block
    if block:
        system = f"{system}\n\n{block}" if system else block
    if system:
        turns.append({"from": "system", "value": system})
    return turns + dialogue_turns(messages, _render_assistant, _tool_payload)


def _tool_payload(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "tool_call_id": message.get("tool_call_id"),
        "name": message.get("name"),
        "content": _maybe_json(message.get("content")),
    }


def dialogue_turns(
    messages: list[dict[str, Any]],
    render_assistant: Callable[[dict[str, Any]], str],
    tool_payload: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[dict[str, str]]:
    """The human, gpt and tool turns of ``messages`` (system messages are the caller's): each assistant
    message rendered by ``render_assistant``, each tool result as a ``<tool_response>`` block holding
    ``tool_payload(message)``, consecutive results merged into one tool turn."""
    turns: list[dict[str, str]] = []
    for message in messages:
        role = message.get("role")
        if role == "user":
            turns.append({"from": "human", "value": message.get("content") or ""})
        elif role == "assistant":
            turns.append({"from": "gpt", "value": render_assistant(message)})
        elif role == "tool":
            block = "<tool_response>\n" + _dumps(tool_payload(message)) + "\n</tool_response>"
            if turns and turns[-1]["from"] == "tool":
                turns[-1]["value"] += "\n" + block
            else:
                turns.append({"from": "tool", "value": block})
    return turns


def _render_assistant(message: dict[str, Any]) -> str:
    reasoning, content = split_reasoning(message)
    parts = []
    if reasoning:
        parts.append(f"<think>\n{reasoning}\n</think>")
    if content:
        parts.append(content)
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            arguments = stored_arguments(arguments)  # a huge one is stored once, in the raw messages
        payload = {"name": fn.get("name"), "arguments": _maybe_json(arguments)}
        parts.append(f"<tool_call>\n{_dumps(payload)}\n</tool_call>")
    return "\n".join(parts)
