"""Environment backends, selected by ``env.type`` and imported lazily (see README.md here)."""

from __future__ import annotations

import importlib

from raygen.envs.base import Environment, EnvSpec, ExecResult

# type -> "module:class". Backends with optional dependencies raise MissingExtraError on import.
BACKENDS: dict[str, str] = {
    "local": "raygen.envs.local:LocalEnvironment",
    "fake": "raygen.envs.fake:FakeEnvironment",
    "docker": "raygen.envs.docker:DockerEnvironment",
    "modal": "raygen.envs.modal:ModalEnvironment",
    "singularity": "raygen.envs.singularity:SingularityEnvironment",
}


def environment_class(env_type: str) -> type[Environment]:
    """The backend class for ``env.type``: the one lookup every caller uses, for sessions and for the
    class-level hooks (``prepare``, ``reap``, ``runs_on_node``, ``confines_destructive_rows``)."""
    module_name, cls_name = BACKENDS[env_type].split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def create_environment(config, spec: EnvSpec) -> Environment:
    """Build (not start) the environment for one session: use it as ``async with``."""
    return environment_class(config.type)(config, spec)


__all__ = ["BACKENDS", "EnvSpec", "Environment", "ExecResult", "create_environment", "environment_class"]
