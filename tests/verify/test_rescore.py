"""rescore: regrade stored artifacts with the dataset's current check, no model call, then re-merge."""

from __future__ import annotations

import asyncio
import json

import pytest

from raygen.config import LocalEnvConfig, RunConfig, ScriptedModelConfig, SimConfig
from raygen.input.validate import iter_samples
from raygen.model.scripted import ScriptedModel
from raygen.output.merge import merge_run
from raygen.output.run_dir import RunDir
from raygen.output.shards import ShardWriter
from raygen.run.rescore import rescore
from tests.input.test_sample_groups import Draw
from tests.verify.helpers import SOLUTIONS, TASKS, runner


async def make_run(tmp_path, dataset, **broken_check):
    """A run folder as the runner leaves it: manifest, keys, shards of real sessions, merged."""
    config = RunConfig(dataset=dataset, samples_per_prompt=2, limit=4, env=LocalEnvConfig())
    config.output.run_name = "r"
    run = RunDir(tmp_path / "r")
    run.write_json("manifest.json", {"config": config.model_dump(mode="json")})
    samples = list(iter_samples(dataset, run_seed=0, distribution=Draw(), limit=4, samples_per_prompt=2))
    run.write_keys({s.sample_key for s in samples})
    model = ScriptedModel(ScriptedModelConfig(), SimConfig(solutions_file=SOLUTIONS, solve_rate=0.5))
    writer = ShardWriter(run, "driver-test", 100, 60.0)
    r = runner(model, config.env)
    for s in samples:
        if broken_check:  # the session graded with a broken check
            data = s.row.model_dump()
            data["verify"].update(broken_check)
            s = s.model_copy(
                update={"row": type(s.row).model_validate(data), "toolsets": ["file", "terminal"]}
            )
        else:
            s = s.model_copy(update={"toolsets": ["file", "terminal"]})
        writer.add((await r.run(s)).model_dump_json())
    writer.close()
    merge_run(run, config.filters, 100, expected_keys=run.read_keys())
    return run


def rewards(run: RunDir) -> dict[str, float | None]:
    out = {}
    for folder in ("data", "rejected", "failed"):
        for path in (run.local_path / folder).glob("*.jsonl"):
            for line in path.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                out[row["sample_key"]] = row["reward"]
    return out


@pytest.mark.slow
def test_rescore_reproduces_the_rewards(tmp_path):
    run = asyncio.run(make_run(tmp_path, TASKS))
    before = rewards(run)
    assert len(before) == 8 and set(before.values()) == {0.0, 1.0}
    result = rescore(run)
    assert (result.regraded, result.changed, result.errors) == (8, 0, 0)
    assert rewards(run) == before


@pytest.mark.slow
def test_rescore_after_fixing_a_broken_check(tmp_path):
    # Graded with a check that timed out (verify_error, no reward); the dataset's check is the good one.
    run = asyncio.run(make_run(tmp_path, TASKS, command="sleep 5", timeout_s=0.2))
    assert set(rewards(run).values()) == {None}
    stats = json.loads((run.local_path / "statistics.json").read_text())
    assert stats["counts"]["failed"] == {"verify_error": 8}
    result = rescore(run)
    assert result.regraded == 8 and result.changed == 8 and result.errors == 0
    after = rewards(run)
    assert set(after.values()) == {0.0, 1.0}
    stats = json.loads((run.local_path / "statistics.json").read_text())
    assert stats["counts"]["failed"] == {} and stats["verification"]["graded"] == 8
