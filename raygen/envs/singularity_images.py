"""Images for the Singularity/Apptainer backend: which executable, and which SIF file or sandbox to run.

A row's image is one of:
- a remote reference (``docker://``, ``docker-archive:``, ``docker-daemon:``, ``oci:``, ``oci-archive:``,
  ``library://``, ``oras://``, ``shub://``, ``http(s)://``): converted once per node, with
  ``apptainer build``, into ``<cache_dir>/<sha256 of the reference>.sif``;
- a path (absolute, or relative to ``image_dir``): a SIF file, or a sandbox directory (one made by
  ``apptainer build --sandbox``: instances need its ``.singularity.d``), used as is;
- a bare name such as ``python:3.11`` that is no existing path: ``docker://python:3.11`` (unless
  ``bare_names_are_docker`` is off).

Conversions happen at most once per node: per process, one coroutine builds while the others wait for its
result (cached, failures too); across processes, an ``flock`` on ``<cache_dir>/<sha>.lock`` serialises
them, and the SIF appears under its final name only when complete (built under a temporary name, then
renamed), so a second process finds it after taking the lock. ``forget_images()`` drops the per-process
results (tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raygen.envs.base import image_names
from raygen.errors import SessionFailure

log = logging.getLogger(__name__)

REMOTE_SCHEMES = re.compile(
    r"^(docker|docker-archive|docker-daemon|oci|oci-archive|library|oras|shub|http|https):"
)
_BARE_DOCKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
_IMAGE_FILE_SUFFIXES = (".sif", ".simg", ".img")
LOCK_POLL_S = 0.25

_executables: dict[str | None, str] = {}
_results: dict[tuple[str, str, str], tuple[str | None, str | None]] = {}
_pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, asyncio.Future]] = (
    weakref.WeakKeyDictionary()
)


def find_executable(config: Any) -> str:
    """The absolute path of ``config.executable`` (else ``apptainer``, else ``singularity`` on PATH).

    Raises SessionFailure("env_start") when there is none: a node without apptainer cannot run any row.
    """
    if config.executable in _executables:
        return _executables[config.executable]
    names = [config.executable] if config.executable else ["apptainer", "singularity"]
    for name in names:
        found = shutil.which(name)
        if found:
            _executables[config.executable] = os.path.abspath(found)
            return _executables[config.executable]
    wanted = config.executable or "apptainer or singularity"
    raise SessionFailure("env_start", f"{wanted} is not installed or not on PATH on this node")


def cache_dir(config: Any) -> Path:
    """Where converted SIF files live on this node."""
    if config.cache_dir is not None:
        return Path(config.cache_dir)
    return Path(tempfile.gettempdir()) / f"raygen-sif-cache-{os.getuid()}"


def build_environment(host_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of ``apptainer build``: the host's, minus variables meant for containers.

    Builds from remote references run no image code, so registry credentials
    (``APPTAINER_DOCKER_USERNAME``/``_PASSWORD``) may reach them; ``APPTAINERENV_*`` must not.
    """
    host_env = os.environ if host_env is None else host_env
    return {
        name: value
        for name, value in host_env.items()
        if not name.startswith(("APPTAINERENV_", "SINGULARITYENV_"))
    }


def classify(config: Any, image: str) -> tuple[str, str]:
    """``("remote", reference)``, ``("path", absolute path)`` or ``("missing", why)``."""
    if REMOTE_SCHEMES.match(image):
        return "remote", image
    base = Path(config.image_dir) if config.image_dir is not None else Path.cwd()
    path = base / image  # an absolute image path replaces base
    if path.exists():
        return "path", str(path.absolute())
    looks_like_path = image.startswith((".", "/", "~")) or image.endswith(_IMAGE_FILE_SUFFIXES)
    if config.bare_names_are_docker and not looks_like_path and _BARE_DOCKER_NAME.match(image):
        return "remote", f"docker://{image}"
    return "missing", f"no such image file or directory: {path}"


def _check_local(path: str) -> str | None:
    if os.path.isdir(path) and not os.path.isdir(os.path.join(path, ".singularity.d")):
        return (
            f"{path} is a directory but no apptainer sandbox (it has no .singularity.d): "
            "make one with `apptainer build --sandbox DIR SOURCE`"
        )
    if not os.access(path, os.R_OK):
        return f"{path} is not readable"
    return None


