"""Prefill messages and the ephemeral system prompt are sent with every call, and not stored unless asked."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import pytest

from raygen.config import FakeEnvConfig, SessionConfig
from raygen.errors import ConfigError
from raygen.formats.prompting import load_prefill
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import ChatModel, Completion
from raygen.output.hermes import convert
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

PREFILL = [
    {"role": "user", "content": "Example: list files."},
    {"role": "assistant", "content": "I would run ls."},
]


class Seen(ChatModel):
    name = "seen"

    def __init__(self) -> None:
        self.sent: list[list[dict[str, Any]]] = []

    async def complete(self, messages, tools) -> Completion:
        self.sent.append([dict(m) for m in messages])
        return Completion({"role": "assistant", "content": "done"}, finish_reason="stop")


def run(tmp_path, **session: Any):
    prefill = tmp_path / "prefill.json"
    prefill.write_text(json.dumps(PREFILL), encoding="utf-8")
    model = Seen()
    runner = SessionRunner(
        model=model,
        registry=load_registry([]),
        env_config=FakeEnvConfig(),
        session=SessionConfig(prefill_messages_file=prefill, **session),
    )
    sample = Sample(
        row=PromptRow(prompt="task"), sample_key="k" * 24, prompt_index=0, line=1, toolsets=["terminal"]
    )
    return asyncio.run(runner.run(sample)), model.sent[0]


def test_sent_but_not_stored(tmp_path):
    record, sent = run(tmp_path, system_prompt="Be brief.", ephemeral_system_prompt="Secret guidance.")
    assert sent[0] == {"role": "system", "content": "Be brief.\n\nSecret guidance."}
    assert sent[1:3] == PREFILL and sent[3] == {"role": "user", "content": "task"}
    stored = json.dumps(record.model_dump(mode="json"))
    assert "Secret guidance." not in stored and "Example: list files." not in stored
    assert record.messages[0] == {"role": "system", "content": "Be brief."}
    hermes, _, _ = convert(record.model_dump(mode="json"), ["terminal"])
    assert "Secret guidance." not in json.dumps(hermes)


def test_stored_when_asked(tmp_path):
    record, sent = run(tmp_path, store_prefill=True, ephemeral_system_prompt="Only sent.")
    assert sent[0] == {"role": "system", "content": "Only sent."}
    assert [m["content"] for m in record.messages[:3]] == ["Example: list files.", "I would run ls.", "task"]
    assert sent[1:] == record.messages[:-1]  # the stored conversation, as it was sent
    assert "Only sent." not in json.dumps(record.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"role": "user"}', "must be a JSON list"),
        ('[{"role": "tool", "content": "x"}]', "message 0: field 'role'"),
        ('[{"role": "user", "content": 3}]', "message 0: field 'content'"),
    ],
)
def test_bad_prefill_files_name_the_file_and_the_message(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as info:
        load_prefill(path)
    assert str(path) in str(info.value)


def test_the_ephemeral_system_prompt_is_recorded_only_as_a_hash():
    # issue 28 case 9: the docs say it is never stored, yet manifest.json held it twice (config, generation).
    from raygen.config import RunConfig, fingerprint
    from raygen.run.generation import Generation, recorded_config

    text = "EPHEMERAL-GUIDANCE: never store me."
    config = RunConfig.model_validate({"session": {"ephemeral_system_prompt": text}})
    generation = Generation.build(config)
    recorded = json.dumps({"config": recorded_config(config), "generation": generation.settings})
    assert "EPHEMERAL-GUIDANCE" not in recorded
    digest = generation.settings["ephemeral_system_prompt"]["sha256"]
    assert digest == hashlib.sha256(text.encode()).hexdigest()
    # The fingerprint is the one runs made before had (the text itself hashed), so they resume unchanged,
    # and another text is another fingerprint.
    assert generation.fingerprint == fingerprint({**generation.settings, "ephemeral_system_prompt": text})
    other = RunConfig.model_validate({"session": {"ephemeral_system_prompt": text + "!"}})
    assert Generation.build(other).fingerprint != generation.fingerprint
    assert Generation.build(RunConfig()).settings.get("ephemeral_system_prompt") is None
