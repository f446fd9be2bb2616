"""Everything that decides *what* a session generates, resolved once in the driver.

The generation fingerprint hashes exactly those inputs (model, endpoint, sampling options, turn limit,
system prompt, toolset distribution, tool schemas, run seed). Every record carries it, and a resume whose
fingerprint differs is refused with the list of what changed, because mixing two configurations in one
dataset silently is worse than stopping.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from raygen.config import RunConfig, fingerprint
from raygen.errors import ConfigError
from raygen.hygiene.leaks import host_secret_values
from raygen.model.provider_options import request_options
from raygen.run.endpoint import endpoint_label
from raygen.tools.distributions import BoundDistribution, load_distribution
from raygen.tools.mcp_config import configured_servers, referenced_values
from raygen.tools.mcp_preflight import run_preflight
from raygen.tools.mcp_tools import McpServerListing, mcp_toolset
from raygen.tools.registry import ToolRegistry, load_registry


@dataclass(frozen=True)
class Generation:
    """What decides a run's sessions (no secrets: this is recorded in the manifest and fingerprinted)."""

    registry: ToolRegistry
    distribution: BoundDistribution
    mcp_servers: list[McpServerListing]
    """The configured MCP servers as the pre-flight found them (``${VAR}`` unresolved: no secrets)."""
    model_name: str
    settings: dict[str, Any]
    """The fingerprinted inputs, as recorded under ``generation`` in ``manifest.json``."""
    fingerprint: str

    @classmethod
    def build(cls, config: RunConfig) -> Generation:
        registry = load_registry(config.tools.plugins)
        mcp_servers = _preflight_mcp(config)
        for listing in mcp_servers:
            registry.add(mcp_toolset(listing), origin=f"MCP server {listing.name}")
        distribution = load_distribution(
            config.tools.distribution, set(registry.toolset_names()), always=[s.name for s in mcp_servers]
        )
        model = config.model
        settings = {
            "model": model.model,
            # Spelled as before ``model.type: sim`` existed (the simulator was an ``openai`` model without
            # an endpoint), so simulator runs made then keep their fingerprint and resume unchanged.
            "model_type": "openai" if model.type == "sim" else model.type,
            "base_url": endpoint_label(config),
            "sampling": _sampling(config),
            "max_turns": config.session.max_turns,
            "system_prompt": config.session.resolved_system_prompt(),
            "distribution": {"name": distribution.name, "toolsets": distribution.probabilities()},
            "tool_schemas": [t.schema() for t in registry.tools_for(registry.toolset_names())],
            "seed": config.seed,
            # Only when set, so runs made before these options existed keep their fingerprint.
            **_optional_generation(config),
        }
        if mcp_servers:  # only when set, so runs without MCP keep their fingerprint
            settings["mcp_servers"] = {s.name: _fingerprinted(s) for s in mcp_servers}
        return cls(
            registry=registry,
            distribution=distribution,
            mcp_servers=mcp_servers,
            model_name=model.model,
            settings=_recorded_settings(settings),
            fingerprint=fingerprint(settings),  # of the text itself, as before it was kept out
        )


@dataclass
class RunSecrets:
    """The secrets a run holds in memory: the API key (sent to the provider, never recorded), and every
    value to scrub from trajectories and count in the output's leak check. Kept apart from
    ``Generation`` so nothing that records or prints the generation can reach them; not in ``repr``."""

    api_key: str = field(default="", repr=False)
    values: list[str] = field(default_factory=list, repr=False)
    """The API key and the driver's values of ``session.secret_env`` (unset or empty ones skipped)."""

    mcp_env: dict[str, str] = field(default_factory=dict, repr=False)
    """The driver's values of the variables MCP server configs reference as ``${VAR}`` (and of
    ``session.secret_env``, which rows' own servers may reference)."""

    @classmethod
    def from_environment(cls, config: RunConfig) -> RunSecrets:
        """Read from the driver's environment; a missing API key for an ``openai`` endpoint is an error."""
        api_key = _api_key(config)
        values = ([api_key] if api_key else []) + host_secret_values(config.session.secret_env)
        mcp_env = _mcp_values(config)
        values += [value for value in mcp_env.values() if value and value not in values]
        return cls(api_key=api_key, values=values, mcp_env=mcp_env)


def _mcp_values(config: RunConfig) -> dict[str, str]:
    servers = configured_servers(config.tools.mcp_servers, config.tools.mcp_config)
    return referenced_values(servers.values(), config.session.secret_env)