async def resolve_image(config: Any, image: str) -> str:
    """The SIF file or sandbox directory to run for ``image``, converting a remote image if needed.

    Raises SessionFailure("image_unavailable") if there is none, ("env_start") without an executable.
    """
    path, problem = await _resolve_cached(config, image)
    if problem is not None or path is None:
        raise SessionFailure("image_unavailable", problem or f"image {image!r} is unavailable")
    return path


async def prepare_sif_images(config: Any, images: Iterable[str | None]) -> dict[str, str | None]:
    """The image pre-flight (``SingularityEnvironment.prepare``): per image, None if usable, else why not.

    ``None`` among ``images`` stands for ``config.default_image``. Raises SessionFailure("env_start") when
    the node has no apptainer, so a run fails loudly instead of sending every row to ``failed/``.
    """
    find_executable(config)
    ordered = sorted(image_names(images, config.default_image))
    results = await asyncio.gather(*(_resolve_cached(config, image) for image in ordered))
    return {image: problem for image, (_path, problem) in zip(ordered, results, strict=True)}


async def _resolve_cached(config: Any, image: str) -> tuple[str | None, str | None]:
    key = (find_executable(config), str(cache_dir(config)), image)
    if key in _results:
        return _results[key]
    pending = _pending.setdefault(asyncio.get_running_loop(), {})
    future = pending.get(key)
    if future is None:
        # One resolution per image and process; waiters are shielded, so a cancelled session never
        # cancels a conversion that other sessions wait for.
        future = pending[key] = asyncio.ensure_future(_resolve(config, key[0], image))
    try:
        result = await asyncio.shield(future)
    finally:
        if future.done():
            pending.pop(key, None)
    _results[key] = result  # failures too, as the Docker pre-flight does: no rebuild storm per row
    return result


async def _resolve(config: Any, executable: str, image: str) -> tuple[str | None, str | None]:
    kind, value = classify(config, image)
    if kind == "missing":
        return None, value
    if kind == "path":
        problem = _check_local(value)
        return (None, problem) if problem else (value, None)
    folder = cache_dir(config)
    digest = hashlib.sha256(value.encode()).hexdigest()[:32]
    target = folder / f"{digest}.sif"
    if target.is_file():
        return str(target), None
    if config.pull == "never":
        return None, f"{value} is not in the SIF cache {folder} and env.pull is 'never'"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        async with _file_lock(folder / f"{digest}.lock"):
            if target.is_file():  # another process converted it while we waited for the lock
                return str(target), None
            problem = await _build(config, executable, value, target)
    except OSError as exc:
        return None, f"cannot use the SIF cache {folder}: {exc}"
    return (None, problem) if problem else (str(target), None)


@contextlib.asynccontextmanager
async def _file_lock(path: Path):
    """An exclusive ``flock``, polled so that waiting stays cancellable and never blocks the event loop."""
    handle = open(path, "a")  # noqa: SIM115 - held for the whole block
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(LOCK_POLL_S)
        yield
    finally:
        handle.close()  # releases the lock


async def _build(config: Any, executable: str, reference: str, target: Path) -> str | None:
    """Convert ``reference`` into ``target``; None on success, else why not."""
    partial = target.with_name(f"{target.stem}.partial-{os.getpid()}-{secrets.token_hex(3)}.sif")
    (target.parent / f"{target.stem}.ref").write_text(reference + "\n")  # for humans browsing the cache
    log.info("converting %s to %s", reference, target)
    process = await asyncio.create_subprocess_exec(
        executable, "build", str(partial), reference,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=build_environment(), start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(), config.build_timeout_s)
    except TimeoutError:
        return f"converting {reference} took longer than env.build_timeout_s={config.build_timeout_s}"
    finally:
        if process.returncode is None:  # timed out or cancelled: the build must not outlive us
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        if process.returncode != 0:
            with contextlib.suppress(OSError):
                partial.unlink()
    if process.returncode != 0:
        tail = output.decode("utf-8", "replace").strip()[-600:]
        return f"cannot convert {reference} to SIF (exit {process.returncode}): {tail}"
    os.replace(partial, target)
    return None


def forget_images() -> None:
    """Drop the per-process results and executable lookups (tests; or after the cache was cleared)."""
    _results.clear()
    _pending.clear()
    _executables.clear()
