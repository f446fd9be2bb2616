"""The cluster-wide sandbox governor: one named Ray actor pacing sandbox creations for every worker.

The model side of a run is governed cluster-wide (``governor.py``); this is its twin for the sandbox
fleet. Per key (a backend on a node for Docker and Apptainer, whose limits are the node's engine; the
backend alone for a cloud service such as Modal, whose limits are the workspace's) it enforces the
backend's ``env.fleet`` limits: a creation rate (paced at 97%, a grant at a time, so no window of one
second ever sees more than the rate), a cap on sandboxes being created at once, and a cap on live
sandboxes. A refusal (``SandboxRefused``: Modal's RESOURCE_EXHAUSTED, a Docker daemon that timed out)
halves the rate and the starting cap and pauses new grants for a second; each run of
``_RECOVER_AFTER`` clean creations then raises them by a tenth (the cap by one), back to the configured
values, the way the model governor treats 429s.

``SandboxPolicy`` holds every decision and runs without Ray (tests drive it with a fake clock);
``SandboxGovernorService`` is the actor's body; ``SandboxGovernorClient`` is a worker process's
``raygen.envs.fleet.SandboxGate``. A session asks before it creates its sandbox, so waiting for the fleet
holds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from raygen.envs.fleet import FleetLimits, OpenSandboxGate, SandboxGate

NAMESPACE = "raygen"
ACTOR_NAME = "raygen-sandbox-governor"
PACE = 0.97
"""Creations are spaced at 1 / (0.97 x rate): a window of one second never holds more than the rate."""
_REFUSAL_PAUSE_S = 1.0
_RECOVER_AFTER = 10
_MAX_SERVER_WAIT_S = 5.0
_MIN_RATE = 0.05


@dataclass
class _Fleet:
    """One key's limits, what was learned, and what is under way."""

    limits: FleetLimits
    rate: float | None
    max_starting: int | None
    next_grant_at: float = 0.0
    starting: int = 0
    live: int = 0
    clean_streak: int = 0
    granted: int = 0
    refused: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "max_starting": self.max_starting,
            "max_live": self.limits.max_live,
            "starting": self.starting,
            "live": self.live,
            "granted": self.granted,
            "refused": self.refused,
        }


