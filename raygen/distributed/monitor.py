"""Driver-side view of the governor: a short line for the progress display and its history for
statistics.json. Polls at most every ``every_s`` so the driver's result loop stays cheap."""

from __future__ import annotations

import time
from typing import Any, cast

import ray
from ray.actor import ActorHandle


class GovernorMonitor:
    def __init__(self, handle: ActorHandle | None, every_s: float = 2.0):
        self.handle = handle
        self.every_s = every_s
        self._last = 0.0
        self._line = ""

    def line(self) -> str:
        if self.handle is None:
            return ""
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            try:
                snap = cast(dict[str, Any], ray.get(self.handle.snapshot.remote(), timeout=5))
            except Exception:  # the display must never stop the run
                return self._line
            target = snap.get("target_rpm")
            limit = f"/{target:.0f}" if target else ""
            self._line = (
                f"rpm {snap.get('achieved_rpm', 0):.0f}{limit} in flight {snap.get('in_flight', 0)} "
                f"429s {snap.get('rate_limited', 0)}"
            )
        return self._line

    def report(self) -> dict[str, Any] | None:
        if self.handle is None:
            return None
        try:
            answers: list[Any] = ray.get(
                [self.handle.snapshot.remote(), self.handle.history.remote()], timeout=10
            )
            snap, history = answers
        except Exception as exc:
            return {"error": f"governor unreachable: {type(exc).__name__}"}
        return {"snapshot": snap, "history": history}
