"""The cluster-wide rate governor: a named Ray actor per (base URL, model, key fingerprint).

The actor (``GovernorService``) wraps ``raygen.distributed.governor_policy.GovernorPolicy``; all decisions
are made there. Each worker process talks to it through one ``GovernorClient``
(raygen.distributed.governor_client), which ``gate_for`` builds.

Callers should acquire a permit *before* creating anything expensive for the request (connections,
sandboxes, large prompts) where they can, so that waiting work holds no resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable
from typing import Any

import ray
from ray.actor import ActorHandle

from raygen.config import GovernorConfig
from raygen.distributed.governor_client import REPORT_INTERVAL_S, GovernorClient
from raygen.distributed.governor_policy import GovernorPolicy
from raygen.distributed.leases import Lease, UsageReport
from raygen.distributed.metrics import GovernorMetrics
from raygen.model.gate import OpenGate, RateGate

__all__ = [
    "GovernorClient",
    "GovernorService",
    "OpenGate",
    "gate_for",
    "get_or_create_governor",
    "governor_name",
    "key_fingerprint",
]

log = logging.getLogger(__name__)

NAMESPACE = "raygen"
_MAX_SERVER_WAIT_S = 5.0
"""A lease call waits at most this long for capacity (FIFO), then answers empty and the worker re-asks."""


def key_fingerprint(api_key: str | None) -> str:
    """Short sha256 of the API key: tells keys apart without revealing them."""
    if not api_key:
        return "nokey"
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:12]


def governor_name(base_url: str | None, model: str, api_key: str | None) -> str:
    """Ray actor name of the governor for this endpoint, model and key."""
    ident = "\0".join([base_url or "", model, key_fingerprint(api_key)])
    return "raygen-governor-" + hashlib.sha256(ident.encode("utf-8")).hexdigest()[:16]


class GovernorService:
    """The governor's state and remote API (the body of the Ray actor; usable in-process in tests).

    ``lease`` waits (FIFO across workers, at most a few seconds) until at least one slot is free; while the
    cluster is saturated it lingers briefly to fill the whole request, so each call carries a batch.
    """

    def __init__(
        self,
        config: GovernorConfig | dict,
        clock: Callable[[], float] | None = None,
        export_as: str | None = None,
    ):
        """``export_as``: the actor's name, under which its rates become Ray metrics (the actor only)."""
        self._config = GovernorConfig.model_validate(config)
        self._policy = GovernorPolicy(self._config) if clock is None else GovernorPolicy(self._config, clock)
        self._metrics = GovernorMetrics(export_as) if export_as else None
        self._queue = asyncio.Lock()  # asyncio.Lock is FIFO: workers are served in arrival order
        self._reported = asyncio.Event()  # a report may free capacity (completions, token refunds)
        self._linger_s = self._config.burst_s / 2  # a batch never spans more than half the burst window
        self.remote_calls = 0

    async def lease(
        self, holder: str, want_requests: int, want_tokens: float = 0.0, report: UsageReport | None = None
    ) -> Lease:
        """Apply ``report``, then grant up to ``want_requests`` slots for about ``want_tokens`` tokens."""
        self.remote_calls += 1
        self._export()
        loop = asyncio.get_running_loop()
        if report is not None:
            self._policy.report(holder, report)
        if want_requests <= 0:
            return self._policy.report(holder, UsageReport())
        async with self._queue:
            start = loop.time()  # lingering counts from this worker's turn, not from its arrival
            while True:
                elapsed = loop.time() - start
                lingering = elapsed < self._linger_s
                granted = self._policy.lease(
                    holder, want_requests, want_tokens, min_requests=want_requests if lingering else 1
                )
                if granted.requests or granted.pause_s > 0 or elapsed >= _MAX_SERVER_WAIT_S:
                    return granted
                deadline = self._linger_s if lingering else _MAX_SERVER_WAIT_S
                nap = min(max(granted.wait_hint_s, 0.002), max(0.0, deadline - elapsed) + 0.001)
                self._reported.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._reported.wait(), nap)

    async def report(self, holder: str, report: UsageReport) -> Lease:
        """Apply a worker's batched deltas; the reply carries the current epoch and any pause."""
        self.remote_calls += 1
        self._export()
        self._reported.set()
        return self._policy.report(holder, report)

    def _export(self) -> None:
        if self._metrics is not None:
            self._metrics.maybe_export(self._policy.snapshot)

    async def snapshot(self) -> dict:
        """Targets, achieved rates (last 10 s), in flight, 429s, total wait, remote calls received."""
        return {**self._policy.snapshot(), "remote_calls": self.remote_calls}

    async def history(self) -> list[dict]:
        """Bounded target/achieved-rate samples (about one a second) for statistics."""
        return self._policy.history()

    async def config(self) -> dict:
        """The configuration this governor was created with (the first creator's wins)."""
        return self._config.model_dump(mode="json")


def get_or_create_governor(
    config: GovernorConfig, base_url: str | None, model: str, api_key: str | None
) -> ActorHandle | None:
    """The cluster's governor actor for this endpoint, model and key (created on first use, shared by
    name afterwards), or None when the config limits nothing. Needs ``ray.init`` first. The actor uses no
    CPU reservation. Ray ties a non-detached actor to the process that created it, so call this from the
    driver before starting workers: the governor then lives exactly as long as the job. (Gates made by
    ``gate_for`` re-resolve the name if the governor dies, e.g. with a worker that created it.)"""
    if not config.limits_anything():
        return None
    global _ACTOR_CLASS  # one Ray class per process; re-wrapping the class on every call is wasteful
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(GovernorService)
    name = governor_name(base_url, model, api_key)
    return _ACTOR_CLASS.options(
        name=name,
        namespace=NAMESPACE,
        get_if_exists=True,
        num_cpus=0,
        max_restarts=-1,  # a restarted governor starts fresh; workers keep going meanwhile
    ).remote(config.model_dump(mode="json"), export_as=name)


_ACTOR_CLASS: Any = None
_GATES: dict[str, GovernorClient] = {}


def gate_for(config: GovernorConfig, base_url: str | None, model: str, api_key: str | None) -> RateGate:
    """The rate gate a model client should use: ``OpenGate`` when nothing is limited, else this process's
    ``GovernorClient`` for the endpoint (one per process, shared by every session in it)."""
    if not config.limits_anything():
        return OpenGate()
    name = governor_name(base_url, model, api_key)
    gate = _GATES.get(name)
    if gate is None or gate.closed:

        def resolve() -> ActorHandle:
            handle = get_or_create_governor(config, base_url, model, api_key)
            assert handle is not None  # the config limits something (checked above)
            return handle

        capped = config.max_in_flight is not None
        gate = _GATES[name] = GovernorClient(
            resolve(),
            lease_size=config.lease_size,
            max_pause_s=config.max_pause_s,
            lookahead=not capped,
            report_interval_s=REPORT_INTERVAL_S / 4 if capped else REPORT_INTERVAL_S,
            resolve=resolve,
        )
    return gate
