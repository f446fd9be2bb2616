"""A record rendered with a model's chat template: its token ids and where each reply lies in them.

The template renders the whole conversation; a reply's span is found by rendering the conversation up to
it twice, with the generation prompt (where the reply starts) and with the reply (where it ends, cut after
the end-of-turn token: what follows it is the template's glue, which the model never generated). Both must
be prefixes of the whole rendering; a template that renders history differently from the live prompt (one
that drops earlier reasoning, say) is not, and such a record cannot be one token sequence with a mask
(``NotPrefixConsistent``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raygen.formats.chat_template import render_ids
from raygen.formats.loss_mask import first_generated_index


class NotPrefixConsistent(ValueError):
    """The template renders a conversation's beginning differently on its own than inside the whole."""


@dataclass
class Rendering:
    ids: list[int]
    """The whole conversation's token ids."""
    first: int
    """Index of the first message the session generated (raygen.formats.loss_mask)."""
    prompt_len: int
    """Tokens before the first generated reply (system, prefill, the prompt, the generation prompt)."""
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Message index of each assistant reply -> its ``[start, end)`` in ``ids``."""
    ends: dict[int, int] = field(default_factory=dict)
    """Message index -> the rendering's length through that message (turn boundaries, for cuts)."""


def _prefix(ids: list[int], part: list[int], index: int, what: str) -> None:
    if ids[: len(part)] != part:
        position = next((i for i, (a, b) in enumerate(zip(ids, part, strict=False)) if a != b), len(ids))
        raise NotPrefixConsistent(
            f"message {index}: the template renders {what} differently at token {position}"
        )


def render_record(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Rendering:
    """Render ``messages`` (a record's) with ``tokenizer``'s template; raises NotPrefixConsistent, and
    whatever the template raises for a conversation it cannot render."""
    ids = render_ids(tokenizer, messages, tools, generation_prompt=False)
    first = first_generated_index(messages)
    eos = tokenizer.eos_token_id
    rendering = Rendering(ids=ids, first=first, prompt_len=len(ids))
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = render_ids(tokenizer, messages[:index], tools, generation_prompt=True)
        through = render_ids(tokenizer, messages[: index + 1], tools, generation_prompt=False)
        _prefix(ids, before, index, "the prompt of this reply")
        _prefix(ids, through, index, "the conversation through this reply")
        start, end = len(before), len(through)
        if eos is not None and eos in ids[start:end]:
            end = ids.index(eos, start, end) + 1
        rendering.spans[index] = (start, end)
        rendering.ends[index] = len(through)
        if index >= first:
            rendering.prompt_len = min(rendering.prompt_len, start)
    return rendering
