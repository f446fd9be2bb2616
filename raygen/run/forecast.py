"""Cost before spending it: the ``--dry-run`` forecast from the prompts and the price, the ``--pilot N``
choice of prompts and its projection for the whole file (docs/cost.md).

The dry run knows only the prompts, so it gives two figures per prompt: its first model call (the prompt
and the tool schemas in, at most ``max_tokens`` out) and a ceiling for a session of ``max_turns`` calls in
which every turn adds a full reply and a full tool result. What a session really costs lies between
and depends on the model; a pilot measures it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from raygen.config import RunConfig
from raygen.input.rows import Sample
from raygen.model.openai_model import estimate_prompt_tokens
from raygen.model.pricing import ModelPricing, reserve_completion_tokens


@dataclass
class Forecast:
    """Sums over the pending prompts of the dry run's two figures, in tokens and USD."""

    prompts: int = 0
    first_call_tokens: int = 0
    first_call_usd: float = 0.0
    ceiling_tokens: int = 0
    ceiling_usd: float = 0.0
    largest_prompt_tokens: int = 0

    def lines(self, pricing: ModelPricing, config: RunConfig) -> list[str]:
        n = max(self.prompts, 1)
        turns = config.session.max_turns
        return [
            f"price: {pricing.describe()}",
            f"forecast for {self.prompts} prompts: first model call {self.first_call_tokens:,} tokens "
            f"${self.first_call_usd:.4f} (per prompt {self.first_call_tokens // n:,} tokens "
            f"${self.first_call_usd / n:.6f}; largest prompt {self.largest_prompt_tokens:,} tokens)",
            f"forecast ceiling ({turns} turns, each a full reply and tool result): "
            f"{self.ceiling_tokens:,} tokens ${self.ceiling_usd:.4f} "
            f"(per prompt ${self.ceiling_usd / n:.6f}); "
            "--pilot N measures what sessions really cost",
        ]


def forecast(samples: Iterable[Sample], config: RunConfig, registry: Any, pricing: ModelPricing) -> Forecast:
    """The dry run's figures for ``samples`` (the pending ones)."""
    reply = reserve_completion_tokens(config.budget, config.sampling)
    tool_result = config.session.tool_output_max_chars // 4
    system = config.session.resolved_system_prompt() or ""
    prefill = config.session.resolved_prefill()
    schemas: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    result = Forecast()
    for sample in samples:
        key = tuple(sample.toolsets)
        if key not in schemas:
            schemas[key] = [t.schema() for t in registry.tools_for(list(key))]
        messages = [{"content": system}, *prefill, {"content": sample.row.prompt}]
        prompt = estimate_prompt_tokens(messages, schemas[key])
        result.prompts += 1
        result.largest_prompt_tokens = max(result.largest_prompt_tokens, prompt)
        result.first_call_tokens += prompt + reply
        result.first_call_usd += pricing.usd(prompt, reply)
        # Call k (0-based) carries the prompt and k earlier turns of a reply and a tool result each.
        turns = config.session.max_turns
        inputs = turns * prompt + (reply + tool_result) * turns * (turns - 1) // 2
        result.ceiling_tokens += inputs + turns * reply
        result.ceiling_usd += pricing.usd(inputs, turns * reply)
    return result


def pilot_keys(pending: Iterable[tuple[str, str | None]], n: int) -> set[str]:
    """``n`` of the pending ``(sample_key, category)`` pairs, spread over the categories in turn (in file
    order within each), so a pilot sees every kind of prompt the file has before it sees many of one."""
    by_category: dict[str | None, list[str]] = {}
    for key, category in pending:
        keys = by_category.setdefault(category, [])
        if len(keys) < n:
            keys.append(key)
    chosen: list[str] = []
    queues = [iter(keys) for keys in by_category.values()]
    while queues and len(chosen) < n:
        for queue in list(queues):
            key = next(queue, None)
            if key is None:
                queues.remove(queue)
            elif len(chosen) < n:
                chosen.append(key)
    return set(chosen)


@dataclass
class PerSession:
    """Running mean and spread of a per-session figure (Welford), kept by the result sink."""

    n: int = 0
    mean: float = 0.0
    _m2: float = field(default=0.0, repr=False)

    def add(self, value: float) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self._m2 += delta * (value - self.mean)

    @property
    def sd(self) -> float:
        return math.sqrt(self._m2 / (self.n - 1)) if self.n > 1 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"n": self.n, "mean": self.mean, "sd": self.sd}


def pilot_lines(per_session: dict[str, dict[str, float]], remaining: int, slots: int) -> list[str]:
    """What the pilot measured per session (the sink's ``per_session``: ``{n, mean, sd}`` of cost and
    duration), with a 95% interval for the mean cost, and the projection for the ``remaining`` samples run
    ``slots`` at a time."""
    cost, duration = per_session["cost_usd"], per_session["duration_s"]
    n, mean = int(cost["n"]), cost["mean"]
    if n == 0:
        return ["pilot: no session came back; nothing to project"]
    half = 1.96 * cost["sd"] / math.sqrt(n)
    low, high = max(0.0, mean - half), mean + half
    wall = duration["mean"] * math.ceil(remaining / max(slots, 1))
    return [
        f"pilot: {n} sessions, ${mean:.6f} per session (95% interval ${low:.6f}-${high:.6f}), "
        f"{duration['mean']:.1f} s per session",
        f"projection for the {remaining} samples left: ${mean * remaining:.4f} "
        f"(${low * remaining:.4f}-${high * remaining:.4f}), about {wall:,.1f} s at {slots} sessions at once; "
        "the pilot's sessions count: --resume runs the rest",
    ]
