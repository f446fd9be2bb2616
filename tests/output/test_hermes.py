"""Hermes-format output against the reference runner's own files (tests/data/hermes-reference).

raygen runs the same prompts the reference ran (the scripted policy in-process, a real local shell) with
the same toolset distribution; the merge writes ``trajectories.jsonl``; each record is compared with the
reference's record of the same ``prompt_index``: keys, types, turn layout, tool-result shape. ``datasets``
must load both files together.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_runs import load_json_with_datasets

from raygen.config import FilterConfig, LocalEnvConfig, ScriptedModelConfig, SessionConfig, SimConfig
from raygen.input.rows import PromptRow, Sample
from raygen.model.scripted import ScriptedModel
from raygen.output.hermes import (
    REFERENCE_TOOLS,
    HermesOptions,
    assistant_turn,
    convert,
    tool_content,
)
from raygen.output.merge import merge_run
from raygen.output.run_dir import TRAJECTORIES_FILE
from raygen.output.shards import ShardWriter
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

REFERENCE = Path(__file__).parent.parent / "data" / "hermes-reference"
TOOLS = sorted(set(REFERENCE_TOOLS) | set(load_registry([]).all_tool_names()))
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}$")
TOOL_RESPONSE = re.compile(r"^<tool_response>\n(.*)\n</tool_response>$", re.DOTALL)
TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def reference_records() -> dict[int, dict[str, Any]]:
    return {r["prompt_index"]: r for r in read_jsonl(REFERENCE / "basic" / "trajectories.jsonl")}


async def _run_sessions(tmp: Path, rows: list[dict[str, Any]], sim: SimConfig, **session: Any) -> list[str]:
    runner = SessionRunner(
        model=ScriptedModel(ScriptedModelConfig(model="mock"), sim),
        registry=load_registry([]),
        env_config=LocalEnvConfig(root=tmp),
        session=SessionConfig(**session),
    )
    samples = [
        Sample(
            row=PromptRow(prompt=row["prompt"]),
            sample_key=f"key{i:04d}",
            prompt_index=i,
            line=i + 1,
            toolsets=["terminal"],  # the reference's --distribution=terminal_only
        )
        for i, row in enumerate(rows)
    ]
    records = await asyncio.gather(*(runner.run(s) for s in samples))
    return [r.model_dump_json() for r in records]


def generate(run_dir: Path, sim: SimConfig | None = None, **session: Any) -> Path:
    """raygen's Hermes-format output for the prompts the reference ran, merged like a run's."""
    rows = read_jsonl(REFERENCE / "basic" / "prompts.jsonl")
    workdirs = run_dir / "work"
    workdirs.mkdir(parents=True)
    writer = ShardWriter(run_dir, "test-writer", max_records=4, flush_s=3600)
    sim = sim or SimConfig(reasoning_style="field")
    for line in asyncio.run(_run_sessions(workdirs, rows, sim, **session)):
        writer.add(line)
    writer.close()
    options = HermesOptions(run_dir.name, "terminal_only", "mock", TOOLS)
    merge_run(run_dir, FilterConfig(), data_shard_records=100, hermes=options)
    return run_dir / TRAJECTORIES_FILE


def type_shape(value: Any) -> Any:
    """The JSON type structure of a value: what a schema-inferring reader sees."""
    if isinstance(value, dict):
        return {k: type_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [type_shape(value[0])] if value else []
    return type(value).__name__


@pytest.fixture(scope="module")
def ours(tmp_path_factory) -> Path:
    return generate(tmp_path_factory.mktemp("hermes-run"))


def test_every_record_has_the_reference_keys_and_types(ours):
    reference = reference_records()
    records = read_jsonl(ours)
    assert [r["prompt_index"] for r in records] == sorted(reference)  # one per prompt, all kept
    for record in records:
        ref = reference[record["prompt_index"]]
        assert list(record) == list(ref)
        shape, ref_shape = type_shape(record), type_shape(ref)
        shape.pop("conversations"), ref_shape.pop("conversations")  # compared turn by turn below
        assert shape == ref_shape
        assert set(record["tool_stats"]) == set(ref["tool_stats"]) == set(record["tool_error_counts"])
        assert TIMESTAMP.match(record["metadata"]["timestamp"])
        assert TIMESTAMP.match(ref["metadata"]["timestamp"])
        assert record["metadata"]["batch_num"] == record["prompt_index"]
        assert (record["completed"], record["partial"]) == (ref["completed"], ref["partial"]) == (True, False)
        assert record["api_calls"] == ref["api_calls"] == 2
        assert (
            record["tool_stats"]["terminal"]
            == ref["tool_stats"]["terminal"]
            == {
                "count": 1,
                "success": 1,
                "failure": 0,
            }
        )


def _system_parts(value: str) -> tuple[str, list[dict[str, Any]], str]:
    head, rest = value.split("<tools>\n", 1)
    tools, tail = rest.split("\n</tools>\n", 1)
    return head, json.loads(tools), tail


def test_turn_layout_matches_the_reference_record_by_record(ours):
    reference = reference_records()
    for record in read_jsonl(ours):
        ref = reference[record["prompt_index"]]
        turns, ref_turns = record["conversations"], ref["conversations"]
        layout = ["system", "human", "gpt", "tool", "gpt"]
        assert [t["from"] for t in turns] == [t["from"] for t in ref_turns] == layout
        assert all(list(t) == ["from", "value"] for t in turns)
        # system: the same preamble and tail around the tools, each tool with the reference's keys
        head, tools, tail = _system_parts(turns[0]["value"])
        ref_head, ref_tools, ref_tail = _system_parts(ref_turns[0]["value"])
        assert (head, tail) == (ref_head, ref_tail)
        assert [list(t) for t in tools] == [list(ref_tools[0])] * len(tools)
        assert [t["name"] for t in tools] == ["terminal"] and all(t["required"] is None for t in tools)
        # human: the prompt verbatim
        assert turns[1]["value"] == ref_turns[1]["value"]
        # gpt: a <think> block first, then the calls as JSON objects with the reference's keys
        for gpt, ref_gpt in ((turns[2], ref_turns[2]), (turns[4], ref_turns[4])):
            assert gpt["value"].startswith("<think>\n") and "\n</think>\n" in gpt["value"]
            assert ref_gpt["value"].startswith("<think>\n")
        (call,) = [json.loads(c) for c in TOOL_CALL.findall(turns[2]["value"])]
        (ref_call,) = [json.loads(c) for c in TOOL_CALL.findall(ref_turns[2]["value"])]
        assert list(call) == list(ref_call) == ["name", "arguments"] and isinstance(call["arguments"], dict)
        assert turns[2]["value"].endswith("</tool_call>") and not TOOL_CALL.search(turns[4]["value"])
        # tool: one <tool_response> block, terminal content {"output", "exit_code", "error": null}
        body = json.loads(TOOL_RESPONSE.match(turns[3]["value"]).group(1))
        ref_body = json.loads(TOOL_RESPONSE.match(ref_turns[3]["value"]).group(1))
        assert list(body) == list(ref_body) == ["tool_call_id", "name", "content"]
        assert list(body["content"]) == list(ref_body["content"]) == ["output", "exit_code", "error"]
        assert body["content"]["error"] is None and isinstance(body["content"]["exit_code"], int)
        assert body["content"]["output"] and not body["content"]["output"].endswith("\n")


def test_datasets_loads_the_reference_and_raygen_together(ours, tmp_path):
    reference = REFERENCE / "basic" / "trajectories.jsonl"
    for files in ((reference, ours), (ours, reference)):  # no CastError in either order
        loaded = load_json_with_datasets(tmp_path, *files)
        assert loaded.get("rows") == 20, loaded
        assert loaded["columns"] == list(reference_records()[0])


def test_raygen_records_do_not_load_with_the_reference(ours, tmp_path):
    """The check above can fail: raygen's own records (data/) are what the issue reported as a CastError."""
    raygen_jsonl = next((ours.parent / "data").glob("train-*.jsonl"))
    loaded = load_json_with_datasets(tmp_path, REFERENCE / "basic" / "trajectories.jsonl", raygen_jsonl)
    assert "error" in loaded


