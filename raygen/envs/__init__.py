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


def create_environment(config, spec: EnvSpec) -> Environment:
    """Build (not start) the environment for one session: use it as ``async with``."""
    module_name, cls_name = BACKENDS[config.type].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(config, spec)


__all__ = ["BACKENDS", "EnvSpec", "Environment", "ExecResult", "create_environment"]
