"""What MCP tool servers cost: per call against the built-in ``terminal``, to start one per session on the
local and Docker backends, and in sessions/s at 64 sessions in flight.

In-process, no Ray (the figures are the session's own), against the real ``mcp-server-time`` (PyPI):

- **per call**: one session's environment, one server already started; ``time__get_current_time`` and
  ``terminal`` (``date``) called alternately, one at a time. Median wall ms per call; the server's own
  CPU per call is read from /proc (its process group), the terminal's commands run under the actor's
  spawner, so their CPU is not in this process's figures either.
- **start**: ``McpConnection.open`` in a fresh environment: process start, ``initialize``, ``tools/list``
  (median of N, environment start not included).
- **sessions/s**: ``SessionRunner.run`` over N samples, 64 at a time, with the simulator's script
  (``ScriptedModel``, 0.2 s per model call). With the ``time`` server the script also calls its two
  tools, so every session starts its own server (or, ``shared: true``, uses the process's one); without,
  the same sessions offer terminal and file only.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

from bench.common import Context, Row
from bench.sandboxes import _docker_problem
from raygen.config import (
    DockerEnvConfig,
    LocalEnvConfig,
    ScriptedModelConfig,
    SessionConfig,
    SimConfig,
    ToolsConfig,
)
from raygen.envs import EnvSpec, create_environment
from raygen.input.rows import PromptRow, Sample
from raygen.model.scripted import ScriptedModel
from raygen.session.agent import SessionRunner
from raygen.tools.base import ToolContext
from raygen.tools.mcp_client import McpConnection
from raygen.tools.mcp_config import McpServerConfig
from raygen.tools.mcp_preflight import preflight_servers
from raygen.tools.mcp_session import McpSettings
from raygen.tools.mcp_tools import close_shared, mcp_toolset
from raygen.tools.registry import load_registry
from raygen.tools.terminal import terminal_toolset

DOCKER_IMAGE = "raygen-test/mcp"
LOCAL_SERVER = McpServerConfig(
    command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"]
)
DOCKER_SERVER = McpServerConfig(command="mcp-server-time", args=["--local-timezone", "UTC"])
TICKS = os.sysconf("SC_CLK_TCK")


def _group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes of a process group."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


async def _per_call(calls: int) -> dict[str, float]:
    spec = EnvSpec(session_key="bench-mcp-call", run_name="bench-mcp")
    async with create_environment(LocalEnvConfig(), spec) as env:
        connection = await McpConnection.open("time", LOCAL_SERVER, env, 60)
        terminal = terminal_toolset().tools[0]
        ctx = ToolContext(env=env)
        mcp_ms, terminal_ms = [], []
        pgid = getattr(connection.process, "pgid", None)
        cpu0 = _group_cpu_s(pgid) if pgid else 0.0
        try:
            for _ in range(calls):
                t0 = time.perf_counter()
                await connection.call("get_current_time", {"timezone": "Asia/Tokyo"}, 30)
                mcp_ms.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await terminal.run({"command": "date"}, ctx)
                terminal_ms.append((time.perf_counter() - t0) * 1000)
            server_cpu = (_group_cpu_s(pgid) - cpu0) / calls if pgid else 0.0
        finally:
            await connection.close()
    return {
        "mcp_ms": statistics.median(mcp_ms),
        "terminal_ms": statistics.median(terminal_ms),
        "server_cpu_ms": server_cpu * 1000,
    }


async def _start_cost(env_config, server: McpServerConfig, image: str | None, count: int) -> float:
    times = []
    for i in range(count):
        spec = EnvSpec(session_key=f"bench-mcp-start-{i}", run_name="bench-mcp", image=image)
        async with create_environment(env_config, spec) as env:
            t0 = time.perf_counter()
            connection = await McpConnection.open("time", server, env, 60)
            times.append(time.perf_counter() - t0)
            await connection.close()
    return statistics.median(times)


async def _sessions_per_s(server: McpServerConfig | None, count: int, in_flight: int) -> float:
    env_config = LocalEnvConfig()
    registry = load_registry([])
    settings = McpSettings()
    toolsets = ["file", "terminal"]
    with_mcp = server is not None
    if server is not None:
        listings = await preflight_servers(
            {"time": server}, {}, env_config, run_name="bench-mcp", name_format="{server}__{tool}",
            start_timeout_s=60,
        )  # fmt: skip
        registry.add(mcp_toolset(listings[0]))
        settings = McpSettings.of(ToolsConfig(), listings, {})
        toolsets.append("time")
    runner = SessionRunner(
        model=ScriptedModel(ScriptedModelConfig(latency_s=0.2), SimConfig(hallucinate_rate=0)),
        registry=registry,
        env_config=env_config,
        session=SessionConfig(),
        run_name="bench-mcp",
        mcp=settings,
    )
    slots = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        sample = Sample(
            row=PromptRow(prompt=f"bench session {i}"),
            sample_key=f"{i:024d}",
            prompt_index=i,
            line=i + 1,
            toolsets=toolsets,
        )
        async with slots:
            record = await runner.run(sample)
        if record.exit_status != "completed":
            raise RuntimeError(f"bench session failed: {record.exit_status}: {record.error}")
        if with_mcp and record.tool_stats["time__get_current_time"].success != 1:
            raise RuntimeError("bench session did not call the MCP server")

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await close_shared()
    return count / (time.perf_counter() - t0)


def run(ctx: Context) -> list[Row]:
    calls, starts, sessions = (50, 5, 64) if ctx.quick else (200, 10, 192)
    rows, figures = [], {}
    per_call = asyncio.run(_per_call(calls))
    figures["per_call"] = per_call
    added = per_call["mcp_ms"] - per_call["terminal_ms"]
    rows.append(
        Row(
            "mcp",
            "local: MCP call vs terminal, wall ms (median)",
            f"{per_call['mcp_ms']:.1f} vs {per_call['terminal_ms']:.1f}",
            note=f"added {added:+.1f} ms a call; the server's CPU {per_call['server_cpu_ms']:.1f} ms a call; "
            f"{calls} calls each",
        )
    )
    local_start = asyncio.run(_start_cost(LocalEnvConfig(), LOCAL_SERVER, None, starts))
    figures["start_local_s"] = local_start
    rows.append(
        Row(
            "mcp",
            "local: server start s (median)",
            f"{local_start:.2f}",
            note="process start, initialize, tools/list",
        )
    )
    problem = _docker_problem()
    if problem is None:
        docker = DockerEnvConfig(default_image=DOCKER_IMAGE, pull="never")
        docker_start = asyncio.run(_start_cost(docker, DOCKER_SERVER, DOCKER_IMAGE, starts))
        figures["start_docker_s"] = docker_start
        rows.append(
            Row(
                "mcp",
                "docker: server start s (median)",
                f"{docker_start:.2f}",
                note="an exec attached in a running container, initialize, tools/list",
            )
        )
    else:
        rows.append(Row("mcp", "docker", "skipped", note=problem))
    without = asyncio.run(_sessions_per_s(None, sessions, 64))
    with_server = asyncio.run(_sessions_per_s(LOCAL_SERVER, sessions, 64))
    shared = asyncio.run(_sessions_per_s(LOCAL_SERVER.model_copy(update={"shared": True}), sessions, 64))
    figures["sessions_per_s"] = {"without": without, "with_server": with_server, "shared": shared}
    rows.append(
        Row(
            "mcp",
            "local: sessions/s at 64 in flight: no MCP / a server per session / one shared server",
            f"{without:.1f} / {with_server:.1f} / {shared:.1f}",
            note=f"{with_server / without:.2f}x and {shared / without:.2f}x; {sessions} sessions each, "
            "0.2 s model latency, one process",
        )
    )
    ctx.results["mcp"] = figures
    return rows
