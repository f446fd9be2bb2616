"""``provider`` config -> the request-body keys each provider understands.

Reasoning is asked for differently per API: OpenRouter takes a ``reasoning`` object (``effort``, or
``enabled: false`` for none), OpenAI-style endpoints (OpenAI, vLLM, most gateways) take
``reasoning_effort``. OpenRouter's upstream routing goes in a ``provider`` object. ``sampling.extra_body``
is applied after these, so a hand-written option always wins.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from raygen.model.configs import ProviderConfig

OPENROUTER_HOST = "openrouter.ai"


def api_style(provider: ProviderConfig, base_url: str | None) -> str:
    """``openrouter`` or ``openai``: the configured style, or the endpoint's (``auto``)."""
    if provider.api_style != "auto":
        return provider.api_style
    host = urlparse(base_url or "").hostname or ""
    return "openrouter" if host == OPENROUTER_HOST or host.endswith("." + OPENROUTER_HOST) else "openai"


def request_options(provider: ProviderConfig, base_url: str | None) -> dict[str, Any]:
    """Body keys for ``provider`` (a ProviderConfig) against ``base_url``; empty when nothing is set."""
    body: dict[str, Any] = {}
    openrouter = api_style(provider, base_url) == "openrouter"
    effort = "none" if not provider.reasoning else provider.reasoning_effort
    if effort is not None:
        if not openrouter:
            body["reasoning_effort"] = effort
        elif effort == "none":
            body["reasoning"] = {"enabled": False}
        else:
            body["reasoning"] = {"effort": effort}
    route = {
        key: value
        for key, value in (
            ("only", provider.providers_allowed),
            ("ignore", provider.providers_ignored),
            ("order", provider.providers_order),
            ("sort", provider.provider_sort),
        )
        if value
    }
    if route:
        body["provider"] = route
    return body
