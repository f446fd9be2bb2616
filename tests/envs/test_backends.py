"""The backend registry and the class-level hooks of the Environment seam (raygen/envs/__init__.py, base.py):
every backend answers them, callers outside raygen/envs/ reach backends only through the registry, and
backends do not import each other's modules."""

from __future__ import annotations

import ast
import asyncio
import re
import typing
from pathlib import Path

import pytest

from raygen import config as config_module
from raygen.config import DockerEnvConfig, LocalEnvConfig
from raygen.envs import BACKENDS, environment_class
from raygen.envs.base import Environment

PACKAGE = Path(config_module.__file__).parent
ENV_CONFIGS = typing.get_args(typing.get_args(config_module.EnvConfig)[0])


def test_every_env_config_has_a_backend_and_every_backend_a_config():
    config_types = {cls.model_fields["type"].default for cls in ENV_CONFIGS}
    assert config_types == set(BACKENDS)


@pytest.mark.parametrize("config_cls", ENV_CONFIGS, ids=lambda cls: cls.__name__)
def test_every_backend_answers_the_hooks(config_cls):
    config = config_cls()
    cls = environment_class(config.type)
    assert issubclass(cls, Environment) and cls.backend == config.type
    assert isinstance(cls.runs_on_node, bool) and isinstance(cls.confined, bool)
    assert isinstance(cls.own_root_filesystem, bool) and callable(cls.build_images)
    assert isinstance(cls.confines_destructive_rows(config), bool)
    assert asyncio.iscoroutinefunction(cls.prepare)
    assert callable(cls.reap)


def test_where_sandboxes_run_and_what_confines():
    assert [t for t in BACKENDS if not environment_class(t).runs_on_node] == ["modal"]
    confining = {t for t in BACKENDS if environment_class(t).confines_destructive_rows(_default(t))}
    assert confining == {"fake", "docker", "modal", "singularity"}
    assert environment_class("local").confines_destructive_rows(LocalEnvConfig(bwrap=True))


def test_which_backends_give_a_session_its_own_root_filesystem():
    assert {t for t in BACKENDS if environment_class(t).own_root_filesystem} == {
        "docker",
        "modal",
        "singularity",
    }


def test_backends_that_cannot_build_images_build_nothing(tmp_path):
    for env_type in ("local", "fake", "modal", "singularity"):
        assert environment_class(env_type).build_images(_default(env_type), {"t:1": tmp_path}) == {
            "t:1": None
        }


def test_backends_without_leftovers_reap_nothing_and_accept_every_image():
    for env_type in ("local", "fake", "modal"):
        cls = environment_class(env_type)
        assert cls.reap(_default(env_type), "any-run") == 0
        assert asyncio.run(cls.prepare(_default(env_type), ["a:1", None])) == {"a:1": None}


def test_unknown_backend_is_a_key_error():
    with pytest.raises(KeyError):
        environment_class("nope")


def test_docker_prepare_checks_the_engine_before_any_image(tmp_path):
    from raygen.errors import SessionFailure

    config = DockerEnvConfig(base_url=f"unix://{tmp_path}/no-engine.sock", api_timeout_s=5)
    with pytest.raises(SessionFailure) as caught:
        asyncio.run(environment_class("docker").prepare(config, [None]))
    assert caught.value.kind == "env_start"


def _default(env_type: str):
    return next(cls for cls in ENV_CONFIGS if cls.model_fields["type"].default == env_type)()


def _backend_of(module: str) -> str | None:
    """Which backend a module of raygen.envs belongs to (docker_engine, docker_stream -> docker)."""
    return next((name for name in BACKENDS if module == name or module.startswith(f"{name}_")), None)


def test_backends_do_not_import_each_others_modules():
    crossings = []
    for path in sorted((PACKAGE / "envs").glob("*.py")):
        owner = _backend_of(path.stem)
        if owner is None:
            continue  # shared modules (base, capture, processes, labels, host) may be imported by all
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raygen.envs."):
                other = _backend_of(node.module.split(".")[2])
                if other not in (None, owner):
                    crossings.append(f"{path.name} imports {node.module}")
    assert crossings == []


# ``env.type == "docker"``, ``config.env.type in (...)``, ``env_type not in ...``: a switch on the backend.
_ENV_TYPE_SWITCH = re.compile(r"\benv(?:_config)?[._]type\s*(?:==|!=|\bin\b|\bnot in\b)")


def test_no_switch_on_the_backend_outside_envs():
    switches = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "envs" not in path.relative_to(PACKAGE).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _ENV_TYPE_SWITCH.search(line)
    ]
    assert switches == []
