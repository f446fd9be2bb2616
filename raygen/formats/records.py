"""The trajectory record: one per session attempt, the unit written to shards and merged into ``data/``.

The JSON form of ``Trajectory`` is what shards and ``data/*.jsonl`` hold; ``raygen.output.schema``
maps it to the fixed Parquet schema.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from raygen.errors import RecordFormatError

FORMAT_VERSION = 1
"""The record format this raygen writes and the newest it reads. Raised when a field changes meaning or
goes away (added fields do not need it: readers ignore fields they do not know). Records written before
the field existed carry none and are version 1."""


def check_format_version(record: dict[str, Any], where: str) -> None:
    """Refuse, in one line, a record written by a newer raygen: reading it with this one's idea of the
    fields would silently mis-merge or mis-report it."""
    version = record.get("format_version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RecordFormatError(
            f"{where}: record format_version {version!r} is newer than this raygen reads "
            f"({FORMAT_VERSION}); upgrade raygen to read this run"
        )


class ToolStat(BaseModel):
    count: int = 0
    """Calls of this tool."""
    success: int = 0
    """Calls that returned without error."""
    failure: int = 0
    """Calls that returned an error to the model."""


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Timing(BaseModel):
    started_at: str = ""
    """UTC ISO-8601 start of the attempt."""
    ended_at: str = ""
    duration_s: float = 0.0
    model_s: float = 0.0
    """Time spent waiting for the model (including retries)."""
    tools_s: float = 0.0
    """Time spent executing tools."""
    env_setup_s: float = 0.0
    """Time to start and stop the environment."""


class EnvInfo(BaseModel):
    backend: str = ""
    image: str | None = None
    node: str | None = None
    """The Ray node (id) that ran the session; None outside Ray."""


class ReasoningCounts(BaseModel):
    with_reasoning: int = 0
    """Assistant turns that carried reasoning."""
    without_reasoning: int = 0


class SafetyLabel(BaseModel):
    """One tool call matched by a rule of the unsafe-action rule set (``raygen/safety``)."""

    turn: int
    """1-based assistant turn (model call) that made the tool call."""
    tool: str
    """Name of the tool called."""
    label: str
    """``destructive_fs``, ``remote_exec``, ``credential_read``, ``network_exfil`` or ``sandbox_escape``."""
    rule_id: str
    """The rule that matched, e.g. ``destructive_fs.rm_root``."""


class Verification(BaseModel):
    """The outcome of a row's ``verify`` check (``raygen/verify``)."""

    passed: bool = False
    """The reward reached the check's ``pass_threshold`` (exit code 0 for ``result: exit_code``)."""
    exit_code: int | None = None
    """Exit code of the check's command (None if it never ran)."""
    output: str = ""
    """The command's stdout then stderr, capped to its head and tail."""
    duration_s: float = 0.0
    """Wall time of the check: grading environment, staging, command."""
    mode: str = "fresh"
    """``fresh`` (a new environment holding only the artifacts) or ``same`` (the agent's environment)."""
    error: str | None = None
    """Why the check could not run (then the record fails with ``verify_error`` and has no reward)."""
    missing_artifacts: list[str] = Field(default_factory=list)
    """Declared artifacts the agent did not leave behind (the check still runs without them)."""
    session_status: str = ""
    """The session's own exit status before grading (``completed``, ``max_turns``): what ``raygen rescore``
    restores when a check that could not run now does."""
    rescored: int = 0
    """How many times ``raygen rescore`` graded this attempt again: of two records of one attempt the merge
    takes the later regrade, whatever the dates or names of the files holding them (a copy without
    modification times must not bring old rewards back)."""


class Artifact(BaseModel):
    """A file the agent left behind, declared by ``verify.artifacts``; ``raygen rescore`` grades it again."""

    path: str
    content: str
    """The file's text, or its bytes in base64 when ``encoding`` is ``base64``."""
    encoding: str = "utf-8"
    """``utf-8`` or ``base64`` (the file was not valid UTF-8)."""


