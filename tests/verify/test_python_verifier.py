"""verify.python: a verifier function by import path, with the grading environment and the conversation."""

from __future__ import annotations

import pytest

from raygen.config import LocalEnvConfig
from tests.verify.helpers import ToolScript, runner, sample_of, solutions, task_rows, write

ROW = task_rows()[0]
RIGHT = solutions()[ROW["id"]]
MOD = "tests.verify.python_verifiers"


def check(name: str, **extra):
    return {"command": None, "python": f"{MOD}:{name}", **extra}


@pytest.mark.parametrize(("solution", "reward"), [(RIGHT, 1.0), ("def nope(): pass\n", 0.0)])
async def test_an_async_verifier_runs_commands_in_the_grading_environment(solution, reward):
    rec = await runner(ToolScript([[write("solution.py", solution)]]), LocalEnvConfig()).run(
        sample_of(ROW, **check("runs_hidden_test"))
    )
    assert rec.exit_status == "completed" and rec.reward == reward


async def test_a_plain_verifier_reads_the_conversation():
    rec = await runner(ToolScript([]), LocalEnvConfig()).run(sample_of(ROW, **check("answer_mentions_done")))
    assert rec.reward == 1.0 and rec.verification.passed


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("too_slow", "timed out"),
        ("raises", "RuntimeError: verifier bug"),
        ("out_of_range", "not a reward in [0, 1]"),
        ("not_there", "cannot load verifier"),
    ],
)
async def test_verifier_problems_are_verify_errors(name, message):
    rec = await runner(ToolScript([]), LocalEnvConfig()).run(sample_of(ROW, **check(name, timeout_s=0.5)))
    assert rec.exit_status == "error:verify_error" and rec.reward is None and message in rec.error


async def test_a_verifier_can_call_the_sessions_model_as_a_judge():
    from raygen.config import ScriptedModelConfig, SimConfig
    from raygen.model.scripted import ScriptedModel

    class Counting(ScriptedModel):
        calls = 0

        async def complete(self, messages, tools, **kw):
            Counting.calls += 1
            return await super().complete(messages, tools, **kw)

    model = Counting(ScriptedModelConfig(), SimConfig())
    rec = await runner(model, LocalEnvConfig()).run(sample_of(ROW, **check("judge_says_yes")))
    assert rec.reward == 1.0 and Counting.calls == rec.api_calls + 1  # one call more than the session's