def test_statistics_have_the_reference_keys_and_types(ours):
    stats = json.loads((ours.parent / "statistics.json").read_text(encoding="utf-8"))
    ref = json.loads((REFERENCE / "basic" / "statistics.json").read_text(encoding="utf-8"))
    assert {k: type_shape(stats[k]) for k in ref} == type_shape(ref)
    assert stats["tool_statistics"]["terminal"] == {
        "count": 10,
        "success": 10,
        "failure": 0,
        "success_rate": 100.0,
        "failure_rate": 0.0,
    }
    assert stats["reasoning_statistics"] == {
        "total_assistant_turns": 20,
        "turns_with_reasoning": 20,
        "turns_without_reasoning": 0,
    }
    assert (stats["total_prompts"], stats["batch_size"], stats["model"]) == (10, 1, "mock")
    assert stats["counts"]["kept"] == 10  # raygen's own statistics stay alongside


def test_turns_without_reasoning_get_an_empty_think_block(tmp_path):
    path = generate(tmp_path / "run", SimConfig(no_reasoning_rate=1.0))
    stats = json.loads((path.parent / "statistics.json").read_text(encoding="utf-8"))
    assert not read_jsonl(path)  # the no-reasoning filter rejected them all, as the reference discards them
    assert stats["reasoning_statistics"]["turns_without_reasoning"] == 20
    options = HermesOptions("run", "terminal_only", "mock", TOOLS)
    merge_run(path.parent, FilterConfig(no_reasoning=False), data_shard_records=100, hermes=options)
    gpt_turns = [t["value"] for r in read_jsonl(path) for t in r["conversations"] if t["from"] == "gpt"]
    assert len(gpt_turns) == 20 and all(v.startswith("<think>\n</think>\n") for v in gpt_turns)
    message = {"role": "assistant", "content": "Done.", "tool_calls": []}
    assert assistant_turn(message) == "<think>\n</think>\nDone."
    fn = {"name": "terminal", "arguments": '{"command": "ls"}'}
    call = {"id": "c1", "type": "function", "function": fn}
    assert assistant_turn({"role": "assistant", "content": None, "tool_calls": [call]}) == (
        '<think>\n</think>\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>'
    )
    inline = {"role": "assistant", "content": "<think>plan</think>\nok"}
    assert assistant_turn(inline) == "<think>\nplan\n</think>\nok"


