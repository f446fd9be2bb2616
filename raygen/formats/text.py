"""Text helpers every layer shares (tool output, environment capture, grader messages)."""

from __future__ import annotations


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the head and tail of ``text`` within ``max_chars`` (errors and results often sit at the end)."""
    if len(text) <= max_chars:
        return text, False
    marker = f"\n... [{len(text) - max_chars} characters cut by raygen] ...\n"
    keep = max(0, max_chars - len(marker))
    head = keep // 2
    tail = keep - head
    return text[:head] + marker + (text[-tail:] if tail else ""), True
