"""raygen's figures as Ray metrics (``ray.util.metrics``), so they appear where Ray users look: the Ray
dashboard and its Prometheus endpoint (``ray.metrics_export_port``, ``ray start --metrics-export-port``).

Ray prefixes every name with ``ray_`` (and Prometheus gives counters a ``_total`` suffix:
``ray_raygen_sessions_started_total``) and tags each series with the reporting process (``WorkerId``), so a
cluster figure is a ``sum`` over processes. Every raygen series carries ``run`` (the run name). Exported:

- ``raygen_sessions_started``, ``raygen_sessions_finished`` (tag ``status``: ``completed``, ``failed`` for
  an ``error:*`` exit, ``other`` for model outcomes such as ``max_turns``), ``raygen_sessions_failed``;
- ``raygen_tokens`` (tag ``kind``: ``prompt`` / ``completion``), ``raygen_rate_limited`` (429 answers);
- ``raygen_cost_usd``: what finished sessions' model calls cost (docs/cost.md);
- gauges ``raygen_requests_in_flight`` and ``raygen_sandboxes``;
- ``run`` is the run name with its non-ASCII characters percent-escaped (Ray's tags are ASCII);
- from the governor actor, gauges ``raygen_governor_target_rpm`` (0 while nothing is paced),
  ``raygen_governor_achieved_rpm`` and ``raygen_governor_measured_limit_rpm`` (tag ``governor``: its actor
  name).

The session layer knows nothing of Ray: the worker wraps the model's ``RateGate`` (every request passes it
with its outcome) and hands ``SessionRunner`` a sandbox callback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from ray.util.metrics import Counter, Gauge

from raygen.model.gate import Permit, RateGate

log = logging.getLogger(__name__)

_FLUSH_S = 1.0
"""A session actor's counts and gauges go to Ray at most this often."""
_EXPORT_EVERY_S = 1.0
"""The governor's gauges are set at most this often (they are read every few seconds at best)."""


def ascii_tag(value: str) -> str:
    """``value`` as a Ray metric tag, which must be ASCII (a non-ASCII run name made every flush raise
    in the session actors, issue 28): non-ASCII characters percent-escaped as UTF-8 (``ü`` -> ``%C3%BC``),
    the rest unchanged."""
    return "".join(c if c.isascii() else quote(c, safe="") for c in value)


