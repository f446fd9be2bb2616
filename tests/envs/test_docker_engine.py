"""The Docker engine client (raygen.envs.docker_engine): presence checks, pull policy, one pull per image,
the pre-flight hook ``DockerEnvironment.prepare``.

Docker tests need an engine (``eval "$(.ci/docker-setup.sh /tmp/rg-docker)"``) and the test images
(``.ci/build-test-images.sh``); they are skipped with the reason otherwise. Missing images are named
``127.0.0.1:9/...`` so a pull attempt is refused on loopback at once and never leaves the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sys
import threading
import uuid

import pytest

from raygen.config import DockerEnvConfig, FakeEnvConfig, LocalEnvConfig
from raygen.envs import docker_engine, environment_class
from raygen.errors import MissingExtraError, SessionFailure

BUSYBOX = "raygen-test/busybox"


def docker_skip_reason() -> str | None:
    """Why Docker tests cannot run here, or None."""
    if not os.environ.get("DOCKER_HOST"):
        return 'DOCKER_HOST is unset: eval "$(.ci/docker-setup.sh /tmp/rg-docker)" first'
    try:
        client = docker_engine.get_client(DockerEnvConfig())
    except SessionFailure as exc:
        return f"Docker engine unreachable: {exc}"
    try:
        client.api.inspect_image(BUSYBOX)
    except Exception:
        return f"image {BUSYBOX} missing: run .ci/build-test-images.sh"
    return None


@pytest.fixture
def docker_config():
    reason = docker_skip_reason()
    if reason:
        pytest.skip(reason)
    docker_engine.forget_images()
    yield DockerEnvConfig()
    docker_engine.forget_images()


class PullSpy:
    """Counts (and forwards) calls to the SDK's low-level pull."""

    def __init__(self, real):
        self.real = real
        self.calls: list[tuple] = []
        self._lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self._lock:
            self.calls.append(args)
        return self.real(*args, **kwargs)


@pytest.fixture
def pull_spy(docker_config, monkeypatch):
    api = docker_engine.get_client(docker_config).api
    spy = PullSpy(api.pull)
    monkeypatch.setattr(api, "pull", spy)
    return spy


def missing_image() -> str:
    return f"127.0.0.1:9/raygen-test/missing-{uuid.uuid4().hex[:8]}:latest"


@pytest.mark.docker
async def test_present_image_is_ok_without_a_pull(docker_config, pull_spy):
    assert await docker_engine.ensure_images(docker_config, {BUSYBOX}) == {BUSYBOX: None}
    assert pull_spy.calls == []


@pytest.mark.docker
async def test_missing_image_gives_a_message_and_is_pulled_once_under_concurrency(docker_config, pull_spy):
    image = missing_image()
    results = await asyncio.gather(
        *(docker_engine.ensure_images(docker_config, {image, BUSYBOX}) for _ in range(8))
    )
    assert len(pull_spy.calls) == 1
    problem = results[0][image]
    assert isinstance(problem, str) and image in problem
    assert all(result == {image: problem, BUSYBOX: None} for result in results)
    # Asked again later in the same process: the cached answer, no second pull.
    assert await docker_engine.ensure_images(docker_config, [image]) == {image: problem}
    assert len(pull_spy.calls) == 1


@pytest.mark.docker
async def test_pull_never_refuses_missing_images_without_pulling(docker_config, pull_spy):
    config = docker_config.model_copy(update={"pull": "never"})
    image = missing_image()
    problem = (await docker_engine.ensure_images(config, {image}))[image]
    assert problem and "never" in problem
    assert pull_spy.calls == []


@pytest.mark.docker
async def test_pull_always_pulls_even_a_present_image_and_falls_back_to_it(docker_config, pull_spy):
    config = docker_config.model_copy(update={"pull": "always"})
    # Pulling raygen-test/busybox fails (no registry), but the local copy keeps it usable.
    assert await docker_engine.ensure_images(config, {BUSYBOX}) == {BUSYBOX: None}
    assert len(pull_spy.calls) == 1


@pytest.mark.docker
async def test_a_pull_waits_for_another_process_and_uses_its_result(docker_config, pull_spy):
    client = docker_engine.get_client(docker_config)
    name = f"raygen-test/tagged-{uuid.uuid4().hex[:8]}"
    lock_file = open(docker_engine._lock_path(docker_config.base_url, name), "w")  # noqa: SIM115
    fcntl.flock(lock_file, fcntl.LOCK_EX)  # "another process" is pulling this image
    try:
        pending = asyncio.ensure_future(docker_engine.ensure_images(docker_config, {name}))
        await asyncio.sleep(0.5)
        assert not pending.done() and pull_spy.calls == []
        # The other process's pull lands, then it lets go of the lock.
        client.api.tag(BUSYBOX, name, "latest")
        fcntl.flock(lock_file, fcntl.LOCK_UN)
        assert await asyncio.wait_for(pending, 60) == {name: None}
        assert pull_spy.calls == []
    finally:
        lock_file.close()
        client.api.remove_image(f"{name}:latest")


@pytest.mark.docker
async def test_prepare_images_checks_the_default_image_for_rows_without_one(docker_config):
    config = docker_config.model_copy(update={"default_image": BUSYBOX, "pull": "never"})
    image = missing_image()
    result = await environment_class("docker").prepare(config, [None, image])
    assert result[BUSYBOX] is None and result[image]
    assert set(result) == {BUSYBOX, image}


@pytest.mark.docker
def test_build_images_builds_missing_tags_once_and_reports_a_failed_build(docker_config, tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder, step in ((good, "RUN echo built > /built"), (bad, "RUN exit 3")):
        folder.mkdir()
        (folder / "Dockerfile").write_text(f"FROM {BUSYBOX}\n{step}\n")
    tags = {
        f"raygen-test/built-{uuid.uuid4().hex[:8]}:1": good,
        f"raygen-test/bad-{uuid.uuid4().hex[:8]}:1": bad,
    }
    docker = environment_class("docker")
    client = docker_engine.get_client(docker_config)
    try:
        result = docker.build_images(docker_config, tags)
        built, failed = list(tags)
        assert result[built] is None and "non-zero code: 3" in result[failed]
        image_id = client.images.get(built).id
        assert docker.build_images(docker_config, {built: good}) == {built: None}
        assert client.images.get(built).id == image_id  # present: not built again
    finally:
        for tag in tags:
            with contextlib.suppress(Exception):
                client.images.remove(tag)


async def test_unreachable_engine_is_an_env_start_failure(tmp_path):
    config = DockerEnvConfig(base_url=f"unix://{tmp_path}/no-engine.sock", api_timeout_s=5)
    with pytest.raises(SessionFailure) as caught:
        await environment_class("docker").prepare(config, {BUSYBOX})
    assert caught.value.kind == "env_start"


@pytest.mark.parametrize("config", [LocalEnvConfig(), FakeEnvConfig()], ids=["local", "fake"])
async def test_backends_without_images_accept_every_image(config):
    result = await environment_class(config.type).prepare(config, ["python:3.12", "does/not:exist", None])
    assert result == {"python:3.12": None, "does/not:exist": None}


def test_reap_is_a_no_op_for_backends_without_containers():
    assert environment_class("local").reap(LocalEnvConfig(), "any-run") == 0
    assert environment_class("fake").reap(FakeEnvConfig(), None) == 0


def test_missing_docker_sdk_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "docker", None)  # makes ``import docker`` fail
    with pytest.raises(MissingExtraError) as caught:
        docker_engine.import_docker()
    assert caught.value.extra == "docker" and "raygen[docker]" in str(caught.value)
