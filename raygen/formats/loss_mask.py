"""Which messages of a record a trainer learns from: the loss mask, one 0/1 per message.

The rule (docs/exports.md, "The loss mask"):

- system, user and tool messages: 0 (the model did not write them);
- assistant messages the session did not generate, i.e. stored prefill (``session.store_prefill``): 0;
- a reply cut at the token limit (``finish_reason: length``): 0, it stops mid-thought and its tool calls
  never ran;
- a reply over ``session.max_reply_chars`` (stored cut to its head, the record fails): 0;
- every other reply of the model: 1.

A model call that failed and was retried inside the session leaves no message (only the answer that came
is stored), and a session run again is a new attempt whose record replaces the old one at the merge, so
retries need no rule of their own.
"""

from __future__ import annotations

from typing import Any

CUT_REPLY_PREFIX = "[raygen: reply of "
"""How ``raygen.formats.limits.cut_reply`` starts the stub of an oversized reply."""


def generated_replies(messages: list[dict[str, Any]], first_generated: int) -> list[int]:
    """Indices of the assistant messages the session generated, in order: the n-th is the reply of the
    n-th model call (``Trajectory.turns[n]``)."""
    return [i for i, m in enumerate(messages) if i >= first_generated and m.get("role") == "assistant"]


def _trained(message: dict[str, Any], turn: Any) -> bool:
    finish_reason = (
        turn.get("finish_reason") if isinstance(turn, dict) else getattr(turn, "finish_reason", None)
    )
    if finish_reason == "length":
        return False
    content = message.get("content")
    return not (
        isinstance(content, str) and content.startswith(CUT_REPLY_PREFIX) and not message.get("tool_calls")
    )


def loss_mask(messages: list[dict[str, Any]], turns: list[Any], first_generated: int) -> list[int]:
    """The mask of ``messages``; ``turns``: the record's ``TurnInfo`` (objects or dicts), one per reply;
    ``first_generated``: the index of the first message the session itself added (after the prompt)."""
    mask = [0] * len(messages)
    for n, index in enumerate(generated_replies(messages, first_generated)):
        turn = turns[n] if n < len(turns) else None
        mask[index] = int(_trained(messages[index], turn))
    return mask


def first_generated_index(messages: list[dict[str, Any]]) -> int:
    """For a record stored without a mask: the message after the session's prompt. A session adds only
    assistant and tool messages after its prompt, so the prompt is the last user message (stored prefill
    comes before it)."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return users[-1] + 1 if users else len(messages)


def record_loss_mask(record: dict[str, Any]) -> list[int]:
    """The record's stored mask, or the rule applied to an older record that has none."""
    messages = record.get("messages") or []
    stored = record.get("loss_mask")
    if isinstance(stored, list) and len(stored) == len(messages):
        return [int(bool(v)) for v in stored]
    return loss_mask(messages, record.get("turns") or [], first_generated_index(messages))
