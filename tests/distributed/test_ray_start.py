"""Starting and joining Ray (``raygen.distributed.cluster.ensure_ray``) where Ray itself fails: a local
start whose raylet missed Ray's fixed 30-s registration (a loaded machine) is tried once more, with what
the failed start left running killed first. ``ray.init`` is replaced here: the failure cannot be made
to happen on demand (the real start is what every Ray test uses)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import raygen.distributed.cluster as cluster

TIMEOUT = Exception(
    "The current node timed out during startup. This could happen because some of the raylet failed to "
    "startup or the GCS has become overloaded."
)


class FailingStarts:
    """``ray.init`` that fails ``failures`` times as Ray's own start does, leaving a 'raylet' (naming
    the temp dir on its command line) with a child that renamed itself, as Ray's workers do."""

    def __init__(self, failures: int, error: Exception = TIMEOUT):
        self.failures, self.error = failures, error
        self.temp_dirs: list[str] = []
        self.left: list[subprocess.Popen] = []
        self.orphans: list[int] = []

    def __call__(self, **kwargs: object) -> None:
        self.temp_dirs.append(str(kwargs["_temp_dir"]))
        if len(self.temp_dirs) > self.failures:
            return
        child = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
        self.left.append(subprocess.Popen([sys.executable, "-c", child, str(kwargs["_temp_dir"])]))
        deadline = time.monotonic() + 30
        while not (children := _children(self.left[-1].pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.orphans += children
        raise self.error

    def clean_up(self) -> None:
        for pid in self.orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.left:
            proc.kill()
            proc.wait()
        for temp_dir in self.temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(p) for p in handle.read().split()]


def test_a_local_start_that_timed_out_is_tried_once_more_and_leaves_nothing(monkeypatch, caplog):
    starts = FailingStarts(failures=1)
    monkeypatch.setattr(cluster.ray, "init", starts)
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster, "_private_temp_dirs", [])  # this fake start's, not a real one's
    try:
        assert cluster.ensure_ray(None) is True
        (raylet,) = starts.left
        raylet.wait(10)  # killed: wait reaps it (and would time out if it were not)
        assert raylet.returncode == -9
        assert starts.orphans and not any(_alive(pid) for pid in starts.orphans)
        assert len(starts.temp_dirs) == 2 and starts.temp_dirs[0] != starts.temp_dirs[1]
        assert "starting it once more" in caplog.text
    finally:
        starts.clean_up()


@pytest.mark.parametrize("error", [TIMEOUT, ValueError("something else")], ids=["twice", "other"])
def test_other_failures_and_a_second_timeout_are_raised(monkeypatch, error):
    starts = FailingStarts(failures=2, error=error)
    monkeypatch.setattr(cluster.ray, "init", starts)
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster, "_private_temp_dirs", [])  # this fake start's, not a real one's
    try:
        with pytest.raises(type(error)):
            cluster.ensure_ray(None)
        assert len(starts.temp_dirs) == (2 if error is TIMEOUT else 1)
    finally:
        starts.clean_up()


@pytest.mark.ray
@pytest.mark.parametrize("keep_logs", [False, True], ids=["removed", "kept-after-a-failure"])
def test_the_private_rays_temp_dir_goes_with_it_unless_the_run_failed(keep_logs):
    """A real local start: its temp dir (Ray's logs, ~4 MB a run) is removed by the shutdown, unless a
    failed run keeps Ray's logs."""
    assert cluster.ensure_ray(None, num_cpus=1) is True
    (temp_dir,) = cluster._private_temp_dirs
    try:
        assert os.path.isdir(os.path.join(temp_dir, "session_latest", "logs"))
    finally:
        cluster.shutdown_ray(keep_logs=keep_logs)
    assert os.path.isdir(temp_dir) == keep_logs and not cluster._private_temp_dirs
    shutil.rmtree(temp_dir, ignore_errors=True)
