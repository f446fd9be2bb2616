"""Starting or joining Ray, with the settings this project needs everywhere.

A local Ray binds loopback only: on machines with a public interface Ray otherwise advertises it (and
``ray.init("127.0.0.1:...")`` rewrites loopback to it). Token auth is explicit so every process that
joins agrees on it.

Placement: a node that can host sandboxes of a backend advertises the custom resource
``raygen_sandbox_<backend>`` (``ray start --resources='{"raygen_sandbox_docker": 64}'``) with its capacity
in concurrent sandboxes; ``session_actor_resources`` turns that into what each session actor reserves.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

from raygen.config import RayConfig
from raygen.envs import environment_class
from raygen.envs.processes import kill_processes_naming
from raygen.errors import ConfigError

log = logging.getLogger(__name__)

RAY_ENV_DEFAULTS = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


RAY_DATA_ACTOR_NOTE = (
    "note: Ray logs one core_worker.cc error about actor constructor arguments in the object store: Ray "
    "Data passes its map function to session actors that way and holds it for the whole run, so a "
    "restarted actor still finds it (ray-project/ray#53727)"
)
"""The one start-up line raygen cannot avoid, and why it is harmless: Ray Data always puts an actor pool's
map function and context in the object store and lets its actors restart, which Ray's core worker reports
once per process (at ERROR level, from C++, so no Python logger setting reaches it)."""


def ensure_ray(
    address: str | None, *, num_cpus: int | None = None, metrics_export_port: int | None = None
) -> bool:
    """Connect to ``address`` or start a private local Ray (its Prometheus endpoint on
    ``metrics_export_port``, if given). Returns True if this call started Ray (the caller then shuts it
    down)."""
    if ray.is_initialized():
        return False
    if address:
        # The loopback switch stays out of a real cluster's workers. A driver joining a head on loopback
        # (one machine) must itself be on loopback, else Ray may take the hostname's address (127.0.1.1 on
        # Debian) and find no raylet there.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        node_ip = "127.0.0.1" if _is_loopback(address) else None  # None: Ray finds the address
        runtime_env = {"env_vars": {"RAY_USAGE_STATS_ENABLED": os.environ["RAY_USAGE_STATS_ENABLED"]}}
        _check_reachable(address)
        try:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, _node_ip_address=node_ip)
        except ConnectionError as exc:  # e.g. the head refused this driver's token: one line, no traceback
            raise ConfigError(f"cannot join the Ray cluster at {address}: {exc}") from exc
        return True
    # No runtime_env here: the local Ray's processes are this process's children and inherit its
    # environment (so these defaults too), and a job runtime_env makes every task and actor wait for
    # the runtime-env agent on every worker lease (measured on 2 cores: three bare actors up in 0.6-0.9 s
    # instead of 1.3-2.8 s; a whole run's start-up is mostly Ray's own process starts, bench `startup`).
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    _start_local_ray(num_cpus, metrics_export_port)
    return True


def _start_local_ray(num_cpus: int | None, metrics_export_port: int | None) -> None:
    """A private local Ray, started a second time if the first start timed out: Ray gives its raylet a
    fixed 30 s to register, which a loaded machine missed (a CI run with 4 test processes on 2 cores)."""
    for attempt in (1, 2):
        # A short private temp dir: Ray's unix socket paths must stay under 107 bytes, and a stale
        # /tmp/ray/ray_current_cluster from a killed run must not be joined by accident.
        temp_dir = tempfile.mkdtemp(prefix="rg-ray-", dir="/tmp")
        try:
            with _quiet_token_auth_notice():
                ray.init(
                    address="local",
                    num_cpus=num_cpus,
                    _node_ip_address="127.0.0.1",
                    include_dashboard=False,
                    _temp_dir=temp_dir,
                    log_to_driver=False,
                    configure_logging=False,
                    _metrics_export_port=metrics_export_port or None,
                )
            _private_temp_dirs.append(temp_dir)
            return
        except Exception as exc:
            if attempt == 2 or RAY_START_TIMEOUT_TEXT not in str(exc):
                raise
            log.warning("Ray's local start timed out (a busy machine?); starting it once more")
            kill_processes_naming(temp_dir)  # what the failed start left running: nobody owns it
            ray.shutdown()  # whatever of its state ray.init had set


_private_temp_dirs: list[str] = []
"""The temp dir of the local Ray this process started (Ray's logs, ~4 MB a run): removed by
``shutdown_ray`` unless the run failed (1,000 of them had piled up in /tmp here)."""

RAY_START_TIMEOUT_TEXT = "timed out during startup"
"""In the exception ``ray.init`` raises when its raylet did not register in time (ray/_private/node.py)."""


HEAD_WAIT_S = 20.0
"""How long a driver waits for the head's port to accept connections (a head still starting)."""


def _check_reachable(address: str, wait_s: float = HEAD_WAIT_S) -> None:
    """Fail in one line when nothing listens at ``host:port``: ``ray.init`` itself waits forever for a
    GCS that is not there (measured: still waiting after 240 s, printing a warning every 5 s)."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return  # ray:// (Ray Client), "auto" and the like: Ray finds the head, and reports its own errors
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"cannot join the Ray cluster at {address}: nothing accepted a connection there in"
                    f" {wait_s:.0f} s ({exc.strerror or exc}); is its head up?"
                ) from exc
            time.sleep(1)


@contextmanager
def _quiet_token_auth_notice() -> Iterator[None]:
    """Ray turns token authentication on for every new local cluster unless ``RAY_AUTH_MODE`` says
    otherwise, and announces it with a warning on each start. raygen's private cluster keeps the
    protection; only the announcement is dropped. (Setting the mode here instead is too late: Ray reads it
    when it is imported.) Joining a cluster keeps every notice, including "token authentication is
    disabled"."""
    notices = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = notices.level
    notices.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notices.setLevel(level)


def shutdown_ray(keep_logs: bool = False) -> None:
    """Stop this process's Ray, and remove the temp dir of a local Ray it started unless ``keep_logs``
    (a run that failed: Ray's logs may say why).

    A second signal stops a run without waiting for Ray Data's iteration thread to end: once Ray is
    gone, any Ray call of that thread would start a NEW local Ray (``ray.init`` on first use) and its
    stats updates print tracebacks about the Ray that is gone (two of them reached the user before the
    exit line, issue 28). Neither may happen after this: the iteration is abandoned, as the run is."""
    try:
        from ray._private import auto_init_hook  # Ray's switch for its init-on-first-use (private)

        auto_init_hook.enable_auto_connect = False
    except ImportError:  # a Ray that moved it: its noise may come back (test_durability says so), no crash
        pass
    logging.getLogger("ray.data").setLevel(logging.CRITICAL)  # set again by the next pass's dataset
    ray.shutdown()
    while _private_temp_dirs:
        temp_dir = _private_temp_dirs.pop()
        if not keep_logs:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _is_loopback(address: str) -> bool:
    """Whether a ``host:port`` address names this machine's loopback (``ray://`` addresses never do here:
    a Ray Client driver has no local raylet)."""
    if "://" in address:
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


SANDBOX_RESOURCE_PREFIX = "raygen_sandbox_"


def sandbox_resource(env_type: str) -> str:
    """The custom resource a node advertises for its capacity in sandboxes of ``env_type``."""
    return f"{SANDBOX_RESOURCE_PREFIX}{env_type}"


def session_actor_resources(config: RayConfig, env_type: str) -> dict[str, float]:
    """The custom Ray resources each session actor reserves (see ``RayConfig.resources``).

    Raises ConfigError when the derived default cannot place a single actor (no node offers the backend,
    or none has room for ``sessions_per_worker`` sandboxes): the run would otherwise wait forever. With
    explicit resources, or when only some actors fit, it warns instead: an autoscaler may add nodes.
    """
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if config.resources is not None:
        wanted = dict(config.resources)
        explicit = True
    else:
        uses_convention = any(key.startswith(SANDBOX_RESOURCE_PREFIX) for res in nodes for key in res)
        # A backend whose sandboxes live off the node (a cloud service) uses no node's sandbox capacity.
        if not uses_convention or not environment_class(env_type).runs_on_node:
            return {}
        wanted = {sandbox_resource(env_type): float(config.sessions_per_worker)}
        explicit = False
    if not wanted:
        return {}
    fits = sum(_actors_fitting(res, wanted) for res in nodes)
    if fits == 0 and not explicit:
        raise ConfigError(_no_room_message(wanted, nodes, config.sessions_per_worker))
    if fits < config.workers:
        log.warning(
            "the cluster has room for %d of %d session actors reserving %s now; the others start when "
            "nodes with capacity join",
            fits,
            config.workers,
            wanted,
        )
    return wanted


def _actors_fitting(node_resources: dict[str, Any], wanted: dict[str, float]) -> int:
    counts = [
        math.floor(node_resources.get(name, 0.0) / amount + 1e-9)
        for name, amount in wanted.items()
        if amount > 0
    ]
    return min(counts) if counts else 1 << 30  # reserving nothing: any node fits


def _no_room_message(wanted: dict[str, float], nodes: list[dict[str, Any]], per_worker: int) -> str:
    ((name, amount),) = wanted.items()
    offered = sorted(
        {
            f"{key}={value:g}"
            for res in nodes
            for key, value in res.items()
            if key.startswith(SANDBOX_RESOURCE_PREFIX)
        }
    )
    if any(name in res for res in nodes):
        return (
            f"each session actor needs {amount:g} of {name} (one per concurrent session, "
            f"sessions_per_worker={per_worker}) but no node has that much (nodes offer: "
            f"{', '.join(offered)}); lower --sessions-per-worker or advertise more capacity"
        )
    return (
        f"no node of this Ray cluster offers {name} (nodes offer: {', '.join(offered)}): start nodes "
        f"that can run this backend with ray start --resources='{{\"{name}\": N}}', or set ray.resources"
    )
