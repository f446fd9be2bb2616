"""ModalEnvironment through the real ``modal`` SDK (1.6.4) against a fake Modal on loopback.

The fake (``fake_modal/``) implements the control-plane and command-router RPCs the SDK uses, backed by
real host processes in per-sandbox folders. An autouse fixture points every test at it and refuses to run
a test otherwise, so nothing here can reach the real cloud; only ``test_real_modal_round_trip``
(``-m modal_cloud``) does, in a subprocess, when Modal credentials exist.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conformance import EnvironmentConformance, alive_host_pids

pytest.importorskip("modal", reason='needs the modal extra: pip install "raygen[modal]"')

from fake_modal import FakeModal

from raygen.config import ModalEnvConfig
from raygen.distributed.sandbox_governor import SandboxGovernorService
from raygen.envs import EnvSpec, create_environment
from raygen.envs import modal as modal_backend
from raygen.envs.fleet import FleetLimits, SandboxRefused
from raygen.envs.labels import LABEL_OWNER_PID, LABEL_RUN, LABEL_SAMPLE
from raygen.envs.modal import ModalEnvironment
from raygen.errors import MissingExtraError, SessionFailure

RUN_NAME = f"test-modal-{uuid.uuid4().hex[:8]}"
IMAGE = "python:3.11-slim"


@pytest.fixture(scope="session")
def fake_modal(tmp_path_factory) -> FakeModal:
    fake = FakeModal(tmp_path_factory.mktemp("fake-modal")).start()
    yield fake
    fake.stop()


@pytest.fixture(autouse=True)
def only_the_fake_modal(request, monkeypatch):
    """Every test talks to the fake, never to Modal (except the modal_cloud test, in a subprocess)."""
    if request.node.get_closest_marker("modal_cloud"):
        yield
        return
    fake = request.getfixturevalue("fake_modal")
    monkeypatch.setenv("MODAL_SERVER_URL", fake.url)
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-fake")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-fake")
    monkeypatch.delenv("MODAL_PROFILE", raising=False)
    import modal
    from modal.client import _Client

    assert modal.config.config.get("server_url") == fake.url
    client = _Client._client_from_env
    assert client is None or client.server_url == fake.url, "the SDK's client points elsewhere"
    yield


@pytest.fixture(autouse=True)
def creation_limit_off_unless_a_test_sets_it(request):
    """The fake enforces Modal's 5 creations/s by default; only the tests of that limit (which set it
    themselves) meet it: the others create sandboxes without raygen's sandbox governor in front."""
    if request.node.get_closest_marker("modal_cloud"):
        yield
        return
    fake = request.getfixturevalue("fake_modal")
    set_limit(fake, None)
    yield
    set_limit(fake, 5.0)


@pytest.fixture
def config() -> ModalEnvConfig:
    return ModalEnvConfig(app_name="raygen-tests", timeout_s=600, cpu=0.5, memory=512, tags={"team": "t1"})


def make_modal_env(config: ModalEnvConfig, **spec_overrides) -> ModalEnvironment:
    spec_overrides.setdefault("session_key", f"t-{uuid.uuid4().hex[:8]}")
    spec_overrides.setdefault("image", IMAGE)
    env = create_environment(config, EnvSpec(run_name=RUN_NAME, **spec_overrides))
    assert isinstance(env, ModalEnvironment)
    return env


def sandboxes_of(fake: FakeModal, session_key: str) -> list:
    return fake.sandboxes_tagged(LABEL_SAMPLE, session_key)


async def wait_until(predicate, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):
            return True
        await asyncio.sleep(0.1)
    return False


def assert_terminated(fake: FakeModal, session_key: str) -> None:
    made = sandboxes_of(fake, session_key)
    assert made, "no sandbox was created for the session"
    for sandbox in made:
        assert not sandbox.running, f"sandbox {sandbox.sandbox_id} is still running"
        assert not sandbox.root.exists(), "its filesystem should be gone"


class TestModalConformance(EnvironmentConformance):
    @pytest.fixture(autouse=True)
    def _remember_the_fake(self, fake_modal):
        self.fake = fake_modal

    @pytest.fixture
    def make_env(self, config):
        return lambda **overrides: make_modal_env(config, **overrides)

    async def assert_cleaned_up(self, env, pids):
        await super().assert_cleaned_up(env, pids)
        if env.sandbox_id is not None:
            await asyncio.to_thread(assert_terminated, self.fake, env.spec.session_key)
        assert alive_host_pids(pids) == []  # the fake's processes are host processes