def _record(messages: list[dict[str, Any]], offered: list[str]) -> dict[str, Any]:
    return {
        "prompt_index": 3,
        "messages": messages,
        "tools_offered": offered,
        "completed": True,
        "api_calls": 2,
        "toolsets_used": ["terminal"],
        "model": "m",
        "timing": {"ended_at": "2026-12-01T13:42:45.382+00:00"},
    }


def test_an_invented_tool_is_never_a_success():
    teleport = {"id": "c1", "type": "function", "function": {"name": "teleport", "arguments": "{}"}}
    record = _record(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [teleport]},
            {
                "role": "tool",
                "tool_call_id": "c1",
                "name": "teleport",
                "content": '{"error": "no such tool"}',
            },
            {"role": "assistant", "content": "gave up"},
        ],
        ["terminal"],
    )
    hermes, _, invented = convert(record, TOOLS)
    assert invented == ["teleport"] and "teleport" not in hermes["tool_stats"]
    assert set(hermes["tool_stats"]) == set(TOOLS) and sum(hermes["tool_error_counts"].values()) == 0
    assert hermes["metadata"]["timestamp"] == "2026-12-01T13:42:45.382000"
    # The reference counts the same call as a success (README: must NOT copy).
    (ref,) = read_jsonl(REFERENCE / "filters" / "teleport.jsonl")
    assert ref["tool_stats"]["teleport"] == {"count": 1, "success": 1, "failure": 0}


def test_tool_results_take_the_reference_shape():
    ok = tool_content("terminal", json.dumps({"output": "hi\n", "exit_code": 0}))
    assert ok == {"output": "hi", "exit_code": 0, "error": None}
    failed_command = tool_content("terminal", json.dumps({"output": "no\n", "exit_code": 2}))
    assert failed_command == {"output": "no", "exit_code": 2, "error": None}  # a result, not a failed call
    timed_out = tool_content("terminal", json.dumps({"output": "", "exit_code": -9, "timed_out": True}))
    assert timed_out["error"] == "command timed out" and timed_out["timed_out"] is True
    bad_args = tool_content("terminal", json.dumps({"error": "missing required argument 'command'"}))
    assert bad_args == {"output": "", "exit_code": -1, "error": "missing required argument 'command'"}
    assert tool_content("read_file", json.dumps({"content": "x"})) == {"content": "x", "error": None}
    assert tool_content("read_file", "plain text") == "plain text"


def test_system_prompt_sent_is_stored_after_the_preamble():
    record = _record([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  hi  "}], [])
    hermes, _, _ = convert(record, TOOLS)
    system, human = hermes["conversations"]
    assert system["value"].startswith("You are a function calling AI model.")
    assert system["value"].endswith("</tool_call>\n\nBe brief.")
    assert human == {"from": "human", "value": "  hi  "}  # as sent: nothing stripped


def test_a_merge_without_hermes_removes_a_stale_trajectories_file(ours, tmp_path):
    run_dir = ours.parent
    merge_run(run_dir, FilterConfig(), data_shard_records=100)
    assert not (run_dir / TRAJECTORIES_FILE).exists()
    merge_run(run_dir, FilterConfig(), data_shard_records=100, hermes=HermesOptions("r", "d", "mock", TOOLS))
    assert len(read_jsonl(run_dir / TRAJECTORIES_FILE)) == 10
