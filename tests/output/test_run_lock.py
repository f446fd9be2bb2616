"""One driver per run: the run folder's lock refuses a live holder in one line and takes over a dead one
(killed process, silent other host, requeued Slurm job), on a filesystem and on an object store."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from raygen.errors import ConfigError
from raygen.output.run_dir import LOCK_FILE, RunDir
from raygen.output.run_lock import Holder, RunLock, RunLocked, lock_status

HOLD = textwrap.dedent(
    """
    import sys, time
    from raygen.output.run_dir import RunDir
    from raygen.output.run_lock import RunLock, RunLocked
    try:
        with RunLock(RunDir(sys.argv[1]), interval_s=0.2, settle_s=0.2).hold():
            print("held", flush=True)
            time.sleep(float(sys.argv[2]))
    except RunLocked as exc:
        print("refused", exc, flush=True)
    """
)


def holder_process(location: str, seconds: float = 60) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, location, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def fake_holder(run: RunDir, *, host: str, age_s: float, slurm_job: str | None = None) -> Holder:
    holder = Holder(
        host=host,
        pid=4242,
        since="2026-01-01T00:00:00+00:00",
        heartbeat=time.time() - age_s,
        token="t-other",
        slurm_job=slurm_job,
    )
    run.create()
    run.write_bytes(LOCK_FILE, [holder.to_bytes()])
    return holder


def test_a_live_holder_is_refused_by_name_and_a_killed_one_taken_over(tmp_path):
    run = RunDir(tmp_path / "run")
    proc = holder_process(str(tmp_path / "run"))
    try:
        with pytest.raises(RunLocked) as err:
            RunLock(run).acquire()
        message = str(err.value)
        assert "\n" not in message
        assert f"host {socket.gethostname()} pid {proc.pid}" in message and " since 20" in message
        assert lock_status(run)[1] is True  # running
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert lock_status(run)[1] is False  # the lock is still there, its holder is not
    lock = RunLock(run)
    with lock.hold():
        assert lock.taken_over is not None and lock.taken_over.pid == proc.pid
        assert json.loads((tmp_path / "run" / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / "run" / LOCK_FILE).exists()  # released


def test_another_host_is_stale_only_after_its_heartbeat_stops(tmp_path):
    run = RunDir(tmp_path / "run")
    fake_holder(run, host="node-b", age_s=2)
    with pytest.raises(RunLocked, match="host node-b pid 4242"):
        RunLock(run, interval_s=5).acquire()
    fake_holder(run, host="node-b", age_s=31)  # > 6 heartbeats of 5 s
    lock = RunLock(run, interval_s=5)
    lock.acquire()
    assert lock.taken_over is not None and lock.taken_over.host == "node-b"
    lock.release()


def test_a_requeued_slurm_job_takes_over_its_predecessor_at_once(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "run")
    fake_holder(run, host="node-b", age_s=1, slurm_job="777")
    monkeypatch.setenv("SLURM_JOB_ID", "778")
    with pytest.raises(RunLocked):
        RunLock(run).acquire()
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    lock = RunLock(run)
    lock.acquire()
    assert lock.taken_over is not None and lock.taken_over.slurm_job == "777"
    lock.release()


def test_heartbeat_advances_and_a_stolen_lock_is_noticed(tmp_path):
    run = RunDir(tmp_path / "run")
    lock = RunLock(run, interval_s=0.1)
    with lock.hold():
        first = lock.read().heartbeat
        time.sleep(0.5)
        assert lock.read().heartbeat > first and not lock.lost  # the thread beats
    manual = RunLock(run, interval_s=3600)  # no beat of its own during the test: no race with ours
    with manual.hold():
        fake_holder(run, host="node-b", age_s=0)  # someone replaced it
        manual.beat()
        assert manual.lost
    assert manual.read().token == "t-other"  # release leaves a lock that is not ours alone


def test_takers_of_one_stale_lock_race_and_exactly_one_wins(tmp_path):
    run = RunDir(tmp_path / "run")
    fake_holder(run, host="node-b", age_s=3600)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLD, str(tmp_path / "run"), "3"], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outcomes = [p.communicate(timeout=60)[0].split()[0] for p in procs]
    assert sorted(outcomes) == ["held", "refused", "refused", "refused"]


def test_object_store_lock(tmp_path):
    pytest.importorskip("moto")
    from s3_server import MotoServer, environment, make_bucket, s3_env

    server = MotoServer(tmp_path / "moto.log")
    try:
        make_bucket(server.url, "locks")
        with environment(s3_env(server.url)):
            location = "s3://locks/runs/r1"
            run = RunDir(location)
            proc = holder_process(location)
            try:
                with pytest.raises(RunLocked, match=f"pid {proc.pid}"):
                    RunLock(run, settle_s=0.2).acquire()
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            lock = RunLock(run, settle_s=0.2)
            with lock.hold():
                assert lock.taken_over is not None and lock.taken_over.pid == proc.pid
            assert not run.exists(LOCK_FILE)
            fake_holder(run, host="node-b", age_s=1)
            with pytest.raises(RunLocked, match="node-b"):
                RunLock(run, settle_s=0.2).acquire()
    finally:
        server.stop()


def test_status_while_the_driver_plans_the_run_names_the_driver(tmp_path):
    # The lock is taken before the manifest and keys are written: a status asked in between says so.
    from raygen.run.folder_commands import run_status

    run = RunDir(tmp_path / "run")
    proc = holder_process(str(tmp_path / "run"))
    try:
        status = run_status(run)
        rows = dict(status.rows())
        assert rows["state"].startswith("preparing")
        assert rows["driver"].startswith("running") and f"pid {proc.pid}" in rows["driver"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rows = dict(run_status(run).rows())  # killed before it wrote the plan
    assert rows["state"].startswith("not started") and rows["driver"].startswith("gone")
    (tmp_path / "run" / LOCK_FILE).unlink()
    with pytest.raises(ConfigError, match="not a raygen run folder"):
        run_status(run)  # no lock, no manifest: not a run