async def test_sandbox_gets_image_lifetime_resources_network_and_tags(config, fake_modal):
    env = make_modal_env(config, session_key="tagged-1")
    async with env:
        (sandbox,) = sandboxes_of(fake_modal, "tagged-1")
        assert sandbox.sandbox_id == env.sandbox_id
        assert sandbox.image == IMAGE
        assert sandbox.timeout_secs == 600
        assert (sandbox.cpu, sandbox.memory_mb) == (0.5, 512)
        assert sandbox.network_blocked is True
        assert sandbox.tags[LABEL_RUN] == RUN_NAME
        assert sandbox.tags["team"] == "t1"
        assert sandbox.tags[LABEL_OWNER_PID] == str(os.getpid())
        assert (await env.exec("pwd", 10, 1000)).stdout.rstrip().endswith("/work")
    assert_terminated(fake_modal, "tagged-1")


async def test_network_can_be_left_open(config, fake_modal):
    async with make_modal_env(config.model_copy(update={"block_network": False}), session_key="net-1"):
        assert sandboxes_of(fake_modal, "net-1")[0].network_blocked is False


async def test_hard_lifetime_ends_a_forgotten_sandbox(config, fake_modal):
    # A driver that dies never calls close(): the sandbox's own lifetime must end it and its processes.
    env = make_modal_env(config.model_copy(update={"timeout_s": 2}), session_key="lost-1")
    await env.start()
    result = await env.exec("sleep 300 > /dev/null 2>&1 & echo $!", 10, 100)
    pid = int(result.stdout)
    assert alive_host_pids([pid]) == [pid]
    (sandbox,) = sandboxes_of(fake_modal, "lost-1")
    assert await wait_until(lambda: not sandbox.running)
    assert sandbox.status == 4  # GENERIC_STATUS_TIMEOUT
    assert await wait_until(lambda: not alive_host_pids([pid]))
    with pytest.raises(SessionFailure) as caught:
        await env.exec("true", 10, 100)
    assert caught.value.kind == "env_lost"
    await env.close()  # terminating a finished sandbox is fine


async def test_sandbox_terminated_from_outside_is_env_lost(config, fake_modal):
    async with make_modal_env(config) as env:
        await asyncio.to_thread(fake_modal.terminate, env.sandbox_id)
        with pytest.raises(SessionFailure) as caught:
            await env.exec("true", 10, 100)
        assert caught.value.kind == "env_lost"
        with pytest.raises(SessionFailure):
            await env.read_file("anything.txt")


async def test_cancelled_start_still_terminates_the_sandbox(config, fake_modal, monkeypatch):
    fake_modal.inspect(lambda state: setattr(state, "create_delay_s", 1.0))
    try:
        env = make_modal_env(config, session_key="cancel-start-1")
        task = asyncio.create_task(env.start())
        assert await wait_until(lambda: fake_modal.inspect(lambda s: "SandboxCreateV2" in s.calls))
        task.cancel()  # while Modal is creating the sandbox
        with pytest.raises(asyncio.CancelledError):
            await task
        await env.close()
    finally:
        fake_modal.inspect(lambda state: setattr(state, "create_delay_s", 0.0))
    assert_terminated(fake_modal, "cancel-start-1")


async def test_cancelling_close_does_not_skip_termination(config, fake_modal):
    env = make_modal_env(config, session_key="cancel-close-1")
    await env.start()
    closing = asyncio.create_task(env.close())
    await asyncio.sleep(0)  # let the termination begin, then cancel the caller
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert_terminated(fake_modal, "cancel-close-1")


async def test_timeout_kills_escaped_processes_without_modals_backstop(config, monkeypatch):
    # Modal's exec timeout pushed far away: raygen's own kill must end the command, including a child
    # that left the process group (setsid), which a process-group kill would miss.
    monkeypatch.setattr(modal_backend, "BACKSTOP_MARGIN_S", 300.0)
    async with make_modal_env(config) as env:
        command = (
            "setsid sh -c 'echo $$ >> pids.txt; exec sleep 301' & sh -c 'echo $$ >> pids.txt; sleep 302'"
        )
        result = await env.exec(command, 2, 1000)
        assert result.timed_out and result.exit_code == 124
        pids = [int(pid) for pid in (await env.read_file("pids.txt")).split()]
        assert len(pids) == 2
        assert await wait_until(lambda: not alive_host_pids(pids), 10)


