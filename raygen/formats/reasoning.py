"""Find a model's reasoning in an assistant message.

Providers return it in different places: a ``reasoning_content`` field (DeepSeek, vLLM, SGLang), a
``reasoning`` field (OpenRouter), or inline in the content as ``<think>...</think>`` (Qwen, R1 distills)
or ``<REASONING_SCRATCHPAD>...</REASONING_SCRATCHPAD>`` (Hermes). The message itself is never changed:
it goes back to the provider on the next turn exactly as received, which is what each provider expects
(its own field, or its own tags in content).
"""

from __future__ import annotations

import re
from typing import Any

REASONING_FIELDS = ("reasoning_content", "reasoning")
_TAG_PATTERNS = [
    re.compile(r"<think>(.*?)</think>", re.DOTALL),
    re.compile(r"<REASONING_SCRATCHPAD>(.*?)</REASONING_SCRATCHPAD>", re.DOTALL),
]


def split_reasoning(message: dict[str, Any]) -> tuple[str | None, str]:
    """Return ``(reasoning, visible_content)`` for an assistant message.

    Field reasoning wins over inline tags; inline blocks are removed from the visible content either way
    so they are not rendered twice in ShareGPT form.
    """
    content = message.get("content") or ""
    if not isinstance(content, str):  # content parts (rare for assistants): keep the text parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    inline: list[str] = []
    for pattern in _TAG_PATTERNS:
        inline.extend(m.strip() for m in pattern.findall(content))
        content = pattern.sub("", content)
    field = next(
        (message[f] for f in REASONING_FIELDS if isinstance(message.get(f), str) and message[f].strip()), None
    )
    reasoning = field.strip() if field else ("\n\n".join(r for r in inline if r) or None)
    return reasoning, content.strip()
