"""The Docker engine client behind the Docker backend: the client, its threads, image checks, the reaper.

- ``ensure_images`` checks local presence and pulls per ``env.pull`` (``DockerEnvironment.prepare``, the
  pre-flight before any model call, and each container start use it). Each image is resolved at
  most once per process (the result is cached, failures too), never by two coroutines at once (a
  per-image asyncio lock), and never by two processes on one node at once (a file lock in the system temp
  dir, after which presence is checked again, so the second process finds the first one's pull).
- ``reap_containers(config, run_name)`` force-removes containers labelled with a run (or every raygen
  container): ``DockerEnvironment.reap``.

An unreachable engine is not an image problem: it raises ``SessionFailure("env_start")`` so a run fails
loudly instead of sending every row to ``failed/``.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hashlib
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from raygen.envs.labels import LABEL_RUN
from raygen.errors import MissingExtraError, SessionFailure

log = logging.getLogger(__name__)

T = TypeVar("T")

_clients: dict[tuple[str | None, float], Any] = {}
_clients_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
# Per-process image results, keyed by (engine address, image); and the locks that serialise each image,
# per event loop (an asyncio.Lock belongs to the loop it was first used on).
ImageKey = tuple[str | None, str]
_image_results: dict[ImageKey, str | None] = {}
_image_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ImageKey, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def import_docker() -> Any:
    """The ``docker`` SDK module, or MissingExtraError naming the extra that installs it."""
    try:
        import docker
    except ImportError as exc:
        raise MissingExtraError("docker", "docker") from exc
    return docker


def engine_address(config: Any) -> str:
    """Where the engine is, for messages: the configured URL, else DOCKER_HOST, else the default socket."""
    return config.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def get_client(config: Any) -> Any:
    """The process's Docker client for this engine (blocking: it asks the engine for its API version).

    One client per engine and process: its connection pool is shared by every session of the process.
    Raises SessionFailure("env_start") when the engine cannot be reached.
    """
    docker = import_docker()
    key = (config.base_url, config.api_timeout_s)
    with _clients_lock:
        client = _clients.get(key)
        if client is not None:
            return client
        # Pool as large as the thread pool, or urllib3 discards (and re-opens) connections under load.
        options = {"timeout": config.api_timeout_s, "max_pool_size": config.max_api_threads}
        try:
            if config.base_url:
                client = docker.DockerClient(base_url=config.base_url, version="auto", **options)
            else:
                client = docker.from_env(**options)
            client.ping()
        except Exception as exc:
            raise SessionFailure(
                "env_start", f"Docker engine unreachable at {engine_address(config)}: {exc}"
            ) from exc
        _clients[key] = client
        return client


def _api_executor(config: Any) -> ThreadPoolExecutor:
    # A dedicated pool, not asyncio's default one (min(32, cpus + 4) threads): every running command
    # holds a thread for its whole duration, so the default pool would cap a worker at a handful of
    # concurrent commands and starve everything else that uses to_thread.
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(config.max_api_threads, thread_name_prefix="raygen-docker")
        return _executor


async def run_blocking(config: Any, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking Docker SDK call on the Docker thread pool, keeping the event loop free."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_api_executor(config), functools.partial(fn, *args, **kwargs))


async def get_client_async(config: Any) -> Any:
    """``get_client`` without blocking the event loop (the first call talks to the engine)."""
    key = (config.base_url, config.api_timeout_s)
    client = _clients.get(key)
    return client if client is not None else await run_blocking(config, get_client, config)


def _lock_path(address: str | None, image: str) -> str:
    digest = hashlib.sha256(f"{address}\0{image}".encode()).hexdigest()[:24]
    folder = os.path.join(tempfile.gettempdir(), "raygen-image-locks")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{digest}.lock")


def _image_present(client: Any, image: str) -> bool:
    docker = import_docker()
    try:
        client.api.inspect_image(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def _pull(client: Any, image: str, timeout_s: float) -> str | None:
    """Pull ``image``; None on success, else the engine's reason."""
    docker = import_docker()
    repository, tag = docker.utils.parse_repository_tag(image)
    deadline = time.monotonic() + timeout_s
    try:
        # The engine reports some failures inside the progress stream, not as an HTTP error.
        for event in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
            if isinstance(event, dict) and event.get("error"):
                return str(event["error"])
            if time.monotonic() > deadline:
                return f"pull took longer than env.pull_timeout_s={timeout_s}"
    except docker.errors.APIError as exc:
        return str(exc.explanation or exc)
    except Exception as exc:  # a timeout or a dropped connection mid-pull
        return f"pull interrupted: {exc}"
    return None if _image_present(client, image) else "the engine reported success but has no such image"


