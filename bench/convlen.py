"""``convlen``: CPU per model call as the conversation grows (issue 11, "cost as the work grows").

In one process, no Ray, no HTTP. A session of N turns makes N + 1 model calls (N with one ``terminal`` call
each, whose output is K kB, then the answer), so call i sends i tool outputs: what a call costs to encode
grows with both N and K. Per size, averaged over the calls of whole sessions (``time.process_time``):

- **raygen's own work**: the real ``SessionRunner`` driving the real ``OpenAIChatModel.complete`` (request
  messages, token estimate, request body, rate gate), the real ``terminal`` tool (argument check, output
  cap and JSON), safety labels, secret scrubbing, and the record at the end (ShareGPT form, record scrub,
  size cap), amortized over the session's calls. Only two things are replaced, because they are not
  raygen's: the SDK's HTTP call (a canned reply is returned where the SDK would be called) and the command
  itself (the environment returns K kB of output at once);
- **encode**: the SDK's own ``openapi_dumps`` of the JSON body each of those calls sends;
- **SDK create**: ``chat.completions.with_raw_response.create`` of the same bodies on an in-memory
  transport (request build, encode, send), for reference;
- **asyncio runner**: the same calls as ``bench/baselines.py`` makes them (``messages=``, ``tools=``, so the
  SDK walks them against its typed definitions), through the SDK on the same in-memory transport.

The target: what raygen's per-call work adds as the conversation grows is at most what encoding the
request adds (per tool-output size, shortest to longest conversation). The per-size ratios are printed
too; at short conversations a fixed per-call cost (~0.1 ms) outweighs encoding a few-kB request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import httpx2
import openai
from openai._utils._json import openapi_dumps

import raygen.envs
from bench.common import Context, Row
from raygen.config import FakeEnvConfig, OpenAIModelConfig, SamplingConfig, SessionConfig
from raygen.envs.base import ExecResult
from raygen.envs.fake import FakeEnvironment
from raygen.formats.prompting import request_messages
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import Completion
from raygen.model.openai_model import OpenAIChatModel, estimate_tokens
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

SIZES = [(2, 1), (2, 20), (10, 1), (10, 20), (25, 1), (25, 20), (50, 1), (50, 20)]
"""(turns, kB of output per tool call)."""
TOOLSETS = ["terminal", "file"]
API_KEY = "sk-convlen-bench-0123456789"
"""Scrubbed like a real key: every tool output and the record are searched for it."""
OUTPUT_MAX_CHARS = 24_000
"""Above the default 16,000 so that a 20 kB output reaches the conversation whole, as the issue asks."""
REASONING = "Let me look at what the last command printed before I decide the next step. " * 6
"""Each reply carries reasoning (a ``reasoning_content`` field), as reasoning models' replies do."""
SYSTEM_PROMPT = (
    "You are a careful engineer working in a Linux shell. Use the tools to inspect before you answer."
)
_CPU_BUDGET_S = 1.5
"""Repetitions per size are chosen to take about this much CPU per measure (quick: a third)."""
_URL = "http://127.0.0.1:9/v1"


