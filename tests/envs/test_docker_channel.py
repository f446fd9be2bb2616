"""The Docker exec channel (raygen/envs/docker_channel.py) on a real engine: the same semantics as one
``docker exec`` per call (the conformance suite runs both ways), and what is particular to the channel.

Needs ``eval "$(.ci/docker-setup.sh /tmp/rg-docker)"`` and ``.ci/build-test-images.sh``.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from conformance import EnvironmentConformance
from test_docker import BUSYBOX, PYTHON, container_exists, make_docker_env
from test_docker_engine import docker_skip_reason

from raygen.config import DockerEnvConfig
from raygen.envs import docker_engine
from raygen.errors import SessionFailure

pytestmark = pytest.mark.docker


@pytest.fixture
def docker_config() -> DockerEnvConfig:
    reason = docker_skip_reason()
    if reason:
        pytest.skip(reason)
    return DockerEnvConfig(cpus=0.5, memory="256m", pids_limit=200)


def exec_ids(env) -> list[str]:
    """The execs the engine ran in the container (per-call execs add one each; the channel none)."""
    client = docker_engine.get_client(env.config)
    return client.api.inspect_container(env.container_id).get("ExecIDs") or []


class TestPerExecConformance(EnvironmentConformance):
    """``exec_channel: false``: the per-call ``docker exec`` path keeps passing the same suite."""

    @pytest.fixture
    def make_env(self, docker_config):
        config = docker_config.model_copy(update={"exec_channel": False})
        return lambda **overrides: make_docker_env(config, **overrides)


@pytest.mark.parametrize("image", [BUSYBOX, PYTHON])
async def test_commands_and_files_go_through_one_exec(docker_config, image):
    async with make_docker_env(docker_config, image=image, env={"QUOTED": 'it\'s "$HOME" `x`'}) as env:
        assert env._channel is not None and env._channel.usable
        hostile = 'printf \'%s|\' "$QUOTED" "a\'b"; echo\nexit 3'
        result = await env.exec(hostile, 30, 1000)
        assert (result.exit_code, result.stdout) == (3, "it's \"$HOME\" `x`|a'b|\n")
        both = await env.exec("echo out; echo err >&2; exit 0", 30, 1000)
        assert (both.stdout, both.stderr) == ("out\n", "err\n")
        data = bytes(range(256)) * 3
        await env.write_file("sub/dir/blob.bin", data)
        assert await env.read_file("sub/dir/blob.bin") == data
        assert (await env.exec("wc -c < sub/dir/blob.bin", 30, 100)).stdout.strip() == "768"
        with pytest.raises(FileNotFoundError):
            await env.read_file("missing.txt")
        with pytest.raises(IsADirectoryError):
            await env.read_file("sub")
        with pytest.raises(IsADirectoryError):
            await env.write_file("sub", b"x")
        assert exec_ids(env) == []  # none of the above started a docker exec


async def test_concurrent_calls_get_their_own_replies(docker_config):
    async with make_docker_env(docker_config) as env:
        commands = [
            f"sleep 0.{9 - index}; echo {index}; echo e{index} >&2; exit {index}" for index in range(8)
        ]
        results = await asyncio.gather(*(env.exec(command, 30, 1000) for command in commands))
        for index, result in enumerate(results):
            assert (result.exit_code, result.stdout, result.stderr) == (index, f"{index}\n", f"e{index}\n")


async def test_output_is_capped_inside_the_container_and_says_how_much_there_was(docker_config):
    async with make_docker_env(docker_config) as env:
        result = await env.exec("yes abcdefghij | head -c 5000000; echo END", 60, 1000)
        assert result.exit_code == 0 and result.truncated
        assert result.stdout.startswith("abcdefghij\n") and result.stdout.endswith("END\n")
        assert "5000004 bytes in all" in result.stdout
        assert len(result.stdout) <= 1000


async def test_a_timeout_kills_the_whole_tree_and_reports_124(docker_config):
    async with make_docker_env(docker_config) as env:
        command = "sleep 301 & (setsid sleep 302 &) ; sh -c 'sleep 303' & echo started; sleep 304"
        started = time.monotonic()
        result = await env.exec(command, 1.0, 1000)
        assert result.timed_out and result.exit_code == 124
        assert result.stdout == "started\n"
        assert time.monotonic() - started < 4
        left = await env.exec("ps -o args 2>/dev/null || ps", 30, 10_000)
        assert "sleep 30" not in left.stdout, left.stdout


async def test_a_background_child_does_not_hold_the_reply_nor_outlive_close(docker_config):
    env = make_docker_env(docker_config)
    async with env:
        started = time.monotonic()
        result = await env.exec("sleep 60 & echo bg", 30, 1000)
        assert result.stdout == "bg\n" and time.monotonic() - started < 5
    assert not container_exists(docker_engine.get_client(env.config), env.container_name)


async def test_a_command_that_kills_the_channel_ends_the_container_as_killing_the_keepalive_did(
    docker_config,
):
    env = make_docker_env(docker_config)
    async with env:
        with pytest.raises(SessionFailure) as failure:
            # $PPID is the request's subshell; the channel's sh, the container's own process, its parent
            await env.exec("kill -9 $(cut -d' ' -f4 /proc/$PPID/stat) $PPID; sleep 5", 30, 100)
        assert failure.value.kind == "env_lost"
        assert not env._channel.usable
        with pytest.raises(SessionFailure) as later:
            await env.exec("echo still here", 30, 100)
        assert later.value.kind == "env_lost"
    assert not container_exists(docker_engine.get_client(env.config), env.container_name)


async def test_the_channel_is_the_containers_own_process_and_logs_nothing(docker_config):
    async with make_docker_env(docker_config) as env:
        await env.exec("echo a line that must not reach the engine's logs", 30, 100)
        client = docker_engine.get_client(env.config)
        info = client.api.inspect_container(env.container_id)
        assert info["Config"]["Cmd"] == ["sh"] and info["Config"]["OpenStdin"]
        assert info["HostConfig"]["LogConfig"]["Type"] == "none"
        assert exec_ids(env) == []  # no docker exec at all, the channel included


async def test_cancelling_mid_command_kills_it_and_close_leaves_nothing(docker_config):
    env = make_docker_env(docker_config)
    await env.start()
    task = asyncio.ensure_future(env.exec("echo $$ > pid; sleep 300", 60, 100))
    for _ in range(200):
        await asyncio.sleep(0.05)
        try:
            pid = (await env.read_file("pid")).decode().strip()
            break
        except FileNotFoundError:
            continue
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(50):  # the kill runs in the background
        alive = await env.exec(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone", 30, 100)
        if alive.stdout == "gone\n":
            break
        await asyncio.sleep(0.1)
    assert alive.stdout == "gone\n"
    await env.close()
    assert not container_exists(docker_engine.get_client(env.config), env.container_name)


async def test_exec_through_the_channel_takes_milliseconds(docker_config):
    async with make_docker_env(docker_config) as env:
        await env.exec("true", 30, 100)
        durations = []
        for _ in range(15):
            started = time.perf_counter()
            assert (await env.exec("echo ok", 30, 100)).stdout == "ok\n"
            durations.append(time.perf_counter() - started)
        # docker exec takes 50-600 ms here; the channel a few ms (generous bound for a loaded machine)
        assert statistics.median(durations) < 0.05, durations