def _preflight_mcp(config: RunConfig) -> list[McpServerListing]:
    """Start each configured MCP server once and read its tools (ConfigError, one line, if one fails)."""
    servers = configured_servers(config.tools.mcp_servers, config.tools.mcp_config)
    if not servers:
        return []
    return run_preflight(
        servers,
        _mcp_values(config),
        config.env,
        run_name=config.output.run_name or "raygen",
        name_format=config.tools.mcp_tool_name_format,
        start_timeout_s=config.tools.mcp_start_timeout_s,
    )


def _fingerprinted(listing: McpServerListing) -> dict[str, Any]:
    # What decides the sessions: where it runs and what it is; never its variables or headers (secrets).
    return {
        "transport": listing.config.transport,
        "placement": listing.config.placement,
    }


_CAPTURE_OPTIONS = ("logprobs", "top_logprobs", "return_token_ids")
"""Sampling options newer than the fingerprint: in it only when set, so earlier runs keep theirs."""


def _sampling(config: RunConfig) -> dict[str, Any]:
    sampling = config.sampling.model_dump(mode="json")
    return {k: v for k, v in sampling.items() if k not in _CAPTURE_OPTIONS or v}


def _optional_generation(config: RunConfig) -> dict[str, Any]:
    """Reasoning and routing options, ephemeral system prompt and prefill: what they change is what the
    model is asked, so they belong to the fingerprint (reading the prefill file also checks it early)."""
    session = config.session
    optional = {
        "provider_options": request_options(config.provider, getattr(config.model, "base_url", None)),
        "ephemeral_system_prompt": session.ephemeral_system_prompt,
        "prefill": session.resolved_prefill(),
        "store_prefill": session.store_prefill or None,
        # The harness decides the conversation as much as the model does (raygen's own loop: absent).
        "agent": config.agent.model_dump(mode="json") if config.agent.type != "builtin" else None,
    }
    return {key: value for key, value in optional.items() if value}


def _recorded_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` as the manifest records them: the ephemeral system prompt is sent, never stored
    (docs/migrating-from-hermes.md); its hash tells two runs' prompts apart (issue 28)."""
    text = settings.get("ephemeral_system_prompt")
    if not text:
        return settings
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return {**settings, "ephemeral_system_prompt": {"sha256": digest, "chars": len(text)}}


def recorded_config(config: RunConfig) -> dict[str, Any]:
    """The resolved config as ``manifest.json`` records it: without the ephemeral system prompt's text
    (``generation`` holds its hash)."""
    data = config.model_dump(mode="json")
    if data["session"].get("ephemeral_system_prompt"):
        data["session"]["ephemeral_system_prompt"] = None
    return data


def _api_key(config: RunConfig) -> str:
    if config.model.type != "openai":
        return ""
    key = os.environ.get(config.model.api_key_env, "")
    if not key:
        raise ConfigError(
            f"environment variable {config.model.api_key_env} is not set; export the key there or name "
            "another variable with --api-key-env (endpoints without keys accept any value)"
        )
    return key


def resume_check(previous: dict[str, Any], generation: Generation, *, force: bool) -> None:
    """Refuse to resume with another generation config (``previous``: the run's manifest) unless forced."""
    if previous.get("config_fingerprint") == generation.fingerprint or force:
        return
    changes = describe_changes(previous.get("generation") or {}, generation.settings)
    raise ConfigError(
        "the generation config differs from the run being resumed ("
        + "; ".join(changes or ["unknown change"])
        + "); records would mix two configurations. Use a new --run-name, or --force to continue anyway"
    )


_SHOWN_VALUE_CHARS = 60


def describe_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """What differs between two generation dicts, one entry per changed field, e.g.
    ``max_turns: 10 -> 3``, ``sampling.temperature: None -> 0.7``, ``tool_schemas: added patch``."""
    changes: list[str] = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        name = f"{prefix}{key}"
        if isinstance(before, dict) and isinstance(after, dict):
            changes += describe_changes(before, after, f"{name}.")
        elif key == "tool_schemas" and isinstance(before, list) and isinstance(after, list):
            changes.append(f"{name}: {_schema_changes(before, after)}")
        else:
            changes.append(f"{name}: {_short(before)} -> {_short(after)}")
    return changes


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= _SHOWN_VALUE_CHARS else f"<{len(text)} chars, sha {fingerprint(value)[:8]}>"


def _schema_changes(before: list[Any], after: list[Any]) -> str:
    def by_name(schemas: list[Any]) -> dict[str, Any]:
        return {str((s.get("function") or s).get("name")): s for s in schemas if isinstance(s, dict)}

    old, new = by_name(before), by_name(after)
    parts = [
        f"{label} {', '.join(names)}"
        for label, names in (
            ("added", sorted(new.keys() - old.keys())),
            ("removed", sorted(old.keys() - new.keys())),
            ("changed", sorted(k for k in old.keys() & new.keys() if old[k] != new[k])),
        )
        if names
    ]
    return " / ".join(parts) or "reordered"
