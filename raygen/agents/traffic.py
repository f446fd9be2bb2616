"""A trajectory from a harness's recorded model calls.

Threads: a call continues a thread when its messages begin with that thread's last call's messages and
answer (compared by role, text and tool calls' names and arguments: harnesses re-send earlier turns
with fields added or dropped, such as reasoning). A call that continues no thread starts one: a harness
that compacted its context, or a sub-agent. The main thread is the one of the session's last answered
call, the conversation the harness ended with; ``messages`` is that call's messages plus its answer.

From the main conversation: tools offered (its last call's ``tools``), tool calls per name (from the
answers; a call counts as a success when a ``tool`` message answers its id or when it is in the last
answer, which the harness acted on without asking the model again, such as mini-swe-agent's submit; else as
a failure), tool names not offered (hallucinated), reasoning per answer. Usage and turns count every
call of every thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from raygen.agents.base import RecordedCall
from raygen.agents.wire import content_text
from raygen.formats.reasoning import split_reasoning
from raygen.formats.records import ReasoningCounts, ThreadInfo, ToolStat, TurnInfo, Usage


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What must match for two messages to be the same turn (reasoning and ids left out)."""
    calls = tuple(
        (
            str((c.get("function") or {}).get("name", "")),
            json.dumps(_arguments((c.get("function") or {}).get("arguments")), sort_keys=True),
        )
        for c in message.get("tool_calls") or ()
        if isinstance(c, dict)
    )
    _, visible = split_reasoning(message) if message.get("role") == "assistant" else (None, None)
    text = visible if isinstance(visible, str) else content_text(message.get("content"))
    return (message.get("role"), text.strip(), calls)


@dataclass
class _Thread:
    calls: list[int] = field(default_factory=list)
    keys: list[tuple[Any, ...]] = field(default_factory=list)
    """Keys of the last call's messages plus its answer: what a continuing call begins with."""


def threads_of(calls: list[RecordedCall]) -> tuple[list[list[int]], int | None]:
    """(the calls of each thread, the index of the main thread or None when no call was answered)."""
    threads: list[_Thread] = []
    main = None
    for index, call in enumerate(calls):
        keys = [_key(m) for m in call.messages]
        chosen = None
        for number in range(len(threads) - 1, -1, -1):  # the latest thread first
            prefix = threads[number].keys
            if len(prefix) <= len(keys) and keys[: len(prefix)] == prefix:
                chosen = number
                break
        if chosen is None:
            threads.append(_Thread())
            chosen = len(threads) - 1
        thread = threads[chosen]
        thread.calls.append(index)
        if call.response is not None:
            thread.keys = [*keys, _key(call.response)]
            main = chosen
        else:
            thread.keys = keys
    return [t.calls for t in threads], main


def conversation(call: RecordedCall) -> list[dict[str, Any]]:
    """A call's messages plus its answer (if it got one)."""
    messages = [dict(m) for m in call.messages]
    if call.response is not None:
        messages.append(dict(call.response))
    return messages


@dataclass
class Traffic:
    """What the record takes from a harness session's calls."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    threads: list[ThreadInfo]
    tool_stats: dict[str, ToolStat]
    hallucinated: list[str]
    reasoning: ReasoningCounts
    usage: Usage
    turns: list[TurnInfo]
    final_answer: bool
    """The main thread's last answer calls no tool (the harness's answer)."""


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    names = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            names.append(str(fn["name"]))
    return names


def _tool_use(messages: list[dict[str, Any]], offered: set[str]) -> tuple[dict[str, ToolStat], list[str]]:
    answered = {str(m.get("tool_call_id", "")) for m in messages if m.get("role") == "tool"}
    last = messages[-1] if messages else {}
    stats: dict[str, ToolStat] = {name: ToolStat() for name in sorted(offered)}
    hallucinated = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            name = str((call.get("function") or {}).get("name", ""))
            if offered and name not in offered:
                hallucinated.append(name)
            stat = stats.setdefault(name, ToolStat())
            stat.count += 1
            if str(call.get("id", "")) in answered or message is last:
                stat.success += 1
            else:
                stat.failure += 1
    return stats, hallucinated


def reconstruct(calls: list[RecordedCall]) -> Traffic:
    """The record's conversation and counts from a session's calls, in the order they were made."""
    groups, main = threads_of(calls)
    answered = [c for c in calls if c.response is not None]
    reasoning = ReasoningCounts()
    for call in answered:
        thought, _ = split_reasoning(call.response)
        if thought:
            reasoning.with_reasoning += 1
        else:
            reasoning.without_reasoning += 1
    usage = Usage(
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        completion_tokens=sum(c.completion_tokens for c in calls),
    )
    turns = [TurnInfo(finish_reason=c.finish_reason, provider=c.provider) for c in answered]
    if main is None:  # no call was answered: the first call's messages, if any, are all there is
        messages = conversation(calls[0]) if calls else []
        tools = calls[0].tools if calls else []
    else:
        last = calls[max(i for i in groups[main] if calls[i].response is not None)]
        messages, tools = conversation(last), last.tools
    stats, hallucinated = _tool_use(messages, set(tool_names(tools)))
    threads = [
        ThreadInfo(
            calls=group,
            main=number == main,
            messages=[] if number == main else conversation(calls[group[-1]]),
        )
        for number, group in enumerate(groups)
    ]
    final = bool(messages) and messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls")
    return Traffic(messages, tools, threads, stats, hallucinated, reasoning, usage, turns, final)
