"""Warm pools of Docker containers (raygen/envs/docker_pool.py) on a real engine: ready containers handed
over once, fresh, and nothing left behind, even by a run SIGKILLed with its pools full.

Needs ``eval "$(.ci/docker-setup.sh /tmp/rg-docker)"`` and ``.ci/build-test-images.sh``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest
import yaml
from resume_harness import finish, kill_group, run_cli, start_group, stop_leftovers, wait_for, write_dataset
from test_docker import BUSYBOX, containers_of
from test_docker_engine import docker_skip_reason

from raygen.config import DockerEnvConfig
from raygen.envs import docker_engine
from raygen.envs.docker import DockerEnvironment
from raygen.envs.docker_pool import POOL_LABEL, pool_for

pytestmark = pytest.mark.docker


@pytest.fixture
def pool_config() -> DockerEnvConfig:
    reason = docker_skip_reason()
    if reason:
        pytest.skip(reason)
    return DockerEnvConfig(cpus=0.5, memory="256m", pids_limit=200, warm_pool=3)


def labels_of(env: DockerEnvironment) -> dict[str, str]:
    client = docker_engine.get_client(env.config)
    return client.api.inspect_container(env.container_name)["Config"]["Labels"]


async def wait_ready(pool, image: str, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while len(pool.ready.get(image, [])) < count:
        assert time.monotonic() < deadline, f"the pool never held {count} ready container(s)"
        await asyncio.sleep(0.05)


async def test_a_pool_fills_after_demand_and_hands_each_container_out_once(pool_config):
    run_name = f"test-pool-{uuid.uuid4().hex[:8]}"
    envs = []
    try:
        first = DockerEnvironment(pool_config, _spec(run_name))
        await first.start()  # the pool was empty: its own container; the pool fills behind it
        envs.append(first)
        assert POOL_LABEL not in labels_of(first)
        pool = pool_for(pool_config, run_name)
        await wait_ready(pool, BUSYBOX, 1)
        second = DockerEnvironment(pool_config, _spec(run_name, cwd="deep/er"))
        began = time.monotonic()
        await second.start()
        handed_over_s = time.monotonic() - began
        envs.append(second)
        assert labels_of(second)[POOL_LABEL] == "1" and pool.handed_out == 1
        assert handed_over_s < 0.5, handed_over_s  # no container start: a hand-over and one channel call
        assert (await second.exec("pwd", 30, 100)).stdout == "/work/deep/er\n"
        await second.write_file("mine.txt", b"second's")
        await wait_ready(pool, BUSYBOX, 1)
        third = DockerEnvironment(pool_config, _spec(run_name))
        await third.start()
        envs.append(third)
        names = {env.container_name for env in envs}
        assert len(names) == 3  # never the same container twice
        assert (await third.exec("cat /work/deep/er/mine.txt", 30, 100)).exit_code != 0  # fresh
        await second.close()
        client = docker_engine.get_client(pool_config)
        assert not client.api.containers(all=True, filters={"name": f"^/{second.container_name}$"})
    finally:
        for env in envs:
            await env.close()
        removed = await pool_for(pool_config, run_name).drain()
        assert removed >= 0
    assert containers_of(docker_engine.get_client(pool_config), run_name) == []


async def test_the_reaper_removes_ready_pool_containers(pool_config):
    run_name = f"test-pool-{uuid.uuid4().hex[:8]}"
    env = DockerEnvironment(pool_config, _spec(run_name))
    await env.start()
    pool = pool_for(pool_config, run_name)
    await wait_ready(pool, BUSYBOX, 1)
    await env.close()
    client = docker_engine.get_client(pool_config)
    pooled = [c for c in containers_of(client, run_name) if c["Labels"].get(POOL_LABEL) == "1"]
    assert pooled
    assert DockerEnvironment.reap(pool_config, run_name) == len(pooled)
    assert containers_of(client, run_name) == []
    pool.ready.clear()


def _spec(run_name: str, **overrides):
    from raygen.envs import EnvSpec

    return EnvSpec(session_key=f"t-{uuid.uuid4().hex[:8]}", run_name=run_name, image=BUSYBOX, **overrides)


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_killed_with_full_pools_leaves_nothing_after_clean_and_the_next_start(tmp_path: Path):
    if docker_skip_reason():
        pytest.skip(docker_skip_reason())
    run_name = f"pool-kill-{uuid.uuid4().hex[:6]}"
    rows = [{"prompt": f"Task {i}: list the files here.", "image": BUSYBOX} for i in range(40)]
    write_dataset(tmp_path / "p.jsonl", rows)
    config = {
        "sim": {"latency_s": 1.0},
        "ray": {"workers": 1, "sessions_per_worker": 4},
        "env": {"type": "docker", "warm_pool": 4, "cpus": 0.5, "memory": "256m"},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": run_name},
        "filters": {"no_reasoning": False, "hallucinated_tools": False},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    args = ["run", str(tmp_path / "p.jsonl"), "--config", str(tmp_path / "run.yaml")]
    client = docker_engine.get_client(DockerEnvConfig())

    def pooled() -> list[dict]:
        return [c for c in containers_of(client, run_name) if c["Labels"].get(POOL_LABEL) == "1"]

    log = tmp_path / "first.log"
    proc = start_group(args, log)
    try:
        assert wait_for(lambda: len(pooled()) >= 2, 240, proc), log.read_text(errors="replace")[-3000:]
        kill_group(proc, settle_s=30)
    finally:
        stop_leftovers(proc.pid)
    left = containers_of(client, run_name)
    assert left and any(c["Labels"].get(POOL_LABEL) == "1" for c in left)  # the kill left containers
    cleaned = run_cli("clean", str(tmp_path / "runs" / run_name))
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert f"removed {len(left)}" in cleaned.stdout + cleaned.stderr
    assert containers_of(client, run_name) == []
    log = tmp_path / "second.log"
    proc = start_group([*args, "--resume"], log)
    out = finish(proc, log, timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert containers_of(client, run_name) == [], out[-2000:]
    assert os.path.isdir(tmp_path / "runs" / run_name / "data")