class TopLogprob(BaseModel):
    """One alternative token at a position of a reply (``sampling.top_logprobs``)."""

    token: str
    logprob: float


class TurnInfo(BaseModel):
    """What the provider said about one model call besides the message. The token fields are filled only
    when ``sampling`` asks for them and the endpoint answers (docs/exports.md, "What is captured")."""

    finish_reason: str | None = None
    """``stop``, ``tool_calls``, ``length`` (the reply was cut at the token limit), ... as sent."""
    provider: str | None = None
    """The upstream provider that served the call, where the endpoint names it (OpenRouter's ``provider``)."""
    model: str | None = None
    """The model the response names (a served snapshot or weights version; ``response.model``)."""
    system_fingerprint: str | None = None
    """The backend configuration the response names (``system_fingerprint``), where sent."""
    prompt_token_ids: list[int] | None = None
    """The prompt's token ids as the server rendered them (vLLM ``return_token_ids``), stored from
    position ``prompt_token_ids_from`` on: the positions before it are the previous turn's prompt and
    reply ids, which this prompt repeats (stored once, so a session's ids grow linearly, not
    quadratically)."""
    prompt_token_ids_from: int = 0
    """Where ``prompt_token_ids`` starts in the full prompt: 0 for the first turn, and for any prompt that
    does not begin with the previous turn's prompt and reply (the chat template re-rendered history)."""
    token_ids: list[int] | None = None
    """The reply's token ids as sampled (vLLM ``return_token_ids``)."""
    logprobs: list[float] | None = None
    """The sampler's logprob of each reply token (``sampling.logprobs``)."""
    tokens: list[str] | None = None
    """Each reply token's text, as the logprobs name it: kept only when the server sent no token ids, so a
    reader can still align the logprobs with the text."""
    top_logprobs: list[list[TopLogprob]] | None = None
    """Per reply token, the most likely alternatives (``sampling.top_logprobs`` > 0)."""


class AgentInfo(BaseModel):
    """How an agent harness run as the session went (``agent.type`` other than ``builtin``)."""

    type: str = ""
    """The ``agent.type``: ``command``, ``hermes``, ``mini-swe-agent``."""
    command: str = ""
    """The shell command as configured (placeholders not filled in)."""
    exit_code: int | None = None
    """The harness's exit code (None when it was stopped: timeout, a refused or failed model call)."""
    stdout_tail: str = ""
    stderr_tail: str = ""
    duration_s: float = 0.0
    """Wall time of the harness process."""
    refused: str | None = None
    """Why raygen's proxy refused a call of the harness (``max_turns``), if it did."""


class ThreadInfo(BaseModel):
    """One conversation thread of a harness's model calls: calls whose messages extend the previous one's."""

    calls: list[int] = Field(default_factory=list)
    """0-based indices of the session's model calls in this thread, in order."""
    main: bool = False
    """The thread ``messages`` holds (the one of the last call, docs/agents.md)."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The thread's final conversation; empty for the main thread (it is the record's ``messages``)."""


