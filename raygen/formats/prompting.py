"""What a session sends besides its stored conversation: prefill (few-shot) messages and an ephemeral
system prompt. Both reach the model on every call; neither is stored in the record unless asked
(``session.store_prefill``), so guidance and examples do not become training data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raygen.errors import ConfigError

PREFILL_ROLES = ("system", "user", "assistant")


def load_prefill(path: Path) -> list[dict[str, str]]:
    """The messages of a prefill file: a JSON list of ``{"role", "content"}``; ConfigError naming the file
    and the message otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the prefill messages: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise ConfigError(f"{path}: prefill messages must be a JSON list of {{role, content}} objects")
    messages = []
    for i, item in enumerate(data):
        where = f"{path}: message {i}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: must be an object with role and content")
        if item.get("role") not in PREFILL_ROLES:
            raise ConfigError(f"{where}: field 'role' must be one of {', '.join(PREFILL_ROLES)}")
        if not isinstance(item.get("content"), str):
            raise ConfigError(f"{where}: field 'content' must be a string")
        messages.append({"role": item["role"], "content": item["content"]})
    return messages


def request_messages(
    stored: list[dict[str, Any]], ephemeral_system: str | None, prefill: list[dict[str, str]]
) -> list[dict[str, Any]]:
    """The messages of one call: ``stored`` with the ephemeral system prompt appended to (or forming) the
    system message and ``prefill`` inserted after it, before the conversation."""
    if not ephemeral_system and not prefill:
        return stored
    head, rest = [], stored
    if stored and stored[0].get("role") == "system":
        head, rest = [stored[0]], stored[1:]
    if ephemeral_system:
        text = f"{head[0]['content']}\n\n{ephemeral_system}" if head else ephemeral_system
        head = [{"role": "system", "content": text}]
    return head + prefill + rest