class SandboxPolicy:
    """Every decision of the sandbox governor (no Ray, no I/O)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._fleets: dict[str, _Fleet] = {}

    def fleet(self, key: str, limits: FleetLimits) -> _Fleet:
        found = self._fleets.get(key)
        if found is None:  # the first asker's limits hold for the key (one run's config)
            found = self._fleets[key] = _Fleet(limits, limits.creations_per_s, limits.max_starting)
        return found

    def try_grant(self, key: str, limits: FleetLimits) -> float:
        """Grant one creation (0.0), or how long to wait before asking again (> 0)."""
        fleet = self.fleet(key, limits)
        now = self._clock()
        if fleet.max_starting is not None and fleet.starting >= fleet.max_starting:
            return 0.05  # until a start ends (the service wakes its waiters on every report)
        if fleet.limits.max_live is not None and fleet.live >= fleet.limits.max_live:
            return 0.05
        if now < fleet.next_grant_at:
            return fleet.next_grant_at - now
        if fleet.rate is not None:
            fleet.next_grant_at = max(now, fleet.next_grant_at) + 1.0 / (PACE * fleet.rate)
        fleet.starting += 1
        fleet.live += 1
        fleet.granted += 1
        return 0.0

    def started(self, key: str, ok: bool, refused: bool) -> None:
        fleet = self._fleets[key]
        fleet.starting = max(0, fleet.starting - 1)
        if not ok:
            fleet.live = max(0, fleet.live - 1)
        if refused:
            self._learn_down(fleet)
        elif ok:
            self._recover(fleet)

    def closed(self, key: str) -> None:
        fleet = self._fleets.get(key)
        if fleet is not None:
            fleet.live = max(0, fleet.live - 1)

    def _learn_down(self, fleet: _Fleet) -> None:
        fleet.refused += 1
        fleet.clean_streak = 0
        if not fleet.limits.learn:
            return
        now = self._clock()
        fleet.next_grant_at = max(fleet.next_grant_at, now + _REFUSAL_PAUSE_S)
        if fleet.rate is not None:
            fleet.rate = max(_MIN_RATE, fleet.rate / 2)
        # Without a configured cap, the refusal says what was too many: half of what was starting.
        at_refusal = fleet.max_starting if fleet.max_starting is not None else fleet.starting + 1
        fleet.max_starting = max(1, at_refusal // 2)

    def _recover(self, fleet: _Fleet) -> None:
        fleet.clean_streak += 1
        if fleet.clean_streak < _RECOVER_AFTER:
            return
        fleet.clean_streak = 0
        configured = fleet.limits
        if fleet.rate is not None and configured.creations_per_s is not None:
            fleet.rate = min(configured.creations_per_s, fleet.rate * 1.1)
        if fleet.max_starting is not None:
            if configured.max_starting is None and fleet.max_starting >= 64:
                fleet.max_starting = None  # learned from nothing, recovered to nothing
            else:
                ceiling = configured.max_starting or math.inf
                fleet.max_starting = int(min(ceiling, fleet.max_starting + 1))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {key: fleet.snapshot() for key, fleet in self._fleets.items()}


class SandboxGovernorService:
    """The actor's body (usable in-process in tests): ``acquire`` waits (at most a few seconds, then
    answers False and the worker asks again) until the policy grants a creation."""

    def __init__(self, clock: Callable[[], float] | None = None):
        self._policy = SandboxPolicy(clock) if clock is not None else SandboxPolicy()
        self._changed = asyncio.Event()

    async def acquire(self, key: str, limits: dict) -> bool:
        parsed = FleetLimits.model_validate(limits)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _MAX_SERVER_WAIT_S
        while True:
            wait_s = self._policy.try_grant(key, parsed)
            if wait_s <= 0:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(wait_s, remaining))

    async def started(self, key: str, ok: bool, refused: bool) -> None:
        self._policy.started(key, ok, refused)
        self._changed.set()

    async def closed(self, key: str) -> None:
        self._policy.closed(key)
        self._changed.set()

    async def snapshot(self) -> dict:
        return self._policy.snapshot()


@dataclass
class SandboxPermit:
    key: str
    waited_s: float


class SandboxGovernorClient:
    """A worker process's ``SandboxGate``: asks the actor before each creation; reports without waiting
    (Ray runs one caller's calls to an actor in the order they were sent)."""

    def __init__(self, actor: Any, limits: FleetLimits):
        self._actor = actor
        self._limits = limits.model_dump(mode="json")

    async def acquire(self, key: str) -> SandboxPermit:
        started = time.monotonic()
        while not await self._actor.acquire.remote(key, self._limits):
            pass
        return SandboxPermit(key, time.monotonic() - started)

    def started(self, permit: SandboxPermit, *, ok: bool, refused: bool = False) -> None:
        self._actor.started.remote(permit.key, ok, refused)

    def closed(self, permit: SandboxPermit) -> None:
        self._actor.closed.remote(permit.key)


_ACTOR_CLASS: Any = None
_GATES: dict[str, SandboxGate] = {}


def get_or_create_sandbox_governor(limits: FleetLimits) -> Any | None:
    """The cluster's sandbox governor (created on first use, shared by name), or None when the backend's
    limits limit nothing. Call it from the driver before the workers start, so it lives as long as the
    run's job; it reserves no CPU."""
    if not limits.limits_anything():
        return None
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(SandboxGovernorService)
    return _ACTOR_CLASS.options(
        name=ACTOR_NAME, namespace=NAMESPACE, get_if_exists=True, num_cpus=0, max_restarts=-1
    ).remote()


def sandbox_key(env_config: Any, node: str) -> str:
    """What one set of limits covers: a backend on a node (its own engine), or a cloud backend as a whole."""
    from raygen.envs import environment_class

    backend = str(env_config.type)
    return f"{backend}@{node}" if environment_class(backend).runs_on_node else backend


def sandbox_gate_for(env_config: Any) -> SandboxGate:
    """The gate this worker process's sessions use for ``env_config``'s backend: the governor's client,
    or ``OpenSandboxGate`` for a backend without ``fleet`` limits (local, fake) or with none set."""
    limits: FleetLimits | None = getattr(env_config, "fleet", None)
    if limits is None or not limits.limits_anything():
        return OpenSandboxGate()
    gate = _GATES.get(env_config.type)
    if gate is None:
        gate = _GATES[env_config.type] = SandboxGovernorClient(get_or_create_sandbox_governor(limits), limits)
    return gate
