"""What every session worker needs to know, shipped once to each actor (picklable, no Ray import)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import SecretStr

from raygen.config import ChatAPIModelConfig, ModelConfig, RunConfig


@dataclass
class WorkerPlan:
    config: RunConfig
    run_name: str
    base_url: str | None
    """Resolved model endpoint: the configured one, the simulator's (``model.type: sim``), or None."""
    api_key: SecretStr = field(default_factory=lambda: SecretStr(""))
    """Travels in the actor's constructor arguments, never in config, records or logs."""
    config_fingerprint: str = ""
    secret_values: list[SecretStr] = field(default_factory=list)

    def model_config(self) -> ModelConfig:
        """The model section as a worker uses it: an unset ``max_connections`` becomes one connection per
        session slot (a session has at most one model request in flight)."""
        model = self.config.model
        if isinstance(model, ChatAPIModelConfig) and model.max_connections is None:
            return model.model_copy(update={"max_connections": self.config.ray.sessions_per_worker})
        return model
