"""Run configuration: one pydantic model per concept, every field documented.

A YAML file (``raygen run --config run.yaml``) holds any of these fields with the same nesting;
CLI flags override it. ``docs/configuration.md`` is generated from these docstrings
(``python -m raygen.docs_gen``), so the reference cannot drift from the code.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from raygen.agents.configs import (  # noqa: F401 (re-exported)
    AgentConfig,
    BuiltinAgentConfig,
    ClaudeCodeAgentConfig,
    CodexAgentConfig,
    CommandAgentConfig,
    HermesAgentConfig,
    MiniSweAgentConfig,
)
from raygen.config_section import Section as _Section
from raygen.envs.configs import (  # noqa: F401 (re-exported: one place to import configuration from)
    DockerEnvConfig,
    EnvConfig,
    FakeEnvConfig,
    LocalEnvConfig,
    ModalEnvConfig,
    SingularityEnvConfig,
)
from raygen.input.verify_spec import VerifySpec
from raygen.model.configs import (  # noqa: F401 (re-exported)
    BudgetConfig,
    ChatAPIModelConfig,
    GovernorConfig,
    ModelConfig,
    OpenAIModelConfig,
    PriceConfig,
    ProviderConfig,
    ReasoningEffort,
    SamplingConfig,
    ScriptedModelConfig,
    SimConfig,
    SimModelConfig,
)
from raygen.tools.mcp_config import McpServerConfig, unwrap_servers

MAX_SAMPLES_PER_PROMPT = 1000
"""``--samples-per-prompt`` beyond this is refused: groups for best-of-K and RL are far smaller, and a
typo of 100,000,000 made a dry run sit silent while it made the keys (issue 28)."""


def _binds_host_folders(backend: str) -> bool:
    """Whether the backend shows a session a host folder (``Environment.supports_binds``), so that an agent
    harness inside can reach raygen's model proxy; False when its extra is not installed."""
    from raygen.envs import environment_class

    try:
        return environment_class(backend).supports_binds
    except ImportError:
        return False


class SessionConfig(_Section):
    """The multi-turn agent loop."""

    max_turns: int = Field(10, ge=1)
    """Most model calls per session; at the limit the session ends with ``exit_status="max_turns"``."""
    system_prompt: str | None = None
    """System prompt text (mutually exclusive with ``system_prompt_file``)."""
    system_prompt_file: Path | None = None
    """File holding the system prompt."""
    tool_output_max_chars: int = Field(16_000, ge=256)
    """Tool output longer than this is cut to its head and tail with a marker in between."""
    command_timeout_s: float = Field(60.0, gt=0)
    """Default timeout of one terminal command."""
    max_command_timeout_s: float = Field(600.0, gt=0)
    """Upper bound on the timeout a model may ask for in a terminal call."""
    session_timeout_s: float = Field(3600.0, gt=0)
    """Hard wall-clock limit of one session; past it the session fails with ``session_timeout``. Time the
    session waits for the rate governor (paced behind a limit, or paused after refusals) is not counted;
    model calls (``model.timeout_s`` each), the waits between their retries (``model.retry_max_wait_s``
    each), tools, the environment and the grading are."""
    max_reply_chars: int = Field(8_000_000, ge=1000)
    """Longest model reply (content, reasoning and tool-call arguments together, in characters); a longer
    one ends the session with ``error:reply_too_large`` (final) and is stored cut to its head."""
    max_record_bytes: int = Field(16 * 1024 * 1024, ge=64 * 1024)
    """Largest stored record (its JSON, in bytes); a larger one keeps its metadata but its conversation is
    dropped and it fails with ``error:record_too_large``."""
    secret_env: list[str] = Field(default_factory=list)
    """Names of environment variables whose values are secret (a row's ``env`` or the driver's host
    environment): the values are replaced by ``[REDACTED]`` in trajectories, even when a tool prints them,
    and a run-level check counts any that slipped into the output. The API key always is."""
    ephemeral_system_prompt: str | None = None
    """Sent to the model as the system message (after ``system_prompt``, if any) but never stored in
    records: guidance that should not become training data."""
    prefill_messages_file: Path | None = None
    """JSON file holding a list of ``{"role": "system"|"user"|"assistant", "content": "..."}`` messages sent
    before the prompt on every call (few-shot turns); not stored unless ``store_prefill``."""
    store_prefill: bool = False
    """Store the prefill messages in the records too, as turns before the prompt."""

    @model_validator(mode="after")
    def _one_system_prompt(self) -> SessionConfig:
        if self.system_prompt is not None and self.system_prompt_file is not None:
            raise ValueError("set system_prompt or system_prompt_file, not both")
        return self

    def resolved_system_prompt(self) -> str | None:
        if self.system_prompt_file is not None:
            return Path(self.system_prompt_file).read_text(encoding="utf-8")
        return self.system_prompt

    def resolved_prefill(self) -> list[dict[str, str]]:
        """The prefill messages (``raygen.formats.prompting.load_prefill``); [] when there is no file."""
        from raygen.formats.prompting import load_prefill

        return load_prefill(self.prefill_messages_file) if self.prefill_messages_file is not None else []


