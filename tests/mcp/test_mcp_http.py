"""MCP servers reached by URL: a server built with the official SDK over streamable HTTP on loopback
(tests/mcp/servers/http_server.py), with a bearer token from the driver's environment; and ``shared``
stdio servers, one per actor process."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from raygen.config import FakeEnvConfig, LocalEnvConfig
from raygen.errors import ConfigError
from raygen.tools.mcp_tools import close_shared
from tests.mcp.helpers import (
    DONE,
    SERVERS,
    ListModel,
    call,
    mcp_runner,
    sample,
    scripted,
    tool_messages,
    turn,
)

TOKEN = "bearer-" + "7" * 24


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(*args: str):
    port = free_port()
    server = subprocess.Popen([sys.executable, str(SERVERS / "http_server.py"), str(port), *args])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert server.poll() is None, "the HTTP MCP server exited"
            time.sleep(0.1)
    return server, port


@pytest.fixture(scope="module")
def http_url():
    server, port = start_server(TOKEN)
    yield f"http://127.0.0.1:{port}/mcp"
    server.terminate()
    server.wait(10)


@pytest.fixture(scope="module")
def sse_url():
    server, port = start_server("-", "sse")
    yield f"http://127.0.0.1:{port}/sse"
    server.terminate()
    server.wait(10)


async def test_http_server_with_a_secret_header(http_url):
    servers = {"remote": {"url": http_url, "headers": {"Authorization": "Bearer ${REMOTE_TOKEN}"}}}
    model = ListModel(
        [
            turn(call("remote__add", {"a": 2, "b": 40}, "a"), call("remote__add", {"a": "x"}, "bad")),
            turn(call("remote__counter", {}, "c1")),
            turn(call("remote__counter", {}, "c2")),
            DONE,
        ]
    )
    runner = await mcp_runner(servers, FakeEnvConfig(), model, values={"REMOTE_TOKEN": TOKEN})
    record = await runner.run(sample(["remote"]))
    assert record.exit_status == "completed", record.error
    results = tool_messages(record)
    assert results["a"] == "42"
    assert "error" in results["bad"] and record.tool_stats["remote__add"].failure == 1
    first, second = int(results["c1"].split()[1]), int(results["c2"].split()[1])
    assert second == first + 1  # one server, its state kept between calls
    assert record.mcp_servers[0]["placement"] == "remote" and record.mcp_servers[0]["transport"] == "http"
    assert TOKEN not in record.model_dump_json()


async def test_http_server_refusing_the_token_stops_the_preflight(http_url):
    servers = {"remote": {"url": http_url, "headers": {"Authorization": "Bearer wrong"}}}
    with pytest.raises(ConfigError, match="'remote' did not start"):
        await mcp_runner(servers, FakeEnvConfig(), ListModel([]))


async def test_shared_server_serves_every_session_of_the_process(tmp_path):
    server = {**scripted(), "shared": True}

    def script() -> ListModel:
        return ListModel([turn(call("s__pid", {}, "p")), DONE])

    runner = await mcp_runner({"s": server}, LocalEnvConfig(root=str(tmp_path)), script())
    pids = []
    try:
        for key in "ab":
            runner.model = script()
            record = await runner.run(sample(["s"], key=key))
            assert record.exit_status == "completed", record.error
            assert record.mcp_servers[0]["placement"] == "actor"
            pids.append(tool_messages(record)["p"])
        assert pids[0] == pids[1]  # the same process answered both sessions
    finally:
        await close_shared()


async def test_sse_server(sse_url):
    model = ListModel([turn(call("old__add", {"a": 1, "b": 2}, "a")), DONE])
    runner = await mcp_runner({"old": {"type": "sse", "url": sse_url}}, FakeEnvConfig(), model)
    record = await runner.run(sample(["old"]))
    assert record.exit_status == "completed", record.error
    assert tool_messages(record)["a"] == "3"
    assert record.mcp_servers[0]["transport"] == "sse"
