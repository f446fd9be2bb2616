"""Prices, the cost of a call, the budget's admission rule and its overshoot bound, the ledger's uncounted
budget stops, the statistics' cost section, the forecast and the pilot's choice. No Ray: the budget's
logic is ``BudgetLedger``, the actor only wraps it."""

from __future__ import annotations

import asyncio
import random

import pytest

from raygen.config import FakeEnvConfig, RunConfig, SessionConfig
from raygen.distributed.budget import WAIT, BudgetLedger
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import Completion
from raygen.model.configs import PriceConfig, ScriptedModelConfig, SimConfig
from raygen.model.openai_model import usage_details
from raygen.model.pricing import (
    CostPolicy,
    ModelPricing,
    combine_sources,
    reserve_completion_tokens,
)
from raygen.model.scripted import ScriptedModel
from raygen.output.stats import StatsAccumulator
from raygen.output.summary import SessionSummary
from raygen.run.forecast import forecast, pilot_keys, pilot_lines
from raygen.run.ledger import Ledger
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

PRICE = PriceConfig(input=2.0, output=10.0, cached_input=0.5, reasoning=20.0)


def test_price_resolution_config_wins_then_table_by_last_part_then_unknown():
    assert ModelPricing.resolve("gpt-4o", {"gpt-4o": PRICE}).source == "config"
    table = ModelPricing.resolve("openai/gpt-4o-mini")
    assert table.source == "table" and table.price.output == 0.6
    unknown = ModelPricing.resolve("acme/secret-model")
    assert unknown.source == "unknown" and not unknown.known and unknown.usd(10**6, 10**6) == 0.0
    assert "price unknown" in unknown.describe()


def test_usd_prices_cached_and_reasoning_tokens_apart():
    pricing = ModelPricing("m", PRICE, "config")
    # 1M prompt of which 400k cached, 1M completion of which 250k reasoning.
    usd = pricing.usd(1_000_000, 1_000_000, cached=400_000, reasoning=250_000)
    assert usd == pytest.approx(0.6 * 2 + 0.4 * 0.5 + 0.75 * 10 + 0.25 * 20)
    plain = ModelPricing("m", PriceConfig(input=2, output=10), "config")
    assert plain.usd(1000, 500, cached=1000, reasoning=500) == pytest.approx(plain.usd(1000, 500))


def test_provider_reported_cost_wins_over_the_price():
    pricing = ModelPricing("m", PRICE, "config")
    reported = Completion(message={}, prompt_tokens=1000, completion_tokens=100, cost_usd=0.0123)
    assert pricing.call_cost(reported) == (0.0123, "provider")
    priced = Completion(message={}, prompt_tokens=1000, completion_tokens=100)
    assert pricing.call_cost(priced) == (pytest.approx((1000 * 2 + 100 * 10) / 1e6), "config")


def test_usage_details_reads_openrouter_and_openai_fields():
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "cost": 0.002,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    assert usage_details(usage) == (4, 3, 0.002)
    assert usage_details({"prompt_tokens": 1, "cost": "free"}) == (0, 0, None)
    assert usage_details(None) == (0, 0, None)


def test_record_source_is_unknown_if_any_call_was_unpriced():
    assert combine_sources(set()) == ""
    assert combine_sources({"config"}) == "config"
    assert combine_sources({"config", "provider"}) == "mixed"
    assert combine_sources({"provider", "unknown"}) == "unknown"


def test_reserve_tokens_follow_budget_then_max_tokens_then_default():
    cfg = RunConfig()
    assert reserve_completion_tokens(cfg.budget, cfg.sampling) == 4096
    cfg = RunConfig.model_validate({"sampling": {"max_tokens": 300}})
    assert reserve_completion_tokens(cfg.budget, cfg.sampling) == 300
    cfg = RunConfig.model_validate(
        {"sampling": {"max_tokens": 300}, "budget": {"reserve_completion_tokens": 7}}
    )
    assert reserve_completion_tokens(cfg.budget, cfg.sampling) == 7


# ---- the budget's admission rule


def test_a_call_that_fits_only_after_settlements_waits_and_one_that_never_fits_is_refused():
    ledger = BudgetLedger(max_usd=1.0)
    first = ledger.reserve(0.6, 0)
    assert first not in (None, WAIT)
    assert ledger.reserve(0.6, 0) == WAIT  # 0.6 held + 0.6 > 1.0, but alone it fits
    ledger.settle(first, 0.1, 0)
    second = ledger.reserve(0.6, 0)
    assert second not in (None, WAIT)
    ledger.settle(second, 0.5, 0)  # spent 0.6
    assert ledger.reserve(0.5, 0) is None  # 0.6 + 0.5 > 1.0 with nothing in flight: reached
    assert ledger.reached == "cost"
    assert ledger.reserve(0.01, 0) is None  # sticky: the run stops instead of trickling on
    assert ledger.snapshot()["refused"] == 2


