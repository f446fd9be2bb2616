"""What every export reads of a record: its conversation, its offered tools, its loss mask.

The record keeps the raw OpenAI messages exactly as they went to the provider (``messages``) and the tool
schemas in its ShareGPT system turn; an export takes both from there, so a run exports with no model call
and no config.
"""

from __future__ import annotations

from typing import Any

from raygen.formats.loss_mask import record_loss_mask
from raygen.output.hermes import offered_schemas

_OPENAI_KEYS = {
    "system": ("content",),
    "user": ("content",),
    "assistant": ("content", "tool_calls"),
    "tool": ("tool_call_id", "content"),
}


def tool_schemas(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The offered tools as OpenAI ``tools`` entries (``{"type": "function", "function": {...}}``)."""
    return [{"type": "function", "function": schema} for schema in offered_schemas(record)]


def messages_of(record: dict[str, Any], cut: int | None = None) -> list[dict[str, Any]]:
    """The record's messages, the first ``cut`` of them when given (a cut at a turn boundary)."""
    messages = [m for m in record.get("messages") or [] if isinstance(m, dict)]
    return messages if cut is None else messages[:cut]


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "id": str(call.get("id") or ""),
        "type": "function",
        "function": {"name": str(fn.get("name") or ""), "arguments": str(fn.get("arguments") or "")},
    }


def openai_message(message: dict[str, Any], trained: int | None) -> dict[str, Any]:
    """One message in OpenAI's fine-tuning shape: only the keys it defines for the role; an assistant
    message carries ``weight`` (its loss mask); reasoning fields are dropped (the format has none)."""
    role = str(message.get("role") or "")
    out: dict[str, Any] = {"role": role}
    for key in _OPENAI_KEYS.get(role, ("content",)):
        value = message.get(key)
        if key == "tool_calls":
            if value:
                out["tool_calls"] = [_tool_call(c) for c in value if isinstance(c, dict)]
        elif key == "content":
            if value is not None or role != "assistant":
                out["content"] = value if isinstance(value, str) else ("" if value is None else str(value))
        elif value is not None:
            out[key] = str(value)
    if role == "assistant" and trained is not None:
        out["weight"] = trained
    return out


def mask_of(record: dict[str, Any], cut: int | None = None) -> list[int]:
    mask = record_loss_mask(record)
    return mask if cut is None else mask[:cut]
