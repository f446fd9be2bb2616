"""Configuration of the model backends (``model:``), the simulator (``sim:``), sampling and provider
options, and the pacing of model requests (``governor:``, the ``RateGate`` seam's settings).

Re-exported by ``raygen.config``; ``docs/configuration.md`` is generated from these docstrings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from raygen.config_section import Section as _Section
from raygen.config_section import refuse_non_finite


class PriceConfig(_Section):
    """A model's price in USD per million tokens (``pricing.<model>``), as the provider bills it."""

    input: float = Field(ge=0)
    """Prompt tokens not served from the provider's prompt cache."""
    output: float = Field(ge=0)
    """Completion tokens (reasoning tokens included unless ``reasoning`` is set)."""
    cached_input: float | None = Field(None, ge=0)
    """Prompt tokens the provider reports as cached (``usage.prompt_tokens_details.cached_tokens``); unset:
    the ``input`` price."""
    reasoning: float | None = Field(None, ge=0)
    """Reasoning tokens (``usage.completion_tokens_details.reasoning_tokens``), where billed apart; unset: the
    ``output`` price."""


class SimConfig(_Section):
    """The built-in OpenAI-compatible simulator (``raygen sim serve``; default model of ``raygen run``)."""

    host: str = "127.0.0.1"
    """Address the simulator listens on; loopback by default."""
    port: int = 0
    """TCP port; 0 picks a free one."""
    latency_s: float = 0.05
    """Mean model latency per request, in seconds."""
    latency_jitter_s: float = 0.0
    """Uniform jitter added to (or taken from) the latency, in seconds."""
    rate_limit_rpm: float | None = None
    """Hard request-rate limit (requests per minute); requests over it get 429 with Retry-After."""
    rate_limit_tpm: float | None = None
    """Hard token-rate limit (prompt + completion tokens per minute, charged on arrival); requests over it
    get 429 with Retry-After."""
    rate_limit_kind: Literal["token_bucket", "fixed_window", "sliding_window"] = "token_bucket"
    """How the limits are counted, as providers do: a token bucket (refills continuously, holds
    ``rate_limit_burst``), fixed windows of ``rate_limit_window_s`` aligned to the clock (the count resets
    at each boundary), or a sliding window (any ``rate_limit_window_s`` interval holds at most its share)."""
    rate_limit_window_s: float = Field(60.0, gt=0)
    """Length of a fixed or sliding window, in seconds; each window admits ``rpm * window_s / 60``
    requests (and likewise tokens)."""
    rate_limit_burst: float | None = None
    """Burst capacity of the rate limit's token bucket (requests); unset: one second's worth of the rate,
    at least 1."""
    rate_limit_headers: bool = True
    """Send OpenAI-style ``x-ratelimit-*`` headers with every answer. Off: like many self-hosted gateways
    and OpenAI-compatible hosts, the limit shows only as a 429 with ``Retry-After`` (and
    ``retry-after-ms``), which is all the governor needs to learn it."""
    error_rate: float = 0.0
    """Share of requests answered with a 5xx error."""
    hallucinate_rate: float = 0.0
    """Share of sessions (decided per prompt) that call a tool that does not exist."""
    no_reasoning_rate: float = 0.0
    """Share of sessions (decided per prompt) whose assistant turns carry no reasoning."""
    slow_rate: float = Field(0.0, ge=0, le=1)
    """Share of sessions (decided per prompt) that are stragglers: each of their requests takes
    ``slow_factor`` times the latency."""
    slow_factor: float = Field(50.0, ge=1)
    """How many times slower a straggler's requests are."""
    provider_name: str | None = None
    """Name returned in each response's ``provider`` field, as OpenRouter names the upstream that served
    the call (recorded per turn in ``turns``); unset: no such field."""
    stream_chunk_delay_s: float = Field(0.0, ge=0)
    """Pause before each chunk of a streamed (``stream: true``) answer, in seconds."""
    reasoning_style: Literal["field", "think", "mixed"] = "mixed"
    """Where reasoning is returned: the ``reasoning_content`` field, ``<think>`` tags in content, or both
    styles chosen per session."""
    seed: int = 0
    """Seed for the per-prompt decisions and the latency jitter."""
    log_path: Path | None = None
    """If set, every request is appended to this JSONL file (prompt hash, decision, status)."""
    solutions_file: Path | None = None
    """For verified-task demos and tests: a JSONL of reference solutions (``{"id", "solution_py"}``, as
    ``verified-tasks.solutions.jsonl``). A prompt asking to write a Python file gets the one completing its
    code in a share ``solve_rate`` of sessions, else the bare code (which fails the hidden tests). Unset:
    every prompt gets the probe script."""
    solve_rate: float = Field(0.5, ge=0, le=1)
    """Share of coding sessions (drawn per prompt and request ``seed``) that write the reference solution."""
    reported_price: PriceConfig | None = None
    """Report each answer's cost in ``usage.cost`` (USD) at this price, as OpenRouter does, e.g.
    ``{input: 0.1, output: 0.3}``; unset: no cost field (docs/cost.md)."""
    tokenizer: str | None = None
    """A Hugging Face tokenizer (local folder, or a name in the local cache) whose chat template renders
    the token ids the simulator returns when asked (``sampling.return_token_ids``, ``logprobs``), as vLLM
    serving that model would; needs ``raygen[export]``. Unset: stand-in ids (raygen/sim/tokens.py)."""


