"""Chat completions through the ``openai`` SDK against any OpenAI-compatible endpoint.

The SDK's own retries are off (``max_retries=0``): retries happen here, with tenacity, so every attempt
passes through the rate gate (the cluster-wide governor sees each 429) and waits honour the
provider's ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import openai

if TYPE_CHECKING:
    import httpx  # the openai SDK's transport types
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from raygen.errors import SessionFailure
from raygen.model.base import ChatModel, Completion, request_seed
from raygen.model.configs import ChatAPIModelConfig, SamplingConfig
from raygen.model.gate import OpenGate, RateGate
from raygen.model.provider_options import request_options
from raygen.model.streaming import StreamStalled, assemble
from raygen.model.token_capture import capture, request_fields

log = logging.getLogger(__name__)


class _Transient(Exception):
    """A retryable provider error; ``retry_after`` is the provider's hint in seconds, if any."""

    def __init__(self, kind: str, detail: str, retry_after: float | None = None):
        super().__init__(kind, detail, retry_after)
        self.kind, self.detail, self.retry_after = kind, detail, retry_after


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    """The provider's ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), in seconds."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                try:  # an HTTP date
                    return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
                except (TypeError, ValueError):
                    continue  # unreadable: our own backoff
    return None


def estimate_tokens(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int | None
) -> int:
    """Rough prompt + completion estimate (4 characters a token) for rate limiting before the call."""
    return estimate_prompt_tokens(messages, tools) + (max_tokens or 512)


def estimate_prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """Rough prompt tokens of a request (4 characters a token), as the simulator counts them."""
    chars = sum(len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages)
    return (chars + _schema_chars(tools)) // 4


_SCHEMA_CHARS: dict[int, tuple[list[dict[str, Any]], int]] = {}


def _schema_chars(tools: list[dict[str, Any]]) -> int:
    """Characters of the tool schemas. Sessions share one schema list per set of toolsets (the session
    runner builds it once), so its size is computed once per list, not at every call (``str`` of the
    schemas was most of this function's time). Keyed by identity; the list is kept, so the id cannot
    be reused while the entry lives."""
    cached = _SCHEMA_CHARS.get(id(tools))
    if cached is not None and cached[0] is tools:
        return cached[1]
    chars = sum(len(str(t)) for t in tools)
    if len(_SCHEMA_CHARS) >= 256:
        _SCHEMA_CHARS.clear()
    _SCHEMA_CHARS[id(tools)] = (tools, chars)
    return chars


_UNSET_CONNECTIONS = 256
"""Connections when neither the config nor the caller sets them (a SessionWorker always does)."""


def connection_limits(max_connections: int) -> httpx.Limits:
    """The SDK's own ``Limits`` type (from httpx or its successor, whichever this openai release uses),
    every connection kept alive: a worker's sessions reuse them turn after turn."""
    limits_type = type(openai.DEFAULT_CONNECTION_LIMITS)
    return limits_type(max_connections=max_connections, max_keepalive_connections=max_connections)


class OpenAIChatModel(ChatModel):
    def __init__(
        self,
        config: ChatAPIModelConfig,
        sampling: SamplingConfig,
        *,
        api_key: str,
        base_url: str,
        gate: RateGate | None = None,
        provider: Any = None,
    ):
        self.name = config.model
        # ``provider`` (a ProviderConfig): reasoning, routing and streaming options of each request.
        self.provider = provider
        self.options = request_options(provider, base_url) if provider is not None else {}
        self.stream = provider is not None and provider.stream
        self.config = config
        self.sampling = sampling
        self.gate = gate or OpenGate()
        self.capture_fields = request_fields(sampling)
        """Token ids and logprobs asked of each request (``sampling.logprobs``, ``return_token_ids``)."""
        # aiohttp transport: the default httpx pool walks every pooled connection on each request,
        # which dominates CPU at thousands of concurrent sessions (bench/README.md, findings).
        self.client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed",
            base_url=base_url,
            max_retries=0,
            timeout=config.timeout_s,
            http_client=openai.DefaultAioHttpClient(
                timeout=config.timeout_s,
                limits=connection_limits(config.max_connections or _UNSET_CONNECTIONS),
            ),
        )

    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """Keyword arguments of ``chat.completions.create``.

        The conversation and the tools travel in ``extra_body``, which the SDK sends as given. Passed as
        ``messages=``/``tools=``, the SDK walks every message and schema of every request against its
        typed-dict definitions to rename aliased keys, which ours (plain JSON built here) never have:
        measured ~2 ms of CPU a call, a tenth of a session's. ``messages=[]`` satisfies the signature;
        ``extra_body`` keys override the transformed body's."""
        payload: dict[str, Any] = {"messages": messages}
        if tools:
            payload["tools"] = tools
        s = self.sampling
        if s.max_tokens is not None:
            payload["max_tokens"] = s.max_tokens
        if s.temperature is not None:
            payload["temperature"] = s.temperature
        if (seed := request_seed(s.seed)) is not None:
            payload["seed"] = seed
        payload.update(self.capture_fields)
        payload.update(self.options)  # reasoning and routing, spelled for this provider
        if s.extra_body:
            payload.update(s.extra_body)  # provider options (OpenRouter routing, reasoning effort, ...)
        if self.stream:  # a real keyword: the SDK reads the answer as events only when told so
            payload["stream_options"] = {"include_usage": True}
            return {"model": self.name, "messages": [], "extra_body": payload, "stream": True}
        return {"model": self.name, "messages": [], "extra_body": payload}

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        body = self._request(messages, tools)
        est = estimate_tokens(messages, tools, self.sampling.max_tokens)
        # The first attempt without tenacity: its machinery costs ~0.2 ms of CPU a call, and most calls
        # succeed at once. Retries (if any) keep the same schedule: attempt n+1 waits as tenacity would.
        try:
            return await self._attempt(body, est)
        except _Transient as exc:
            failure = exc
        if self.config.max_retries == 0:
            raise self._exhausted(failure)
        await asyncio.sleep(self._wait_after(1, failure))
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.max_retries),
            retry=retry_if_exception_type(_Transient),
            wait=lambda state: self._wait_after(
                state.attempt_number + 1, state.outcome.exception() if state.outcome else None
            ),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(body, est)
        except _Transient as exc:
            raise self._exhausted(exc) from None
        raise AssertionError("unreachable")

    def _exhausted(self, exc: _Transient) -> SessionFailure:
        kind = exc.kind if exc.kind in ("rate_limited", "provider_malformed") else "provider_unavailable"
        return SessionFailure(kind, f"after {self.config.max_retries + 1} attempts: {exc.detail}")

    def _wait_after(self, attempt_number: int, exc: BaseException | None) -> float:
        """Seconds before the attempt after ``attempt_number`` (1-based) failed with ``exc``: jittered
        exponential backoff, or the provider's Retry-After if that is longer, capped."""
        # tenacity's wait strategies read only ``attempt_number`` of the retry state.
        backoff = wait_random_exponential(multiplier=0.5, max=self.config.retry_max_wait_s)(
            cast(RetryCallState, SimpleNamespace(attempt_number=attempt_number))
        )
        hint = getattr(exc, "retry_after", None)
        return min(self.config.retry_max_wait_s, max(backoff, hint or 0.0))

    async def _attempt(self, body: dict[str, Any], est: int) -> Completion:
        permit = await self.gate.acquire(est)
        try:
            # The SDK's timeout bounds each read, so a body trickling one byte at a time would never end:
            # this bounds the whole request (send, wait, read and parse).
            async with asyncio.timeout(self.config.timeout_s):
                raw = await self.client.chat.completions.with_raw_response.create(**body)
                response = raw.parse()
            if self.stream:  # each chunk has its own idle timeout, the whole reply none
                response = await assemble(response, self.provider.stream_idle_timeout_s)
        except StreamStalled as exc:
            self.gate.release(permit, status=None)
            raise _Transient("provider_unavailable", str(exc)) from None
        except TimeoutError:
            self.gate.release(permit, status=None)
            detail = f"no complete response within model.timeout_s={self.config.timeout_s:g} s"
            raise _Transient("provider_unavailable", detail) from None
        except openai.APIStatusError as exc:
            headers = dict(exc.response.headers)
            retry_after = _retry_after(exc.response.headers)
            self.gate.release(permit, status=exc.status_code, retry_after_s=retry_after, headers=headers)
            raise _classify_status(exc, retry_after) from None
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            self.gate.release(permit, status=None)
            raise _Transient("provider_unavailable", f"{type(exc).__name__}: {exc}") from None
        except (ValueError, openai.APIResponseValidationError) as exc:
            # A 200 whose body is not JSON (UnicodeDecodeError is a ValueError too) or not a completion:
            # the provider's fault, and often a one-off of a proxy in between, so retried.
            self.gate.release(permit, status=None)
            raise _Transient("provider_malformed", f"unreadable response body: {_first_line(exc)}") from None
        except BaseException:
            self.gate.release(permit, status=None)
            raise
        if not isinstance(getattr(response, "choices", None), list):  # valid JSON, but not a completion
            self.gate.release(permit, status=None)
            raise _Transient("provider_malformed", f"not a chat completion: {str(response)[:200]}")
        usage = response.usage
        prompt_tokens = usage.prompt_tokens if usage else 0
        completion_tokens = usage.completion_tokens if usage else 0
        self.gate.release(
            permit,
            status=200,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            headers=dict(raw.headers),
        )
        return _completion(response, prompt_tokens, completion_tokens)

    async def aclose(self) -> None:
        await self.client.close()


