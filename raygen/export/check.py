"""The template check: does the chat template render every trajectory, how long are they in tokens, and
do its tokens equal the ones the server returned? Written as ``template_check.json`` (docs/exports.md).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from raygen.export.render import Rendering
from raygen.formats.chat_template import render_ids, reply_ids
from raygen.formats.loss_mask import first_generated_index, generated_replies
from raygen.formats.token_ids import full_prompts

HISTOGRAM_EDGES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
"""Upper edges of the token-count bins (the last bin holds everything longer)."""
_EXAMPLES = 20
"""How many failing trajectories each list names (the counts are complete)."""
_CONTEXT = 6
"""Tokens shown on either side of a mismatch."""


def _bin_label(index: int) -> str:
    low = 0 if index == 0 else HISTOGRAM_EDGES[index - 1]
    return f">={low}" if index == len(HISTOGRAM_EDGES) else f"{low}-{HISTOGRAM_EDGES[index] - 1}"


@dataclass
class TemplateCheck:
    tokenizer: str
    max_length: int | None = None
    records: int = 0
    rendered: int = 0
    render_failures: list[dict[str, str]] = field(default_factory=list)
    render_failure_count: int = 0
    lengths: list[int] = field(default_factory=list)
    over_length: list[str] = field(default_factory=list)
    over_length_count: int = 0
    compared: int = 0
    matched: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    mismatch_count: int = 0

    def failed(self, record_id: str, error: str) -> None:
        self.records += 1
        self.render_failure_count += 1
        if len(self.render_failures) < _EXAMPLES:
            self.render_failures.append({"id": record_id, "error": error[:500]})

    def rendered_ok(self, record_id: str, ids: list[int]) -> None:
        self.records += 1
        self.rendered += 1
        self.lengths.append(len(ids))
        if self.max_length is not None and len(ids) > self.max_length:
            self.over_length_count += 1
            if len(self.over_length) < _EXAMPLES:
                self.over_length.append(record_id)

    def compare(
        self,
        record_id: str,
        record: dict[str, Any],
        tokenizer: Any,
        tools: list[Any],
        rendering: Rendering | None,
    ) -> None:
        """Compare the template's tokens with the ids the server returned, turn by turn: the prompt each
        model call was sent and its reply. From the whole rendering where there is one, else rendered per
        turn (a template that re-renders history has no whole rendering, but each prompt still has one).
        Turns without captured ids are not compared."""
        turns = [t if isinstance(t, dict) else {} for t in record.get("turns") or []]
        messages = record.get("messages") or []
        replies = generated_replies(messages, first_generated_index(messages))
        pairs = [
            (k, index, prompt, turns[k]["token_ids"])
            for k, (index, prompt) in enumerate(zip(replies, full_prompts(turns), strict=False))
            if prompt is not None and turns[k].get("token_ids") is not None
        ]
        if not pairs:
            return
        self.compared += 1
        for k, index, prompt, reply in pairs:
            if rendering is not None:
                begin, end = rendering.spans[index]
                ours = {"prompt": rendering.ids[:begin], "reply": rendering.ids[begin:end]}
            else:
                ours = {
                    "prompt": render_ids(tokenizer, messages[:index], tools, generation_prompt=True),
                    "reply": reply_ids(tokenizer, messages[:index], messages[index], tools),
                }
            for part, served in (("prompt", prompt), ("reply", reply)):
                if served != ours[part]:
                    self._mismatch(record_id, k, part, ours[part], served, tokenizer)
                    return
        self.matched += 1

    def _mismatch(
        self, record_id: str, turn: int, part: str, rendered: list[int], served: list[int], tokenizer: Any
    ) -> None:
        self.mismatch_count += 1
        if len(self.mismatches) >= _EXAMPLES:
            return
        at = next(
            (i for i, (a, b) in enumerate(zip(rendered, served, strict=False)) if a != b),
            min(len(rendered), len(served)),
        )
        low, high = max(0, at - _CONTEXT), at + _CONTEXT
        self.mismatches.append(
            {
                "id": record_id,
                "turn": turn,
                "part": part,
                "position": at,
                "rendered": tokenizer.decode(rendered[low:high]),
                "served": tokenizer.decode(served[low:high]),
            }
        )

    def histogram(self) -> dict[str, int]:
        counts = [0] * (len(HISTOGRAM_EDGES) + 1)
        for n in self.lengths:
            counts[bisect.bisect_right(HISTOGRAM_EDGES, n)] += 1
        return {_bin_label(i): c for i, c in enumerate(counts)}

    def summary(self) -> dict[str, Any]:
        lengths = sorted(self.lengths)
        return {
            "tokenizer": self.tokenizer,
            "max_length": self.max_length,
            "records": self.records,
            "rendered": self.rendered,
            "render_failures": self.render_failure_count,
            "render_failure_examples": self.render_failures,
            "tokens": {
                "min": lengths[0] if lengths else None,
                "median": lengths[len(lengths) // 2] if lengths else None,
                "max": lengths[-1] if lengths else None,
                "histogram": self.histogram(),
            },
            "over_max_length": self.over_length_count,
            "over_max_length_examples": self.over_length,
            "server_ids": {
                "compared": self.compared,
                "matched": self.matched,
                "mismatched": self.mismatch_count,
                "mismatch_examples": self.mismatches,
            },
        }
