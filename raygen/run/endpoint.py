"""Where a run's model is reached: the one place that knows ``model.type: sim`` means "start the built-in
simulator for this run" (before it existed, an ``openai`` model without ``base_url`` meant that)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from raygen.config import RunConfig

SIMULATOR_ENDPOINT = "builtin-simulator"
"""How generation settings and comparisons name the simulator's endpoint (its URL changes every run)."""


def endpoint_label(config: RunConfig) -> str | None:
    """The endpoint as recorded in the generation settings: the URL, ``builtin-simulator``, or None for a
    model that runs in-process."""
    if config.model.type == "sim":
        return SIMULATOR_ENDPOINT
    return getattr(config.model, "base_url", None)


@contextmanager
def model_endpoint(config: RunConfig, announce: Callable[[str], None]) -> Iterator[str | None]:
    """The base URL the workers use while the block runs: the configured endpoint; for ``sim`` a simulator
    subprocess started here (``announce`` says where) and stopped on exit; None for an in-process model."""
    if config.model.type != "sim":
        yield getattr(config.model, "base_url", None)
        return
    from raygen.sim.launch import start_subprocess

    sim = start_subprocess(config.sim)
    try:
        announce(f"no --base-url: using the built-in simulator at {sim.url} (no API key needed)")
        yield sim.url
    finally:
        sim.stop()