class ChatAPIModelConfig(_Section):
    """What the model backends spoken to over the OpenAI chat-completions API (``openai``, ``sim``) share:
    the ``openai`` SDK client's settings."""

    type: str
    """Backend selector."""
    model: str = "raygen-sim"
    """Model name sent with each request."""
    timeout_s: float = 600.0
    """Timeout of one model request (one HTTP attempt: send, wait, read, parse), in seconds. The wait for
    the rate governor before it is not part of it."""
    max_retries: int = 8
    """Retries of one request on 429, 5xx, timeouts and connection errors before the session fails."""
    retry_max_wait_s: float = 120.0
    """Longest wait between two retries (Retry-After from the provider is honoured up to this). Also the
    longest the rate governor pauses the cluster (``governor.max_pause_s`` is capped at it): one answer
    never holds anyone else longer than its own request may wait."""
    max_connections: int | None = Field(None, ge=1)
    """Most HTTP connections to the endpoint per session actor; a request beyond them waits for a free one.
    Unset: ``ray.sessions_per_worker`` (a session has at most one model request in flight)."""


class OpenAIModelConfig(ChatAPIModelConfig):
    """Any OpenAI-compatible chat-completions endpoint, through the ``openai`` SDK. A ``model`` section
    without ``type`` is this backend when it has a ``base_url`` (``--base-url``), else ``sim``."""

    type: Literal["openai"] = "openai"
    """Backend selector."""
    base_url: str
    """Endpoint, e.g. ``https://openrouter.ai/api/v1`` (required; for the built-in simulator use
    ``type: sim``)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (the key itself never goes in config)."""


class SimModelConfig(ChatAPIModelConfig):
    """The built-in OpenAI-compatible simulator, started on loopback for the run (settings: the top-level
    ``sim`` section) and spoken to over HTTP like any endpoint, with no API key and no cost. The default
    model of ``raygen run`` when no endpoint is given."""

    type: Literal["sim"] = "sim"
    """Backend selector."""


class ScriptedModelConfig(_Section):
    """The simulator's scripted policy, in-process with no HTTP: for development and tests."""

    type: Literal["scripted"] = "scripted"
    """Backend selector."""
    model: str = "raygen-scripted"
    """Model name recorded in trajectories."""
    latency_s: float = Field(0.0, ge=0)
    """Simulated latency of each call, in seconds (none by default)."""


ModelConfig = Annotated[SimModelConfig | OpenAIModelConfig | ScriptedModelConfig, Field(discriminator="type")]


class SamplingConfig(_Section):
    """Request options sent with every chat completion."""

    max_tokens: int | None = None
    """Completion token limit per model call (``max_tokens``)."""
    temperature: float | None = None
    """Sampling temperature; unset uses the provider's default."""
    seed: int | None = None
    """Sampling seed passed to the provider (where supported)."""
    logprobs: bool = False
    """Ask for the logprob of each reply token (``logprobs: true``); each turn of the record then carries
    them (``turns[].logprobs``, about 20 bytes a token in the JSON)."""
    top_logprobs: int | None = Field(None, ge=0, le=20)
    """Also ask for this many most likely alternatives per reply token (``top_logprobs``; implies
    ``logprobs``). Large: about 60 bytes per alternative and token."""
    return_token_ids: bool = False
    """Ask an endpoint that supports it (vLLM's ``return_token_ids``) for the prompt's and the reply's
    token ids; kept per turn (the prompt's only from where it extends the previous turn), for token-in /
    token-out training exports (docs/exports.md). Endpoints that ignore it leave the ids empty."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Provider-specific options merged into each request body, e.g. an OpenRouter route
    ``{provider: {order: [...], allow_fallbacks: false}}`` or ``{reasoning: {effort: high}}``.
    Recorded in the manifest."""

    @field_validator("extra_body")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        return refuse_non_finite(v)


