"""A merged run folder made of real sessions (the HTTP simulator rendering with the vendored tokenizer,
the openai SDK, the session loop) without Ray: what ``raygen export`` reads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from raygen.config import (
    FakeEnvConfig,
    FilterConfig,
    SamplingConfig,
    SessionConfig,
    SimConfig,
    SimModelConfig,
)
from raygen.formats.chat_template import load_tokenizer
from raygen.input.rows import PromptRow, Sample
from raygen.model.openai_model import OpenAIChatModel
from raygen.output.merge import merge_run
from raygen.output.shards import ShardWriter
from raygen.session.agent import SessionRunner
from raygen.sim.server import SimServer
from raygen.tools.registry import load_registry

DATA = Path(__file__).resolve().parents[1] / "data"
TOKENIZER = str(DATA / "tiny-chat-tokenizer")
CAPTURE = SamplingConfig(logprobs=True, top_logprobs=1, return_token_ids=True)
PROMPTS = [json.loads(line)["prompt"] for line in (DATA / "agent-tasks.jsonl").open()][:8]


def _sample(i: int, prompt: str, group: bool) -> Sample:
    return Sample(
        row=PromptRow(prompt=prompt),
        sample_key=f"key{i:04d}",
        prompt_index=i,
        line=i + 1,
        toolsets=["file", "terminal"],
        group_id=f"g{i // 2}" if group else None,
        sample_index=i % 2 if group else 0,
    )


async def _sessions(url: str, sampling: SamplingConfig, samples: list[Sample]) -> list[str]:
    model = OpenAIChatModel(SimModelConfig(), sampling, api_key="x", base_url=url)
    runner = SessionRunner(
        model=model,
        registry=load_registry([]),
        env_config=FakeEnvConfig(),
        session=SessionConfig(system_prompt="You are a careful agent."),
    )
    try:
        return [r.model_dump_json() for r in await asyncio.gather(*(runner.run(s) for s in samples))]
    finally:
        await model.aclose()


async def _generate() -> list[str]:
    cfg = SimConfig(latency_s=0.0, tokenizer=TOKENIZER, no_reasoning_rate=0.0)
    async with SimServer(cfg) as sim:
        captured = [_sample(i, p, group=True) for i, p in enumerate(PROMPTS[:6])]
        plain = [_sample(i, p, group=False) for i, p in enumerate(PROMPTS[6:8], start=6)]
        return await _sessions(sim.url, CAPTURE, captured) + await _sessions(sim.url, SamplingConfig(), plain)


def write_run(run: Path, lines: list[str]) -> Path:
    """A merged run folder of these records (shards, manifest, the merge)."""
    run.mkdir(parents=True)
    writer = ShardWriter(run, "w0", max_records=100, flush_s=3600)
    for line in lines:
        writer.add(line)
    writer.close()
    (run / "manifest.json").write_text(json.dumps({"run_name": run.name, "config": {}}))
    merge_run(run, FilterConfig(no_reasoning=False, hallucinated_tools=False), data_shard_records=3)
    return run


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """Six sessions with captured ids and logprobs (three prompt groups of two), two without."""
    return write_run(tmp_path_factory.mktemp("export-run") / "run", asyncio.run(_generate()))


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tokenizer(TOKENIZER)


def kept_records(run: Path) -> dict[str, dict[str, Any]]:
    records = [json.loads(line) for path in sorted((run / "data").glob("*.jsonl")) for line in path.open()]
    return {r["id"]: r for r in records}
