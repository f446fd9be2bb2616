"""Options shared by several ``raygen`` commands, declared once, and the link from a flag to its config key.

A flag that sets a config field names the key in its annotation::

    workers: Annotated[int | None, Opt(help="Session actors [2]."), Sets("ray.workers")] = None

and ``flag_overrides(command, locals())`` turns the flags given into the nested dict ``load_config``
applies on top of the config files and ``-c`` overrides. Adding a flag is that one line; every other
field is reachable with ``-c key.path=value`` without a flag.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from raygen.configfile import set_path

Opt = typer.Option


@dataclass(frozen=True)
class Sets:
    """Annotation marker: the flag sets config key ``key`` (dotted path) when given."""

    key: str


def flag_overrides(command: Callable[..., Any], values: dict[str, Any]) -> dict[str, Any]:
    """The flags of ``command`` that were given (not None), as a nested dict keyed like the config.
    ``values`` is the command's ``locals()`` taken before it defines any other name."""
    data: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(command, include_extras=True).items():
        marker = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Sets)), None)
        value = values.get(name)
        if marker is not None and value is not None:
            set_path(data, marker.key, str(value) if isinstance(value, Path) else value)
    return data


ConfigSources = Annotated[
    list[str] | None,
    Opt(
        "--config",
        "-c",
        help="A YAML config file, or one setting as key.path=value (value read as YAML, e.g. "
        "-c sampling.temperature=0.7). Repeatable, applied in order; the named flags override them.",
    ),
]

# The merge filters: used by `raygen run` (filters of the run) and `raygen merge` (filters of a re-merge).
FilterReasoning = Annotated[
    bool | None,
    Opt("--filter-reasoning/--no-filter-reasoning", help="Reject sessions without reasoning \\[on]."),
    Sets("filters.no_reasoning"),
]
FilterHallucinated = Annotated[
    bool | None,
    Opt("--filter-hallucinated/--no-filter-hallucinated", help="Reject calls of tools not offered \\[on]."),
    Sets("filters.hallucinated_tools"),
]
FilterIncomplete = Annotated[
    bool | None,
    Opt("--filter-incomplete/--no-filter-incomplete", help="Reject sessions that did not complete \\[off]."),
    Sets("filters.incomplete"),
]
FilterUnsafe = Annotated[
    bool | None,
    Opt("--filter-unsafe/--no-filter-unsafe", help="Reject sessions with an unsafe-labelled call \\[off]."),
    Sets("filters.unsafe_actions"),
]
FilterTruncated = Annotated[
    bool | None,
    Opt("--filter-truncated/--no-filter-truncated", help="Reject sessions cut at the token limit \\[on]."),
    Sets("filters.truncated"),
]
# Verified trajectories (raygen/verify): rejection sampling, best-of-n, RL groups.
MinReward = Annotated[
    float | None,
    Opt("--min-reward", min=0.0, max=1.0, help="Reject sessions with no reward or one below R."),
    Sets("filters.min_reward"),
]
BestOf = Annotated[
    bool | None,
    Opt("--best-of/--no-best-of", help="Keep only the highest-reward sample of each prompt group \\[off]."),
    Sets("filters.best_of"),
]
Groups = Annotated[
    bool | None,
    Opt("--groups/--no-groups", help="Keep only complete prompt groups whose rewards differ (RL) \\[off]."),
    Sets("filters.groups"),
]
SamplesPerPrompt = Annotated[
    int | None,
    Opt("--samples-per-prompt", min=1, help="Independent sessions per row, a prompt group \\[1]."),
    Sets("samples_per_prompt"),
]
OutputFormat = Annotated[
    str | None,
    Opt("--format", help="raygen, or hermes: also trajectories.jsonl as Hermes Agent writes it \\[raygen]."),
    Sets("output.format"),
]

# The options people migrate with from Hermes Agent's batch_runner (docs/migrating-from-hermes.md).
ReasoningEffort = Annotated[
    str | None,
    Opt(help="none, minimal, low, medium, high or xhigh; spelled for the endpoint (OpenRouter or OpenAI)."),
    Sets("provider.reasoning_effort"),
]
Reasoning = Annotated[
    bool | None,
    Opt("--reasoning/--no-reasoning", help="--no-reasoning asks the provider for no reasoning at all."),
    Sets("provider.reasoning"),
]
ProvidersAllowed = Annotated[
    str | None, Opt(help="OpenRouter: only these providers (a,b)."), Sets("provider.providers_allowed")
]
ProvidersIgnored = Annotated[
    str | None, Opt(help="OpenRouter: never these providers (a,b)."), Sets("provider.providers_ignored")
]
ProvidersOrder = Annotated[
    str | None, Opt(help="OpenRouter: try these providers in order (a,b)."), Sets("provider.providers_order")
]
ProviderSort = Annotated[
    str | None,
    Opt(help="OpenRouter: rank providers by price, throughput or latency."),
    Sets("provider.provider_sort"),
]
Stream = Annotated[
    bool | None,
    Opt("--stream/--no-stream", help="Streamed replies, idle timeout per chunk."),
    Sets("provider.stream"),
]
PrefillMessages = Annotated[
    Path | None,
    Opt("--prefill-messages", help="JSON list of {role, content} sent before each prompt, not stored."),
    Sets("session.prefill_messages_file"),
]
EphemeralSystemPrompt = Annotated[
    str | None,
    Opt(help="System prompt sent to the model, never stored."),
    Sets("session.ephemeral_system_prompt"),
]
RetryFailed = Annotated[
    str | None,
    Opt(help="With --resume: run final failures of these kinds again (KIND[,KIND], e.g. provider_auth)."),
    Sets("retry.retry_failed"),
]

# Money (docs/cost.md): budgets counted cluster-wide over the whole run, resumes included.
MaxCost = Annotated[
    float | None,
    Opt(help="Stop admitting model calls at this many USD for the run; exit 75."),
    Sets("budget.max_cost_usd"),
]
MaxTokens = Annotated[
    int | None,
    Opt(help="The same budget in tokens (per call: -c sampling.max_tokens)."),
    Sets("budget.max_tokens"),
]
MaxSessionCost = Annotated[
    float | None,
    Opt(help="End a session whose next call could pass this many USD."),
    Sets("budget.max_session_cost_usd"),
]
Pilot = Annotated[
    int | None,
    Opt(min=1, help="Run N prompts (spread over categories), project cost and time, stop."),
]

ToolsetPlugins = Annotated[list[str] | None, Opt("--toolset-plugin", help="Extra toolsets (module:attr).")]
# str, not Path: a run folder may be an object-store URI (Path would fold s3://b into s3:/b).
RunDirArg = Annotated[str, typer.Argument(help="A run folder: a path, or s3://... / gs://...")]
DatasetArg = Annotated[Path, typer.Argument(help="Prompts JSONL.")]

# The session's agent (docs/agents.md): raygen's own loop, a preset harness, or any command.
AgentType = Annotated[
    str | None,
    Opt(
        "--agent",
        help="The agent of each session: builtin, hermes, mini-swe-agent, claude-code, codex, command.",
    ),
    Sets("agent.type"),
]
AgentCommand = Annotated[
    str | None,
    Opt("--agent-command", help="Run this shell command as each session's agent ({prompt}, {workdir}, ...)."),
    Sets("agent.command"),
]