def _completion(response: Any, prompt_tokens: int, completion_tokens: int) -> Completion:
    """The ``Completion`` of a parsed chat completion that passed the gate."""
    if not response.choices:
        raise _Transient("provider_unavailable", "response had no choices")
    choice = response.choices[0]
    extra = {}
    if getattr(response, "provider", None):  # OpenRouter names the upstream provider
        extra["provider"] = response.provider
    cached_tokens, reasoning_tokens, cost_usd = usage_details(response.usage)
    return Completion(
        message=choice.message.model_dump(exclude_none=True),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        finish_reason=choice.finish_reason,
        cached_tokens=cached_tokens,
        reasoning_tokens=reasoning_tokens,
        cost_usd=cost_usd,
        extra=extra,
        tokens=capture(response),
    )


def usage_details(usage: Any) -> tuple[int, int, float | None]:
    """Cached prompt tokens, reasoning tokens and the provider-reported cost in USD (OpenRouter's
    ``usage.cost``; None when absent) of a response's ``usage``, whichever of them the provider sent."""
    if usage is None:
        return 0, 0, None
    data = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
    cached = (data.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (data.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    cost = data.get("cost")
    if not isinstance(cost, int | float) or isinstance(cost, bool) or cost < 0:
        cost = None
    return int(cached), int(reasoning), None if cost is None else float(cost)


def _classify_status(exc: openai.APIStatusError, retry_after: float | None) -> Exception:
    status = exc.status_code
    detail = f"HTTP {status}: {_short(exc)}"
    if status == 429:
        return _Transient("rate_limited", detail, retry_after)
    if status >= 500 or status in (408, 409):
        return _Transient("provider_unavailable", detail, retry_after)
    if status == 413:  # payload too large: the conversation outgrew what the endpoint takes
        return SessionFailure("context_length", detail)
    if status in (401, 403):
        return SessionFailure("provider_auth", detail)
    text = detail.lower()
    if "context" in text and ("length" in text or "window" in text or "too long" in text):
        return SessionFailure("context_length", detail)
    return SessionFailure("provider_bad_request", detail)


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _short(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else None
        if msg:
            return str(msg)[:500]
    return str(exc.message)[:500]
