"""The simulator over HTTP: the openai SDK parses it, rate limits, 5xx, 404, logs, threads, subprocess."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import openai
import pytest

from raygen.config import SimConfig
from raygen.model.sim_policy import plan_for
from raygen.sim.launch import start_in_thread, start_subprocess
from raygen.sim.server import SimServer

FAKE_KEY = "sk-test-SECRET123"
TOOLS = [
    {"type": "function", "function": {"name": n, "description": n, "parameters": {"type": "object"}}}
    for n in ("terminal", "write_file", "read_file")
]


def fast(**kw) -> SimConfig:
    return SimConfig(latency_s=0.0, **kw)


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=FAKE_KEY, max_retries=0, timeout=10)


async def test_openai_sdk_parses_replies_and_keeps_reasoning_content():
    async with SimServer(fast(reasoning_style="field")) as sim, client(sim.url) as ai:
        messages = [{"role": "user", "content": "check the box"}]
        resp = await ai.chat.completions.create(model="raygen-sim", messages=messages, tools=TOOLS)
    assert resp.object == "chat.completion" and resp.id and resp.created > 0 and resp.model == "raygen-sim"
    choice = resp.choices[0]
    assert choice.index == 0 and choice.finish_reason == "tool_calls"
    names = [tc.function.name for tc in choice.message.tool_calls]
    assert names == ["terminal", "write_file"]
    assert json.loads(choice.message.tool_calls[0].function.arguments)["command"]
    assert choice.message.model_extra["reasoning_content"]
    assert choice.message.model_dump()["reasoning_content"] == choice.message.model_extra["reasoning_content"]
    assert resp.usage.prompt_tokens >= 1 and resp.usage.completion_tokens >= 1
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


async def test_full_session_through_the_sdk():
    """The SDK's messages, sent back as the agent loop would, lead to a verified final answer."""
    files: dict[str, str] = {}
    prompt = "full session"
    nonce = plan_for(prompt, SimConfig()).nonce
    async with SimServer(fast()) as sim, client(sim.url) as ai:
        messages: list[dict] = [{"role": "user", "content": prompt}]
        for _ in range(6):
            resp = await ai.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            msg = resp.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            for tc in msg.tool_calls:
                args = json.loads(tc.function.arguments)
                if tc.function.name == "terminal":
                    out = f"raygen-{nonce}-42\n"  # what sh prints for the command (see test_policy)
                elif tc.function.name == "write_file":
                    files[args["path"]] = args["content"]
                    out = "ok"
                else:
                    out = files.get(args["path"], "missing")
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": out})
    assert "RAYGEN-VERIFY terminal=ok file=ok" in messages[-1]["content"]


async def test_models_and_unknown_model():
    async with SimServer(fast()) as sim, client(sim.url) as ai:
        models = await ai.models.list()
        assert [m.id for m in models.data] == ["raygen-sim"]
        with pytest.raises(openai.NotFoundError) as err:
            await ai.chat.completions.create(
                model="nonexistent-model", messages=[{"role": "user", "content": "x"}]
            )
        assert err.value.code == "model_not_found"
        assert sim.stats.counts["4xx"] == 1 and sim.stats.counts["ok"] == 0


async def test_rate_limit_answers_429_with_retry_after():
    async with SimServer(fast(rate_limit_rpm=6, rate_limit_burst=2)) as sim, client(sim.url) as ai:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        ok = await ai.chat.completions.with_raw_response.create(**body)
        assert ok.headers["x-ratelimit-limit-requests"] == "6"
        assert ok.headers["x-ratelimit-remaining-requests"] == "1"
        assert ok.headers["x-ratelimit-reset-requests"].endswith("ms")
        await ai.chat.completions.create(**body)
        with pytest.raises(openai.RateLimitError) as err:
            await ai.chat.completions.create(**body)
        headers = err.value.response.headers
        # 6 rpm refills one token per 10 s: the next one is 9-10 s away.
        assert 9 <= int(headers["Retry-After"]) <= 10
        assert 8000 < int(headers["retry-after-ms"]) <= 10000
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert err.value.code == "rate_limit_exceeded"
        stats = sim.stats.snapshot()
        assert (stats["requests"], stats["ok"], stats["429"]) == (3, 2, 1)
        assert sum(stats["accepted_per_second"].values()) == 2


