"""One agent session: prompt + model + environment + tools -> Trajectory. No Ray here.

The loop calls the model with the offered tools, executes the tool calls it returns (in parallel,
inside the session's environment) and feeds the results back, until the model answers without a tool
call or ``max_turns`` model calls were made. Tool problems are shown to the model; infrastructure and
provider problems end the session with ``exit_status="error:<kind>"`` and are never raised to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from raygen.agents import create_harness
from raygen.config import SessionConfig
from raygen.envs import EnvSpec, create_environment, environment_class
from raygen.envs.fleet import OpenSandboxGate, SandboxGate, SandboxRefused
from raygen.errors import SessionFailure
from raygen.formats.limits import cut_reply, reply_chars
from raygen.formats.prompting import request_messages
from raygen.formats.reasoning import split_reasoning
from raygen.formats.records import (
    AgentInfo,
    Artifact,
    EnvInfo,
    ReasoningCounts,
    SafetyLabel,
    ThreadInfo,
    ToolStat,
    Trajectory,
    TurnInfo,
    Usage,
    Verification,
)
from raygen.formats.scrub import Scrubber, worker_secret_values
from raygen.formats.text import cap_text
from raygen.input.rows import Sample
from raygen.input.verify_spec import VerifySpec
from raygen.model.base import SAMPLE_INDEX, ChatModel
from raygen.model.gate_hold import session_deadline
from raygen.model.pricing import CostPolicy, ModelPricing, SessionSpend
from raygen.safety import label_tool_call
from raygen.session.capture import TurnCapture
from raygen.session.grading import verify_session
from raygen.session.harness import run_harness
from raygen.session.offer import OFFERS_KEPT, Offer
from raygen.session.record import build_record
from raygen.tools.base import ToolContext, ToolResult
from raygen.tools.mcp_session import McpSettings

log = logging.getLogger(__name__)


class SessionRunner:
    """Runs sessions that share one model client, tool registry and environment config."""

    def __init__(
        self,
        *,
        model: ChatModel,
        registry: Any,
        env_config: Any,
        session: SessionConfig,
        run_name: str = "raygen",
        node: str | None = None,
        config_fingerprint: str = "",
        secret_values: list[str] | None = None,
        verify_default: VerifySpec | None = None,
        on_sandbox: Callable[[int], None] | None = None,
        mcp: McpSettings | None = None,
        cost: CostPolicy | None = None,
        agent: Any = None,  # an AgentConfig (raygen.agents.configs); None: raygen's own loop
        sandbox_gate: SandboxGate | None = None,
        sandbox_key: str = "",
    ):
        self.model = model
        self.mcp = mcp or McpSettings()
        """The run's MCP servers and options (raygen/tools/mcp_session.py)."""
        # Prices each call and keeps it within the run's and the session's budgets (raygen.model.pricing).
        self.cost = cost or CostPolicy(ModelPricing.resolve(model.name))
        self.harness = create_harness(agent)
        """The harness run as each session (``agent:`` config); None: raygen's own loop."""
        self.sandbox_gate: SandboxGate = sandbox_gate or OpenSandboxGate()
        """Asked before each sandbox is created (the cluster-wide sandbox governor, raygen.envs.fleet)."""
        self.sandbox_key = sandbox_key or str(getattr(env_config, "type", ""))
        # A governed fleet is waited for before the first model call, so a slow fleet never leaves a
        # paid conversation waiting for its sandbox; an open one starts at the first tool call.
        self.sandbox_first = not isinstance(self.sandbox_gate, OpenSandboxGate)
        self.on_sandbox = on_sandbox
        """Told +1 when a session's environment starts and -1 when it closes (metrics)."""
        self.verify_default = verify_default
        """The check of rows without their own ``verify`` (config ``verify.default``)."""
        self.registry = registry
        self.env_config = env_config
        self.cfg = session
        self.system_prompt = session.resolved_system_prompt()
        # Sent with every call; stored only with ``store_prefill`` (raygen/formats/prompting.py).
        self.prefill = session.resolved_prefill()
        self.sent_prefill = [] if session.store_prefill else self.prefill
        self.run_name = run_name
        self.node = node
        self.config_fingerprint = config_fingerprint
        # The worker's own credential-looking variables too: a tool may read them (/proc, a stray file)
        # even when the driver's secret_env did not name them.
        self.scrubber = Scrubber([*(secret_values or []), *worker_secret_values()])
        self._offers: dict[tuple[str, ...], Offer] = {}

    def offer(self, toolsets: list[str]) -> Offer:
        """The tools of ``toolsets`` (ConfigError for an unknown one), from the runner's cache."""
        key = tuple(toolsets)
        offer = self._offers.get(key)
        if offer is None:
            offer = Offer.of(self.registry.tools_for(toolsets))
            if len(self._offers) < OFFERS_KEPT:
                self._offers[key] = offer
        return offer

    async def run(self, sample: Sample) -> Trajectory:
        """Run one sample to a Trajectory. Never raises except on cancellation."""
        state = _SessionState(sample, self)
        # A sample of a group asks the model for its own seed (raygen.model.base.request_seed).
        index = SAMPLE_INDEX.set(sample.sample_index if sample.group_id is not None else None)
        try:
            async with session_deadline(self.cfg.session_timeout_s):
                await state.run()
        except SessionFailure as failure:
            state.fail(failure.exit_status, str(failure))
        except TimeoutError:
            state.fail("error:session_timeout", f"session exceeded {self.cfg.session_timeout_s} s")
        except Exception as exc:  # a bug must cost one session, not the run
            log.exception("session %s crashed", sample.sample_key)
            state.fail("error:internal", "".join(traceback.format_exception_only(exc)).strip())
        finally:
            SAMPLE_INDEX.reset(index)
            state.spend.end()
        return state.to_record()


