"""The row's check after a session's last turn: grade what the agent left behind (``raygen.verify``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from raygen.envs import Environment, create_environment
from raygen.errors import SessionFailure
from raygen.tools.base import ToolContext
from raygen.verify.grader import VerifyError, collect_artifacts, grade

if TYPE_CHECKING:
    from raygen.session.agent import _SessionState


async def verify_session(state: _SessionState, ctx: ToolContext) -> None:
    """Grade what the agent left behind with the row's check, if it has one (after the last turn,
    while the agent's environment still exists: ``same`` mode runs in it, ``fresh`` copies from it)."""
    spec = state.sample.row.verify or state.runner.verify_default
    if spec is None:
        return
    state.artifacts, missing = await collect_artifacts(ctx.env, spec)
    agent_env = ctx.env
    if spec.resolved_mode == "fresh" and agent_env is not None:
        # Its artifacts are read: the agent's sandbox goes before the grading one starts, so a
        # session never holds two (stack.aclose is idempotent; the ``async with`` finds it empty).
        await state._stack.aclose()
        agent_env = None
    for attempt in range(spec.retries + 1):
        try:
            graded = await grade(
                spec,
                agent_env=agent_env,
                open_fresh=lambda: _grading_env(state),
                artifacts=state.artifacts,
                missing=missing,
                messages=state.messages,
                model=state.runner.model,
            )
            break
        except VerifyError as exc:
            if attempt < spec.retries:
                continue
            state.verification = exc.verification
            state.verification.session_status = state.exit_status
            raise SessionFailure("verify_error", f"{exc} ({attempt + 1} run(s) of the check)") from None
    state.reward, state.verification = graded.reward, graded.verification
    state.verification.session_status = state.exit_status


@contextlib.asynccontextmanager
async def _grading_env(state: _SessionState) -> AsyncIterator[Environment]:
    """A fresh environment for the check, counted as a sandbox like the session's own."""
    runner = state.runner
    async with create_environment(runner.env_config, state._env_spec("-verify")) as env:
        if runner.on_sandbox is not None:
            runner.on_sandbox(+1)
        try:
            yield env
        finally:
            if runner.on_sandbox is not None:
                runner.on_sandbox(-1)
