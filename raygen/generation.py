"""Everything that decides *what* a session generates, resolved once in the driver.

The generation fingerprint hashes exactly those inputs (model, endpoint, sampling options, turn limit,
system prompt, toolset distribution, tool schemas, run seed). Every record carries it, and a resume whose
fingerprint differs is refused with the list of what changed, because mixing two configurations in one
dataset silently is worse than stopping.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygen.config import RunConfig, fingerprint
from raygen.errors import ConfigError
from raygen.tools.distributions import BoundDistribution, load_distribution
from raygen.tools.registry import ToolRegistry, load_registry


@dataclass
class GenerationSetup:
    registry: ToolRegistry
    distribution: BoundDistribution
    model_name: str
    generation: dict[str, Any]
    fingerprint: str
    api_key: str = ""
    secret_values: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, config: RunConfig) -> GenerationSetup:
        registry = load_registry(config.tools.plugins)
        distribution = load_distribution(config.tools.distribution, set(registry.toolset_names()))
        api_key = _api_key(config)
        model = config.model
        generation = {
            "model": model.model,
            "model_type": model.type,
            "base_url": getattr(model, "base_url", None)
            or ("builtin-simulator" if model.type == "openai" else None),
            "sampling": config.sampling.model_dump(mode="json"),
            "max_turns": config.session.max_turns,
            "system_prompt": config.session.resolved_system_prompt(),
            "distribution": {"name": distribution.name, "toolsets": distribution.probabilities()},
            "tool_schemas": [t.schema() for t in registry.tools_for(registry.toolset_names())],
            "seed": config.seed,
        }
        return cls(
            registry=registry,
            distribution=distribution,
            model_name=model.model,
            generation=generation,
            fingerprint=fingerprint(generation),
            api_key=api_key,
            secret_values=[api_key] if api_key else [],
        )


def _api_key(config: RunConfig) -> str:
    if config.model.type != "openai" or config.model.base_url is None:
        return ""
    key = os.environ.get(config.model.api_key_env, "")
    if not key:
        raise ConfigError(
            f"environment variable {config.model.api_key_env} is not set; export the key there or name "
            "another variable with --api-key-env (endpoints without keys accept any value)"
        )
    return key


def resume_check(manifest_path: Path, setup: GenerationSetup, *, force: bool) -> None:
    """Refuse to resume with a different generation config unless forced."""
    previous = json.loads(manifest_path.read_text(encoding="utf-8"))
    if previous.get("config_fingerprint") == setup.fingerprint or force:
        return
    old = previous.get("generation") or {}
    changed = sorted(k for k in set(old) | set(setup.generation) if old.get(k) != setup.generation.get(k))
    raise ConfigError(
        "the generation config differs from the run being resumed (changed: "
        + ", ".join(changed or ["unknown"])
        + "); records would mix two configurations. Use a new --run-name, or --force to continue anyway"
    )
