"""Starting or joining Ray, with the settings this project needs everywhere.

A local Ray binds loopback only: on machines with a public interface Ray otherwise advertises it (and
``ray.init("127.0.0.1:...")`` rewrites loopback to it). Token auth is explicit so every process that
joins agrees on it.
"""

from __future__ import annotations

import logging
import os
import tempfile

import ray

log = logging.getLogger(__name__)

RAY_ENV_DEFAULTS = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def ensure_ray(address: str | None, *, num_cpus: int | None = None) -> bool:
    """Connect to ``address`` or start a private local Ray. Returns True if this call started Ray
    (the caller then shuts it down)."""
    if ray.is_initialized():
        return False
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    runtime_env = {"env_vars": {k: os.environ[k] for k in RAY_ENV_DEFAULTS}}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return True
    # A short private temp dir: Ray's unix socket paths must stay under 107 bytes, and a stale
    # /tmp/ray/ray_current_cluster from a killed run must not be joined by accident.
    temp_dir = tempfile.mkdtemp(prefix="rg-ray-", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=num_cpus,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        _temp_dir=temp_dir,
        runtime_env=runtime_env,
        log_to_driver=False,
        configure_logging=False,
    )
    return True


def shutdown_ray() -> None:
    ray.shutdown()
