"""The driver's side of money (docs/cost.md): the model's price checked before anything runs, the run's
spend before this invocation, and the one line a run stopped at its budget ends with.

The cluster-wide count itself is the budget actor (``raygen.distributed.budget``), started with the
run's services; sessions reserve from it before each model call (``raygen.model.pricing``).
"""

from __future__ import annotations

from typing import Any

from raygen.config import RunConfig
from raygen.errors import ConfigError
from raygen.model.pricing import ModelPricing
from raygen.run.ledger import Ledger
from raygen.run.reporter import RunReporter

BUDGET_DRAIN = "budget"
"""The name a budget's drain goes by (``Drain.signal_name``)."""


def check_pricing(config: RunConfig, reporter: RunReporter) -> ModelPricing:
    """The model's price; a budget in dollars without one is refused here, in one line, before anything
    runs; without a budget an unknown price is said once and costs are counted in tokens only."""
    pricing = ModelPricing.resolve(config.model.model, config.pricing)
    budget = config.budget
    if pricing.known:
        return pricing
    flag = "--max-cost" if budget.max_cost_usd is not None else "--max-session-cost"
    hint = f"-c 'pricing={{{pricing.model}: {{input: USD_PER_1M, output: USD_PER_1M}}}}'"
    if budget.max_cost_usd is not None or budget.max_session_cost_usd is not None:
        raise ConfigError(f"{flag} needs the price of model {pricing.model}; set it with {hint}")
    reporter.warning(
        f"no price known for model {pricing.model}: records get cost_source unknown and only tokens "
        f"count (a provider-reported cost is still used); set it with {hint}"
    )
    return pricing


def reached_before_start(config: RunConfig, ledger: Ledger) -> str | None:
    """The stop line when earlier invocations already spent the budget, else None."""
    budget = config.budget
    snapshot = {
        "max_usd": budget.max_cost_usd,
        "max_tokens": budget.max_tokens,
        "spent_usd": ledger.spent_usd,
        "spent_tokens": ledger.spent_tokens,
    }
    if budget.max_cost_usd is not None and ledger.spent_usd >= budget.max_cost_usd:
        return reached_line({**snapshot, "reached": "cost"})
    if budget.max_tokens is not None and ledger.spent_tokens >= budget.max_tokens:
        return reached_line({**snapshot, "reached": "tokens"})
    return None


def reached_line(snapshot: dict[str, Any]) -> str:
    """``budget reached: $X of $Y; raise --max-cost and --resume`` (or the same in tokens)."""
    if snapshot.get("reached") == "tokens":
        return (
            f"budget reached: {snapshot['spent_tokens']:,} of {snapshot['max_tokens']:,} tokens; "
            "raise --max-tokens and --resume"
        )
    return (
        f"budget reached: ${snapshot['spent_usd']:.4f} of ${snapshot['max_usd']:g}; "
        "raise --max-cost and --resume"
    )
