"""One record -> one row of each message format (``tokens`` rows are built in tokens.py).

- ``openai``: OpenAI's chat fine-tuning JSONL: ``messages`` (only the keys the format defines; each
  assistant message's ``weight`` is its loss mask) and ``tools``.
- ``trl``: TRL's conversational format with tools: ``messages`` as chat templates read them (tool-call
  arguments as objects, reasoning as ``reasoning_content``), ``tools``, and the record's ``id``.
- ``sharegpt``: raygen's ShareGPT turns (the ``conversations`` of ``data/``) with the record's id.
- ``hermes``: Hermes Agent's ``batch_runner.py`` record (raygen.output.hermes).

``cut`` (a message count) exports the conversation's beginning, through a reply (``--over-length cut``).
"""

from __future__ import annotations

from typing import Any

from raygen.export.conversation import mask_of, messages_of, openai_message, tool_schemas
from raygen.formats.chat_template import template_message
from raygen.formats.sharegpt import to_sharegpt
from raygen.output.hermes import REFERENCE_TOOLS, convert

MESSAGE_FORMATS = ("openai", "trl", "sharegpt", "hermes")
FORMATS = (*MESSAGE_FORMATS, "tokens")


def openai_row(record: dict[str, Any], cut: int | None) -> dict[str, Any]:
    messages, mask = messages_of(record, cut), mask_of(record, cut)
    return {
        "messages": [openai_message(m, mask[i]) for i, m in enumerate(messages)],
        "tools": tool_schemas(record),
    }


def trl_row(record: dict[str, Any], cut: int | None) -> dict[str, Any]:
    return {
        "id": str(record.get("id") or record.get("sample_key") or ""),
        "messages": [template_message(m) for m in messages_of(record, cut)],
        "tools": tool_schemas(record),
    }


def sharegpt_row(record: dict[str, Any], cut: int | None) -> dict[str, Any]:
    conversations = record.get("conversations") or []
    if cut is not None:
        conversations = to_sharegpt(messages_of(record, cut), tool_schemas(record))
    return {
        "id": str(record.get("id") or record.get("sample_key") or ""),
        "conversations": conversations,
        "category": record.get("category"),
        "reward": record.get("reward"),
    }


def hermes_tools(manifest: dict[str, Any]) -> list[str]:
    """The fixed tool list of the Hermes records' stats: the run's setting, else the reference's tools
    and the run's own (as ``raygen merge --format hermes`` does)."""
    config = manifest.get("config") or {}
    listed = (config.get("output") or {}).get("hermes_tools")
    if listed:
        return list(listed)
    from raygen.tools.registry import load_registry

    plugins = (config.get("tools") or {}).get("plugins") or []
    return sorted(set(REFERENCE_TOOLS) | set(load_registry(plugins).all_tool_names()))


def hermes_row(record: dict[str, Any], cut: int | None, tools: list[str]) -> dict[str, Any]:
    if cut is not None:
        record = {**record, "messages": messages_of(record, cut)}
    return convert(record, tools)[0]
