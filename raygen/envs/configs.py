"""Configuration of the environment backends (``env:``), one class per backend, selected by ``type``.

Re-exported by ``raygen.config``; ``docs/configuration.md`` is generated from these docstrings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from raygen.config_section import Section as _Section
from raygen.envs.fleet import FleetLimits


class LocalEnvConfig(_Section):
    """A fresh working directory per session on the host. Not a sandbox unless ``bwrap`` is on."""

    type: Literal["local"] = "local"
    """Backend selector."""
    root: Path | None = None
    """Parent folder of the per-session workdirs; unset uses the system temp dir."""
    bwrap: bool = False
    """Confine each session with bubblewrap: system folders read-only, only its workdir writable, private
    HOME and /tmp, no network, its own PID namespace (docs/backends.md lists what is mounted)."""
    bwrap_ro_binds: list[str] = Field(default_factory=list)
    """Further host paths shown read-only inside the bwrap sandbox (e.g. a toolchain under ``/opt``);
    the defaults are only the system folders and a list of harmless ``/etc`` entries."""
    subreaper: bool = True
    """Without bwrap, run each command under a child subreaper so that whatever it detaches (``setsid``,
    ``nohup``, double forks) still ends with the session; costs a small extra process a command (about
    1.4 ms of CPU, forked from each actor's command spawner)."""
    keep_env: list[str] = Field(default_factory=lambda: ["PATH", "LANG", "LC_ALL", "TZ", "TERM"])
    """Host environment variables passed to commands; everything else is dropped."""


class FakeEnvConfig(_Section):
    """An in-memory environment with a tiny command interpreter: for tests, no processes."""

    type: Literal["fake"] = "fake"
    """Backend selector."""


class DockerEnvConfig(_Section):
    """One Docker container per session (``pip install "raygen[docker]"``), from the row's ``image``.

    Containers get no network, no privileges and no host mounts unless configured here, and are labelled
    with the run so ``raygen clean`` can remove leftovers."""

    type: Literal["docker"] = "docker"
    """Backend selector."""
    base_url: str | None = None
    """Docker engine address, e.g. ``unix:///var/run/docker.sock``; unset: ``DOCKER_HOST`` or the default."""
    default_image: str | None = None
    """Image for rows that name none; a row without an image fails with ``image_unavailable`` if unset."""
    pull: Literal["missing", "never", "always"] = "missing"
    """When to pull: only images not present locally, never (local images only), or once per worker
    process before first use."""
    workdir: str = "/work"
    """Default working directory inside the container (created); a row's relative ``cwd`` is taken in it."""
    network: bool = False
    """Give containers the engine's default network; off means ``network_mode=none``."""
    cpus: float | None = Field(1.0, gt=0)
    """CPU limit per container (fractional CPUs); unset: no limit."""
    memory: str | None = "2g"
    """Memory limit per container (Docker syntax such as ``512m``, ``2g``); unset: no limit."""
    pids_limit: int | None = Field(1024, ge=1)
    """Most processes per container (fork-bomb guard); unset: no limit."""
    mounts: list[str] = Field(default_factory=list)
    """Host folders bind-mounted into every container, ``host_path:container_path[:ro]``."""
    api_timeout_s: float = Field(120.0, gt=0)
    """Timeout of one Docker API call (not of commands, which have their own)."""
    pull_timeout_s: float = Field(900.0, gt=0)
    """Timeout of one image pull."""
    max_api_threads: int = Field(64, ge=1)
    """Threads per worker process for blocking Docker SDK calls: each running command holds one, so this
    bounds the commands that run at once in one process."""
    fleet: FleetLimits = Field(default_factory=lambda: FleetLimits(max_starting=32))
    """Sandbox governor limits, per node (each node has its own engine): 32 container starts at once by
    default, a guard against bursts that make the daemon time out (learned down when it does); a lower
    cap only queued starts on a 2-core machine (16 at once: 6.1 starts/s, 4 at once: 4.2/s)."""
    warm_pool: int = Field(0, ge=0)
    """Most ready containers kept ahead of demand per image and worker process (sized from the rate
    sessions start, up to this); 0: none. Never reused across sessions; removed at the end of the run."""
    exec_channel: bool = True
    """Run tool calls through one long-lived ``sh`` per container, attached over the exec stream, instead of
    a ``docker exec`` per call (a few ms instead of tens to hundreds; same exit codes, timeouts, caps)."""

    @model_validator(mode="after")
    def _mounts_well_formed(self) -> DockerEnvConfig:
        for mount in self.mounts:
            parts = mount.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or parts[2:] not in ([], ["ro"], ["rw"]):
                raise ValueError(f"mount {mount!r} is not host_path:container_path[:ro]")
        return self


class ModalEnvConfig(_Section):
    """One Modal sandbox per session (``pip install "raygen[modal]"``), from the row's ``image``.

    Credentials come from Modal's own configuration (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or
    ``~/.modal.toml``). Every sandbox has a hard lifetime (``timeout_s``), so a lost driver cannot leave one
    running, and is tagged with the run and the session."""

    type: Literal["modal"] = "modal"
    """Backend selector."""
    app_name: str = "raygen"
    """Modal app the sandboxes belong to (looked up, created if missing)."""
    environment_name: str | None = None
    """Modal environment of the app; unset: the profile's default environment."""
    default_image: str | None = None
    """Registry image for rows that name none; a row without an image fails with ``image_unavailable``
    if unset."""
    workdir: str = "/work"
    """Default working directory inside the sandbox (created); a row's relative ``cwd`` is taken in it."""
    timeout_s: int = Field(3600, ge=10, le=86_400)
    """Hard lifetime of each sandbox, in seconds: Modal terminates it then, whatever the driver does.
    Keep it above ``session.session_timeout_s``."""
    cpu: float | None = Field(1.0, gt=0)
    """CPU cores requested per sandbox; unset: Modal's default."""
    memory: int | None = Field(2048, ge=1)
    """Memory requested per sandbox, in MiB; unset: Modal's default."""
    block_network: bool = True
    """Block all network access from the sandbox."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Extra tags on every sandbox (raygen always adds ``raygen.run`` and ``raygen.sample``)."""
    fleet: FleetLimits = Field(default_factory=lambda: FleetLimits(creations_per_s=5.0))
    """Sandbox governor limits, across the cluster: 5 creations a second by default, Modal's documented
    limit per workspace (raise it if yours was raised)."""

    @model_validator(mode="after")
    def _workdir_absolute(self) -> ModalEnvConfig:
        if not self.workdir.startswith("/"):
            raise ValueError(f"workdir {self.workdir!r} must be an absolute path")
        return self


class SingularityEnvConfig(_Section):
    """One Apptainer/Singularity instance per session (HPC nodes without Docker), from the row's ``image``.

    Only the session's workdir is bound into the container; ``docker://`` images are converted to SIF
    files once per node. See docs/backends.md."""

    type: Literal["singularity"] = "singularity"
    """Backend selector."""
    executable: str | None = None
    """``apptainer`` or ``singularity`` (a name on PATH or a path); unset: the first of the two on PATH."""
    default_image: str | None = None
    """Image for rows that name none (a ``.sif`` file, a sandbox directory or a ``docker://`` reference);
    a row without an image fails with ``image_unavailable`` if unset."""
    image_dir: Path | None = None
    """Relative image paths are taken in this folder; unset: the worker's current directory."""
    bare_names_are_docker: bool = True
    """Read an image with no scheme that is no existing file or directory (``python:3.11``) as
    ``docker://<name>``, so datasets written for the Docker backend work unchanged."""
    cache_dir: Path | None = None
    """Where ``docker://`` (and other remote) images are converted to SIF files, once per node. Keep it on a
    node-local disk (it is locked with ``flock``); unset: ``<system temp dir>/raygen-sif-cache-<uid>``."""
    pull: Literal["missing", "never"] = "missing"
    """Convert remote images not yet in ``cache_dir`` (``missing``), or use only cached ones (``never``)."""
    root: Path | None = None
    """Parent folder of the per-session workdirs (bound into the container at the same path); unset: the
    system temp dir."""
    network: bool = False
    """Share the host's network; off: ``--net --network none`` (loopback only)."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra flags for ``instance start``, e.g. ``["--nv"]`` for NVIDIA GPUs. Flags that bind host folders
    weaken the isolation."""
    start_timeout_s: float = Field(120.0, gt=0)
    """Timeout of starting or stopping one instance."""
    build_timeout_s: float = Field(1800.0, gt=0)
    """Timeout of converting one remote image to SIF."""
    fleet: FleetLimits = Field(default_factory=lambda: FleetLimits(max_starting=4))
    """Sandbox governor limits, per node: 4 instance starts at once by default."""


EnvConfig = Annotated[
    LocalEnvConfig | FakeEnvConfig | DockerEnvConfig | ModalEnvConfig | SingularityEnvConfig,
    Field(discriminator="type"),
]