class Trajectory(BaseModel):
    format_version: int = FORMAT_VERSION
    """The record format (``FORMAT_VERSION``); readers refuse a newer one."""
    id: str
    """The row's ``id``, else its stable content key."""
    sample_key: str
    """Content-addressed identity of the sample (row hash + occurrence index)."""
    prompt_index: int
    """0-based index of the row among the dataset's valid rows."""
    attempt: int = 1
    category: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    conversations: list[dict[str, str]] = Field(default_factory=list)
    """ShareGPT turns: ``{"from": system|human|gpt|tool, "value": str}``."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The raw OpenAI-format messages, lossless."""
    completed: bool = False
    exit_status: str = "completed"
    """``completed``, ``max_turns``, ``truncated`` (a reply was cut at the token limit: ``finish_reason``
    ``length``) or ``error:<kind>`` (see raygen.errors.FAILURE_KINDS)."""
    error: str | None = None
    api_calls: int = 0
    toolsets_used: list[str] = Field(default_factory=list)
    tools_offered: list[str] = Field(default_factory=list)
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    """The session's MCP servers: ``name``, ``transport``, ``placement`` (``session``, ``actor``,
    ``remote``), ``server_info`` and the ``tools`` offered from it (their schemas are in the system
    turn of ``conversations``)."""
    tool_stats: dict[str, ToolStat] = Field(default_factory=dict)
    """Every known tool, zero-filled."""
    tool_error_counts: dict[str, int] = Field(default_factory=dict)
    """``hallucinated``, ``invalid_arguments``, ``execution``, ``timeout``."""
    hallucinated_tools: list[str] = Field(default_factory=list)
    """Names of tools the model called that were not offered (in call order, repeats kept)."""
    reasoning: ReasoningCounts = Field(default_factory=ReasoningCounts)
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    """What the attempt's model calls cost in USD (provider-reported where sent, else tokens x price)."""
    cost_source: str = ""
    """Where ``cost_usd`` came from: ``provider``, ``config`` (``pricing``), ``table`` (built-in prices),
    ``mixed``, or ``unknown`` (some call had no price: ``cost_usd`` counts only the others); ``""``: no
    call."""
    timing: Timing = Field(default_factory=Timing)
    model: str = ""
    env: EnvInfo = Field(default_factory=EnvInfo)
    config_fingerprint: str = ""
    """Hash of the generation config (model, sampling, turns, system prompt, tools)."""
    safety_labels: list[SafetyLabel] = Field(default_factory=list)
    """Tool calls matched by the unsafe-action rule set, in call order (empty for most sessions)."""
    safety_rules_version: str = ""
    """Version of the rule set that produced ``safety_labels``."""
    group_id: str | None = None
    """The prompt group (``--samples-per-prompt``): the same for every sample of one row; None for K=1."""
    sample_index: int = 0
    """0-based index of this sample within its group."""
    reward: float | None = None
    """The check's reward in [0, 1]; None when the row has no ``verify`` or the check could not run."""
    verification: Verification | None = None
    """How the check went (None when the row has no ``verify``)."""
    artifacts: list[Artifact] = Field(default_factory=list)
    """The declared artifacts as the agent left them."""
    turns: list[TurnInfo] = Field(default_factory=list)
    """One entry per model call that answered, in order: its finish reason and serving provider, and the
    token ids and logprobs where captured. The n-th entry belongs to the n-th assistant message."""
    loss_mask: list[int] = Field(default_factory=list)
    """One 0/1 per message of ``messages``: 1 for the messages a trainer learns from (the model's own
    replies), 0 for the rest (``raygen.formats.loss_mask``, docs/exports.md)."""
    agent: AgentInfo | None = None
    """The harness run as the session (None for raygen's own loop, ``agent.type: builtin``)."""
    threads: list[ThreadInfo] = Field(default_factory=list)
    """A harness's model calls grouped into conversation threads (empty for raygen's own loop); more
    than one when the harness compacted its context or ran sub-agents (docs/agents.md)."""

    def without_token_ids(self, logprobs: bool = False) -> Trajectory:
        """The record with its turns' token ids and token texts dropped, and with ``logprobs`` its
        logprobs too: for a record whose text had a secret redacted (the ids would still encode it), and
        for one too large to keep its conversation."""
        dropped = dict.fromkeys(("prompt_token_ids", "token_ids", "tokens", "top_logprobs"))
        if logprobs:
            dropped["logprobs"] = None
        turns = [t.model_copy(update=dropped) for t in self.turns]
        return self.model_copy(update={"turns": turns})


TOOL_ERROR_KINDS = ("hallucinated", "invalid_arguments", "execution", "timeout")
