"""Token rows for RL trainers: ``prompt_ids``, ``response_ids``, ``loss_mask``, ``logprobs`` per trajectory.

One row per trajectory, or with ``--token-rows turn`` one per model call (the whole prompt that call was
sent, its reply): exact even where a template re-renders history, so that the prompts do not extend each
other. Two sources (docs/exports.md, "tokens"):

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
    turn: int | None = None
    """For a row of one model call (``--token-rows turn``): its 0-based index; None for a trajectory."""

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


def _turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [t if isinstance(t, dict) else {} for t in record.get("turns") or []]


NO_IDS = "no token ids captured (sampling.return_token_ids)"
NOT_EXTENDING = "the server's prompts do not extend each other (a template that re-renders history)"


def _replies(record: dict[str, Any]) -> list[int]:
    messages = record.get("messages") or []
    return generated_replies(messages, first_generated_index(messages))


def capture_gap(record: dict[str, Any], whole: bool = True) -> str | None:
    """Why the record's captured ids cannot make its row (``whole``: one trajectory; else one row per
    turn), or None when they can."""
    turns = _turns(record)
    if not turns or len(_replies(record)) != len(turns) or any(t.get("token_ids") is None for t in turns):
        return NO_IDS
    if any(p is None for p in full_prompts(turns)):
        return NO_IDS
    if whole and any(t.get("prompt_token_ids_from", 0) == 0 for t in turns[1:]):
        return NOT_EXTENDING
    return None


def _aligned(logprobs: Any, ids: list[int]) -> list[float] | None:
    return list(logprobs) if logprobs and len(logprobs) == len(ids) else None


def captured_turn_rows(record: dict[str, Any]) -> list[TokenRow] | None:
    """One row per model call from the server's ids: the whole prompt it was sent, its reply."""
    if capture_gap(record, whole=False):
        return None
    turns, replies, mask = _turns(record), _replies(record), mask_of(record)
    rows = []
    for k, (turn, prompt) in enumerate(zip(turns, full_prompts(turns), strict=True)):
        ids = turn["token_ids"]
        loss = [mask[replies[k]]] * len(ids)
        rows.append(
            TokenRow(
                prompt,
                ids,
                loss,
                _aligned(turn.get("logprobs"), ids),
                "captured",
                [(replies[k], len(ids))],
                k,
            )
        )
    return rows


def rendered_turn_rows(record: dict[str, Any], rendering: Rendering) -> list[TokenRow]:
    """One row per reply from a rendering: the conversation before it (with the generation prompt), it."""
    turns, mask, ids = _turns(record), mask_of(record), rendering.ids
    rows = []
    for k, index in enumerate(_replies(record)):
        begin, end = rendering.spans[index]
        reply = ids[begin:end]
        captured = turns[k] if k < len(turns) else {}
        logprobs = _aligned(captured.get("logprobs"), reply) if captured.get("token_ids") == reply else None
        rows.append(
            TokenRow(
                ids[:begin], reply, [mask[index]] * len(reply), logprobs, "rendered", [(index, len(reply))], k
            )
        )
    return rows


def captured_row(record: dict[str, Any]) -> TokenRow | None:
    """The row from the server's ids, or None when they cannot make it (``capture_gap``)."""
    if capture_gap(record):
        return None
    turns, replies, prompts = _turns(record), _replies(record), full_prompts(_turns(record))
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
    captured = {index: turns[k] for k, index in enumerate(_replies(record)) if k < len(turns)}
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