async def test_modal_exec_timeout_is_a_backstop_when_raygen_cannot_kill(config, monkeypatch):
    # raygen's own kill disabled: the exec timeout it hands to Modal must still end the command.
    async def no_kill(self, exec_tag):
        return None

    monkeypatch.setattr(ModalEnvironment, "_kill_exec", no_kill)
    monkeypatch.setattr(modal_backend, "BACKSTOP_MARGIN_S", 0.0)
    async with make_modal_env(config) as env:
        result = await env.exec("echo $$ > pids.txt; sleep 60", 1, 1000)
        assert result.timed_out and result.exit_code == 124
        pid = int(await env.read_file("pids.txt"))
        assert await wait_until(lambda: not alive_host_pids([pid]), 10)


class _LateWaitAsyncio:
    """``asyncio`` for the backend, except that ``wait`` gives up a second late (a loaded machine)."""

    def __getattr__(self, name):
        return getattr(asyncio, name)

    @staticmethod
    async def wait(tasks, timeout=None):
        return await asyncio.wait(tasks, timeout=None if timeout is None else timeout + 1.0)


async def test_a_sigkill_past_the_limit_that_beats_raygens_wait_is_a_timeout(config, monkeypatch):
    # Under load Modal's exec timeout can SIGKILL the group (137) before raygen's own wait gives up. The
    # command here kills itself past its limit while raygen's wait is a second late: still a timeout.
    monkeypatch.setattr(modal_backend, "BACKSTOP_MARGIN_S", 300.0)
    monkeypatch.setattr(modal_backend, "asyncio", _LateWaitAsyncio())
    async with make_modal_env(config) as env:
        result = await env.exec("sleep 1.3; kill -KILL $$", 1, 1000)
        assert result.timed_out and result.exit_code == 124
        assert result.duration_s < 1.9  # the SIGKILL ended it, not raygen's late wait
        quick = await env.exec("kill -KILL $$", 1, 1000)  # a SIGKILL within the limit is the command's own
        assert not quick.timed_out and quick.exit_code == 137


async def test_missing_image_is_image_unavailable(config, fake_modal):
    env = make_modal_env(config, image="missing/no-such-image:1", session_key="missing-1")
    with pytest.raises(SessionFailure) as caught:
        async with env:
            pass
    assert caught.value.kind == "image_unavailable"
    assert sandboxes_of(fake_modal, "missing-1") == []


async def test_no_image_and_no_default_is_image_unavailable(config):
    with pytest.raises(SessionFailure) as caught:
        async with make_modal_env(config, image=None):
            pass
    assert caught.value.kind == "image_unavailable"
    async with make_modal_env(config.model_copy(update={"default_image": IMAGE}), image=None) as env:
        assert (await env.exec("echo ok", 10, 100)).stdout == "ok\n"


async def test_file_errors_are_builtin_os_errors(config):
    async with make_modal_env(config) as env:
        await env.write_file("plain.txt", b"x")
        with pytest.raises(NotADirectoryError):
            await env.write_file("plain.txt/below.txt", b"y")
        await env.write_file("dir/inner.txt", b"z")
        with pytest.raises(IsADirectoryError):
            await env.write_file("dir", b"cannot replace a folder")


def test_missing_sdk_raises_missing_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "modal", None)
    with pytest.raises(MissingExtraError) as caught:
        modal_backend.import_modal()
    assert caught.value.extra == "modal"