class ToolsConfig(_Section):
    """Which tools a session is offered."""

    distribution: str = "default"
    """Toolset distribution: a built-in name (``raygen distributions``) or a YAML file path."""
    plugins: list[str] = Field(default_factory=list)
    """Extra toolsets as Python import paths ``package.module:attribute`` (a Toolset or a list of them)."""
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    """MCP tool servers by name, as in the ``mcpServers`` object MCP clients share (``{"mcpServers":
    {...}}`` is accepted too): each is a toolset named after it, offered to every session unless the
    distribution or the row's ``toolsets`` name it (docs/tools.md)."""
    mcp_config: list[str] = Field(default_factory=list)
    """Files holding ``{"mcpServers": {...}}`` (``--mcp-config FILE``, repeatable), added to
    ``mcp_servers``."""
    mcp_tool_name_format: str = "{server}__{tool}"
    """How an MCP tool is named to the model (``{server}``, ``{tool}``); characters other than letters,
    digits, ``_`` and ``-`` become ``_``."""
    mcp_call_timeout_s: float = Field(60.0, gt=0)
    """Seconds one MCP tool call may take; past it the model gets a ``timeout`` tool failure (and a server
    that then does not answer a ping ends the session with ``mcp_server_lost``)."""
    mcp_start_timeout_s: float = Field(60.0, gt=0)
    """Seconds a server may take to start and answer ``initialize`` and ``tools/list``."""

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _unwrap_mcp_servers(cls, v: Any) -> Any:
        return unwrap_servers(v, "tools.mcp_servers") if v else v

    @field_validator("mcp_tool_name_format")
    @classmethod
    def _names_tool(cls, v: str) -> str:
        if "{tool}" not in v:
            raise ValueError("must contain {tool}")
        try:
            v.format(server="s", tool="t")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{server}} and {{tool}} may be used: {exc}") from None
        return v


class FilterConfig(_Section):
    """Filters applied by the merge; removed sessions go to ``rejected/`` with the reason."""

    no_reasoning: bool = True
    """Reject sessions in which no assistant turn carries reasoning."""
    hallucinated_tools: bool = True
    """Reject sessions that called a tool that was not offered."""
    incomplete: bool = False
    """Reject sessions that did not complete (e.g. hit ``max_turns``)."""
    truncated: bool = True
    """Reject sessions ended by a reply cut at the token limit (``finish_reason: length``; exit status
    ``truncated``)."""
    unsafe_actions: bool = False
    """Reject sessions with a tool call labelled by the unsafe-action rule set (``raygen/safety``)."""
    min_reward: float | None = Field(None, ge=0, le=1)
    """Rejection sampling (``--min-reward R``): reject sessions whose reward is below R, or that have no
    reward (no check, or it could not run); reason ``low_reward``."""
    groups: bool = False
    """For RL (``--groups``): keep only complete prompt groups (every sample finished, none failed; reason
    ``incomplete_group``) whose rewards are not all equal (reason ``uniform_group``, no learning signal)."""
    best_of: bool = False
    """Best-of-n (``--best-of``): of each prompt group's samples still kept, keep only the one with the
    highest reward (ties: the lowest ``sample_index``); the others get reason ``not_best``."""


