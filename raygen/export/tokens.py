"""Token rows for RL trainers: ``prompt_ids``, ``response_ids``, ``loss_mask``, ``logprobs`` per trajectory.

Two sources (docs/exports.md, "tokens"):

- ``captured``: the ids the server returned (``sampling.return_token_ids``): the first turn's prompt is
  ``prompt_ids``; then each reply's ids (mask 1, or 0 where the record's loss mask says so) and, between
  replies, what the next prompt added (tool results, the generation prompt; mask 0). The trainer gets the
  exact tokens the model produced, no re-tokenization. Possible when every turn has ids and each prompt
  extends the previous prompt and reply.
- ``rendered``: the stored conversation rendered with ``--tokenizer``'s chat template (render.py), the
  replies' spans masked 1. Logprobs are kept where a reply's rendered ids equal its captured ones.

``logprobs`` has one value per ``response_ids`` position (0.0 where the model did not sample the token),
or is null when the record has none that line up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raygen.export.conversation import mask_of
from raygen.export.render import Rendering
from raygen.formats.loss_mask import first_generated_index, generated_replies
from raygen.formats.token_ids import full_prompts


@dataclass
class TokenRow:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    source: str
    """``captured`` or ``rendered``."""
    boundaries: list[tuple[int, int]]
    """(message index of a reply, length of ``response_ids`` through it): where a cut may fall."""

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def cut(self, max_length: int) -> TokenRow | None:
        """The row cut at the last reply that ends within ``max_length`` tokens; None if none does."""
        room = max_length - len(self.prompt_ids)
        fitting = [(m, n) for m, n in self.boundaries if n <= room]
        if not fitting:
            return None
        n = fitting[-1][1]
        logprobs = None if self.logprobs is None else self.logprobs[:n]
        return TokenRow(
            self.prompt_ids, self.response_ids[:n], self.loss_mask[:n], logprobs, self.source, fitting
        )

    @property
    def cut_messages(self) -> int:
        """How many messages the row covers (through its last reply)."""
        return self.boundaries[-1][0] + 1 if self.boundaries else 0


def _turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [t if isinstance(t, dict) else {} for t in record.get("turns") or []]


def captured_row(record: dict[str, Any]) -> TokenRow | None:
    """The row from the server's ids, or None when the record lacks them anywhere (see module doc)."""
    turns = _turns(record)
    messages = record.get("messages") or []
    replies = generated_replies(messages, first_generated_index(messages))
    if not turns or len(replies) != len(turns) or any(t.get("token_ids") is None for t in turns):
        return None
    prompts = full_prompts(turns)
    if any(p is None for p in prompts) or any(t.get("prompt_token_ids_from", 0) == 0 for t in turns[1:]):
        return None
    mask = mask_of(record)
    response: list[int] = []
    loss: list[int] = []
    logprobs: list[float] | None = []
    boundaries: list[tuple[int, int]] = []
    for k, turn in enumerate(turns):
        if k:
            glue = prompts[k][len(prompts[k - 1]) + len(turns[k - 1]["token_ids"]) :]
            response += glue
            loss += [0] * len(glue)
            logprobs = None if logprobs is None else logprobs + [0.0] * len(glue)
        ids = turn["token_ids"]
        response += ids
        loss += [mask[replies[k]]] * len(ids)
        lps = turn.get("logprobs")
        logprobs = logprobs + lps if logprobs is not None and lps and len(lps) == len(ids) else None
        boundaries.append((replies[k], len(response)))
    return TokenRow(prompts[0], response, loss, logprobs, "captured", boundaries)


def rendered_row(record: dict[str, Any], rendering: Rendering) -> TokenRow:
    """The row from a rendering of the record's stored conversation."""
    mask = mask_of(record)
    ids, start = rendering.ids, rendering.prompt_len
    response = ids[start:]
    loss = [0] * len(response)
    turns = _turns(record)
    replies = generated_replies(
        record.get("messages") or [], first_generated_index(record.get("messages") or [])
    )
    captured = {index: turns[k] for k, index in enumerate(replies) if k < len(turns)}
    logprobs: list[float] | None = [0.0] * len(response)
    boundaries: list[tuple[int, int]] = []
    for index, (begin, end) in sorted(rendering.spans.items()):
        if begin < start:
            continue  # an assistant message of the prompt (stored prefill)
        loss[begin - start : end - start] = [mask[index]] * (end - begin)
        turn = captured.get(index, {})
        if logprobs is not None and turn.get("token_ids") == ids[begin:end] and turn.get("logprobs"):
            logprobs[begin - start : end - start] = turn["logprobs"]
        elif mask[index]:
            logprobs = None
        boundaries.append((index, rendering.ends[index] - start))
    return TokenRow(ids[:start], response, loss, logprobs, "rendered", boundaries)
