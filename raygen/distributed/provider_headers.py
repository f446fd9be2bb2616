"""What a provider's rate-limit headers say: how long until a window resets, and whether to hold off.

Read where present, never required (many endpoints send none): OpenAI's ``x-ratelimit-{remaining,reset}-
{requests,tokens}`` (durations such as ``6m0s``), OpenRouter's ``X-RateLimit-{Remaining,Reset}`` (epoch
milliseconds) and Anthropic's ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
{remaining,reset}`` (RFC 3339 times). ``Retry-After`` and ``retry-after-ms`` are read by the model client
(raygen.model.openai_model) and take precedence.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_WINDOWS = [
    (f"x-ratelimit-remaining{suffix}", f"x-ratelimit-reset{suffix}")
    for suffix in ("-requests", "-tokens", "")
] + [
    (f"anthropic-ratelimit-{kind}-remaining", f"anthropic-ratelimit-{kind}-reset")
    for kind in ("requests", "tokens", "input-tokens", "output-tokens")
]
"""(remaining, reset) header pairs, lower case, of every family read."""


def parse_reset(value: str, wall_now: float) -> float | None:
    """Seconds until a rate-limit window resets, from ``6m0s`` / ``20ms`` / ``1.5s`` style durations
    (OpenAI), plain seconds, an epoch timestamp in seconds or milliseconds (OpenRouter), or an RFC 3339
    time (Anthropic)."""
    text = value.strip().lower()
    try:
        number = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_S[u] for n, u in parts)
        return _rfc3339_in(value.strip(), wall_now)
    if number > 1e12:  # epoch milliseconds
        return max(0.0, number / 1000.0 - wall_now)
    if number > 1e9:  # epoch seconds
        return max(0.0, number - wall_now)
    return max(0.0, number)


def _rfc3339_in(text: str, wall_now: float) -> float | None:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:  # a time without a zone says nothing certain
        return None
    return max(0.0, when.timestamp() - wall_now)


def pause_from_headers(headers: Mapping[str, str] | None, wall_now: float | None = None) -> float:
    """How long the provider's rate-limit headers say to hold off: the reset time of any window whose
    ``remaining`` is 0; 0.0 when none is exhausted or the headers are absent or unreadable."""
    if not headers:
        return 0.0
    wall_now = time.time() if wall_now is None else wall_now
    lower = {k.lower(): v for k, v in headers.items()}
    pause = 0.0
    for remaining_name, reset_name in _WINDOWS:
        remaining, reset = lower.get(remaining_name), lower.get(reset_name)
        if remaining is None or reset is None:
            continue
        try:
            exhausted = float(remaining) <= 0
        except ValueError:
            continue
        if exhausted:
            pause = max(pause, parse_reset(str(reset), wall_now) or 0.0)
    return pause