class OutputConfig(_Section):
    """Where and how results are written."""

    output_dir: str = "runs"
    """Parent folder of run folders: a local path, a path on a shared filesystem (Lustre, GPFS, NFS), or an
    object-store URI (``s3://bucket/prefix``, ``gs://bucket/prefix``) read and written through
    ``pyarrow.fs``; credentials come from the provider's environment and config (``AWS_*`` variables,
    ``~/.aws``), never from here (docs/resume.md)."""
    run_name: str | None = None
    """Run folder name; unset: the dataset's name plus a UTC timestamp."""
    shard_max_records: int = Field(64, ge=1)
    """The driver flushes finished trajectories to a new shard after this many records ...
    (small values lose less work to a crash; each flush is one small file)."""
    shard_flush_s: float = Field(5.0, gt=0)
    """... or after this many seconds, whichever comes first (``durable_within_s`` caps it)."""
    durable_within_s: float = Field(1.0, gt=0)
    """Each finished session's record is on disk (written, fsynced, in a complete shard file) within
    this many seconds of the session's end, whatever the other sessions do: what a crash of the driver
    can cost beyond the sessions in flight (docs/resume.md)."""
    data_shard_records: int = Field(10_000, ge=1)
    """Records per merged ``data/`` shard (Parquet and JSONL)."""
    merge_processes: int | None = Field(None, ge=1)
    """Processes of the final merge (the same output, ``raygen/output/merge_parallel.py``); unset: one
    per core, at most 8, for a local run of 4,000 samples or more (forked before Ray starts), else 1."""
    compact_during_run: bool = True
    """With a parallel merge (``merge_processes``): digest each closed shard on the merge's workers while
    the run goes on, one at a time, so the merge at the end reads columns instead of parsing every
    record twice (``raygen/output/digests.py``; at most one core meanwhile; ``RUN_DIR/work/digests``,
    about a quarter of the shards' size, a cache that may be deleted)."""
    storage_retry_s: float = Field(60.0, ge=0)
    """Object stores: how long a write keeps retrying (with backoff) while the store is unreachable, the
    records waiting in memory; then the run stops with a one-line error and ``--resume`` continues it.
    A missing bucket or refused credentials fail at once."""
    format: Literal["raygen", "hermes"] = "raygen"
    """``hermes`` also writes the kept sessions to ``RUN_DIR/trajectories.jsonl`` in the format of Hermes
    Agent's ``batch_runner.py``, and adds its keys to ``statistics.json``, so a pipeline reading that runner's
    output reads raygen's unchanged (docs/migrating-from-hermes.md). ``data/`` keeps raygen's full records."""
    hermes_tools: list[str] | None = None
    """The fixed tool list of ``tool_stats``/``tool_error_counts`` in Hermes-format records (every record
    has exactly these keys); unset: the reference runner's tool names plus this run's tools."""


