"""What every session worker needs to know, shipped once to each actor (picklable, no Ray import)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import SecretStr

from raygen.config import ChatAPIModelConfig, ModelConfig, RunConfig
from raygen.tools.mcp_tools import McpServerListing


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
    mcp_servers: list[McpServerListing] = field(default_factory=list)
    """The configured MCP servers and the tools the driver's pre-flight listed (``${VAR}`` unresolved)."""
    mcp_env: dict[str, SecretStr] = field(default_factory=dict)
    """The driver's values of the variables the MCP servers reference (``RunSecrets.mcp_env``)."""

    def model_config(self) -> ModelConfig:
        """The model section as a worker uses it: an unset ``max_connections`` becomes one connection per
        session slot (a session has at most one model request in flight)."""
        model = self.config.model
        if isinstance(model, ChatAPIModelConfig) and model.max_connections is None:
            return model.model_copy(update={"max_connections": self.config.ray.sessions_per_worker})
        return model