def _output(kb: int) -> str:
    line = "drwxr-xr-x  2 raygen raygen  4096 Dec  1 16:09 some-directory-name\n"
    return (line * (kb * 1024 // len(line) + 1))[: kb * 1024]


class _CannedOutputEnv(FakeEnvironment):
    """The fake environment, every command printing the same K kB at once (the command's own cost is
    the environment's, not raygen's)."""

    output = ""

    async def exec(self, command: str, **_: Any) -> ExecResult:
        return ExecResult(exit_code=0, stdout=self.output, stderr="")


class _CannedReplyModel(OpenAIChatModel):
    """``OpenAIChatModel`` with the SDK's HTTP call replaced by a canned reply: a ``terminal`` call until
    the conversation holds ``turns`` tool results, then an answer. ``sent`` keeps each request body when
    set to a list (not while timing)."""

    def __init__(self, turns: int):
        super().__init__(OpenAIModelConfig(base_url=_URL), SamplingConfig(), api_key=API_KEY, base_url=_URL)
        self.turns = turns
        self.sent: list[dict[str, Any]] | None = None

    async def _attempt(self, body: dict[str, Any], est: int) -> Completion:
        permit = await self.gate.acquire(est)
        self.gate.release(permit, status=200, prompt_tokens=est, completion_tokens=40)
        if self.sent is not None:  # a copy: the session appends to the list it sent
            self.sent.append(
                {
                    **body,
                    "extra_body": {**body["extra_body"], "messages": list(body["extra_body"]["messages"])},
                }
            )
        turn = (len(body["extra_body"]["messages"]) - 2) // 2  # system, user, then an exchange per turn
        message: dict[str, Any] = {"role": "assistant", "reasoning_content": REASONING}
        if turn >= self.turns:
            message["content"] = "Done: the directory holds what was asked."
            return Completion(message=message, prompt_tokens=est, completion_tokens=40, finish_reason="stop")
        arguments = json.dumps({"command": f"ls -la /srv/data/part-{turn:03d}"})
        message["content"] = ""
        message["tool_calls"] = [
            {
                "id": f"call_{turn:04d}",
                "type": "function",
                "function": {"name": "terminal", "arguments": arguments},
            }
        ]
        return Completion(
            message=message, prompt_tokens=est, completion_tokens=40, finish_reason="tool_calls"
        )


def _sample(i: int) -> Sample:
    row = PromptRow(prompt=f"List what /srv/data holds, part by part, and summarize it. ({i})")
    return Sample(row=row, sample_key=f"convlen{i:017d}", prompt_index=i, line=i + 1, toolsets=TOOLSETS)


def _per_call_us(fn: Callable[[], Any], calls_per_rep: int, quick: bool) -> tuple[float, int]:
    """CPU µs per call of ``fn`` (which makes ``calls_per_rep`` calls), repeated for about the budget."""
    budget = _CPU_BUDGET_S / (3 if quick else 1)
    fn()  # warm: imports, caches, the first allocation of each size
    t0 = time.process_time()
    fn()
    once = max(time.process_time() - t0, 1e-5)
    reps = max(3, int(budget / once))
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps / calls_per_rep * 1e6, reps


def _mock_client() -> openai.AsyncOpenAI:
    reply = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, json=reply))
    return openai.AsyncOpenAI(
        api_key=API_KEY, base_url=_URL, max_retries=0, http_client=httpx2.AsyncClient(transport=transport)
    )