def test_new_sessions_wait_while_open_ones_may_need_the_rest_and_stop_when_one_would_not_fit_alone():
    ledger = BudgetLedger(max_usd=1.0)

    def call(session: str, reserve: float, cost: float | None = None) -> int | None:
        ticket = ledger.reserve(reserve, 0, session=session)
        if cost is not None and ticket not in (None, WAIT):
            ledger.settle(ticket, cost, 0)
        return ticket

    call("a", 0.1, 0.3)
    ledger.end_session("a")  # a finished session costs 0.3 on average
    call("b", 0.1, 0.1)  # b spent 0.1: it may need 0.2 more
    assert call("c", 0.1, 0.1) not in (None, WAIT)  # 0.4 spent + 0.2 for b + 0.1 fits
    # 0.5 spent; b and c may need 0.2 each: d's first call waits (0.5 + 0.4 + 0.2 > 1.0) ...
    assert call("d", 0.2) == WAIT
    assert call("b", 0.2, 0.1) not in (None, WAIT)  # ... while open sessions go on
    ledger.end_session("c")  # c ended at 0.1: the average is 0.2, b (0.2 spent) needs nothing more
    assert call("d", 0.1, 0.25) not in (None, WAIT)  # 0.6 spent + 0.1 fits now; 0.85 spent after
    ledger.end_session("b")
    assert call("e", 0.1) is None  # 0.85 + an average session (0.2) > 1.0: new sessions stop
    assert ledger.sessions_closed == "cost" and not ledger.reached
    assert call("f", 0.01) is None  # for good
    assert call("d", 0.1) not in (None, WAIT)  # d is open: it goes on
    assert ledger.snapshot()["reached"] == "cost"


def test_token_budget_and_spend_of_earlier_invocations():
    ledger = BudgetLedger(max_tokens=1000, spent_tokens=900)
    assert ledger.reserve(0.0, 101) is None and ledger.reached == "tokens"
    ledger = BudgetLedger(max_tokens=1000, spent_tokens=900)
    ticket = ledger.reserve(0.0, 100)
    ledger.settle(ticket, 0.0, 150)
    snap = ledger.snapshot()
    assert snap["overshoot_tokens"] == 50 and snap["excess_tokens"] == 50


def test_dead_actors_reservations_expire():
    ledger = BudgetLedger(max_usd=1.0, ttl_s=10)
    ledger.reserve(0.9, 0, now=0.0)
    assert ledger.reserve(0.5, 0, now=5.0) == WAIT
    ledger.expire(11.0)
    assert ledger.reserve(0.5, 0, now=11.0) not in (None, WAIT)
    assert ledger.snapshot()["expired"] == 1


@pytest.mark.parametrize("reserve_share", [1.0, 0.5, 0.1])
def test_overshoot_never_exceeds_what_calls_in_flight_spent_beyond_their_reservations(reserve_share):
    """Many concurrent calls with random costs against one cap: whatever the reservations, the spend
    past the cap is at most the summed excess of actual over reserved (and 0 when no call exceeds its
    reservation)."""
    rng = random.Random(7)
    ledger = BudgetLedger(max_usd=5.0)
    in_flight: dict[int, float] = {}
    while True:
        # Up to 16 calls in flight; each call's actual cost is at most 0.2, its reservation a share of that.
        while len(in_flight) < 16:
            ticket = ledger.reserve(0.2 * reserve_share, 0)
            if ticket is None or ticket == WAIT:
                break
            in_flight[ticket] = rng.uniform(0.0, 0.2)
        if not in_flight:
            break
        ticket = rng.choice(list(in_flight))
        ledger.settle(ticket, in_flight.pop(ticket), 0)
    snap = ledger.snapshot()
    assert snap["reached"] == "cost"
    assert snap["overshoot_usd"] <= snap["excess_usd"] + 1e-12
    if reserve_share == 1.0:
        assert snap["overshoot_usd"] == 0.0
        assert snap["spent_usd"] > 5.0 - 0.2  # stopped within one call's reservation of the cap
    assert snap["overshoot_usd"] <= 16 * 0.2 * (1 - reserve_share) + 1e-12  # in flight x excess per call


# ---- the run ledger: a budget stop is not an attempt


def test_budget_stops_do_not_count_towards_max_attempts():
    ledger = Ledger()
    for attempt in (1, 2, 3):
        ledger.record("k", attempt, "error:budget_reached")
    assert ledger.next_attempt("k", max_attempts=1) == 4
    ledger.record("k", 4, "error:provider_unavailable")
    assert ledger.next_attempt("k", max_attempts=1) is None  # one counted attempt, out of 1
    ledger.record("j", 1, "error:session_cost_cap")
    assert ledger.next_attempt("j", max_attempts=3) is None  # final


# ---- sessions: cost per record and the per-session cap


def _runner(cost: CostPolicy) -> SessionRunner:
    model = ScriptedModel(ScriptedModelConfig(), SimConfig())
    return SessionRunner(
        model=model,
        registry=load_registry([]),
        env_config=FakeEnvConfig(),
        session=SessionConfig(max_turns=6),
        cost=cost,
    )