async def test_rate_limit_headers_off_leave_only_retry_after():
    cfg = fast(rate_limit_rpm=6, rate_limit_burst=1, rate_limit_headers=False)
    async with SimServer(cfg) as sim, client(sim.url) as ai:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        ok = await ai.chat.completions.with_raw_response.create(**body)
        assert not [h for h in ok.headers if h.lower().startswith("x-ratelimit")]
        with pytest.raises(openai.RateLimitError) as err:
            await ai.chat.completions.create(**body)
        headers = err.value.response.headers
        assert not [h for h in headers if h.lower().startswith("x-ratelimit")]
        assert 9 <= int(headers["Retry-After"]) <= 10 and 8000 < int(headers["retry-after-ms"]) <= 10000
        assert sim.stats.snapshot()["429"] == 1


async def test_error_rate_and_stats_reset():
    async with SimServer(fast(error_rate=0.5, seed=5)) as sim, aiohttp.ClientSession() as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        statuses = []
        for _ in range(200):
            async with http.post(f"{sim.url}/chat/completions", json=body) as r:
                statuses.append(r.status)
                if r.status >= 500:
                    assert (await r.json())["error"]["type"] == "server_error"
        assert set(statuses) <= {200, 500, 503}
        assert 60 < sum(s >= 500 for s in statuses) < 140
        async with http.get(f"{sim.url.removesuffix('/v1')}/sim/stats") as r:
            stats = await r.json()
        assert stats["5xx"] == sum(s >= 500 for s in statuses) and stats["requests"] == 200
        async with http.post(f"{sim.url.removesuffix('/v1')}/sim/reset") as r:
            assert r.status == 200
        assert sim.stats.snapshot()["requests"] == 0


async def test_bad_requests_get_400():
    # (``stream: true`` is supported: tests/sim/test_server_streaming.py)
    async with (
        SimServer(fast()) as sim,
        aiohttp.ClientSession() as http,
        http.post(f"{sim.url}/chat/completions", data=b"{not json") as r,
    ):
        assert r.status == 400


async def test_many_concurrent_connections():
    async with SimServer(SimConfig(latency_s=0.5)) as sim:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def one(i: int) -> int:
                body = {"model": "m", "messages": [{"role": "user", "content": f"p{i}"}]}
                async with http.post(f"{sim.url}/chat/completions", json=body) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(one(i) for i in range(200)))
        assert statuses == [200] * 200
        assert sim.stats.max_in_flight >= 20  # served concurrently, not one after another


async def test_log_has_one_line_per_request_and_no_key(tmp_path):
    log = tmp_path / "sim" / "requests.jsonl"
    cfg = fast(log_path=log, rate_limit_rpm=60, rate_limit_burst=2)
    async with SimServer(cfg) as sim, client(sim.url) as ai:
        messages = [{"role": "user", "content": "log me"}]
        await ai.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        await ai.chat.completions.create(model="m", messages=messages, extra_headers={"X-Api-Key": FAKE_KEY})
        with pytest.raises(openai.RateLimitError):
            await ai.chat.completions.create(model="m", messages=messages)
    text = log.read_text()
    assert "SECRET123" not in text and "Bearer" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["status"] for line in lines] == [200, 200, 429]
    first = lines[0]
    assert len(first["prompt_sha"]) == 16 and first["turn"] == 0
    assert first["tool_calls"] == ["terminal", "write_file"]
    assert first["decision"]["nonce"] == plan_for("log me", SimConfig()).nonce
    assert 0 < lines[2]["decision"]["retry_after_s"] <= 1  # a 429 logs how long it asked to wait


def _post_sync(url: str) -> dict:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "sync"}]}).encode()
    req = urllib.request.Request(
        f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_start_in_thread():
    handle = start_in_thread(fast())
    try:
        assert handle.url.startswith("http://127.0.0.1:") and handle.url.endswith("/v1")
        assert _post_sync(handle.url)["choices"][0]["finish_reason"] == "stop"
    finally:
        handle.stop()
    with pytest.raises(OSError):
        _post_sync(handle.url)


def test_subprocess_start_stop_flushes_log(tmp_path):
    log = tmp_path / "requests.jsonl"
    proc = start_subprocess(fast(log_path=log))
    try:
        assert _post_sync(proc.url)["object"] == "chat.completion"
    finally:
        proc.stop()
    assert proc.proc.returncode is not None
    assert [json.loads(line)["status"] for line in log.read_text().splitlines()] == [200]
    with pytest.raises(OSError):
        _post_sync(proc.url)
