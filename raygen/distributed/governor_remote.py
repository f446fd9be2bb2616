"""How a worker's ``GovernorClient`` reaches the governor: a Ray actor handle (re-resolved by name if
the actor died) or, in tests, an in-process ``GovernorService``; and the worker's name as the governor
knows it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Protocol

import ray
from ray.actor import ActorHandle

from raygen.distributed.leases import Lease, UsageReport


class GovernorRemote(Protocol):
    """The two calls a worker makes (``GovernorService.lease`` and ``.report``), awaitable."""

    async def lease(
        self, holder: str, want_requests: int, want_tokens: float, report: UsageReport
    ) -> Lease: ...

    async def report(self, holder: str, report: UsageReport) -> Lease: ...


class ActorRemote:
    """Adapts a Ray actor handle to ``GovernorRemote``. If the actor died (e.g. with the process that
    owned it) and ``resolve`` is given, the governor is looked up (or re-created) by name once and the
    call retried."""

    def __init__(self, handle: ActorHandle, resolve: Callable[[], ActorHandle] | None = None):
        self._handle = handle
        self._resolve = resolve

    async def lease(self, holder: str, want_requests: int, want_tokens: float, report: UsageReport) -> Lease:
        return await self._call("lease", holder, want_requests, want_tokens, report)

    async def report(self, holder: str, report: UsageReport) -> Lease:
        return await self._call("report", holder, report)

    async def _call(self, method: str, *args: object) -> Lease:
        try:
            reply: Lease = await getattr(self._handle, method).remote(*args)
        except ray.exceptions.RayActorError:
            if self._resolve is None:
                raise
            self._handle = self._resolve()
            reply = await getattr(self._handle, method).remote(*args)
        return reply


def as_remote(
    governor: ActorHandle | GovernorRemote, resolve: Callable[[], ActorHandle] | None = None
) -> GovernorRemote:
    """The governor as a ``GovernorRemote``: an actor handle adapted, anything else used as it is."""
    if isinstance(governor, ActorHandle):
        return ActorRemote(governor, resolve)
    return governor


def default_holder() -> str:
    """A worker id unique across the cluster: Ray's worker id when inside Ray, else a random one."""
    try:
        if ray.is_initialized():
            return f"{ray.get_runtime_context().get_worker_id()[:16]}-{uuid.uuid4().hex[:6]}"
    except Exception:  # outside a Ray worker context
        pass
    return f"pid{os.getpid()}-{uuid.uuid4().hex[:8]}"
