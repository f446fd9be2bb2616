"""Warm pools of Docker containers (``env.warm_pool``): ready containers ahead of demand, per image and
worker process, so a session's sandbox is handed over in milliseconds instead of a container start.

- **Sized from demand.** Each session that asks records its start; the pool aims at
  ``ceil(1.5 x start rate x creation time)`` ready containers (the starts that arrive while one is being
  made), at least one once sessions come, at most ``env.warm_pool``. The start rate is taken over the
  last 30 s, the creation time is a moving average. One container is made at a time per image and
  process, so a pool never floods the daemon (the sessions' own starts go through the sandbox governor).
- **Never reused.** A container is handed over once, to one session, and removed when that session
  closes it, like any other: a pooled container is only ever fresh.
- **Same container as any session's** (same limits, mounts, network, keep-alive and exec channel),
  labelled with the run plus ``raygen.pool=1``; its ``raygen.sample`` label is ``warm-pool`` (it was made
  before its session was known). A session whose cwd differs from ``env.workdir`` gets it created through
  the channel.
- **Nothing left behind.** Containers idle for ``IDLE_S`` are removed by the pool; at process exit the
  pool removes what it holds (``atexit``); what a killed worker or driver leaves is labelled with the run,
  so ``raygen clean RUN_DIR`` and the next start (and the end) of the run remove it with every other
  container of the run (``DockerEnvironment.reap``). A draining run starts no session, so its pools are
  not refilled, and the run's end removes them.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import secrets
import time
from collections import deque
from contextlib import suppress
from typing import TYPE_CHECKING

from raygen.envs.base import EnvSpec

if TYPE_CHECKING:
    from raygen.envs.configs import DockerEnvConfig
    from raygen.envs.docker import DockerEnvironment

log = logging.getLogger(__name__)

POOL_LABEL = "raygen.pool"
POOL_SAMPLE = "warm-pool"
IDLE_S = 120.0
"""A ready container nobody took for this long is removed (demand went away)."""
RATE_WINDOW_S = 30.0
HEADROOM = 1.5


class WarmPool:
    """One worker process's ready containers for one run and engine configuration."""

    def __init__(self, config: DockerEnvConfig, run_name: str):
        self.limit = config.warm_pool
        self.config = config.model_copy(update={"warm_pool": 0})  # pool containers do not draw on a pool
        self.run_name = run_name
        self.ready: dict[str, list[tuple[float, DockerEnvironment]]] = {}
        self.filling: dict[str, asyncio.Task] = {}
        self.starts: dict[str, deque[float]] = {}
        self.creation_s: dict[str, float] = {}
        self.handed_out = 0
        self.removing: set[asyncio.Future] = set()

    def target(self, image: str) -> int:
        """How many ready containers of ``image`` to keep now."""
        starts = self.starts.get(image)
        if not starts:
            return 0
        now = time.monotonic()
        window = min(RATE_WINDOW_S, max(1.0, now - starts[0]))
        rate = len(starts) / window
        wanted = math.ceil(HEADROOM * rate * self.creation_s.get(image, 1.0))
        return max(1, min(self.limit, wanted))

    def take(self, image: str) -> DockerEnvironment | None:
        """A ready container of ``image`` (removed from the pool), or None; either way the demand is
        noted and the pool refilled in the background."""
        now = time.monotonic()
        starts = self.starts.setdefault(image, deque())
        starts.append(now)
        while starts and now - starts[0] > RATE_WINDOW_S:
            starts.popleft()
        self._expire(image, now)
        queue = self.ready.get(image) or []
        env = queue.pop(0)[1] if queue else None
        if env is not None:
            self.handed_out += 1
        self._refill(image)
        return env

    def _refill(self, image: str) -> None:
        task = self.filling.get(image)
        if task is None or task.done():
            self.filling[image] = asyncio.ensure_future(self._fill(image))

    async def _fill(self, image: str) -> None:
        from raygen.envs.docker import DockerEnvironment

        while len(self.ready.get(image, [])) < self.target(image):
            spec = EnvSpec(
                session_key=f"{POOL_SAMPLE}-{secrets.token_hex(4)}", run_name=self.run_name, image=image
            )
            env = DockerEnvironment(self.config, spec)
            env.extra_labels = {POOL_LABEL: "1"}
            began = time.monotonic()
            try:
                await env.start()
            except BaseException as exc:  # a failure (the sessions' own starts report it) or a drain
                await env.close()  # waits for a creation under way, then removes it
                if not isinstance(exc, Exception):
                    raise
                log.info("warm pool: could not start a container of %s: %s", image, exc)
                return
            took = time.monotonic() - began
            previous = self.creation_s.get(image)
            self.creation_s[image] = took if previous is None else 0.7 * previous + 0.3 * took
            self.ready.setdefault(image, []).append((time.monotonic(), env))

    def _expire(self, image: str, now: float) -> None:
        queue = self.ready.get(image) or []
        stale = [env for since, env in queue if now - since > IDLE_S]
        if stale:
            self.ready[image] = [(since, env) for since, env in queue if now - since <= IDLE_S]
            for env in stale:
                removal = asyncio.ensure_future(env.close())
                self.removing.add(removal)
                removal.add_done_callback(self.removing.discard)

    async def drain(self) -> int:
        """Stop refilling and remove every ready container; how many were removed."""
        for task in self.filling.values():
            task.cancel()
        await asyncio.gather(*self.filling.values(), return_exceptions=True)
        envs = [env for queue in self.ready.values() for _, env in queue]
        self.ready.clear()
        await asyncio.gather(*(env.close() for env in envs), return_exceptions=True)
        return len(envs)

    def remove_now(self) -> None:
        """Blocking, for process exit: remove what the pool holds, without an event loop."""
        for queue in self.ready.values():
            for _, env in queue:
                with suppress(Exception):
                    env._client.api.remove_container(env.container_name, force=True, v=True)
        self.ready.clear()


_pools: dict[tuple[str, str, int], WarmPool] = {}


def pool_for(config: DockerEnvConfig, run_name: str) -> WarmPool:
    """This process's pool for the run and engine configuration (one per event loop)."""
    key = (config.model_dump_json(exclude={"warm_pool"}), run_name, id(asyncio.get_running_loop()))
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = WarmPool(config, run_name)
    return pool


async def adopt_warm(env: DockerEnvironment, image: str) -> bool:
    """Give ``env`` a ready container from its pool, if there is one it can use; else False (the
    session starts its own container)."""
    pool = pool_for(env.config, env.spec.run_name)
    ready = pool.take(image)
    if ready is None:
        return False
    channel = ready._channel
    if env.cwd != ready.cwd and (channel is None or not channel.usable):
        await ready.close()  # without the channel the cwd cannot be made cheaply: start afresh
        return False
    env.container_name, env.container_id = ready.container_name, ready.container_id
    env._client, env._docker, env._channel = ready._client, ready._docker, channel
    env._starting = ready._starting  # the creation, done: close() removes the container by its name
    if env.cwd != ready.cwd:
        await env.exec("true", 60, 100)  # the channel creates a missing cwd
    return True


@atexit.register
def _remove_pools_at_exit() -> None:
    for pool in list(_pools.values()):
        pool.remove_now()