def _sample(prompt: str = "List the files in the current directory.") -> Sample:
    return Sample(
        sample_key="k1", prompt_index=0, line=1, row=PromptRow(prompt=prompt), toolsets=["terminal", "file"]
    )


def test_session_record_carries_its_cost_at_the_configured_price():
    pricing = ModelPricing("raygen-scripted", PriceConfig(input=3, output=15), "config")
    record = asyncio.run(_runner(CostPolicy(pricing)).run(_sample()))
    assert record.api_calls >= 2 and record.cost_source == "config"
    assert record.cost_usd == pytest.approx(
        (record.usage.prompt_tokens * 3 + record.usage.completion_tokens * 15) / 1e6
    )


def test_session_cost_cap_ends_the_session_before_the_call_that_could_pass_it():
    pricing = ModelPricing("raygen-scripted", PriceConfig(input=3, output=15), "config")
    one_call = CostPolicy(pricing, reserve_completion_tokens=100).estimate([{"content": "x" * 400}], [])[1]
    cap = 2.5 * one_call
    record = asyncio.run(
        _runner(CostPolicy(pricing, session_cap_usd=cap, reserve_completion_tokens=100)).run(_sample())
    )
    assert record.exit_status == "error:session_cost_cap", record.error
    assert record.cost_usd <= cap and record.api_calls >= 1
    assert record.messages  # the partial trajectory is kept


# ---- statistics, forecast, pilot


def _summary(key: str, status: str, usd: float, category: str = "a") -> SessionSummary:
    return SessionSummary(
        sample_key=key, id=key, prompt_index=0, category=category, attempt=1, exit_status=status,
        completed=status == "completed", cost_usd=usd, cost_source="config",
    )  # fmt: skip


def test_statistics_cost_section_separates_waste():
    acc = StatsAccumulator()
    acc.add(_summary("a", "completed", 0.5), "kept")
    acc.add(_summary("b", "completed", 0.25), "kept")
    acc.add(_summary("c", "completed", 0.125), "rejected", "no_reasoning")
    acc.add(_summary("d", "error:budget_reached", 0.0625, "b"), "failed")
    cost = acc.to_dict()["cost"]
    assert cost["final_usd"] == pytest.approx(0.9375)
    assert cost["kept_usd"] == pytest.approx(0.75) and cost["waste_usd"] == pytest.approx(0.1875)
    assert cost["per_kept_usd"] == pytest.approx(0.9375 / 2)
    assert cost["failed_by_kind_usd"] == {"budget_reached": pytest.approx(0.0625)}
    assert acc.to_dict()["per_category"]["b"]["cost"]["failed_usd"] == pytest.approx(0.0625)


def test_pilot_keys_spread_over_categories():
    pending = [(f"a{i}", "a") for i in range(10)] + [("b0", "b"), ("c0", "c"), ("c1", "c")]
    assert pilot_keys(pending, 4) == {"a0", "b0", "c0", "a1"}
    assert pilot_keys(pending, 100) == {k for k, _ in pending}


def test_pilot_projection_with_an_interval():
    per_session = {
        "cost_usd": {"n": 4, "mean": 0.01, "sd": 0.002},
        "duration_s": {"n": 4, "mean": 2.0, "sd": 0},
    }
    lines = pilot_lines(per_session, remaining=100, slots=10)
    assert "$0.010000 per session" in lines[0] and "$1.0000" in lines[1]
    half = 1.96 * 0.002 / 2 * 100
    assert f"${1 - half:.4f}-${1 + half:.4f}" in lines[1] and "about 20.0 s" in lines[1]


def test_forecast_first_call_and_ceiling():
    config = RunConfig.model_validate(
        {"sampling": {"max_tokens": 100}, "session": {"max_turns": 3, "tool_output_max_chars": 400}}
    )
    pricing = ModelPricing("m", PriceConfig(input=1, output=2), "config")
    registry = load_registry([])
    samples = [_sample("x" * 4000)]
    result = forecast(samples, config, registry, pricing)
    prompt = result.first_call_tokens - 100
    assert prompt >= 1000  # the prompt's 4000 characters, plus the tool schemas
    # 3 calls: inputs prompt, prompt + 200, prompt + 400 (each turn a 100-token reply and a 100-token result)
    assert result.ceiling_tokens == 3 * prompt + 600 + 300
    assert result.ceiling_usd == pytest.approx(((3 * prompt + 600) * 1 + 300 * 2) / 1e6)


def test_report_cost_section_shows_spend_waste_and_categories():
    from raygen.eval.cost import cost_section

    acc = StatsAccumulator()
    acc.add(_summary("a", "completed", 0.5, "bash"), "kept")
    acc.add(_summary("d", "error:budget_reached", 0.25, "sql"), "failed")
    stats = acc.to_dict()
    stats["cost"]["total_usd"], stats["cost"]["superseded_usd"] = 1.0, 0.25
    html = cost_section(stats)
    for text in ("$1.0000", "$0.5000", "$0.2500", "budget_reached", ">bash<", ">sql<", "<svg"):
        assert text in html, text
    assert "Nothing was spent" in cost_section(StatsAccumulator().to_dict())