class _SessionState:
    def __init__(self, sample: Sample, runner: SessionRunner):
        self.sample = sample
        self.runner = runner
        self.offer = runner.offer(sample.toolsets)
        self.tools, self.offered, self.schemas = self.offer.tools, self.offer.offered, self.offer.schemas
        self.tools_block = self.offer.tools_block
        self.toolsets_used = list(sample.toolsets) + sorted(set(sample.row.mcp_servers or ()))
        self.messages: list[dict[str, Any]] = []
        if runner.system_prompt:
            self.messages.append({"role": "system", "content": runner.system_prompt})
        if runner.cfg.store_prefill:
            self.messages.extend(dict(m) for m in runner.prefill)
        self.messages.append({"role": "user", "content": sample.row.prompt})
        self.first_generated = len(self.messages)
        """Index of the first message the session itself adds (the loss mask's start)."""
        self.capture = TurnCapture()
        self.tool_stats = {name: ToolStat() for name in runner.registry.all_tool_names()}
        self.tool_errors: dict[str, int] = {}
        self.hallucinated: list[str] = []
        self.safety_labels: list[SafetyLabel] = []
        # The row's own secret env values are redacted from this session's record and tool output, but
        # still reach its environment (the task may need them): EnvSpec withholds only the runner's.
        row_secrets = [v for k, v in sample.row.env.items() if k in runner.cfg.secret_env]
        self.scrubber = Scrubber(runner.scrubber.values + row_secrets) if row_secrets else runner.scrubber
        self.reasoning = ReasoningCounts()
        self.turns: list[TurnInfo] = []
        self.usage = Usage()
        self.spend = SessionSpend(runner.cost)
        self.api_calls = 0
        self.completed = False
        self.exit_status = "max_turns"
        self.error: str | None = None
        self.started = time.time()
        self.model_s = self.tools_s = self.env_s = 0.0
        self.env_info = EnvInfo(backend=runner.env_config.type, image=sample.row.image, node=runner.node)
        self.reward: float | None = None
        self.verification: Verification | None = None
        self.artifacts: list[Artifact] = []
        self.mcp = runner.mcp.for_session(sample.toolsets, sample.row.mcp_servers)
        self.binds: list[str] = []  # a harness's seat folder, while its environment starts
        self.agent_info: AgentInfo | None = None
        self.threads: list[ThreadInfo] = []

    async def run(self) -> None:
        await self._check_image()
        # The environment starts at the first tool call, not before the first model call: a session
        # waiting for the rate governor (or answering without tools) holds no sandbox.
        async with contextlib.AsyncExitStack() as stack:
            ctx = ToolContext(
                env=None,  # type: ignore[arg-type]  # set by _ensure_env before any tool runs
                output_max_chars=self.runner.cfg.tool_output_max_chars,
                default_timeout_s=self.runner.cfg.command_timeout_s,
                max_timeout_s=self.runner.cfg.max_command_timeout_s,
                mcp=self.mcp,
            )
            self._stack = stack
            if self.runner.sandbox_first and self.offered and self.runner.harness is None:
                await self._ensure_env(ctx)
            if self.mcp is not None:
                stack.push_async_callback(self.mcp.close)  # again after the environment: closed before it
                await self._start_row_servers(ctx)
            if self.runner.harness is not None:
                await run_harness(self, ctx)
            else:
                await self._loop(ctx)
            await verify_session(self, ctx)
            t = time.monotonic()
        if ctx.env is not None:
            self.env_s += time.monotonic() - t

    def _env_spec(self, suffix: str = "") -> EnvSpec:
        return EnvSpec(
            session_key=f"{self.sample.sample_key}-a{self.sample.attempt}{suffix}",
            run_name=self.runner.run_name,
            image=self.sample.row.image,
            cwd=self.sample.row.cwd,
            env=dict(self.sample.row.env),
            secret_values=self.runner.scrubber.values,
            binds=list(self.binds),
        )

    async def _ensure_env(self, ctx: ToolContext) -> None:
        if ctx.env is not None:
            return
        t = time.monotonic()
        gate = self.runner.sandbox_gate
        permit = await gate.acquire(self.runner.sandbox_key)
        made = False

        def gone() -> None:  # runs after the environment's own close (the stack unwinds in reverse)
            if made:
                gate.closed(permit)

        self._stack.callback(gone)
        try:
            ctx.env = await self._stack.enter_async_context(
                create_environment(self.runner.env_config, self._env_spec())
            )
        except BaseException as exc:
            gate.started(permit, ok=False, refused=isinstance(exc, SandboxRefused))
            raise
        made = True
        gate.started(permit, ok=True)
        if self.runner.on_sandbox is not None:
            self.runner.on_sandbox(+1)
            self._stack.callback(self.runner.on_sandbox, -1)
        if self.mcp is not None:
            self._stack.push_async_callback(self.mcp.close)
        self.env_s += time.monotonic() - t

    async def _start_row_servers(self, ctx: ToolContext) -> None:
        """A row's own MCP servers start before the first model call: their tools join the offer."""
        servers = self.sample.row.mcp_servers
        if not servers:
            return
        if any(server.transport == "stdio" for server in servers.values()):
            await self._ensure_env(ctx)
        toolsets = await self.mcp.start_row_servers(servers, ctx)
        added = [tool for toolset in toolsets for tool in toolset.tools]
        kept = [tool for tool in self.tools if tool.name not in {t.name for t in added}]
        self.offer = Offer.of(kept + added)
        self.tools, self.offered, self.schemas = self.offer.tools, self.offer.offered, self.offer.schemas
        self.tool_stats.update({tool.name: ToolStat() for tool in added})

    async def _check_image(self) -> None:
        """Fail before any model call if the row's image cannot be had (checked once per image per
        process; pulls are serialized per node)."""
        image = self.sample.row.image
        config = self.runner.env_config
        problems = await environment_class(config.type).prepare(config, [image])
        name = image or getattr(config, "default_image", None)
        if name and problems.get(name):
            raise SessionFailure("image_unavailable", f"{name}: {problems[name]}")

    async def _loop(self, ctx: ToolContext) -> None:
        for _ in range(self.runner.cfg.max_turns):
            sent = request_messages(
                self.messages, self.runner.cfg.ephemeral_system_prompt, self.runner.sent_prefill
            )
            ticket = await self.spend.before_call(sent, self.schemas)  # a budget may end the session here
            t = time.monotonic()
            self.api_calls += 1  # before the call: one that fails after its retries was still made
            completion = None
            try:
                completion = await self.runner.model.complete(sent, self.schemas)
            finally:
                self.model_s += time.monotonic() - t
                self.spend.after_call(ticket, completion)
            self.usage.prompt_tokens += completion.prompt_tokens
            self.usage.completion_tokens += completion.completion_tokens
            message = {k: v for k, v in completion.message.items() if v is not None}
            message["role"] = "assistant"
            self.turns.append(self.capture.turn(completion))
            size, limit = reply_chars(message), self.runner.cfg.max_reply_chars
            if size > limit:
                self.messages.append(cut_reply(message, size))  # its head, so the record shows what came
                raise SessionFailure("reply_too_large", f"reply of {size} characters, over {limit}")
            self.messages.append(message)
            reasoning, _ = split_reasoning(message)
            if reasoning:
                self.reasoning.with_reasoning += 1
            else:
                self.reasoning.without_reasoning += 1
            if completion.finish_reason == "length":
                # Cut at the token limit: not an answer, and its tool calls may be cut too (never run).
                self.exit_status = "truncated"
                return
            calls = message.get("tool_calls") or []
            if not calls:
                self.completed, self.exit_status = True, "completed"
                return
            await self._ensure_env(ctx)
            t = time.monotonic()
            results = await asyncio.gather(*(self._call_tool(call, ctx) for call in calls))
            self.tools_s += time.monotonic() - t
            for call, result in zip(calls, results, strict=True):
                self.messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.get("id", ""),
                        "name": call.get("function", {}).get("name", ""),
                        "content": result.content,
                    }
                )

    async def _call_tool(self, call: dict[str, Any], ctx: ToolContext) -> ToolResult:
        fn = call.get("function") or {}
        name = fn.get("name") or ""
        tool = self.offered.get(name)
        if tool is None:
            self.hallucinated.append(name)
            available = ", ".join(sorted(self.offered)) or "none"
            return self._count(
                None,
                ToolResult.error(f"unknown tool {name!r}; available tools: {available}", kind="hallucinated"),
            )
        try:
            raw = fn.get("arguments") or "{}"
            args = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return self._count(
                name, ToolResult.error(f"invalid arguments for {name}: {exc}", "invalid_arguments")
            )
        # Labelled before it runs (and whatever its outcome): the label is about what was attempted.
        self.safety_labels.extend(label_tool_call(name, args, turn=self.api_calls))
        try:
            result = await tool.run(args, ctx)
        except SessionFailure:
            raise
        except Exception as exc:  # a broken tool is the tool's failure, shown to the model
            log.warning("tool %s raised: %r", name, exc)
            result = ToolResult.error(f"{type(exc).__name__}: {exc}", "execution")
        content, _ = cap_text(self.scrubber.scrub(result.content), ctx.output_max_chars)
        return self._count(name, ToolResult(result.ok, content, result.error_kind))

    def _count(self, name: str | None, result: ToolResult) -> ToolResult:
        if name is not None:
            stat = self.tool_stats.setdefault(name, ToolStat())
            stat.count += 1
            if result.ok:
                stat.success += 1
            else:
                stat.failure += 1
        if not result.ok:
            kind = result.error_kind or "execution"
            self.tool_errors[kind] = self.tool_errors.get(kind, 0) + 1
        return result

    def fail(self, exit_status: str, error: str) -> None:
        self.completed, self.exit_status, self.error = False, exit_status, self.scrubber.scrub(error)

    def to_record(self) -> Trajectory:
        return build_record(self)