def _resolve_image(config: Any, image: str) -> str | None:
    """Blocking: make ``image`` usable per the pull policy; None if it is, else why not."""
    client = get_client(config)
    docker = import_docker()
    try:
        if config.pull != "always" and _image_present(client, image):
            return None
        if config.pull == "never":
            return f"image {image!r} is not present on the engine and env.pull is 'never'"
        with open(_lock_path(config.base_url, image), "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)  # another process on this node may be pulling it
            if config.pull != "always" and _image_present(client, image):
                return None
            log.info("pulling image %s", image)
            problem = _pull(client, image, config.pull_timeout_s)
    except docker.errors.DockerException as exc:
        return f"image {image!r}: {exc}"
    except OSError as exc:
        raise SessionFailure("env_start", f"Docker engine at {engine_address(config)}: {exc}") from exc
    if problem is None:
        return None
    if config.pull == "always" and _image_present(client, image):
        log.warning("could not refresh image %s (%s); using the local copy", image, problem)
        return None
    return f"image {image!r} is not present and could not be pulled: {problem}"


async def ensure_images(config: Any, images: Iterable[str]) -> dict[str, str | None]:
    """Make each Docker image usable (check, pull per ``config.pull``); None per usable image, else why not.

    Raises SessionFailure("env_start") if the engine cannot be reached.
    """
    await get_client_async(config)  # fail fast, once, on an unreachable engine
    wanted = sorted(set(images))
    results = await asyncio.gather(*(_ensure_one(config, image) for image in wanted))
    return dict(zip(wanted, results, strict=True))


async def _ensure_one(config: Any, image: str) -> str | None:
    key = (config.base_url, image)
    if key in _image_results:
        return _image_results[key]
    locks = _image_locks.setdefault(asyncio.get_running_loop(), {})
    lock = locks.setdefault(key, asyncio.Lock())
    async with lock:
        if key not in _image_results:
            _image_results[key] = await run_blocking(config, _resolve_image, config, image)
    return _image_results[key]


def build_missing_images(config: Any, contexts: dict[str, Any]) -> dict[str, str | None]:
    """Build each tag from its context folder unless the engine has it (a tag that hashes its context is
    never stale); per tag None or why the build failed. Blocking. Builds get no network (the engine may have
    none): an image that needs the network to build must be prebuilt."""
    client = get_client(config)
    docker = import_docker()
    out: dict[str, str | None] = {}
    for tag, context in contexts.items():
        if _image_present(client, tag):
            out[tag] = None
            continue
        try:
            client.images.build(path=str(context), tag=tag, network_mode="none", rm=True)
            out[tag] = None
        except (docker.errors.DockerException, OSError) as exc:
            out[tag] = f"building {context}: {exc}"
    return out


def reap_containers(config: Any, run_name: str | None) -> int:
    """Force-remove containers labelled with ``run_name`` (every raygen container when None); returns how
    many were removed. Blocking. Raises SessionFailure("env_start") if the engine is unreachable."""
    docker = import_docker()
    client = get_client(config)
    label = f"{LABEL_RUN}={run_name}" if run_name is not None else LABEL_RUN
    removed = 0
    for container in client.api.containers(all=True, filters={"label": label}):
        try:
            client.api.remove_container(container["Id"], force=True)
            removed += 1
        except docker.errors.NotFound:
            pass  # removed meanwhile by its own session
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # "removal already in progress"
                continue
            log.warning("could not remove container %s: %s", container["Id"][:12], exc)
    return removed


def forget_images() -> None:
    """Drop the per-process image results (tests; or after images changed on the engine)."""
    _image_results.clear()
    _image_locks.clear()


def container_gone(exc: Any) -> bool:
    # 404 means either "no such container" or "no such path in it"; 409 means "container not running".
    text = str(getattr(exc, "explanation", None) or exc).lower()
    return "no such container" in text or "is not running" in text


def container_options(
    config: Any, name: str, labels: dict[str, str], cwd: str, binds: Iterable[str] = ()
) -> dict[str, Any]:
    """``containers.create`` options of a session's container (see DockerEnvironment); ``binds``: host
    folders shown at the same path inside (an agent harness's seat, EnvSpec.binds)."""
    docker = import_docker()
    options: dict[str, Any] = {
        "name": name,
        "labels": labels,
        "init": True,
        "working_dir": cwd,  # Docker creates it
        "network_mode": None if config.network else "none",
        "privileged": False,
        "detach": True,
    }
    if config.exec_channel:  # the container's process is the exec channel's sh, fed through its stdin
        options.update(stdin_open=True, log_config=docker.types.LogConfig(type="none"))
    if config.cpus is not None:
        options["nano_cpus"] = int(config.cpus * 1e9)
    if config.memory is not None:
        options["mem_limit"] = config.memory
    if config.pids_limit is not None:
        options["pids_limit"] = config.pids_limit
    if mounts := [*config.mounts, *(f"{path}:{path}" for path in binds)]:
        options["mounts"] = [bind_mount(docker, mount) for mount in mounts]
    return options


def bind_mount(docker: Any, spec: str) -> Any:
    source, target, *mode = spec.split(":")
    return docker.types.Mount(target=target, source=source, type="bind", read_only=mode == ["ro"])
