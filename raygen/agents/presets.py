"""The command of each agent type: ``command`` as configured, and the presets for known harnesses.

A preset is only a shell command: it writes whatever config file the harness needs to reach the proxy
(from the variables the forwarder sets: ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``RAYGEN_MODEL``), then
runs the harness one-shot and non-interactively on the row's prompt (docs/agents.md lists the install line
of each for an image).
"""

from __future__ import annotations

import shlex

from raygen.agents.configs import (
    ClaudeCodeAgentConfig,
    CodexAgentConfig,
    CommandAgentConfig,
    HarnessConfig,
    HermesAgentConfig,
    MiniSweAgentConfig,
)

_HERMES_CONFIG = """: "${HERMES_HOME:=$HOME/.hermes}" && export HERMES_HOME && mkdir -p "$HERMES_HOME"
cat > "$HERMES_HOME/config.yaml" <<EOF
model:
  provider: custom
  base_url: $OPENAI_BASE_URL
  api_key: $OPENAI_API_KEY
  default: $RAYGEN_MODEL
EOF
"""
"""Hermes Agent reads its endpoint from ``$HERMES_HOME/config.yaml`` (a ``custom`` provider)."""

MINI_ENV = {
    "MSWEA_CONFIGURED": "true",  # no first-run set-up dialogue
    "MSWEA_COST_TRACKING": "ignore_errors",  # models unknown to litellm's price list have no cost
    "MSWEA_SILENT_STARTUP": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm would fetch its price list from the network
}


def _args(args: list[str]) -> str:
    return "".join(f" {shlex.quote(a)}" for a in args)


def hermes_command(config: HermesAgentConfig) -> str:
    toolsets = f" --toolsets {shlex.quote(config.toolsets)}" if config.toolsets else ""
    extra = _args(config.extra_args)
    run = f"exec {shlex.quote(config.executable)} chat -q {{prompt}} -Q --yolo{toolsets}{extra}"
    return _HERMES_CONFIG + run


def mini_command(config: MiniSweAgentConfig) -> str:
    return (
        f"exec {shlex.quote(config.executable)} -y --exit-immediately -t {{prompt}} "
        f'-m "openai/$RAYGEN_MODEL" -c {shlex.quote(config.config)} '
        f'-c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -l 0 -o "$HOME/mini.traj.json"'
        f"{_args(config.extra_args)}"
    )


CLAUDE_ENV = {
    "IS_SANDBOX": "1",  # it runs in raygen's sandbox: skipping permission prompts is allowed even as root
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # only the model calls, which go to the proxy
}


def claude_command(config: ClaudeCodeAgentConfig) -> str:
    run = f"exec {shlex.quote(config.executable)} -p {{prompt}} --dangerously-skip-permissions"
    return run + _args(config.extra_args)


_CODEX_CONFIG = """: "${CODEX_HOME:=$HOME/.codex}" && export CODEX_HOME && mkdir -p "$CODEX_HOME"
cat > "$CODEX_HOME/config.toml" <<EOF
model = "$RAYGEN_MODEL"
model_provider = "raygen"
[model_providers.raygen]
name = "raygen"
base_url = "$OPENAI_BASE_URL"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
EOF
"""
"""Codex reads its provider from ``$CODEX_HOME/config.toml``; it speaks only the Responses API."""


def codex_command(config: CodexAgentConfig) -> str:
    run = f"exec {shlex.quote(config.executable)} exec --skip-git-repo-check"
    run += " --dangerously-bypass-approvals-and-sandbox"  # raygen's sandbox is the sandbox
    return _CODEX_CONFIG + run + _args(config.extra_args) + " {prompt}"


def harness_command(config: HarnessConfig) -> str:
    """The shell command (with placeholders) that runs the configured harness."""
    if isinstance(config, HermesAgentConfig):
        return hermes_command(config)
    if isinstance(config, MiniSweAgentConfig):
        return mini_command(config)
    if isinstance(config, ClaudeCodeAgentConfig):
        return claude_command(config)
    if isinstance(config, CodexAgentConfig):
        return codex_command(config)
    assert isinstance(config, CommandAgentConfig)
    return config.command


def harness_env(config: HarnessConfig) -> dict[str, str]:
    """The harness's own variables: the preset's, then the configured ``env``."""
    presets = {MiniSweAgentConfig: MINI_ENV, ClaudeCodeAgentConfig: CLAUDE_ENV}
    preset = presets.get(type(config), {})
    return {**preset, **config.env}
