"""Size limits on what a session stores: one model reply, one tool-call argument, one whole record.

A hostile or broken model can answer with tens of megabytes; stored as it came (and twice, in
``messages`` and ``conversations``) one such reply made a 115 MB JSONL line. These caps keep a record
bounded and say so in its status (docs/resume.md, failure taxonomy).
"""

from __future__ import annotations

import json
from typing import Any

from raygen.formats.records import Trajectory

LARGE_ARGUMENT_CHARS = 1_000_000
"""Tool-call arguments longer than this are stored once, in ``messages``; the ShareGPT ``conversations``
show a placeholder naming their size instead of a second copy."""
_REPLY_HEAD_CHARS = 2000
"""How much of an oversized reply the record keeps, so a reader can see what it was."""
_RECORD_SLACK = 64 * 1024
"""Room for a record's fields besides its conversation when estimating its size."""


def reply_chars(message: dict[str, Any]) -> int:
    """Size of a model reply: its content, reasoning and tool calls, as the JSON it is stored as."""
    return len(json.dumps(message, ensure_ascii=False))


def cut_reply(message: dict[str, Any], size: int) -> dict[str, Any]:
    """What a record keeps of an oversized reply: its head, as text, with no tool calls."""
    head = json.dumps(message, ensure_ascii=False)[:_REPLY_HEAD_CHARS]
    return {"role": "assistant", "content": f"[raygen: reply of {size} characters cut to its head] {head}"}


def stored_arguments(arguments: str) -> str:
    """The arguments a second copy (ShareGPT) shows: themselves, or a placeholder when they are large."""
    if len(arguments) <= LARGE_ARGUMENT_CHARS:
        return arguments
    return f"[raygen: {len(arguments)} characters of arguments, stored once in messages]"


def _conversation_chars(messages: list[dict[str, Any]]) -> int:
    total = 0
    for message in messages:
        total += sum(len(value) for value in message.values() if isinstance(value, str))
        for call in message.get("tool_calls") or []:
            total += len(str((call.get("function") or {}).get("arguments") or ""))
    return total


_TOKEN_BYTES = 32
"""Most JSON bytes of one captured token id or logprob (a top-logprob alternative: twice that plus its
text), for the estimate below."""


def _token_bytes(record: Trajectory) -> int:
    total = 0
    for turn in record.turns:
        for values in (turn.prompt_token_ids, turn.token_ids, turn.logprobs):
            total += _TOKEN_BYTES * len(values or ())
        total += sum(len(t) + 8 for t in turn.tokens or ())
        for alternatives in turn.top_logprobs or ():
            total += sum(2 * _TOKEN_BYTES + len(a.token) for a in alternatives)
    return total


def capped_record(record: Trajectory, max_bytes: int) -> Trajectory:
    """The record, or, if its JSON is larger than ``max_bytes``, the record without its conversation and
    captured tokens, failed with ``error:record_too_large`` (metadata, usage and timings kept)."""
    # Cheap estimate first (the conversation is stored twice, escaping at most doubles it; captured token
    # ids and logprobs are bounded per value): only a record that might be too large pays for a full
    # serialization.
    if 4 * _conversation_chars(record.messages) + _token_bytes(record) + _RECORD_SLACK < max_bytes:
        return record
    size = len(record.model_dump_json().encode("utf-8"))
    if size <= max_bytes:
        return record
    update: dict[str, Any] = {
        "messages": [],
        "conversations": [],
        "completed": False,
        "exit_status": "error:record_too_large",
        "error": f"record of {size} bytes, over session.max_record_bytes={max_bytes}; its conversation "
        f"was dropped (the session had ended with {record.exit_status})",
    }
    if getattr(record, "artifacts", None):
        update["artifacts"] = []
    update["loss_mask"] = []
    return record.model_copy(update=update).without_token_ids(logprobs=True)
