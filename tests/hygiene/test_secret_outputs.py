"""Secret values stay out of trajectories (even when a tool prints them), and the run-level check counts
any that reach the output files."""

from __future__ import annotations

import json
from typing import Any

from raygen.config import FakeEnvConfig, RunConfig, SessionConfig
from raygen.hygiene import count_secret_leaks, host_secret_values
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import ChatModel, Completion
from raygen.run.plan import check_dataset
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

ROW_SECRET = "rowtok-5e3f9a1c"
API_KEY = "sk-test-0123456789abcdef"


class EchoModel(ChatModel):
    """Asks the terminal to print the given command's output, then echoes back what it saw."""

    name = "echo-model"

    def __init__(self, command: str):
        self.command = command
        self.seen_tool_output: list[str] = []

    async def complete(self, messages, tools) -> Completion:
        if messages[-1]["role"] == "tool":
            self.seen_tool_output.append(messages[-1]["content"])
            return Completion(message={"role": "assistant", "content": f"It said: {messages[-1]['content']}"})
        call = {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": ""}}
        call["function"]["arguments"] = json.dumps({"command": self.command})
        return Completion(message={"role": "assistant", "content": "", "tool_calls": [call]})


async def run_session(
    model: ChatModel, env: dict[str, str], secret_env: list[str], secrets: list[str]
) -> Any:
    runner = SessionRunner(
        model=model,
        registry=load_registry([]),
        env_config=FakeEnvConfig(),
        session=SessionConfig(secret_env=secret_env),
        secret_values=secrets,
    )
    sample = Sample(
        row=PromptRow(prompt="Print the variables.", env=env),
        sample_key="k" * 24,
        prompt_index=0,
        line=1,
        toolsets=["terminal"],
    )
    return await runner.run(sample)


async def test_a_secret_env_value_printed_by_a_tool_is_redacted_everywhere():
    model = EchoModel('echo "token=$SERVICE_TOKEN plain=$PLAIN_VALUE"')
    env = {"SERVICE_TOKEN": ROW_SECRET, "PLAIN_VALUE": "visible-42"}
    record = await run_session(model, env, secret_env=["SERVICE_TOKEN"], secrets=[API_KEY])
    tool_messages = [m["content"] for m in record.messages if m["role"] == "tool"]
    # The variable reached the environment (the command printed something in its place) ...
    assert "token=[REDACTED]" in tool_messages[0] and "plain=visible-42" in tool_messages[0]
    # ... the model never saw the value, and the record holds it nowhere.
    assert ROW_SECRET not in "".join(model.seen_tool_output)
    assert ROW_SECRET not in record.model_dump_json()


async def test_undeclared_variables_are_left_alone():
    record = await run_session(EchoModel("echo $SERVICE_TOKEN"), {"SERVICE_TOKEN": ROW_SECRET}, [], [])
    assert ROW_SECRET in record.model_dump_json()  # the control: without secret_env nothing is redacted


def test_leak_check_counts_raw_and_json_escaped_values(tmp_path):
    quoted = 'pa"ss\\word9'  # JSON-escaped in a .jsonl file: pa\"ss\\\\word9
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train-00001-of-00001.jsonl").write_text(
        json.dumps({"m": f"x {API_KEY} y {API_KEY}"}) + "\n" + json.dumps({"m": quoted}) + "\n"
    )
    (tmp_path / "data" / "train-00001-of-00001.parquet").write_bytes(API_KEY.encode())  # skipped
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / "failed-00001.jsonl").write_text(json.dumps({"e": ROW_SECRET}) + "\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "pending-0.jsonl").write_text(ROW_SECRET)  # inputs, not output: skipped
    (tmp_path / "manifest.json").write_text("{}")
    result = count_secret_leaks(tmp_path, [API_KEY, ROW_SECRET, quoted, "short", ""])
    assert result == {
        "secret_values_checked": 3,  # values under 6 characters are never redacted, so never counted
        "secret_leaks": 4,
        "secret_leaks_by_folder": {"data": 3, "failed": 1},
    }
    assert API_KEY not in json.dumps(result) and ROW_SECRET not in json.dumps(result)
    assert count_secret_leaks(tmp_path, [])["secret_leaks"] == 0
    assert count_secret_leaks(tmp_path / "missing", [API_KEY])["secret_leaks"] == 0


def test_secret_values_from_host_and_rows(tmp_path):
    assert host_secret_values(["A", "B", "C"], {"A": "va", "C": ""}) == ["va"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"prompt": "a", "env": {"TOKEN": "t-one", "OTHER": "o"}},
                {"prompt": "b"},
                {"prompt": "c", "env": {"TOKEN": "t-two"}},
                {"prompt": 5},  # invalid
            )
        )
    )
    prompts.write_text(prompts.read_text().rsplit("\n", 1)[0])  # the driver reads only valid files

    def row_secrets(names: list[str], limit: int | None = None) -> set[str]:
        config = RunConfig.model_validate({"session": {"secret_env": names}, "limit": limit})
        return check_dataset(config, prompts, known_toolsets=set()).row_secrets

    assert row_secrets(["TOKEN"]) == {"t-one", "t-two"}
    assert row_secrets(["TOKEN"], limit=1) == {"t-one"}
    assert row_secrets([]) == set()
