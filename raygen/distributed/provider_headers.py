"""What a provider's rate-limit headers say: how long until a window resets, and whether to hold off."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_reset(value: str, wall_now: float) -> float | None:
    """Seconds until a rate-limit window resets, from ``6m0s`` / ``20ms`` / ``1.5s`` style durations
    (OpenAI), plain seconds, or an epoch timestamp in seconds or milliseconds (OpenRouter)."""
    text = value.strip().lower()
    try:
        number = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            return None
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    if number > 1e12:  # epoch milliseconds
        return max(0.0, number / 1000.0 - wall_now)
    if number > 1e9:  # epoch seconds
        return max(0.0, number - wall_now)
    return max(0.0, number)


def pause_from_headers(headers: Mapping[str, str] | None, wall_now: float | None = None) -> float:
    """How long the provider's ``x-ratelimit-*`` headers say to hold off: the reset time of any window
    whose ``remaining`` is 0; 0.0 when none is exhausted or the headers are absent or unreadable."""
    if not headers:
        return 0.0
    wall_now = time.time() if wall_now is None else wall_now
    lower = {k.lower(): v for k, v in headers.items()}
    pause = 0.0
    for suffix in ("-requests", "-tokens", ""):
        remaining = lower.get(f"x-ratelimit-remaining{suffix}")
        reset = lower.get(f"x-ratelimit-reset{suffix}")
        if remaining is None or reset is None:
            continue
        try:
            exhausted = float(remaining) <= 0
        except ValueError:
            continue
        if exhausted:
            pause = max(pause, parse_reset(str(reset), wall_now) or 0.0)
    return pause
