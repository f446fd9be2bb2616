"""What a model call costs, and the seam through which a session asks a run's budget before each call.

Prices are USD per million tokens (``PriceConfig``): the run's ``pricing.<model>`` wins, then the small
table below; a model in neither has an unknown price, and its calls are counted in tokens only. A cost
the provider reports with the response (OpenRouter's ``usage.cost``) wins over any price: it is what the
provider bills. Every call's cost carries its source (``provider``, ``config``, ``table`` or ``unknown``).

``BudgetGate`` is to money what ``raygen.model.gate.RateGate`` is to request rates: a session reserves a
call's estimated cost before the call and settles the actual cost after it (``raygen.distributed.budget``
is the cluster-wide one; ``NoBudget`` admits everything). docs/cost.md explains the admission rule.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from raygen.errors import SessionFailure
from raygen.model.base import Completion
from raygen.model.configs import BudgetConfig, PriceConfig, SamplingConfig

BUILTIN_PRICES_AS_OF = "2025-06"
"""When the built-in prices were copied from the providers' price pages; check yours before trusting a
budget to them (``pricing.<model>`` overrides any of them)."""
BUILTIN_PRICES: dict[str, PriceConfig] = {
    "gpt-4o": PriceConfig(input=2.5, cached_input=1.25, output=10.0),
    "gpt-4o-mini": PriceConfig(input=0.15, cached_input=0.075, output=0.6),
    "gpt-4.1": PriceConfig(input=2.0, cached_input=0.5, output=8.0),
    "gpt-4.1-mini": PriceConfig(input=0.4, cached_input=0.1, output=1.6),
    "gpt-4.1-nano": PriceConfig(input=0.1, cached_input=0.025, output=0.4),
    "o4-mini": PriceConfig(input=1.1, cached_input=0.275, output=4.4),
    "claude-sonnet-4": PriceConfig(input=3.0, cached_input=0.3, output=15.0),
    # raygen's own simulator and scripted model cost nothing (price them with ``pricing`` to try budgets).
    "raygen-sim": PriceConfig(input=0.0, output=0.0),
    "raygen-scripted": PriceConfig(input=0.0, output=0.0),
}
"""List prices of a few common models, matched by the model name or its last ``/`` part (OpenRouter's
``openai/gpt-4o`` is ``gpt-4o``)."""

DEFAULT_RESERVE_COMPLETION_TOKENS = 4096
"""Completion tokens a call's reservation assumes when neither ``budget.reserve_completion_tokens`` nor
``sampling.max_tokens`` is set."""


def reserve_completion_tokens(budget: BudgetConfig, sampling: SamplingConfig) -> int:
    """Completion tokens a call reserves from a budget: ``budget.reserve_completion_tokens``, else
    ``sampling.max_tokens`` (the most a call can return), else ``DEFAULT_RESERVE_COMPLETION_TOKENS``."""
    for value in (budget.reserve_completion_tokens, sampling.max_tokens):
        if value is not None:
            return value
    return DEFAULT_RESERVE_COMPLETION_TOKENS


@dataclass(frozen=True)
class ModelPricing:
    """The price of one model and where it came from (``config``, ``table`` or ``unknown``)."""

    model: str
    price: PriceConfig | None
    source: str

    @classmethod
    def resolve(cls, model: str, overrides: dict[str, PriceConfig] | None = None) -> ModelPricing:
        overrides = overrides or {}
        if model in overrides:
            return cls(model, overrides[model], "config")
        short = model.rsplit("/", 1)[-1]
        price = BUILTIN_PRICES.get(model) or BUILTIN_PRICES.get(short)
        return cls(model, price, "table") if price is not None else cls(model, None, "unknown")

    @property
    def known(self) -> bool:
        return self.price is not None

    def usd(self, prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> float:
        """Cost of a call with these token counts at this price (0.0 when the price is unknown)."""
        p = self.price
        if p is None:
            return 0.0
        cached = min(max(cached, 0), prompt)
        reasoning = min(max(reasoning, 0), completion)
        cached_price = p.input if p.cached_input is None else p.cached_input
        reasoning_price = p.output if p.reasoning is None else p.reasoning
        micro = (
            (prompt - cached) * p.input
            + cached * cached_price
            + (completion - reasoning) * p.output
            + reasoning * reasoning_price
        )
        return micro / 1e6

    def call_cost(self, completion: Completion) -> tuple[float, str]:
        """A finished call's cost in USD and its source: the provider's figure when it sent one."""
        if completion.cost_usd is not None:
            return completion.cost_usd, "provider"
        usd = self.usd(
            completion.prompt_tokens,
            completion.completion_tokens,
            completion.cached_tokens,
            completion.reasoning_tokens,
        )
        return usd, self.source

    def describe(self) -> str:
        """One line: the model's prices and their source."""
        p = self.price
        if p is None:
            return f"{self.model}: price unknown (set -c 'pricing={{{self.model}: {{input: X, output: Y}}}}')"
        extra = "".join(
            f", {name} ${value:g}"
            for name, value in (("cached input", p.cached_input), ("reasoning", p.reasoning))
            if value is not None
        )
        where = f"built-in table of {BUILTIN_PRICES_AS_OF}" if self.source == "table" else self.source
        return f"{self.model}: input ${p.input:g}, output ${p.output:g}{extra} per 1M tokens ({where})"