class WorkerMetrics:
    """The counters and gauges of one session-actor process."""

    def __init__(self, run_name: str):
        self._tags = {"run": ascii_tag(run_name)}
        self.started = Counter("raygen_sessions_started", description="Sessions started.", tag_keys=("run",))
        self.finished = Counter(
            "raygen_sessions_finished",
            description="Sessions finished, by status (completed, failed, other).",
            tag_keys=("run", "status"),
        )
        self.failed = Counter(
            "raygen_sessions_failed", description="Sessions ended by an error:* status.", tag_keys=("run",)
        )
        self.tokens = Counter(
            "raygen_tokens", description="Tokens the provider reported, by kind.", tag_keys=("run", "kind")
        )
        self.cost = Counter("raygen_cost_usd", description="USD spent on model calls.", tag_keys=("run",))
        self.rate_limited = Counter(
            "raygen_rate_limited", description="Requests answered 429.", tag_keys=("run",)
        )
        self.requests_gauge = Gauge(
            "raygen_requests_in_flight", description="Model requests in flight.", tag_keys=("run",)
        )
        self.sandboxes_gauge = Gauge(
            "raygen_sandboxes", description="Sandboxes (environments) open.", tag_keys=("run",)
        )
        self.requests = self.sandboxes = 0
        self._status_tags = {k: {**self._tags, "status": k} for k in ("completed", "failed", "other")}
        self._kind_tags = {k: {**self._tags, "kind": k} for k in ("prompt", "completion")}
        self._pending: dict[tuple, list] = {}
        self._flush_at: asyncio.TimerHandle | None = None
        self._failed = False

    def session_started(self) -> None:
        self._add(self.started, self._tags, 1)

    def session_finished(self, exit_status: str, cost_usd: float = 0.0) -> None:
        if cost_usd > 0:
            self._add(self.cost, self._tags, cost_usd)
        failed = exit_status.startswith("error:")
        status = "completed" if exit_status == "completed" else "failed" if failed else "other"
        self._add(self.finished, self._status_tags[status], 1)
        if failed:
            self._add(self.failed, self._tags, 1)

    def sandbox_opened(self, delta: int) -> None:
        """``SessionRunner``'s ``on_sandbox`` callback: +1 when a session's environment starts, -1 when
        it is closed."""
        self.sandboxes += delta
        self._due()

    def request(self, delta: int) -> None:
        self.requests += delta
        self._due()

    def outcome(self, status: int | None, prompt_tokens: int, completion_tokens: int) -> None:
        if status == 429:
            self._add(self.rate_limited, self._tags, 1)
        if prompt_tokens > 0:
            self._add(self.tokens, self._kind_tags["prompt"], prompt_tokens)
        if completion_tokens > 0:
            self._add(self.tokens, self._kind_tags["completion"], completion_tokens)

    # Each ``inc``/``set`` of a Ray metric checks its tags in Python and calls into Ray's core: about a
    # dozen per session were 2% of a session actor's CPU. Counts add up here and go out together at most
    # every ``_FLUSH_S`` (Ray exports every few seconds anyway).

    def _add(self, metric: Counter, tags: dict[str, str], amount: float) -> None:
        key = (id(metric), tuple(tags.items()))
        entry = self._pending.get(key)
        if entry is None:
            self._pending[key] = [metric, tags, amount]
        else:
            entry[2] += amount
        self._due()

    def _due(self) -> None:
        if self._flush_at is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a plain call): at once
            self.flush()
            return
        self._flush_at = loop.call_later(_FLUSH_S, self.flush)

    def flush(self) -> None:
        """Send every count added since the last flush, and the gauges' current values."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        pending, self._pending = self._pending, {}
        try:
            for metric, tags, amount in pending.values():
                metric.inc(amount, tags=tags)
            self.requests_gauge.set(self.requests, tags=self._tags)
            self.sandboxes_gauge.set(self.sandboxes, tags=self._tags)
        except Exception as exc:  # figures for a dashboard must never cost a session: said once, dropped
            if not self._failed:
                log.warning("raygen metrics not exported: %s: %s", type(exc).__name__, exc)
            self._failed = True


class MeteredGate:
    """A ``RateGate`` that counts what passes through it (requests in flight, 429s, tokens) and leaves
    every decision to the gate it wraps."""

    def __init__(self, inner: RateGate, metrics: WorkerMetrics):
        self._inner = inner
        self._metrics = metrics

    async def acquire(self, est_tokens: int) -> Permit:
        permit = await self._inner.acquire(est_tokens)
        self._metrics.request(+1)
        return permit

    def release(self, permit: Permit, **outcome: Any) -> None:
        self._metrics.request(-1)
        self._metrics.outcome(
            outcome.get("status"), outcome.get("prompt_tokens", 0), outcome.get("completion_tokens", 0)
        )
        self._inner.release(permit, **outcome)


class GovernorMetrics:
    """The governor actor's gauges, set from its policy's snapshot at most once a second."""

    def __init__(self, governor: str):
        self._tags = {"governor": governor}
        keys = ("governor",)
        self._gauges = {
            "target_rpm": Gauge(
                "raygen_governor_target_rpm",
                description="The governor's paced rate (0: nothing paced).",
                tag_keys=keys,
            ),
            "achieved_rpm": Gauge(
                "raygen_governor_achieved_rpm", description="Requests granted, last 10 s.", tag_keys=keys
            ),
            "measured_limit_rpm": Gauge(
                "raygen_governor_measured_limit_rpm",
                description="The rate the provider let through at its last 429 (0: none yet).",
                tag_keys=keys,
            ),
        }
        self._next = 0.0

    def maybe_export(self, snapshot: Callable[[], Mapping[str, float | None]]) -> None:
        """Set the gauges from ``snapshot()`` (a callable, called only when due)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + _EXPORT_EVERY_S
        figures = snapshot()
        for key, gauge in self._gauges.items():
            gauge.set(float(figures.get(key) or 0.0), tags=self._tags)
