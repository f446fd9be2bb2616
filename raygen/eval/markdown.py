"""A trajectory as readable Markdown: a header of facts, then every turn, tool calls and results in
fenced blocks. Fences are longer than any backtick run in their text, so prompt text (which may hold
```, ``</think>`` or ``<tool_call>``) can never close a block or turn into markup."""

from __future__ import annotations

import json
import re
from typing import Any

from raygen.eval.viewer import compact_message, entry_header, record_messages

TEXT_CAP = 20_000
"""Characters per text block in the Markdown (the JSONL next to it has everything)."""
_BACKTICKS = re.compile(r"`+")
_INLINE_MAX = 100
# Inline code cannot hold these safely in every renderer (or in a plain-text reading of the file).
_UNSAFE_INLINE = re.compile(r"[`\r\u2028\u2029\x85]")


def fence(text: str, lang: str = "text") -> str:
    """``text`` in a fenced block that nothing inside it can close."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}\n"


def code(text: str) -> str:
    """Inline code that survives backticks (and line breaks) in ``text``."""
    text = " ".join(text.split("\n"))
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""  # CommonMark strips one space each side
    return f"{ticks}{pad}{text}{pad}{ticks}"


# What could become HTML, a link, emphasis or a table cell break in prose (``_`` inside words cannot).
_MARKUP = re.compile(r"([\\`*\[\]<>|&])")


def text(value: object) -> str:
    """Plain text for Markdown prose: markup characters backslash-escaped, one line."""
    return _MARKUP.sub(r"\\\1", " ".join(str(value).splitlines()))


def _turn(turn: dict[str, Any], number: int | None) -> str:
    role = turn["role"]
    title = f"{role} · turn {number}" if number else role
    if role == "tool":
        title = f"tool result {code(turn.get('name') or '?')} ({code(turn.get('call_id') or '?')})"
    out = [f"#### {title}\n"]
    if turn.get("reasoning"):
        out.append("*reasoning*\n\n" + fence(turn["reasoning"]))
    if turn.get("text"):
        out.append(fence(turn["text"]))
    for call in turn.get("calls") or []:
        out.append(f"*tool call* {code(call['name'])} ({code(call['id'] or '?')})\n")
        out.append(_fields(call) if "fields" in call else fence(call["args"]))
    if "fields" in turn:
        out.append(_fields(turn))
    return "\n".join(out)


def _fields(item: dict[str, Any]) -> str:
    """Short one-line values inline, anything else fenced."""
    parts = []
    for key, value in item["fields"].items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(shown) <= _INLINE_MAX and "\n" not in shown and not _UNSAFE_INLINE.search(shown):
            parts.append(f"{code(key)}: {code(shown)}\n")
        else:
            parts.append(f"{code(key)}:\n\n" + fence(shown))
    return "\n".join(parts)


def trajectory_markdown(record: dict[str, Any], outcome: str, reason: str | None, number: int) -> str:
    """One ``## `` section for one record."""
    head = entry_header(record, outcome, reason)
    outcome_text = text(outcome + (f" ({reason})" if reason else ""))
    tools = ", ".join(
        f"{t} {s.get('count', 0)} ({s.get('failure', 0)} failed)" for t, s in head["tool_stats"].items()
    )
    facts = [
        ("category", text(head["category"])),
        ("outcome", outcome_text),
        ("exit status", text(head["exit_status"])),
        ("sample key", code(head["key"])),
        ("attempt", head["attempt"]),
        ("model", text(head["model"])),
        ("model calls", head["api_calls"]),
        ("tokens", f"{head['prompt_tokens']:,} prompt / {head['completion_tokens']:,} completion"),
        ("duration", f"{head['duration_s']} s"),
        ("tool calls", text(tools or "none")),
        ("tools offered", text(", ".join(head["offered"]) or "none")),
    ]
    if head["hallucinated"]:
        facts.append(("hallucinated tools", text(", ".join(head["hallucinated"]))))
    lines = [f"## {number}. {code(head['id'])} · {text(head['category'])} · {outcome_text}\n"]
    lines += [f"- **{name}**: {value}" for name, value in facts]
    lines.append("")
    if head["error"]:
        lines.append("**error**\n\n" + fence(str(head["error"])))
    assistant_turns = 0
    for turn in (compact_message(m, TEXT_CAP) for m in record_messages(record)):
        if turn["role"] == "assistant":
            assistant_turns += 1
        lines.append(_turn(turn, assistant_turns if turn["role"] == "assistant" else None))
    return "\n".join(lines) + "\n"
