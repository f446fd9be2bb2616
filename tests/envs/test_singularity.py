"""SingularityEnvironment on the real apptainer: the conformance suite, plus what only this backend has.

Needs the "HPC node" fixture: ``eval "$(.ci/apptainer-setup.sh)"`` after the Docker engine and test images
(see that script). The tests use ROOT (``RAYGEN_HPC_ROOT``, default /tmp/raygen-hpc): ``ROOT/bin/apptainer``
(the wrapper into the node; else an ``apptainer`` on PATH) and ``ROOT/images/`` (debian.sif,
busybox-sandbox/, busybox.tar); they are skipped with the reason otherwise. Session workdirs and SIF caches
live under ROOT, which the node sees at the same path.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conformance import ALIVE_CHECK, EnvironmentConformance

from raygen.config import RunConfig, SingularityEnvConfig
from raygen.envs import EnvSpec, create_environment
from raygen.envs.singularity import SingularityEnvironment, apptainer_environment, container_variables
from raygen.envs.singularity_images import classify, forget_images
from raygen.errors import SessionFailure

pytestmark = pytest.mark.singularity

HPC_ROOT = Path(os.environ.get("RAYGEN_HPC_ROOT", "/tmp/raygen-hpc"))
IMAGES = HPC_ROOT / "images"
DEBIAN = IMAGES / "debian.sif"
SANDBOX = IMAGES / "busybox-sandbox"
ARCHIVE = IMAGES / "busybox.tar"
RUN_NAME = f"test-sing-{uuid.uuid4().hex[:8]}"
WORK_ROOT = HPC_ROOT / "work" / RUN_NAME


@functools.cache
def apptainer_fixture() -> tuple[str | None, str | None]:
    """(the apptainer to use, None) or (None, why the tests cannot run here)."""
    wrapper = HPC_ROOT / "bin" / "apptainer"
    executable = str(wrapper) if wrapper.exists() else shutil.which("apptainer")
    if executable is None:
        return None, 'no apptainer: run eval "$(.ci/apptainer-setup.sh)" (needs DOCKER_HOST) first'
    try:
        subprocess.run([executable, "version"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{executable} does not work (is the HPC node container running?): {exc}"
    missing = [str(path) for path in (DEBIAN, SANDBOX, ARCHIVE) if not path.exists()]
    if missing:
        return None, f"test images missing ({', '.join(missing)}): run .ci/apptainer-setup.sh"
    return executable, None


@pytest.fixture
def sing_config() -> SingularityEnvConfig:
    executable, reason = apptainer_fixture()
    if reason:
        pytest.skip(reason)
    forget_images()
    cache = HPC_ROOT / "cache" / f"{RUN_NAME}-{uuid.uuid4().hex[:6]}"
    yield SingularityEnvConfig(executable=executable, root=WORK_ROOT, cache_dir=cache)
    shutil.rmtree(cache, ignore_errors=True)
    forget_images()


def make_env(config: SingularityEnvConfig, **spec_overrides) -> SingularityEnvironment:
    spec_overrides.setdefault("session_key", f"t-{uuid.uuid4().hex[:8]}")
    spec_overrides.setdefault("image", str(DEBIAN))
    env = create_environment(config, EnvSpec(run_name=RUN_NAME, **spec_overrides))
    assert isinstance(env, SingularityEnvironment)
    return env


def instance_names(config: SingularityEnvConfig) -> list[str]:
    listing = subprocess.run(
        [config.executable, "instance", "list", "--json"], capture_output=True, timeout=60, check=True
    )
    return [item["instance"] for item in json.loads(listing.stdout)["instances"] or []]


class TestSingularityConformance(EnvironmentConformance):
    @pytest.fixture
    def make_env(self, sing_config):
        return lambda **overrides: make_env(sing_config, **overrides)

    async def assert_cleaned_up(self, env, pids):
        await super().assert_cleaned_up(env, pids)
        assert env.workdir is not None and not env.workdir.exists()
        assert env.instance_name not in instance_names(env.config)


class TestSingularityPerExecConformance(TestSingularityConformance):
    """``exec_channel: false``: one ``apptainer exec`` per command keeps passing the same suite."""

    @pytest.fixture
    def make_env(self, sing_config):
        config = sing_config.model_copy(update={"exec_channel": False})
        return lambda **overrides: make_env(config, **overrides)


async def test_commands_go_through_the_channel_and_take_a_fraction_of_an_apptainer_exec(sing_config):
    timings = {}
    for channel in (True, False):
        config = sing_config.model_copy(update={"exec_channel": channel})
        async with make_env(config, env={"GREETING": 'it\'s "here"'}) as env:
            assert (env._channel is not None) == channel
            result = await env.exec('echo "$GREETING"; exit 4', 30, 1000)
            assert (result.exit_code, result.stdout) == (4, 'it\'s "here"\n')
            took = []
            for _ in range(5):
                began = time.monotonic()
                assert (await env.exec("echo ok", 30, 100)).stdout == "ok\n"
                took.append(time.monotonic() - began)
            timings[channel] = statistics.median(took)
    assert timings[True] < timings[False] / 3, timings


# --- without apptainer: configuration, environments, image references --------------------------------


def test_config_selects_the_backend():
    config = RunConfig.model_validate({"env": {"type": "singularity", "default_image": "x.sif"}}).env
    assert isinstance(config, SingularityEnvConfig)
    env = create_environment(config, EnvSpec(session_key="k"))
    assert isinstance(env, SingularityEnvironment) and env.image == "x.sif"


def test_apptainer_process_environment_is_scrubbed():
    host = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "OPENAI_API_KEY": "sk-x",
        "APPTAINER_CACHEDIR": "/scratch/cache",
        "APPTAINER_DOCKER_PASSWORD": "pw",
        "APPTAINERENV_FROM_HOST": "leak",
        "SINGULARITYENV_FROM_HOST": "leak",
        "UNRELATED": "x",
    }
    assert apptainer_environment(host) == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "APPTAINER_CACHEDIR": "/scratch/cache",
    }
    spec = EnvSpec(
        session_key="k",
        env={"A": "1", "HOME": "/x", "BAD-NAME": "2", "TOKEN": "s3cret"},
        secret_values=["s3cret"],
    )
    assert container_variables(spec) == {"APPTAINERENV_A": "1"}


def test_image_references_are_classified(tmp_path: Path):
    (tmp_path / "local.sif").write_bytes(b"x")
    config = SingularityEnvConfig(image_dir=tmp_path)
    assert classify(config, "docker://alpine:3") == ("remote", "docker://alpine:3")
    assert classify(config, "docker-archive:/x/y.tar") == ("remote", "docker-archive:/x/y.tar")
    assert classify(config, "python:3.11") == ("remote", "docker://python:3.11")
    assert classify(config, "local.sif") == ("path", str(tmp_path / "local.sif"))
    assert classify(config, "absent.sif")[0] == "missing"
    assert classify(config, "./absent")[0] == "missing"
    no_bare = config.model_copy(update={"bare_names_are_docker": False})
    assert classify(no_bare, "python:3.11")[0] == "missing"


async def test_no_executable_is_env_start(tmp_path: Path):
    forget_images()
    config = SingularityEnvConfig(executable=str(tmp_path / "no-apptainer"), root=tmp_path)
    with pytest.raises(SessionFailure) as caught:
        async with make_env(config):
            pass
    assert caught.value.kind == "env_start"
    with pytest.raises(SessionFailure) as caught:
        await SingularityEnvironment.prepare(config, ["docker://alpine"])
    assert caught.value.kind == "env_start"


# --- on the real apptainer --------------------------------------------------------------------------


async def test_python_image_runs_python3(sing_config):
    async with make_env(sing_config) as env:
        command = "python3 -c 'import sys; print(sum(range(10)), sys.version_info[0])'"
        result = await env.exec(command, 30, 100)
        assert (result.exit_code, result.stdout) == (0, "45 3\n")


async def test_only_the_workdir_is_bound(sing_config):
    async with make_env(sing_config) as env:
        probe = f'[ -d "{env.workdir}" ] && echo workdir; [ -e "{IMAGES}" ] || echo no-images; echo $HOME'
        result = await env.exec(probe, 20, 1000)
        assert result.stdout.split() == ["workdir", "no-images", f"{env.workdir}/home"]


async def test_sandbox_directory_image(sing_config, tmp_path: Path):
    async with make_env(sing_config, image=str(SANDBOX)) as env:
        assert (await env.exec("busybox echo from-sandbox", 20, 100)).stdout == "from-sandbox\n"
    raw = HPC_ROOT / "work" / f"raw-{uuid.uuid4().hex[:6]}"
    (raw / "bin").mkdir(parents=True)
    try:
        problems = await SingularityEnvironment.prepare(sing_config, [str(raw)])
        assert ".singularity.d" in problems[str(raw)]
        with pytest.raises(SessionFailure) as caught:
            async with make_env(sing_config, image=str(raw)):
                pass
        assert caught.value.kind == "image_unavailable"
    finally:
        shutil.rmtree(raw)


def counting_executable(folder: Path, real: str, build_delay_s: int = 0) -> tuple[str, Path]:
    """A wrapper of ``real`` that logs (and delays) each ``build``, and the log."""
    builds = folder / "builds.log"
    builds.touch()
    script = folder / "apptainer"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = build ]; then echo "$$" >> {builds}; sleep {build_delay_s}; fi\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return str(script), builds


_CHILD = """
import asyncio, json, sys
from raygen.config import SingularityEnvConfig
from raygen.envs.singularity import SingularityEnvironment
config = SingularityEnvConfig.model_validate_json(sys.argv[1])
print(json.dumps(asyncio.run(SingularityEnvironment.prepare(config, [sys.argv[2]]))))
"""


async def test_docker_archive_is_converted_once_per_node(sing_config, tmp_path: Path):
    # Slow builds, so that the other processes ask while the first build is still running.
    executable, builds = counting_executable(tmp_path, sing_config.executable, build_delay_s=5)
    config = sing_config.model_copy(update={"executable": executable})
    reference = f"docker-archive:{ARCHIVE}"
    # Two other processes and three coroutines here ask for the same image at once.
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CHILD, config.model_dump_json(), reference, stdout=subprocess.PIPE
        )
        for _ in range(2)
    ]
    local = await asyncio.gather(*(SingularityEnvironment.prepare(config, [reference]) for _ in range(3)))
    outputs = [json.loads((await child.communicate())[0]) for child in children]
    assert all(result == {reference: None} for result in local + outputs)
    assert len(builds.read_text().split()) == 1
    cached = sorted(path.name for path in Path(config.cache_dir).glob("*.sif"))
    assert len(cached) == 1 and "partial" not in cached[0]
    async with make_env(config, image=reference) as env:
        assert (await env.exec("busybox echo converted", 20, 100)).stdout == "converted\n"
    assert len(builds.read_text().split()) == 1


async def test_pull_never_and_missing_images_are_image_unavailable(sing_config, tmp_path: Path):
    executable, builds = counting_executable(tmp_path, sing_config.executable)
    config = sing_config.model_copy(update={"executable": executable, "pull": "never"})
    reference = f"docker-archive:{ARCHIVE}"
    problems = await SingularityEnvironment.prepare(config, [reference, str(tmp_path / "absent.sif")])
    assert "'never'" in problems[reference] and "no such image" in problems[str(tmp_path / "absent.sif")]
    assert builds.read_text() == ""
    for image in (reference, None):
        with pytest.raises(SessionFailure) as caught:
            async with make_env(config, image=image):
                pass
        assert caught.value.kind == "image_unavailable"


async def test_files_outside_the_workdir_live_in_the_container(sing_config):
    async with make_env(sing_config) as env:
        marker = f"/opt/raygen-marker-{uuid.uuid4().hex[:8]}"
        await env.write_file(marker, b"\x00container side\xff")
        # The link exists on the host too (workdir), but must resolve as in the container: the host has
        # no such marker file, so following it on the host would fail.
        await env.exec(f"ln -s {marker} link", 20, 100)
        assert not Path(marker).exists()
        assert await env.read_file("link") == b"\x00container side\xff"
        await env.write_file("link", b"through the link")
        assert (await env.exec(f"cat {marker}", 20, 100)).stdout == "through the link"
        await env.write_file("plain.txt", b"on the host")
        assert (Path(env.cwd) / "plain.txt").read_bytes() == b"on the host"
        with pytest.raises(FileNotFoundError):
            await env.read_file("/opt/absent")
        with pytest.raises(IsADirectoryError):
            await env.read_file("/opt")


async def test_host_apptainerenv_variables_do_not_reach_commands(sing_config, monkeypatch):
    monkeypatch.setenv("APPTAINERENV_LEAK", "from-host")
    monkeypatch.setenv("SINGULARITYENV_LEAK2", "from-host")
    async with make_env(sing_config, env={"ROW": "row"}) as env:
        assert (await env.exec('echo "[$LEAK][$LEAK2][$ROW]"', 20, 100)).stdout == "[][][row]\n"


async def test_timeout_kills_processes_that_left_the_process_group(sing_config):
    async with make_env(sing_config) as env:
        command = (
            "setsid sh -c 'echo $$ >> pids.txt; exec sleep 301' & sh -c 'echo $$ >> pids.txt; sleep 302'"
        )
        result = await env.exec(command, 2, 1000)
        assert result.timed_out
        assert len((await env.read_file("pids.txt")).split()) == 2
        assert (await env.exec(ALIVE_CHECK, 20, 1000)).stdout == "alive:\n"


async def test_cancelled_start_still_stops_the_instance(sing_config):
    env = make_env(sing_config)
    real_start = env._start_instance
    starting = asyncio.Event()

    async def start_and_signal(workdir):
        starting.set()
        await real_start(workdir)

    env._start_instance = start_and_signal
    task = asyncio.create_task(env.start())
    await asyncio.wait_for(starting.wait(), 60)
    await asyncio.sleep(0.3)  # while apptainer starts the instance
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await env.close()
    assert env.instance_name not in instance_names(sing_config)
    assert not env.workdir.exists()


async def test_cancelling_close_does_not_skip_the_stop(sing_config):
    env = make_env(sing_config)
    await env.start()
    assert env.instance_name in instance_names(sing_config)
    closing = asyncio.create_task(env.close())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert env.instance_name not in instance_names(sing_config)


async def test_instance_stopped_behind_our_back_is_env_lost(sing_config):
    async with make_env(sing_config) as env:
        subprocess.run(
            [sing_config.executable, "instance", "stop", "--force", env.instance_name],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        with pytest.raises(SessionFailure) as caught:
            await env.exec("true", 20, 100)
        assert caught.value.kind == "env_lost"
        with pytest.raises(SessionFailure) as caught:
            await env.read_file("/etc/hostname")
        assert caught.value.kind == "env_lost"


def test_zz_nothing_is_left_by_this_module(sing_config):
    # Runs last (file order): every environment above was closed, whichever way its test ended.
    assert [name for name in instance_names(sing_config) if RUN_NAME in name] == []
    assert not WORK_ROOT.exists() or list(WORK_ROOT.iterdir()) == []
    shutil.rmtree(WORK_ROOT, ignore_errors=True)


def test_reap_stops_the_instances_a_killed_worker_left(sing_config):
    import asyncio

    from raygen.envs.singularity import reap_instances

    # No exec channel: its process would belong to the first event loop, gone before the close.
    env = make_env(sing_config.model_copy(update={"exec_channel": False}))
    asyncio.run(env.start())  # never closed, as if its worker had been killed
    try:
        assert env.instance_name in instance_names(sing_config)
        assert reap_instances(sing_config, "some-other-run") == 0
        assert reap_instances(sing_config, RUN_NAME) >= 1
        assert env.instance_name not in instance_names(sing_config)
    finally:
        asyncio.run(env.close())
