"""The flags of ``raygen run``, declared as the fields of one dataclass.

``raygen run`` has some fifty flags; as function parameters they made one function of 150 lines. Here
each flag is one field, declared exactly as a parameter would be (``Annotated[type, Opt(...), Sets(key)]
= default``), and ``takes_flags(RunFlags)`` (raygen.cli.options) shows typer one parameter per field, in
this order: the command's flags and help stay what the fields say. Adding a flag is one field here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from raygen.cli.options import (
    AgentCommand,
    AgentType,
    BestOf,
    ConfigSources,
    DatasetArg,
    EphemeralSystemPrompt,
    FilterHallucinated,
    FilterIncomplete,
    FilterReasoning,
    FilterTruncated,
    FilterUnsafe,
    Groups,
    MaxCost,
    MaxSessionCost,
    MaxTokens,
    MinReward,
    Opt,
    OutputFormat,
    Pilot,
    PrefillMessages,
    ProvidersAllowed,
    ProvidersIgnored,
    ProvidersOrder,
    ProviderSort,
    Reasoning,
    ReasoningEffort,
    RetryFailed,
    SamplesPerPrompt,
    Sets,
    Stream,
)


@dataclass(frozen=True)
class RunFlags:
    """What ``raygen run`` was given: every flag, None (or False) when not given."""

    dataset: DatasetArg
    config: ConfigSources = None
    base_url: Annotated[
        str | None,
        Opt(help="OpenAI-compatible endpoint; unset: the built-in simulator."),
        Sets("model.base_url"),
    ] = None
    model: Annotated[str | None, Opt(help="Model name."), Sets("model.model")] = None
    api_key_env: Annotated[
        str | None, Opt(help="Variable holding the API key [OPENAI_API_KEY]."), Sets("model.api_key_env")
    ] = None
    max_turns: Annotated[
        int | None, Opt(help="Most model calls per session [10]."), Sets("session.max_turns")
    ] = None
    distribution: Annotated[
        str | None,
        Opt(help="Toolset distribution name or YAML file \\[default]."),
        Sets("tools.distribution"),
    ] = None
    mcp_config: Annotated[
        list[str] | None,
        Opt(
            "--mcp-config", help='MCP servers: a JSON file {"mcpServers": {...}} (repeatable; docs/tools.md).'
        ),
        Sets("tools.mcp_config"),
    ] = None
    env: Annotated[
        str | None,
        Opt("--env", help="Environment backend: local, docker, modal, singularity \\[local]."),
        Sets("env.type"),
    ] = None
    bwrap: Annotated[bool | None, Opt(help="Confine local sessions with bubblewrap."), Sets("env.bwrap")] = (
        None
    )
    workers: Annotated[int | None, Opt(help="Session actors [2]."), Sets("ray.workers")] = None
    sessions_per_worker: Annotated[
        int | None, Opt(help="Concurrent sessions per actor [16]."), Sets("ray.sessions_per_worker")
    ] = None
    ray_address: Annotated[
        str | None, Opt(help="Join this Ray cluster instead of starting one."), Sets("ray.address")
    ] = None
    rpm: Annotated[float | None, Opt(help="Cluster-wide requests per minute."), Sets("governor.rpm")] = None
    adaptive: Annotated[
        bool | None,
        Opt("--adaptive/--no-adaptive", help="Learn the rate limit from 429s \\[on unless --rpm]."),
        Sets("governor.adaptive"),
    ] = None
    output_dir: Annotated[
        str | None,
        Opt(help="Parent folder of runs: a path, or s3://... / gs://... \\[runs]."),
        Sets("output.output_dir"),
    ] = None
    run_name: Annotated[
        str | None, Opt(help="Run folder name \\[dataset name + timestamp]."), Sets("output.run_name")
    ] = None
    limit: Annotated[int | None, Opt(help="Only the first N valid rows."), Sets("limit")] = None
    max_attempts: Annotated[
        int | None,
        Opt(help="Attempts per sample on infrastructure failures [3]."),
        Sets("retry.max_attempts"),
    ] = None
    drain_timeout: Annotated[
        float | None,
        Opt(help="On SIGTERM/SIGINT/SIGUSR1, seconds the sessions in flight get to finish [60]; exit 75."),
        Sets("retry.drain_timeout_s"),
    ] = None
    filter_reasoning: FilterReasoning = None
    filter_hallucinated: FilterHallucinated = None
    filter_incomplete: FilterIncomplete = None
    filter_unsafe: FilterUnsafe = None
    filter_truncated: FilterTruncated = None
    min_reward: MinReward = None
    best_of: BestOf = None
    groups: Groups = None
    samples_per_prompt: SamplesPerPrompt = None
    output_format: OutputFormat = None
    reasoning_effort: ReasoningEffort = None
    reasoning: Reasoning = None
    providers_allowed: ProvidersAllowed = None
    providers_ignored: ProvidersIgnored = None
    providers_order: ProvidersOrder = None
    provider_sort: ProviderSort = None
    stream: Stream = None
    prefill_messages: PrefillMessages = None
    ephemeral_system_prompt: EphemeralSystemPrompt = None
    retry_failed: RetryFailed = None
    max_cost: MaxCost = None
    max_tokens: MaxTokens = None
    max_session_cost: MaxSessionCost = None
    pilot: Pilot = None
    agent: AgentType = None
    agent_command: AgentCommand = None
    resume: Annotated[bool, Opt(help="Continue the run folder: only pending samples run.")] = False
    force: Annotated[bool, Opt(help="Resume even if the generation config changed.")] = False
    dry_run: Annotated[bool, Opt(help="Validate and plan; print the resolved config; run nothing.")] = False
    allow_unsafe_local: Annotated[bool, Opt(help="Run needs_isolation rows on the bare local backend.")] = (
        False
    )
    verbose: Annotated[bool, Opt("--verbose", "-v")] = False
