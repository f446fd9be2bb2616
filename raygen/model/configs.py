"""Configuration of the model backends (``model:``), the simulator (``sim:``), sampling and provider
options.

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
