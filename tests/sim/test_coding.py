"""The simulator's coding script against real grading: reference solutions earn 1, stubs 0."""

from __future__ import annotations

import json

import pytest

from raygen.config import LocalEnvConfig, ScriptedModelConfig, SimConfig
from raygen.input.rows import PromptRow, Sample
from raygen.model.scripted import ScriptedModel
from raygen.model.sim_coding import coding_task
from tests.verify.helpers import SOLUTIONS, runner, task_rows


def group_sample(row: dict, index: int) -> Sample:
    return Sample(
        row=PromptRow.model_validate(row),
        sample_key=f"{index}" * 24,
        prompt_index=0,
        line=1,
        toolsets=["file", "terminal"],
        group_id="g" * 24,
        sample_index=index,
    )


async def rewards(cfg: SimConfig, rows: list[dict], samples: int = 1) -> list[list[float | None]]:
    r = runner(ScriptedModel(ScriptedModelConfig(), cfg), LocalEnvConfig())
    out = []
    for row in rows:
        out.append([(await r.run(group_sample(row, i))).reward for i in range(samples)])
    return out


def test_only_coding_prompts_get_the_coding_script():
    task = coding_task(task_rows()[0]["prompt"])
    assert task is not None and task.path == "solution.py" and task.code.startswith("from typing import List")
    assert coding_task("List the files here.") is None


@pytest.mark.slow
async def test_reference_earns_1_and_stub_0_on_every_vendored_task():
    rows = task_rows()
    assert await rewards(SimConfig(solutions_file=SOLUTIONS, solve_rate=1.0), rows) == [[1.0]] * len(rows)
    assert await rewards(SimConfig(solutions_file=SOLUTIONS, solve_rate=0.0), rows) == [[0.0]] * len(rows)
    assert await rewards(SimConfig(solve_rate=1.0), rows[:2]) == [[0.0]] * 2  # no solutions file: stubs


@pytest.mark.slow
async def test_samples_of_a_group_differ_and_repeat_exactly():
    cfg = SimConfig(solutions_file=SOLUTIONS, solve_rate=0.5)
    rows = task_rows()[:6]
    first = await rewards(cfg, rows, samples=4)
    assert first == await rewards(cfg, rows, samples=4)  # same seeds, same choices
    mixed = [group for group in first if len(set(group)) > 1]
    assert mixed, first  # some group has both a solved and a failed sample


async def test_the_session_writes_then_tests_then_answers():
    row = task_rows()[3]
    r = runner(
        ScriptedModel(ScriptedModelConfig(), SimConfig(solutions_file=SOLUTIONS, solve_rate=1.0)),
        LocalEnvConfig(),
    )
    rec = await r.run(group_sample(row, 0))
    names = [
        c["function"]["name"]
        for m in rec.messages
        if m["role"] == "assistant"
        for c in m.get("tool_calls", [])
    ]
    assert names == ["write_file", "terminal"] and rec.completed and rec.reward == 1.0
    assert "imports-ok" in json.dumps(rec.messages)
    assert "def check" not in json.dumps(rec.messages)  # the hidden test never reached the model