class RayConfig(_Section):
    """The distributed layer."""

    address: str | None = None
    """Join this Ray cluster (``ray://`` or ``host:port``); unset starts a local Ray for the run."""
    workers: int = Field(2, ge=1)
    """Session actors."""
    sessions_per_worker: int = Field(16, ge=1)
    """Sessions one actor runs at once on its event loop."""
    num_cpus_per_worker: float = Field(0.25, gt=0)
    """Logical CPUs reserved per actor; fractional because sessions wait on I/O, and whole CPUs
    deadlock Ray Data's read stage on small nodes."""
    resources: dict[str, float] | None = None
    """Custom Ray resources each session actor reserves, e.g. ``{raygen_sandbox_docker: 16}``; ``{}``:
    none. Unset: if any node advertises a ``raygen_sandbox_<backend>`` resource (``ray start --resources``,
    see docs/cluster.md), each actor reserves ``sessions_per_worker`` units of the one for ``env.type``
    (one per sandbox it may hold), so sessions run only on nodes offering that backend and within their
    capacity; if no node does (a plain local run), nothing."""
    metrics_export_port: int | None = Field(None, ge=1, le=65535)
    """Port of the Prometheus endpoint of the private Ray a run starts (``_metrics_export_port``; raygen's
    sessions, tokens, 429s, requests and sandboxes in flight and the governor's rates are among its
    metrics, docs/cluster.md). Unset: Ray picks one. A joined cluster sets it with ``ray start
    --metrics-export-port``."""


class RetryConfig(_Section):
    """Attempts per sample for infrastructure failures (provider down, sandbox failed, worker lost)."""

    max_attempts: int = Field(3, ge=1)
    """Attempts per sample, across the passes of one run and across resumes; model/task outcomes
    (max turns, hallucinated tools, no reasoning) are never retried."""
    pass_delay_s: float = Field(5.0, ge=0)
    """Pause before re-running the failed samples of a pass, so a provider or node can recover; doubles
    with each further pass (backoff)."""
    drain_timeout_s: float = Field(60.0, ge=0)
    """On SIGTERM, SIGINT or SIGUSR1 the run drains: no new session starts, sessions in flight get this
    many seconds to finish, everything finished is merged, and raygen exits with code 75 (resumable)."""
    retry_failed: list[str] = Field(default_factory=list)
    """With ``--resume``: failure kinds (``provider_auth``, ``provider_bad_request``, ...) whose final
    failures run again, each with ``max_attempts`` new attempts (``--retry-failed KIND[,KIND]``), e.g. after
    fixing a key or a model name (a changed generation config also needs ``--force``)."""

    @field_validator("retry_failed", mode="before")
    @classmethod
    def _known_kinds(cls, kinds: Any) -> Any:
        from raygen.errors import FAILURE_KINDS

        if isinstance(kinds, str):  # the flag's KIND[,KIND]
            kinds = [k.strip() for k in kinds.split(",") if k.strip()]
        if not isinstance(kinds, list):
            return kinds  # pydantic reports the type
        unknown = [k for k in kinds if k not in FAILURE_KINDS]
        if unknown:
            raise ValueError(f"unknown failure kind {unknown[0]!r}; known: {', '.join(FAILURE_KINDS)}")
        return kinds


class HygieneConfig(_Section):
    """Secrets, personal data and evaluation-set overlap in the prompts, checked before any model call by
    ``raygen run`` (and by ``raygen hygiene``); see docs/hygiene.md."""

    on_findings: Literal["warn", "refuse"] = "warn"
    """What ``raygen run`` does when the prompts hold a secret, personal data or an eval-set row: print the
    findings (values masked) and go on, or stop before the first model call."""
    secrets: bool = True
    """Look for secrets: API keys, tokens, private keys, credentials in URLs and ``KEY=value`` lines."""
    pii: bool = True
    """Look for personal data: email addresses, phone numbers, payment card numbers (Luhn-checked)."""
    phone_region: str | None = "US"
    """Region for phone numbers written without a country code (ISO 3166 code); unset: only numbers
    written with ``+<country code>`` are found."""
    eval_set: Path | None = None
    """An independent evaluation set (JSONL): prompts that also occur in it (exactly or nearly) are
    findings."""
    eval_field: str = "prompt"
    """Field of the eval-set rows holding the text compared with the prompts."""
    near_duplicate_threshold: float = Field(0.6, gt=0, le=1)
    """Estimated Jaccard similarity of word-bigram sets at or above which a prompt counts as a near
    duplicate of an eval-set row."""


