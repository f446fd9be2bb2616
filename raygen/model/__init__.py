"""Model backends, selected by ``model.type`` and imported lazily."""

from __future__ import annotations

from typing import Any

from raygen.model.base import ChatModel, Completion
from raygen.model.gate import RateGate


def create_model(
    config: Any,
    *,
    sampling: Any,
    sim: Any,
    base_url: str | None,
    api_key: str,
    gate: RateGate | None = None,
    provider: Any = None,
) -> ChatModel:
    """Build the chat model for ``config`` (a ModelConfig). ``base_url`` is the resolved endpoint
    (``raygen.run.endpoint``: the simulator's for ``sim``); ``provider`` (a ProviderConfig) adds the
    reasoning, routing and streaming options."""
    if config.type == "scripted":
        from raygen.model.scripted import ScriptedModel

        return ScriptedModel(config, sim, gate)
    from raygen.model.openai_model import OpenAIChatModel

    return OpenAIChatModel(
        config, sampling, api_key=api_key, base_url=base_url or "", gate=gate, provider=provider
    )


__all__ = ["ChatModel", "Completion", "create_model"]
