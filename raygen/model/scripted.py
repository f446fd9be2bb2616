"""``ScriptedModel``: the simulator's scripted policy in-process, without HTTP (development and tests)."""

from __future__ import annotations

import asyncio
from typing import Any

from raygen.errors import SessionFailure
from raygen.model.base import ChatModel, Completion, request_seed
from raygen.model.configs import ScriptedModelConfig, SimConfig
from raygen.model.gate import RateGate
from raygen.model.sim_policy import is_nonexistent_model, respond


class ScriptedModel(ChatModel):
    """Runs ``raygen.model.sim_policy.respond`` directly. Messages have the shape ``OpenAIChatModel``
    yields for the simulator's HTTP replies. ``sim`` supplies the policy's knobs (seed, hallucination and
    reasoning rates); its latency, rate-limit and error knobs are HTTP-only and ignored here.

    With a ``gate`` each call is bracketed by the gate's ``acquire`` and ``release`` as an HTTP call is, so
    a run at zero model cost still pays the cluster-wide governor's path (bench ``ceiling``)."""

    def __init__(
        self, config: ScriptedModelConfig, sim: SimConfig | None = None, gate: RateGate | None = None
    ):
        self.config = config
        self.sim = sim if sim is not None else SimConfig()
        self.name = config.model
        self.gate = gate

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        if self.gate is None:
            return await self._complete(messages, tools)
        # About a token per 4 characters of the conversation, plus room for the reply.
        permit = await self.gate.acquire(sum(len(str(m.get("content") or "")) for m in messages) // 4 + 256)
        try:
            completion = await self._complete(messages, tools)
        except BaseException as exc:  # what the HTTP simulator answers a model it does not know: a 404
            self.gate.release(permit, status=404 if isinstance(exc, SessionFailure) else None)
            raise
        self.gate.release(
            permit,
            status=200,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
        )
        return completion

    async def _complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        if is_nonexistent_model(self.config.model):
            # Mirrors the simulator's 404 so failure paths behave the same with and without HTTP.
            raise SessionFailure("provider_bad_request", f"model {self.config.model!r} does not exist")
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        request: dict[str, Any] = {"model": self.config.model, "messages": messages, "tools": tools}
        if (seed := request_seed(None)) is not None:
            request["seed"] = seed
        reply = respond(request, self.sim)
        return Completion(
            # Like the HTTP client (the SDK's ``model_dump(exclude_none=True)``): no ``content: None``.
            message={k: v for k, v in reply.message.items() if v is not None},
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            finish_reason=reply.finish_reason,
        )
