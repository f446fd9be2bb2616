"""The sandbox governor's policy (a fake clock, no Ray) and its service (in-process, real asyncio)."""

from __future__ import annotations

import asyncio
import time

import pytest

from raygen.distributed.sandbox_governor import PACE, SandboxGovernorService, SandboxPolicy, sandbox_gate_for
from raygen.envs.configs import DockerEnvConfig, LocalEnvConfig, ModalEnvConfig
from raygen.envs.fleet import FleetLimits, OpenSandboxGate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def grants_over(policy: SandboxPolicy, clock: Clock, limits: FleetLimits, seconds: float) -> list[float]:
    """Ask every millisecond for ``seconds``; when each creation was granted (each finishes at once)."""
    granted = []
    end = clock.now + seconds
    while clock.now < end:
        if policy.try_grant("k", limits) == 0.0:
            granted.append(clock.now)
            policy.started("k", ok=True, refused=False)
        clock.now += 0.001
    return granted


def most_in_one_second(times: list[float]) -> int:
    return max(sum(1 for t in times if start <= t < start + 1.0) for start in times)


def test_the_rate_holds_in_every_one_second_window():
    clock = Clock()
    policy = SandboxPolicy(clock)
    granted = grants_over(policy, clock, FleetLimits(creations_per_s=5.0), 10.0)
    assert most_in_one_second(granted) == 5
    assert len(granted) == pytest.approx(10 * 5 * PACE, abs=1.5)


def test_the_starting_cap_and_the_live_cap():
    clock = Clock()
    policy = SandboxPolicy(clock)
    limits = FleetLimits(max_starting=2, max_live=3)
    assert [policy.try_grant("k", limits) for _ in range(3)][:2] == [0.0, 0.0]
    assert policy.try_grant("k", limits) > 0  # two are starting
    policy.started("k", ok=True, refused=False)
    assert policy.try_grant("k", limits) == 0.0  # one started: a third may start
    policy.started("k", ok=True, refused=False)
    policy.started("k", ok=True, refused=False)
    assert policy.try_grant("k", limits) > 0  # three live
    policy.closed("k")
    assert policy.try_grant("k", limits) == 0.0
    policy.started("k", ok=False, refused=False)  # a failed start frees its live slot
    assert policy.snapshot()["k"]["live"] == 2


def test_refusals_learn_the_limits_down_then_clean_starts_recover_them():
    clock = Clock()
    policy = SandboxPolicy(clock)
    limits = FleetLimits(creations_per_s=8.0, max_starting=8)
    assert policy.try_grant("k", limits) == 0.0
    policy.started("k", ok=False, refused=True)
    state = policy.snapshot()["k"]
    assert (state["rate"], state["max_starting"], state["refused"]) == (4.0, 4, 1)
    assert policy.try_grant("k", limits) == pytest.approx(1.0, abs=0.01)  # paused a second
    clock.now += 1.0
    for _ in range(200):  # clean starts, well spaced
        assert policy.try_grant("k", limits) == 0.0
        policy.started("k", ok=True, refused=False)
        policy.closed("k")
        clock.now += 1.0
    state = policy.snapshot()["k"]
    assert (state["rate"], state["max_starting"]) == (8.0, 8)  # back to the configured values, no higher


def test_a_refusal_without_a_starting_cap_caps_at_half_of_what_was_starting():
    clock = Clock()
    policy = SandboxPolicy(clock)
    limits = FleetLimits(creations_per_s=100.0)
    for _ in range(8):
        clock.now += 0.02
        assert policy.try_grant("k", limits) == 0.0
    policy.started("k", ok=False, refused=True)
    assert policy.snapshot()["k"]["max_starting"] == 4


def test_without_learning_a_refusal_changes_nothing():
    clock = Clock()
    policy = SandboxPolicy(clock)
    limits = FleetLimits(creations_per_s=5.0, max_starting=4, learn=False)
    policy.try_grant("k", limits)
    policy.started("k", ok=False, refused=True)
    assert policy.snapshot()["k"]["rate"] == 5.0 and policy.snapshot()["k"]["max_starting"] == 4


async def test_the_service_makes_concurrent_askers_wait_their_turn():
    service = SandboxGovernorService()
    limits = FleetLimits(creations_per_s=50.0, max_starting=2).model_dump()
    starting = 0
    most = 0
    grants: list[float] = []

    async def session() -> None:
        nonlocal starting, most
        while not await service.acquire("k", limits):
            pass
        grants.append(time.monotonic())
        starting += 1
        most = max(most, starting)
        await asyncio.sleep(0.1)
        starting -= 1
        await service.started("k", True, False)
        await service.closed("k")

    began = time.monotonic()
    await asyncio.gather(*(session() for _ in range(20)))
    assert most == 2
    assert most_in_one_second(grants) <= 50
    assert time.monotonic() - began >= 20 / 2 * 0.1  # two at a time
    assert (await service.snapshot())["k"]["live"] == 0


def test_backends_without_limits_get_an_open_gate():
    assert isinstance(sandbox_gate_for(LocalEnvConfig()), OpenSandboxGate)
    assert isinstance(sandbox_gate_for(DockerEnvConfig(fleet=FleetLimits())), OpenSandboxGate)
    assert DockerEnvConfig().fleet.max_starting == 32
    assert ModalEnvConfig().fleet.creations_per_s == 5.0
