"""Records -> the compact, size-bounded form the report's trajectory viewer embeds.

A record's ``messages`` (lossless OpenAI format) are turned into turns the page renders as they are:
reasoning split from the visible text, tool calls with pretty-printed arguments, tool results parsed
when they are JSON objects. Long texts are cut (head and tail kept, with a marker saying how much was
cut) until the entry fits its byte budget, so 500 trajectories never make a page of hundreds of MB.
"""

from __future__ import annotations

import json
from typing import Any

from raygen.formats.reasoning import split_reasoning

# Tried in order until an entry fits its budget; the last one also drops middle messages.
TEXT_CAPS = (6_000, 2_000, 800, 300, 120)
_KEEP_ENDS = 6
_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "tool": "tool"}


def clip(text: str, cap: int) -> str:
    """``text`` if short enough, else its head and tail around a marker giving the cut length."""
    if len(text) <= cap:
        return text
    head, tail = cap * 2 // 3, cap // 3
    return f"{text[:head]}\n[… {len(text) - head - tail:,} characters cut …]\n{text[-tail:]}"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)


def _object(value: Any, cap: int, text_key: str) -> dict[str, Any]:
    """Tool arguments or a tool result: ``{"fields": {...}}`` when it is (JSON of) an object, so string
    values show as they are (a multi-line command or output stays readable), else ``{text_key: str}``."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
    if not isinstance(parsed, dict):
        return {text_key: clip(_text(value), cap)}
    fields = {}
    for key, item in parsed.items():
        if isinstance(item, str):
            fields[str(key)] = clip(item, cap)
        elif isinstance(item, int | float | bool) or item is None:
            fields[str(key)] = item
        else:
            fields[str(key)] = clip(json.dumps(item, ensure_ascii=False, indent=1), cap)
    return {"fields": fields}


def compact_message(message: dict[str, Any], cap: int) -> dict[str, Any]:
    """One OpenAI-format message as a viewer turn (see the module docstring)."""
    role = str(message.get("role") or "?")
    turn: dict[str, Any] = {"role": role}
    if role == "assistant":
        reasoning, visible = split_reasoning(message)
        turn["text"] = clip(visible, cap)
        if reasoning:
            turn["reasoning"] = clip(reasoning, cap)
        calls = []
        for call in message.get("tool_calls") or []:
            function = (call or {}).get("function") or {}
            calls.append(
                {
                    "id": str(call.get("id") or ""),
                    "name": str(function.get("name") or "?"),
                    **_object(function.get("arguments"), cap, "args"),
                }
            )
        if calls:
            turn["calls"] = calls
    elif role == "tool":
        turn["call_id"] = str(message.get("tool_call_id") or "")
        turn["name"] = str(message.get("name") or "")
        turn.update(_object(_text(message.get("content")), cap, "text"))
    else:
        turn["text"] = clip(_text(message.get("content")), cap)
    return turn


def record_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's OpenAI-format messages; for hand-made or older records without them, its ShareGPT
    turns mapped to roles."""
    messages = record.get("messages")
    if isinstance(messages, list) and messages:
        return [m for m in messages if isinstance(m, dict)]
    return [
        {"role": _ROLES.get(str(t.get("from")), str(t.get("from"))), "content": t.get("value")}
        for t in record.get("conversations") or []
        if isinstance(t, dict)
    ]


def entry_header(record: dict[str, Any], outcome: str, reason: str | None) -> dict[str, Any]:
    """The facts about a session the viewer shows above its turns."""
    usage = record.get("usage") or {}
    tool_stats = record.get("tool_stats") or {}
    called = sorted(t for t, s in tool_stats.items() if int((s or {}).get("count") or 0) > 0)
    category = record.get("category")
    return {
        "id": str(record.get("id") or record.get("sample_key") or "?"),
        "key": str(record.get("sample_key") or ""),
        "category": "(none)" if category is None else str(category),
        "outcome": outcome,
        "reason": reason,
        "exit_status": str(record.get("exit_status") or ""),
        "error": record.get("error"),
        "attempt": record.get("attempt"),
        "model": record.get("model"),
        "api_calls": int(record.get("api_calls") or 0),
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "duration_s": round(float((record.get("timing") or {}).get("duration_s") or 0.0), 3),
        "tools": called,
        "hallucinated": sorted(set(record.get("hallucinated_tools") or [])),
        "offered": list(record.get("tools_offered") or []),
        "tool_stats": {t: s for t, s in tool_stats.items() if int((s or {}).get("count") or 0) > 0},
    }


def viewer_entry(record: dict[str, Any], outcome: str, reason: str | None, budget: int) -> dict[str, Any]:
    """The viewer form of ``record``, its JSON at most about ``budget`` bytes (texts cut as needed)."""
    entry = entry_header(record, outcome, reason)
    messages = record_messages(record)
    for cap in TEXT_CAPS:
        chosen = messages
        if cap == TEXT_CAPS[-1] and len(messages) > 2 * _KEEP_ENDS:
            chosen = messages[:_KEEP_ENDS] + messages[-_KEEP_ENDS:]
        turns = [compact_message(m, cap) for m in chosen]
        if chosen is not messages:
            note = f"[… {len(messages) - len(chosen)} messages left out of this report …]"
            turns.insert(_KEEP_ENDS, {"role": "note", "text": note})
        entry["turns"] = turns
        entry["text_cap"] = cap
        if len(json.dumps(entry, ensure_ascii=False)) <= budget:
            break
    entry["error"] = clip(str(entry["error"]), TEXT_CAPS[0]) if entry["error"] else None
    return entry


def embed_json(value: Any) -> str:
    """JSON safe to place inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` appears
    literally, so texts holding ``</script>``, ``<!--`` or ``</think>`` cannot end or alter the element."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )
