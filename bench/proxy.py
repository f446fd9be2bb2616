"""``proxy``: what raygen's model proxy for agent harnesses costs per model call (docs/agents.md).

The real ``ModelProxy`` in this process, in front of a model that answers at once with a fixed reply (one
tool call, reasoning): what this process spends is the proxy's own work per call (aiohttp, reading and
recording the request, the reply as JSON or server-sent events). A client in another process sends the
same request N times, one after another on one kept-alive connection, as a harness does:

- **direct**: to the proxy's unix socket;
- **forwarder**: to the loopback port of raygen's forwarder (``raygen/agents/forward.py``, run with the
  client as its command, as in a sandbox), which relays to the socket.

Sizes: a short request (system + user, 2 tool schemas, ~1 kB) and a long one (50 turns with 20 kB tool
outputs, ~1 MB), each without and with ``stream: true``. Figures: proxy CPU ms per call (this process's
``process_time``), and the client's wall ms per call (median) directly and through the forwarder; plus
``traffic.reconstruct`` CPU for a session of 50 such calls (the record at the session's end).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Context, Row
from raygen.agents.base import RecordedCall
from raygen.agents.command import FORWARDER
from raygen.agents.proxy import ModelProxy
from raygen.agents.traffic import reconstruct
from raygen.model.base import ChatModel, Completion

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("terminal", "read_file")
]
REPLY = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "I will look at the files first. " * 8,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
        }
    ],
}

CLIENT = r"""
import http.client, json, os, socket, statistics, sys, time
class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("proxy")
        self.path = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path)
body, n, target, token = open(sys.argv[1], "rb").read(), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if target == "env":
    host, port = os.environ["OPENAI_BASE_URL"][len("http://"):].split("/")[0].split(":")
    conn, prefix = http.client.HTTPConnection(host, int(port)), "/v1"
else:
    conn, prefix = Unix(target), "/v1"
headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
times = []
for _ in range(n):
    t = time.perf_counter()
    conn.request("POST", prefix + "/chat/completions", body, headers)
    response = conn.getresponse()
    data = response.read()
    assert response.status == 200, data[:300]
    times.append(time.perf_counter() - t)
print(json.dumps({"median_ms": 1000 * statistics.median(times)}))
"""


class InstantModel(ChatModel):
    name = "bench-instant"

    async def complete(self, messages, tools):
        return Completion(
            message=dict(REPLY), prompt_tokens=100, completion_tokens=20, finish_reason="tool_calls"
        )


def _conversation(turns: int, output_kb: int) -> list[dict]:
    messages = [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "Go."},
    ]
    for i in range(turns):
        call = {**REPLY["tool_calls"][0], "id": f"call_{i}"}
        messages.append({**REPLY, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "x" * (output_kb * 1024)})
    return messages


async def _measure(ctx: Context, body: dict, calls: int, forwarder: bool) -> tuple[float, float]:
    """(proxy CPU ms per call, client wall ms per call, median)."""
    proxy = ModelProxy(ctx.work / f"proxy-{os.getpid()}-{time.monotonic_ns()}")
    proxy.directory.mkdir(parents=True)
    await proxy.start()
    seat = proxy.open_seat(InstantModel(), max_calls=calls + 1)
    body_file = proxy.directory / "body.json"
    body_file.write_bytes(json.dumps(body).encode())
    client = proxy.directory / "client.py"
    client.write_text(CLIENT)
    if forwarder:
        folder = proxy.directory / "seat"
        folder.mkdir()
        os.link(proxy.socket_path, folder / "proxy.sock")
        (folder / "prompt.txt").write_text("Go.")
        command = shlex.join([sys.executable, str(client), str(body_file), str(calls), "env", seat.token])
        agent = {"command": command, "token": seat.token, "model": "m", "session_id": "bench"}
        (folder / "agent.json").write_text(json.dumps(agent))
        argv = [sys.executable, str(FORWARDER), str(folder)]
    else:
        argv = [sys.executable, str(client), str(body_file), str(calls), str(proxy.socket_path), seat.token]
    cpu = time.process_time()
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE)
    out, _ = await process.communicate()
    cpu = time.process_time() - cpu
    await proxy.close()
    assert process.returncode == 0 and len(seat.calls) == calls, out
    return 1000 * cpu / calls, json.loads(out.decode().strip().splitlines()[-1])["median_ms"]


def _reconstruct_ms(turns: int, output_kb: int) -> float:
    calls = []
    for i in range(1, turns + 1):
        messages = _conversation(i - 1, output_kb)
        calls.append(
            RecordedCall(
                "chat", False, messages, TOOLS, 0.0, response=dict(REPLY), finish_reason="tool_calls"
            )
        )
    t = time.process_time()
    traffic = reconstruct(calls)
    assert len(traffic.threads) == 1
    return 1000 * (time.process_time() - t)


def run(ctx: Context) -> list[Row]:
    calls = 100 if ctx.quick else 400
    sizes = {"short": _conversation(0, 0), "long (50 turns x 20 kB)": _conversation(50, 20)}
    rows, figures = [], {}
    for size, messages in sizes.items():
        for stream in (False, True):
            body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": stream}
            n = calls if size == "short" else max(20, calls // 10)
            cpu, direct = asyncio.run(_measure(ctx, body, n, forwarder=False))
            _, forwarded = asyncio.run(_measure(ctx, body, n, forwarder=True))
            label = f"{size}, {'stream' if stream else 'no stream'}"
            figures[label] = {"proxy_cpu_ms": cpu, "direct_ms": direct, "forwarder_ms": forwarded, "calls": n}
            rows.append(Row("proxy", f"{label}: proxy CPU ms/call", f"{cpu:.2f}", note=f"{n} calls"))
            rows.append(
                Row(
                    "proxy",
                    f"{label}: wall ms/call direct / via forwarder",
                    f"{direct:.2f} / {forwarded:.2f}",
                    note=f"{len(json.dumps(body)) / 1024:.1f} kB request; medians; model answers at once",
                )
            )
    rebuild = _reconstruct_ms(50, 20)
    figures["reconstruct_ms_50_calls"] = rebuild
    rows.append(
        Row(
            "proxy",
            "record of a 50-call session: reconstruct CPU ms",
            f"{rebuild:.1f}",
            note="20 kB tool outputs",
        )
    )
    ctx.results["proxy"] = figures
    return rows


if __name__ == "__main__":  # a quick look without the table machinery
    for row in run(Context(work=Path("/tmp/raygen-bench-proxy"), quick=True)):
        print(row)
