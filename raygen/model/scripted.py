"""``ScriptedModel``: the simulator's scripted policy in-process, without HTTP (development and tests)."""

from __future__ import annotations

import asyncio
from typing import Any

from raygen.errors import SessionFailure
from raygen.model.base import ChatModel, Completion, request_seed
from raygen.model.configs import ScriptedModelConfig, SimConfig
from raygen.model.sim_policy import is_nonexistent_model, respond


class ScriptedModel(ChatModel):
    """Runs ``raygen.model.sim_policy.respond`` directly. Messages have the shape ``OpenAIChatModel``
    yields for the simulator's HTTP replies. ``sim`` supplies the policy's knobs (seed, hallucination and
    reasoning rates); its latency, rate-limit and error knobs are HTTP-only and ignored here."""

    def __init__(self, config: ScriptedModelConfig, sim: SimConfig | None = None):
        self.config = config
        self.sim = sim if sim is not None else SimConfig()
        self.name = config.model

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
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