class BudgetConfig(_Section):
    """Hard limits on what a run may spend, counted cluster-wide over all its passes and resumes, none of
    them part of the generation fingerprint (docs/cost.md)."""

    max_cost_usd: float | None = Field(None, gt=0)
    """``--max-cost``: no model call starts unless the run's spend plus the calls in flight stays under this
    (USD); at it the run stops admitting, finishes, merges and exits 75. Needs the model's price."""
    max_tokens: int | None = Field(None, gt=0)
    """``--max-tokens``: the same limit in tokens (prompt + completion) over the whole run; the per-call
    completion limit is ``sampling.max_tokens``."""
    max_session_cost_usd: float | None = Field(None, gt=0)
    """``--max-session-cost``: a session whose next call could take it past this ends with
    ``error:session_cost_cap`` (final; its trajectory so far is kept in ``failed/``)."""
    reserve_completion_tokens: int | None = Field(None, ge=0)
    """Completion tokens each call reserves from a budget before it is sent (with its prompt, estimated at 4
    characters a token); unset: ``sampling.max_tokens``, else 4096. The overshoot of a budget is bounded by
    what the calls in flight spend beyond their reservations (docs/cost.md)."""

    def limits_anything(self) -> bool:
        return self.max_cost_usd is not None or self.max_tokens is not None


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ProviderConfig(_Section):
    """What each request asks of the provider beyond sampling: reasoning, OpenRouter routing, streaming.
    Mapped per provider by ``raygen.model.provider_options`` (docs/migrating-from-hermes.md)."""

    api_style: Literal["auto", "openrouter", "openai"] = "auto"
    """How reasoning options are spelled: OpenRouter's ``reasoning: {...}`` object or OpenAI's
    ``reasoning_effort``; ``auto``: OpenRouter when ``model.base_url`` is on openrouter.ai, else OpenAI's."""
    reasoning_effort: ReasoningEffort | None = None
    """How much the model should reason (``--reasoning-effort``); unset: the provider's default."""
    reasoning: bool = True
    """False asks the provider for no reasoning at all (``--no-reasoning``): OpenRouter
    ``reasoning: {enabled: false}``, OpenAI ``reasoning_effort: none``."""
    providers_allowed: list[str] | None = None
    """OpenRouter: only these upstream providers may serve the calls (``provider.only``)."""
    providers_ignored: list[str] | None = None
    """OpenRouter: never these upstream providers (``provider.ignore``)."""
    providers_order: list[str] | None = None
    """OpenRouter: try these upstream providers in this order (``provider.order``)."""
    provider_sort: Literal["price", "throughput", "latency"] | None = None
    """OpenRouter: rank upstream providers by this (``provider.sort``)."""
    stream: bool = False
    """Receive each reply as a stream of chunks (``stream: true``), for providers and gateways that need
    it; the reply is assembled before the session goes on."""
    stream_idle_timeout_s: float = Field(120.0, gt=0)
    """With ``stream``: longest wait for the next chunk before the call counts as failed (and is retried);
    ``model.timeout_s`` then bounds only the wait for the response to start."""

    @field_validator("providers_allowed", "providers_ignored", "providers_order", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        # The flags take ``a,b,c`` as the reference runner's do.
        return [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _reasoning_consistent(self) -> ProviderConfig:
        if not self.reasoning and self.reasoning_effort not in (None, "none"):
            raise ValueError("reasoning: false (--no-reasoning) contradicts reasoning_effort")
        return self


class GovernorConfig(_Section):
    """Cluster-wide pacing of model requests: one governor per (endpoint, model, API key) is shared by every
    worker on every node. By default it only watches until the provider answers 429 (``adaptive``);
    off entirely with ``adaptive: false`` and no limit."""

    rpm: float | None = Field(None, gt=0)
    """Requests per minute allowed across the whole cluster; unset: unknown (see ``adaptive``)."""
    tpm: float | None = Field(None, gt=0)
    """Tokens per minute (prompt + completion) across the cluster: estimated before each call and corrected
    with the provider's reported usage after it; unset: unlimited."""
    max_in_flight: int | None = Field(None, ge=1)
    """Most requests in flight at once across the cluster; unset: unlimited."""
    headroom: float = Field(0.97, gt=0, le=1)
    """Share of ``rpm`` and ``tpm`` (and of a limit learned from 429s) the governor paces to. A little under
    the limit, because requests reach the provider with some jitter (slots used a moment after they were
    granted, network) and a provider counting over a short window answers a bunched second with 429s;
    1.0 paces exactly at the limit."""
    adaptive: bool | None = None
    """Learn the limit from 429s: unset (the default) means on when ``rpm`` is unset and off when it is set.
    On and with no ``rpm``, nothing is throttled until the provider refuses (a run that never gets a 429
    is never slowed); 429s that are evidence (a second within 10 s: a lone one only delays its own
    request) set the target to the rate the provider actually let through (requests that passed over the
    last 10 s, divided by the span until it takes requests again, by its Retry-After), then the target
    grows again after clean, busy traffic and each further such cut sets it to the measured rate (AIMD).
    With ``rpm`` set and adaptive on, ``rpm`` is the start and the ceiling. Off: 429s slow a known limit by
    1.5% (down to 90%), on evidence as above, and pause the cluster only as ``max_pause_s`` says; with no
    limit either, nothing is governed (``--adaptive/--no-adaptive``)."""
    initial_rpm: float | None = Field(None, gt=0)
    """Adaptive start rate when ``rpm`` is unset; from it the target doubles after each clean, busy
    interval until the first 429 (slow start). Unset: unthrottled until the first 429."""
    max_rpm: float = Field(10_000.0, gt=0)
    """Adaptive ceiling when ``rpm`` is unset."""
    decrease_factor: float = Field(0.7, gt=0, lt=1)
    """On a 429 that the measured rate cannot explain (it is at or above the target), the target is
    multiplied by this instead; near a measured limit no cut goes deeper than this in one step; at most one
    cut per ``cut_window_s``."""
    increase_fraction: float = Field(0.03, gt=0, le=1)
    """Near the limit learned from the last 429, the target grows by this fraction of that limit after each
    ``increase_interval_s`` of clean traffic that used the target (additive increase); far below it, or
    before any 429, it doubles (slow start). Once two cuts in a row measured about the same limit, it grows
    only up to that limit, and past it at half the pace per such cut (down to an eighth)."""
    increase_interval_s: float = Field(1.0, gt=0)
    """Seconds of clean traffic between two increases of the adaptive target (at least three requests'
    worth of the target)."""
    cut_window_s: float = Field(1.0, ge=0)
    """A burst of 429s within this many seconds cuts the target once."""
    burst_s: float = Field(0.1, gt=0)
    """Pacing burst: at most this many seconds' worth of the rate (plus one request) goes out at once.
    Providers count over token buckets, fixed windows or sliding windows of 1 to 60 s; paced at
    ``headroom`` with a 0.1 s burst every window of 10 s or more holds (a 1-s burst at 97% overshoots a
    10-s sliding window). Only a 1-s sliding window can still refuse a bunched request now and then; a
    known limit then paces 1.5% slower per 429 (down to 90%), a learned one is cut to the measured rate.
    Smaller values cost more remote calls per request (each lease holds at most one burst)."""
    lease_size: int | None = Field(None, ge=1)
    """Most request slots a worker takes from the governor in one remote call. Unset (the default): a
    lease carries the worker's waiting callers plus about 0.5 s of its recent demand, and never more than
    one pacing burst of a known limit, so a worker makes a few calls a second at any request rate."""
    lease_ttl_s: float = Field(2.0, gt=0)
    """Leased slots unused after this many seconds go back, so idle workers strand no capacity."""
    max_pause_s: float = Field(120.0, gt=0)
    """Longest pause of the cluster (or of one worker) when several answers in a row asked to wait (3
    within 2 s; their median Retry-After or rate-limit reset). Never above ``model.retry_max_wait_s``: one
    answer alone only delays its own request's retry."""

    @model_validator(mode="after")
    def _initial_within_ceiling(self) -> GovernorConfig:
        if self.rpm is None and self.initial_rpm is not None and self.initial_rpm > self.max_rpm:
            raise ValueError("initial_rpm must not exceed max_rpm")
        return self

    def bounded(self, retry_max_wait_s: float | None) -> GovernorConfig:
        """This section with ``max_pause_s`` no longer than the model's ``retry_max_wait_s``: the cluster is
        never held longer than the user lets one request wait."""
        if retry_max_wait_s is None or retry_max_wait_s >= self.max_pause_s:
            return self
        return self.model_copy(update={"max_pause_s": max(retry_max_wait_s, 1e-3)})

    def resolved_adaptive(self) -> bool:
        """Whether the governor learns the limit from 429s: ``adaptive``; unset: when ``rpm`` is unset."""
        return self.adaptive if self.adaptive is not None else self.rpm is None

    def limits_anything(self) -> bool:
        """False when there is nothing to govern (no limit and adaptive off): callers use ``OpenGate``."""
        return self.resolved_adaptive() or any(
            v is not None for v in (self.rpm, self.tpm, self.max_in_flight)
        )
