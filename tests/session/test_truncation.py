"""A reply cut at the token limit is not an answer: the session ends ``truncated``, not ``completed``."""

from __future__ import annotations

from typing import Any

from raygen.config import FakeEnvConfig, FilterConfig, SessionConfig
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import ChatModel, Completion
from raygen.output.filters import classify
from raygen.output.hermes import convert
from raygen.output.summary import summarize
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry


class Replies(ChatModel):
    name = "replies"

    def __init__(self, replies: list[Completion]):
        self.replies = replies

    async def complete(self, messages, tools) -> Completion:
        return self.replies.pop(0)


def run(replies: list[Completion], **session: Any):
    import asyncio

    runner = SessionRunner(
        model=Replies(replies),
        registry=load_registry([]),
        env_config=FakeEnvConfig(),
        session=SessionConfig(**session),
    )
    sample = Sample(
        row=PromptRow(prompt="hi"), sample_key="k" * 24, prompt_index=0, line=1, toolsets=["terminal"]
    )
    return asyncio.run(runner.run(sample))


def call() -> dict[str, Any]:
    return {
        "id": "c1",
        "type": "function",
        "function": {"name": "terminal", "arguments": '{"command": "echo a"}'},
    }


def test_length_ends_the_session_truncated_and_the_merge_rejects_it():
    cut = Completion(
        {"role": "assistant", "content": "The answer is", "tool_calls": [call()]}, finish_reason="length"
    )
    record = run([cut])
    assert (record.exit_status, record.completed, record.api_calls) == ("truncated", False, 1)
    assert [t.finish_reason for t in record.turns] == ["length"]
    assert record.tool_stats["terminal"].count == 0  # the cut reply's tool call never ran
    summary = summarize(record.model_dump(mode="json"))
    assert classify(summary, FilterConfig(no_reasoning=False)) == ("rejected", "truncated")
    assert classify(summary, FilterConfig(no_reasoning=False, truncated=False)) == ("kept", None)
    hermes, _, _ = convert(record.model_dump(mode="json"), ["terminal"])
    assert (hermes["completed"], hermes["partial"]) == (False, True)


def test_turns_record_finish_reasons_and_the_serving_provider():
    first = Completion(
        {"role": "assistant", "content": None, "tool_calls": [call()]}, finish_reason="tool_calls"
    )
    first.extra["provider"] = "Upstream-A"
    record = run([first, Completion({"role": "assistant", "content": "done"}, finish_reason="stop")])
    assert record.exit_status == "completed"
    assert [(t.finish_reason, t.provider) for t in record.turns] == [
        ("tool_calls", "Upstream-A"),
        ("stop", None),
    ]


def test_max_turns_says_so():
    replies = [
        Completion({"role": "assistant", "content": None, "tool_calls": [call()]}, finish_reason="tool_calls")
    ]
    record = run(replies * 2, max_turns=2)
    assert (record.exit_status, record.completed, record.api_calls) == ("max_turns", False, 2)
    hermes, _, _ = convert(record.model_dump(mode="json"), ["terminal"])
    assert (hermes["completed"], hermes["partial"]) == (False, True)
