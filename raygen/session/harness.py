"""A session whose agent is a harness run as a command (``agent.type`` other than ``builtin``).

The harness gets a seat (``raygen.agents``): its environment starts with the seat's folder bound in, the
harness runs there until it exits, is stopped or times out, and the session's record is then built from
the model calls the proxy recorded (``raygen.agents.traffic``): the same fields as a session of raygen's
own loop, plus ``agent`` and ``threads``. Hidden checks grade afterwards, as for any session.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from raygen.agents import HarnessRun
from raygen.agents.traffic import reconstruct, tool_names
from raygen.errors import SessionFailure
from raygen.formats.limits import cut_reply, reply_chars
from raygen.formats.sharegpt import tools_block
from raygen.safety import label_tool_call
from raygen.tools.base import ToolContext

if TYPE_CHECKING:
    from raygen.session.agent import _SessionState

RECORD_MARGIN_S = 2.0
"""Of the session's time, what is kept back so that a harness that runs until its timeout still leaves
time to build the record before ``session_timeout_s``."""


async def run_harness(state: _SessionState, ctx: ToolContext) -> None:
    """Run the runner's harness as the session; raises the run's failure after recording its traffic."""
    runner = state.runner
    elapsed = time.time() - state.started
    timeout_s = runner.cfg.session_timeout_s - elapsed - RECORD_MARGIN_S
    seat_cm = runner.harness.seat(
        model=runner.model,
        max_calls=runner.cfg.max_turns,
        prompt=state.sample.row.prompt,
        session_id=f"{state.sample.sample_key}-a{state.sample.attempt}",
    )
    async with seat_cm as seat:
        state.binds = list(seat.binds)
        try:
            await state._ensure_env(ctx)
        finally:
            state.binds = []
        run = await seat.run(ctx.env, timeout_s)
    _cut_oversized(run, runner.cfg.max_reply_chars)
    absorb(state, run)
    if run.failure is not None:
        raise run.failure


def _cut_oversized(run: HarnessRun, limit: int) -> None:
    """A reply over ``session.max_reply_chars`` is stored cut to its head and fails the session, as in
    raygen's own loop (the harness got it whole: it was already served)."""
    for call in run.calls:
        if call.response is not None and (size := reply_chars(call.response)) > limit:
            call.response = cut_reply(call.response, size)
            run.failure = run.failure or SessionFailure(
                "reply_too_large", f"reply of {size} characters, over {limit}"
            )


def absorb(state: _SessionState, run: HarnessRun) -> None:
    """Fill the session's record fields from a harness run."""
    traffic = reconstruct(run.calls)
    state.messages = traffic.messages
    state.schemas = traffic.tools
    state.tools_block = tools_block(traffic.tools)
    state.offered = dict.fromkeys(tool_names(traffic.tools))
    state.toolsets_used = []
    state.tool_stats = traffic.tool_stats
    state.hallucinated = traffic.hallucinated
    state.reasoning = traffic.reasoning
    state.usage = traffic.usage
    state.turns = traffic.turns
    state.api_calls = len(run.calls)
    state.model_s = sum(call.duration_s for call in run.calls)
    state.agent_info = run.info
    state.threads = traffic.threads
    state.safety_labels = _labels(traffic.messages)
    if run.failure is None:
        state.exit_status = run.exit_status
        state.completed = run.exit_status == "completed"


def _labels(messages: list[dict[str, Any]]) -> list[Any]:
    """Unsafe-action labels of the main conversation's tool calls (turn: 1-based assistant message)."""
    labels = []
    turn = 0
    for message in messages:
        if message.get("role") != "assistant":
            continue
        turn += 1
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except (TypeError, ValueError):
                continue
            if isinstance(args, dict):
                labels.extend(label_tool_call(str(fn.get("name", "")), args, turn=turn))
    return labels
