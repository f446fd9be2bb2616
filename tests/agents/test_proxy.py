"""The model proxy with the real OpenAI and Anthropic SDKs over its unix socket, streaming and not."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx2
import openai
import pytest

from raygen.agents.proxy import ModelProxy
from raygen.config import ScriptedModelConfig, SimConfig
from raygen.errors import SessionFailure
from raygen.model.base import SAMPLE_INDEX, ChatModel, Completion
from raygen.model.scripted import ScriptedModel

TOOLS = [
    {"type": "function", "function": {"name": "terminal", "parameters": {"type": "object", "properties": {}}}}
]
PROMPT = [{"role": "user", "content": "Check the environment."}]


@pytest.fixture
async def proxy():
    proxy = ModelProxy()
    await proxy.start()
    yield proxy
    await proxy.close()
    assert not proxy.directory.exists()


def scripted() -> ScriptedModel:
    return ScriptedModel(
        ScriptedModelConfig(), SimConfig(hallucinate_rate=0, no_reasoning_rate=0, reasoning_style="field")
    )


def transport(proxy: ModelProxy) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(proxy.socket_path)))


def openai_client(proxy: ModelProxy, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=token, base_url="http://proxy/v1", http_client=transport(proxy), max_retries=0
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_is_forwarded_and_recorded(proxy, stream):
    seat = proxy.open_seat(scripted(), max_calls=5)
    client = openai_client(proxy, seat.token)
    if stream:
        chunks = await client.chat.completions.create(
            model="anything",
            messages=PROMPT,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        calls, usage, finish = [], None, None
        async for chunk in chunks:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                calls += choice.delta.tool_calls or []
                finish = choice.finish_reason or finish
        names = [c.function.name for c in calls]
        assert usage is not None and usage.completion_tokens > 0
    else:
        completion = await client.chat.completions.create(model="anything", messages=PROMPT, tools=TOOLS)
        message = completion.choices[0].message
        names, finish = [c.function.name for c in message.tool_calls], completion.choices[0].finish_reason
        assert completion.model == "raygen-scripted"  # the run's model answers, whatever the harness asks
        assert message.model_extra.get("reasoning_content")  # reasoning passes through
    assert names == ["terminal"] and finish == "tool_calls"
    [call] = seat.calls
    assert call.api == "chat" and call.stream is stream
    assert call.messages == PROMPT and call.tools == TOOLS
    assert call.response["tool_calls"][0]["function"]["name"] == "terminal"
    assert call.prompt_tokens > 0 and seat.in_flight == 0
    await client.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_messages_are_translated_both_ways(proxy, stream):
    seat = proxy.open_seat(scripted(), max_calls=5)
    client = anthropic.AsyncAnthropic(
        api_key=seat.token, base_url="http://proxy", http_client=transport(proxy), max_retries=0
    )
    tools = [{"name": "terminal", "description": "Run a command.", "input_schema": {"type": "object"}}]
    request = {
        "model": "claude-anything",
        "max_tokens": 1024,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Check the environment."}],
        "tools": tools,
    }
    if stream:
        async with client.messages.stream(**request) as events:
            message = await events.get_final_message()
    else:
        message = await client.messages.create(**request)
    kinds = [block.type for block in message.content]
    assert kinds == ["thinking", "tool_use"] and message.stop_reason == "tool_use"
    use = message.content[1]
    assert use.name == "terminal" and "printf" in use.input["command"]
    assert message.usage.output_tokens > 0
    # The second turn: the tool's result goes back as a tool_result block, and becomes a tool message.
    request["messages"] += [
        {"role": "assistant", "content": [b.model_dump() for b in message.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "raygen-x-42"}],
        },
    ]
    await client.messages.create(**request)
    first, second = seat.calls
    assert first.api == "messages" and first.stream is stream
    assert first.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Check the environment."},
    ]
    assert first.tools[0]["function"]["name"] == "terminal"
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool"]
    assert second.messages[2]["tool_calls"][0]["id"] == use.id
    assert second.messages[3] == {"role": "tool", "tool_call_id": use.id, "content": "raygen-x-42"}
    await client.close()


async def test_tokens_are_per_session_and_end_with_it(proxy):
    seat = proxy.open_seat(scripted(), max_calls=5)
    stranger = openai_client(proxy, "not-a-token")
    with pytest.raises(openai.AuthenticationError):
        await stranger.chat.completions.create(model="m", messages=PROMPT)
    proxy.close_seat(seat)
    late = openai_client(proxy, seat.token)
    with pytest.raises(openai.AuthenticationError, match="ended"):
        await late.chat.completions.create(model="m", messages=PROMPT)
    assert seat.late_calls == 1 and seat.calls == []
    await stranger.close()
    await late.close()


async def test_the_call_past_max_turns_is_refused_with_a_final_error(proxy):
    seat = proxy.open_seat(scripted(), max_calls=1)
    client = openai_client(proxy, seat.token)
    await client.chat.completions.create(model="m", messages=PROMPT, tools=TOOLS)
    assert not seat.stop.is_set()
    with pytest.raises(openai.BadRequestError, match="max_turns"):  # 400: harnesses do not retry it
        await client.chat.completions.create(model="m", messages=PROMPT, tools=TOOLS)
    assert seat.refused == "max_turns" and seat.stop.is_set() and len(seat.calls) == 1
    await client.close()


class FailingModel(ChatModel):
    name = "failing"

    async def complete(self, messages, tools):
        raise SessionFailure("provider_auth", "HTTP 401: bad key")


async def test_a_provider_failure_reaches_the_harness_as_final_and_the_session_as_its_kind(proxy):
    seat = proxy.open_seat(FailingModel(), max_calls=5)
    client = openai_client(proxy, seat.token)
    with pytest.raises(openai.BadRequestError, match="provider_auth"):
        await client.chat.completions.create(model="m", messages=PROMPT)
    assert seat.failure.kind == "provider_auth" and seat.stop.is_set()
    assert seat.calls[0].response is None and "401" in seat.calls[0].error
    await client.close()


class SeedModel(ChatModel):
    name = "seed"

    async def complete(self, messages, tools):
        return Completion(message={"role": "assistant", "content": str(SAMPLE_INDEX.get())})


async def test_each_call_runs_in_its_sessions_context(proxy):
    token = SAMPLE_INDEX.set(3)  # a sample of a group: its calls ask for their own seed
    seat = proxy.open_seat(SeedModel(), max_calls=5)
    SAMPLE_INDEX.reset(token)
    client = openai_client(proxy, seat.token)
    completion = await client.chat.completions.create(model="m", messages=PROMPT)
    assert completion.choices[0].message.content == "3"
    await client.close()


async def test_bad_bodies_are_told_apart_from_model_failures(proxy):
    seat = proxy.open_seat(scripted(), max_calls=5)
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    body = json.dumps({"messages": "not a list"}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer {seat.token}\r\n"
    writer.write(head.encode() + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    answer = (await reader.read()).decode()
    writer.close()
    assert answer.startswith("HTTP/1.1 400") and "messages must be a list" in answer
    assert seat.calls == [] and seat.failure is None


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_responses_are_translated_both_ways(proxy, stream):
    seat = proxy.open_seat(scripted(), max_calls=5)
    client = openai_client(proxy, seat.token)
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}]
    request = {
        "model": "gpt-anything",
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Check it."}]}
        ],
        "tools": [*tools, {"type": "web_search"}],  # a provider-side tool: not forwarded
    }
    if stream:
        events = [event async for event in await client.responses.create(**request, stream=True)]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        response = events[-1].response
    else:
        response = await client.responses.create(**request)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "function_call"] and response.usage.output_tokens > 0
    call = response.output[1]
    assert call.name == "exec_command" and "printf" in json.loads(call.arguments)["cmd"]
    # The second turn: the call and its output go back as items, and become a tool call and its result.
    request["input"] += [
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "raygen-x-42"},
    ]
    final = await client.responses.create(**request)
    assert final.output[-1].type == "message" and "RAYGEN-VERIFY" in final.output_text
    first, second = seat.calls
    assert first.api == "responses" and first.stream is stream
    assert first.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Check it."},
    ]
    assert [t["function"]["name"] for t in first.tools] == ["exec_command"]
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool"]
    assert second.messages[2]["tool_calls"][0]["id"] == call.call_id
    assert second.messages[3] == {"role": "tool", "tool_call_id": call.call_id, "content": "raygen-x-42"}
    await client.close()


async def test_a_new_proxy_removes_the_folders_of_proxies_whose_process_died(tmp_path, monkeypatch):
    import subprocess
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead_pid = subprocess.Popen(["true"])  # a finished process: its pid names no live process
    dead_pid.wait()
    orphan = tmp_path / f"raygen-agent-proxy-{dead_pid.pid}-abcd"
    orphan.mkdir()
    (orphan / "proxy.sock").write_text("")
    ours = ModelProxy()
    assert not orphan.exists() and ours.directory.parent == tmp_path
    again = ModelProxy()  # a live process's folder stays
    assert ours.directory.exists()
    await ours.close()
    await again.close()