def combine_sources(sources: set[str]) -> str:
    """A record's ``cost_source`` from its calls' sources: the one source, ``unknown`` if any call's price
    was unknown (its ``cost_usd`` is then a lower bound), else ``mixed``; ``""`` with no call."""
    if not sources:
        return ""
    if "unknown" in sources:
        return "unknown"
    return next(iter(sources)) if len(sources) == 1 else "mixed"


class BudgetGate(Protocol):
    async def reserve(self, usd: float, tokens: int, session: str | None = None) -> Any:
        """Admit one model call of ``session`` estimated at ``usd`` and ``tokens``, or raise
        ``SessionFailure`` with kind ``budget_reached`` when the run's budget cannot take it."""
        ...

    def settle(self, ticket: Any, usd: float, tokens: int) -> None:
        """The call admitted with ``ticket`` ended having cost ``usd`` and ``tokens`` (0 if it failed)."""
        ...

    def end_session(self, session: str) -> None:
        """``session`` made its last call."""
        ...


class NoBudget:
    """Admits every call."""

    async def reserve(self, usd: float, tokens: int, session: str | None = None) -> None:
        return None

    def settle(self, ticket: Any, usd: float, tokens: int) -> None:
        return None

    def end_session(self, session: str) -> None:
        return None


@dataclass
class CostPolicy:
    """What a session needs to price its calls and keep them within the budgets."""

    pricing: ModelPricing
    gate: Any = None
    """A ``BudgetGate``; None: ``NoBudget``."""
    session_cap_usd: float | None = None
    """``--max-session-cost``: a session whose next call could take it past this ends
    (``session_cost_cap``)."""
    reserve_completion_tokens: int = DEFAULT_RESERVE_COMPLETION_TOKENS
    """Completion tokens each call's reservation assumes (``budget.reserve_completion_tokens``)."""

    def __post_init__(self) -> None:
        if self.gate is None:
            self.gate = NoBudget()

    def estimate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[int, float]:
        """Tokens and USD to reserve for a call with this conversation: its prompt (4 characters a token)
        and ``reserve_completion_tokens`` of completion."""
        from raygen.model.openai_model import estimate_prompt_tokens

        prompt = estimate_prompt_tokens(messages, tools)
        completion = self.reserve_completion_tokens
        return prompt + completion, self.pricing.usd(prompt, completion)


class SessionSpend:
    """One session's calls against its policy: checks the session cap and reserves from the run's budget
    before each call, settles after it, and sums the session's cost and its sources."""

    def __init__(self, policy: CostPolicy):
        self.policy = policy
        self.usd = 0.0
        self.sources: set[str] = set()
        self.session = uuid.uuid4().hex
        """How the budget tells this session's calls from others' (its first call opens it there)."""
        self.opened = False

    async def before_call(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        """The call's ticket; raises ``SessionFailure`` (``session_cost_cap``, ``budget_reached``) when the
        call may not start."""
        tokens, usd = self.policy.estimate(messages, tools)
        cap = self.policy.session_cap_usd
        if cap is not None and self.usd + usd > cap:
            raise SessionFailure(
                "session_cost_cap",
                f"spent ${self.usd:.6f}; the next call may cost up to ${usd:.6f}, over the ${cap:g} cap",
            )
        ticket = _Ticket(await self.policy.gate.reserve(usd, tokens, self.session))
        self.opened = True
        return ticket

    def end(self) -> None:
        """The session ended (however): the budget stops holding room for it."""
        if self.opened:
            self.opened = False
            self.policy.gate.end_session(self.session)

    def after_call(self, ticket: Any, completion: Completion | None) -> None:
        """Settle ``ticket``: with the call's cost, or with nothing when it failed (``completion`` None;
        a failed request is not billed by the providers raygen knows)."""
        if ticket.settled:
            return
        ticket.settled = True
        if completion is None:
            self.policy.gate.settle(ticket.inner, 0.0, 0)
            return
        usd, source = self.policy.pricing.call_cost(completion)
        self.usd += usd
        self.sources.add(source)
        tokens = completion.prompt_tokens + completion.completion_tokens
        self.policy.gate.settle(ticket.inner, usd, tokens)

    @property
    def source(self) -> str:
        return combine_sources(self.sources)


@dataclass
class _Ticket:
    inner: Any
    settled: bool = False
