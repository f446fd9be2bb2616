"""When refusals are evidence: one answer is never a cluster-wide verdict.

A provider's single 429 or 503 with ``Retry-After: 100000`` may come from one overloaded replica or a
misconfigured gateway; honouring it for everyone froze a whole run (issue 24: 4 sessions, 3 of them
healthy, all failed ``session_timeout`` behind a 120-s cluster pause). So an answer by itself only delays
its own request (the model client's retry, within ``model.retry_max_wait_s``), and:

- the cluster (or one worker, on its own refusals) pauses only when ``PAUSE_AFTER`` refusals came within
  ``PAUSE_WINDOW_S`` seconds, for the median of the pauses they asked (one absurd Retry-After among them
  does not set it), capped at ``governor.max_pause_s`` (itself never above ``model.retry_max_wait_s``);
- a learned target is cut (or a known one trimmed) only when a 429 is not alone: ``CUT_AFTER`` of them
  within ``CUT_WINDOW_S`` seconds. A rate limit the cluster really overshoots answers many requests with
  429 in that span; a stray one (a one-second window's jitter, a replica's hiccup) does not repeat.

A refusal is a 429, or any other answer that asks to wait (a 5xx with ``Retry-After``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

PAUSE_AFTER = 3
"""Refusals within ``PAUSE_WINDOW_S`` that pause everyone (cluster-wide at the governor, per worker at a
worker for its own answers)."""
PAUSE_WINDOW_S = 2.0
CUT_AFTER = 2
"""429s within ``CUT_WINDOW_S`` that cut (or trim) the rate."""
CUT_WINDOW_S = 10.0
_KEPT = 256
"""Refusals remembered (the newest); far more than any rule above counts."""


@dataclass(frozen=True)
class Refusal:
    at: float
    pause_s: float
    """What the answer asked for (Retry-After, or its rate-limit reset headers); 0 if nothing."""
    rate_limited: bool
    """A 429 (counts towards cuts), not only an answer asking to wait."""


class RefusalEvidence:
    """The recent refusals of one scope (the whole cluster, or one worker) and what they justify."""

    def __init__(self) -> None:
        self._recent: deque[Refusal] = deque(maxlen=_KEPT)

    def add(self, refusal: Refusal) -> None:
        self._recent.append(refusal)

    def _within(self, now: float, window_s: float, *, rate_limited: bool = False) -> list[Refusal]:
        return [r for r in self._recent if now - r.at <= window_s and (r.rate_limited or not rate_limited)]

    def pause_s(self, now: float, cap_s: float) -> float:
        """How long everyone should hold off now: 0.0 unless ``PAUSE_AFTER`` refusals came within
        ``PAUSE_WINDOW_S``; then the median of the pauses they asked for (at least one that asked),
        counted from the latest of them, capped at ``cap_s``."""
        recent = self._within(now, PAUSE_WINDOW_S)
        if len(recent) < PAUSE_AFTER:
            return 0.0
        asked = sorted(r.pause_s for r in recent if r.pause_s > 0)
        if not asked:
            return 0.0
        median = asked[(len(asked) - 1) // 2]  # the lower median: an outlier above it never counts
        latest = max(r.at for r in recent)
        return max(0.0, min(cap_s, median) - (now - latest))

    def justifies_cut(self, now: float) -> bool:
        """Whether the latest 429 is not alone: ``CUT_AFTER`` 429s within ``CUT_WINDOW_S``."""
        return len(self._within(now, CUT_WINDOW_S, rate_limited=True)) >= CUT_AFTER


def allowed_again_at(now: float, refusals: list[tuple[float, bool, float]], cap_s: float) -> float:
    """When the provider will take requests again, by the 429s of one report (``(pause asked, was a 429,
    seconds since sent)``): each says "sent at ``now - age``, wait ``pause``". A request's answer comes
    after it was sent, so each such moment is early by how long the request sat in the worker before
    going out: the latest is the best, among those within a second of the median (one absurd Retry-After
    never sets it). ``now`` if none was a 429."""
    moments = sorted(
        now - max(0.0, age) + min(pause, cap_s) for pause, rate_limited, age in refusals if rate_limited
    )
    if not moments:
        return now
    median = moments[(len(moments) - 1) // 2]
    return max(m for m in moments if m <= median + 1.0)