class VerifyConfig(_Section):
    """Verified trajectories: the check of rows that carry none (rows' own ``verify`` win); see
    raygen/verify/README.md."""

    default: VerifySpec | None = None
    """Check applied to every row without its own ``verify`` (same fields as a row's: ``files``,
    ``command``, ``timeout_s``, ``result``, ``reward_file``, ``pass_threshold``, ``mode``, ``artifacts``)."""


class RunConfig(_Section):
    """A whole run. Every field can be set in YAML; flags override."""

    dataset: Path | None = None
    """Prompts JSONL."""
    limit: int | None = Field(None, ge=1)
    """Take only the first N valid rows."""
    seed: int = 0
    """Run seed: with the prompt's key it seeds the toolset draw."""
    samples_per_prompt: int = Field(1, ge=1, le=MAX_SAMPLES_PER_PROMPT)
    """Independent sessions per row (``--samples-per-prompt``): a group sharing ``group_id``, each sample
    with its own key and ``sample_index`` and its own request seed (``sampling.seed``, default 0, plus the
    index). A resume runs exactly the samples a group is missing. At most 1000
    (``MAX_SAMPLES_PER_PROMPT``)."""
    model: ModelConfig = Field(default_factory=SimModelConfig)
    """Model backend."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Request options."""
    provider: ProviderConfig = Field(default_factory=ProviderConfig)
    """Reasoning, routing and streaming options of each request."""
    session: SessionConfig = Field(default_factory=SessionConfig)
    """Agent loop."""
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    """Tools and toolset distribution."""
    env: EnvConfig = Field(default_factory=LocalEnvConfig)
    """Environment backend."""
    filters: FilterConfig = Field(default_factory=FilterConfig)
    """Merge filters."""
    output: OutputConfig = Field(default_factory=OutputConfig)
    """Output location and sharding."""
    ray: RayConfig = Field(default_factory=RayConfig)
    """Distributed settings."""
    sim: SimConfig = Field(default_factory=SimConfig)
    """Settings of the built-in simulator (``model.type: sim``, the default model)."""
    retry: RetryConfig = Field(default_factory=RetryConfig)
    """Retry policy for infrastructure failures."""
    governor: GovernorConfig = Field(default_factory=GovernorConfig)
    """Cluster-wide request pacing (rpm, tpm, in-flight cap, adaptive back-off on 429)."""
    hygiene: HygieneConfig = Field(default_factory=HygieneConfig)
    """Data hygiene checks of the prompts before any model call."""
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    """Verified trajectories: the default check of rows without their own."""
    pricing: dict[str, PriceConfig] = Field(default_factory=dict)
    """Prices by model name, USD per million tokens, e.g. ``{qwen/qwen3-32b: {input: 0.1, output: 0.3}}``;
    they win over the built-in table (``raygen.model.pricing``), a provider-reported cost wins over both."""
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    """Run and session spending limits (``--max-cost``, ``--max-tokens``, ``--max-session-cost``)."""
    agent: AgentConfig = Field(default_factory=BuiltinAgentConfig)
    """The agent of each session: raygen's own loop, or a harness run as a command (docs/agents.md)."""

    @model_validator(mode="after")
    def _harness_reaches_its_proxy(self) -> RunConfig:
        if self.agent.type != "builtin" and not _binds_host_folders(self.env.type):
            raise ValueError(
                f"agent.type {self.agent.type} runs the harness inside the session's environment, which "
                f"must show it raygen's model proxy (a bound host folder): env.type {self.env.type} cannot "
                "(docs/agents.md#backends)"
            )
        return self


def fingerprint(obj: Any) -> str:
    """Stable short hash of any JSON-able object (sorted keys)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