def _modal_credentials_exist() -> bool:
    has_env = bool(os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET"))
    return has_env or (Path.home() / ".modal.toml").exists()


@pytest.mark.modal_cloud
@pytest.mark.skipif(not _modal_credentials_exist(), reason="no Modal credentials")
def test_real_modal_round_trip(tmp_path):
    # A subprocess: the SDK's client is a per-process singleton, and this process's one is the fake's.
    script = textwrap.dedent(
        """
        import asyncio
        from raygen.config import ModalEnvConfig
        from raygen.envs import EnvSpec, create_environment

        async def main():
            config = ModalEnvConfig(app_name="raygen-ci", default_image="python:3.11-slim", timeout_s=300)
            async with create_environment(config, EnvSpec(session_key="cloud-check", run_name="ci")) as env:
                result = await env.exec("sleep 30 & echo $((6*7))", 3, 1000)
                assert result.stdout.startswith("42"), result
                timed = await env.exec("sleep 30", 2, 1000)
                assert timed.timed_out and timed.exit_code == 124, timed
                await env.write_file("a/b.bin", bytes(range(256)))
                assert await env.read_file("a/b.bin") == bytes(range(256))
                try:
                    await env.read_file("nope")
                except FileNotFoundError:
                    pass
                else:
                    raise AssertionError("read of a missing file succeeded")
            print("ok")

        asyncio.run(main())
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "MODAL_SERVER_URL"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


# --- Modal's creation limit (5/s per workspace, RESOURCE_EXHAUSTED) against the sandbox governor ------


class InProcessGate:
    """The sandbox governor's client protocol, calling the service directly (no Ray)."""

    def __init__(self, service: SandboxGovernorService, limits: FleetLimits):
        self.service, self.limits = service, limits.model_dump()
        self.pending: list[asyncio.Task] = []

    async def acquire(self, key: str) -> str:
        while not await self.service.acquire(key, self.limits):
            pass
        return key

    def started(self, permit: str, *, ok: bool, refused: bool = False) -> None:
        self.pending.append(asyncio.ensure_future(self.service.started(permit, ok, refused)))

    def closed(self, permit: str) -> None:
        self.pending.append(asyncio.ensure_future(self.service.closed(permit)))


async def start_and_close(config, gate=None) -> str:
    """One sandbox's life, through ``gate`` if given: "ok" or "refused"."""
    permit = await gate.acquire("modal") if gate else None
    env = make_modal_env(config)
    try:
        await env.start()
    except SandboxRefused as exc:
        assert exc.kind == "env_start" and exc.retryable
        assert "Sandbox creation rate limit (" in str(exc) and "/s) exceeded" in str(exc)
        if gate:
            gate.started(permit, ok=False, refused=True)
        return "refused"
    finally:
        await env.close()
    if gate:
        gate.started(permit, ok=True)
        gate.closed(permit)
    return "ok"


def set_limit(fake_modal, per_s: float | None) -> None:
    fake_modal.inspect(lambda state: setattr(state, "creations_per_s", per_s))


async def test_the_fake_refuses_creations_past_five_a_second_with_modals_error(fake_modal, config):
    set_limit(fake_modal, 5.0)
    await asyncio.sleep(1.1)  # an empty window
    outcomes = await asyncio.gather(*(start_and_close(config) for _ in range(9)))
    assert outcomes.count("ok") == 5 and outcomes.count("refused") == 4
    message = fake_modal.inspect(lambda state: state.refused_creations)
    assert message >= 4


async def test_through_the_governor_no_creation_is_refused(fake_modal, config):
    set_limit(fake_modal, 5.0)
    await asyncio.sleep(1.1)
    refused_before = fake_modal.inspect(lambda state: state.refused_creations)
    gate = InProcessGate(SandboxGovernorService(), config.fleet)
    began = time.monotonic()
    outcomes = await asyncio.gather(*(start_and_close(config, gate) for _ in range(12)))
    assert outcomes == ["ok"] * 12
    # None refused: the grants are spaced at 1/(0.9 x 5) s, room for a creation's varying way to Modal.
    assert fake_modal.inspect(lambda state: state.refused_creations) == refused_before
    assert time.monotonic() - began >= 11 / 5  # paced, not bursted


async def test_the_governor_learns_a_lower_limit_from_modals_refusals(fake_modal, config):
    set_limit(fake_modal, 2.0)  # the workspace allows less than configured
    await asyncio.sleep(1.1)
    service = SandboxGovernorService()
    gate = InProcessGate(service, FleetLimits(creations_per_s=5.0))
    remaining, refusals, passes = 14, 0, 0
    try:
        while remaining and passes < 10:  # a refused session is retried, as a run's next pass would
            outcomes = await asyncio.gather(*(start_and_close(config, gate) for _ in range(remaining)))
            await asyncio.gather(*gate.pending)
            remaining = outcomes.count("refused")
            refusals += remaining
            passes += 1
        assert remaining == 0 and refusals >= 1
        learned = (await service.snapshot())["modal"]
        assert learned["rate"] <= 2.5 and learned["refused"] == refusals
    finally:
        set_limit(fake_modal, 5.0)


def test_zz_nothing_unfaked_was_called_and_nothing_is_left_running(fake_modal):
    # Runs last (file order): every sandbox above was terminated, whichever way its test ended, and the
    # SDK never called an RPC the fake does not implement.
    state = fake_modal.inspect(
        lambda s: (list(s.unimplemented), [sb.sandbox_id for sb in s.sandboxes.values() if sb.running])
    )
    assert state == ([], [])
