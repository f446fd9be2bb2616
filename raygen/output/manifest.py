"""``manifest.json``: what produced a run (dataset, resolved config, versions, times). No secrets: the
config holds only the *name* of the API-key variable, never its value."""

from __future__ import annotations

import platform
import socket
from datetime import UTC, datetime
from importlib import metadata
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def build_manifest(**fields: Any) -> dict[str, Any]:
    manifest = {
        "raygen_version": _version("raygen"),
        "python_version": platform.python_version(),
        "ray_version": _version("ray"),
        "openai_version": _version("openai"),
        "host": socket.gethostname(),
    }
    manifest.update(fields)
    return manifest