def _sdk_body(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON the SDK sends for ``create(**body)``: its own fields, then ``extra_body`` over them."""
    return {"messages": body["messages"], "model": body["model"], **body["extra_body"]}


def measure(turns: int, kb: int, quick: bool) -> dict[str, Any]:
    """Every figure of one size, in µs of CPU per model call (means over the session's calls)."""
    calls = turns + 1
    _CannedOutputEnv.output = _output(kb)
    loop = asyncio.new_event_loop()
    try:
        model = loop.run_until_complete(_make_model(turns))
        runner = SessionRunner(
            model=model,
            registry=load_registry([]),
            env_config=FakeEnvConfig(),
            session=SessionConfig(
                max_turns=calls, tool_output_max_chars=OUTPUT_MAX_CHARS, system_prompt=SYSTEM_PROMPT
            ),
            secret_values=[API_KEY],
        )
        counter = iter(range(10**9))

        def session() -> None:
            record = loop.run_until_complete(runner.run(_sample(next(counter))))
            assert record.exit_status == "completed" and record.api_calls == calls, record.error

        with mock.patch.dict(raygen.envs.BACKENDS, {"fake": f"{__name__}:_CannedOutputEnv"}):
            own, reps = _per_call_us(session, calls, quick)
            model.sent = []
            session()
        bodies, model.sent = model.sent, None
        encode, _ = _per_call_us(lambda: [openapi_dumps(_sdk_body(b)) for b in bodies], calls, quick)
        sdk_ours = _sdk_create_us(loop, bodies, typed=False, quick=quick)
        sdk_typed = _sdk_create_us(loop, bodies, typed=True, quick=quick)
        last = bodies[-1]
        last_encode, _ = _per_call_us(lambda: openapi_dumps(_sdk_body(last)), 1, quick)
        sent = last["extra_body"]["messages"]
        schemas, cfg = runner.offer(TOOLSETS).schemas, runner.cfg

        def request_path() -> None:  # what grows with the conversation: the messages, the estimate, the body
            messages = request_messages(sent, cfg.ephemeral_system_prompt, runner.sent_prefill)
            estimate_tokens(messages, schemas, model.sampling.max_tokens)
            model._request(messages, schemas)

        last_request, _ = _per_call_us(request_path, 1, quick)
        loop.run_until_complete(model.aclose())
    finally:
        loop.close()
    return {
        "turns": turns,
        "tool_output_kb": kb,
        "calls_per_session": calls,
        "sessions_timed": reps,
        "raygen_own_us": own,
        "encode_us": encode,
        "sdk_create_us": sdk_ours,
        "asyncio_runner_sdk_create_us": sdk_typed,
        "last_call_request_bytes": len(openapi_dumps(_sdk_body(last))),
        "last_call_encode_us": last_encode,
        "last_call_request_path_us": last_request,
    }


async def _make_model(turns: int) -> _CannedReplyModel:
    return _CannedReplyModel(turns)  # its aiohttp client wants a running loop


def _sdk_create_us(
    loop: asyncio.AbstractEventLoop, bodies: list[dict[str, Any]], typed: bool, quick: bool
) -> float:
    """CPU µs per call of the SDK's ``create`` on an in-memory transport: raygen's way (``extra_body``) or
    the asyncio runner's (``messages=``, ``tools=``)."""
    client = _mock_client()
    create = client.chat.completions.with_raw_response.create
    if typed:
        kwargs = [
            {"model": b["model"], "messages": b["extra_body"]["messages"], "tools": b["extra_body"]["tools"]}
            for b in bodies
        ]
    else:
        kwargs = bodies

    async def all_calls() -> None:
        for kw in kwargs:
            await create(**kw)

    try:
        us, _ = _per_call_us(lambda: loop.run_until_complete(all_calls()), len(kwargs), quick)
    finally:
        loop.run_until_complete(client.close())
    return us


def run(ctx: Context) -> list[Row]:
    figures = []
    rows: list[Row] = []
    for turns, kb in SIZES:
        ctx.log(f"convlen: {turns} turns x {kb} kB")
        f = measure(turns, kb, ctx.quick)
        figures.append(f)
        ratio = f["raygen_own_us"] / f["encode_us"]
        growing = f["last_call_request_path_us"] / f["last_call_encode_us"]
        rows.append(
            Row(
                "convlen",
                f"{turns} turns x {kb} kB: raygen's own work / encode, per call",
                f"{ratio:.2f}x ({f['raygen_own_us']:,.0f} / {f['encode_us']:,.0f} µs)",
                note=f"last call ({f['last_call_request_bytes'] / 1024:,.0f} kB): request path "
                f"{f['last_call_request_path_us']:,.0f} µs = {growing:.2f}x its encode; SDK create "
                f"{f['sdk_create_us']:,.0f} µs/call, asyncio runner's way "
                f"{f['asyncio_runner_sdk_create_us']:,.0f}; {f['sessions_timed']} sessions",
            )
        )
    ctx.results["convlen"] = figures
    return rows + _growth_rows(figures)


def _growth_rows(figures: list[dict[str, Any]]) -> list[Row]:
    """The target, read as "cost grows no faster than encoding the request does": per tool-output size,
    what raygen's per-call work adds from the shortest to the longest conversation, against what
    encoding adds over the same span. (A fixed per-call cost, ~0.1 ms, is not growth: at 2 turns it is
    several times the encoding of a 5 kB request, and the per-size rows above show it.)"""
    rows = []
    for kb in sorted({f["tool_output_kb"] for f in figures}):
        by_turns = sorted((f for f in figures if f["tool_output_kb"] == kb), key=lambda f: f["turns"])
        if len(by_turns) < 2:
            continue
        short, long = by_turns[0], by_turns[-1]
        added = long["raygen_own_us"] - short["raygen_own_us"]
        encode_added = long["encode_us"] - short["encode_us"]
        ratio = added / encode_added if encode_added > 0 else float("inf")
        rows.append(
            Row(
                "convlen",
                f"{kb} kB outputs, {short['turns']} -> {long['turns']} turns: raygen's added work / "
                "encoding's added work, per call",
                f"{ratio:.2f}x ({added:+,.0f} / {encode_added:+,.0f} µs)",
                "<= 1.0x",
                ratio <= 1.0,
                "grows no faster than encoding the request",
            )
        )
    return rows
