"""Hostile run folders for ``raygen rescore`` and ``raygen merge`` (issue 28 cases 3 and 4): a damaged
stored record, a copy that lost its modification times."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket

import pytest
from typer.testing import CliRunner

from raygen.cli import main as cli
from raygen.output.run_dir import RunDir
from raygen.run.folder_commands import remerge
from raygen.run.rescore import rescore
from tests.output.test_run_lock import holder_process
from tests.verify.helpers import TASKS
from tests.verify.test_rescore import make_run, rewards

pytestmark = pytest.mark.slow


def _shard(run: RunDir, prefix: str):
    (path,) = (run.local_path / "shards").glob(f"{prefix}*.jsonl")
    return path


def test_one_damaged_record_is_its_own_verify_error_not_the_whole_command(tmp_path):
    run = asyncio.run(make_run(tmp_path, TASKS))
    before = rewards(run)
    shard = _shard(run, "driver-")
    lines = shard.read_text(encoding="utf-8").splitlines()
    damaged = json.loads(lines[0])
    assert damaged["artifacts"], damaged  # a record with a stored artifact
    damaged["artifacts"][0].update(encoding="base64", content="!!! not base64 !!!")
    unreadable = json.loads(lines[1])
    unreadable["artifacts"] = "not a list"  # no longer a record raygen can read back
    lines[0], lines[1] = json.dumps(damaged), json.dumps(unreadable)
    shard.write_text("\n".join(lines) + "\n", encoding="utf-8")

    # The command as a user runs it: it used to end in a traceback (binascii.Error), nothing rescored.
    done = CliRunner().invoke(cli.app, ["rescore", str(run.local_path)])
    assert done.exit_code == 0 and done.exception is None, done.output
    said = " ".join(done.output.split())
    assert "rescored 7 sessions: 1 changed, 1 checks could not run" in said  # the damaged one
    assert "1 damaged records left as they were" in said
    written = _shard(run, "rescore-").read_text(encoding="utf-8").splitlines()
    regraded = {record["sample_key"]: record for record in map(json.loads, written)}
    failed = regraded[damaged["sample_key"]]
    assert failed["exit_status"] == "error:verify_error"
    assert "solution.py" in failed["error"] and "base64" in failed["error"]
    # The graded line of the damaged record still stands (a check that could not run loses to it), and
    # every other reward is what it was.
    assert rewards(run) == before


def test_rescored_rewards_survive_a_copy_that_lost_modification_times(tmp_path):
    # Graded with a wrong check (every reward 0, not an error); the dataset's check is the right one.
    run = asyncio.run(make_run(tmp_path, TASKS, command="false"))
    assert set(rewards(run).values()) == {0.0}
    rescore(run)
    rescored = rewards(run)
    assert set(rescored.values()) == {0.0, 1.0}
    # cp without -p, rsync without -t, an object-store upload: the driver's shard can end up newer.
    copy = RunDir(tmp_path / "copy")
    shutil.copytree(run.local_path, copy.local_path)
    later = os.stat(_shard(copy, "rescore-")).st_mtime + 60
    os.utime(_shard(copy, "driver-"), (later, later))
    remerge(copy)
    assert rewards(copy) == rescored
    # A second rescore (after another fix of the check) wins over the first, however the files are dated.
    rescore(copy)
    for path in (copy.local_path / "shards").glob("rescore-*.jsonl"):
        os.utime(path, (later - 3600, later - 3600))
    remerge(copy)
    assert rewards(copy) == rescored


def test_merge_and_rescore_refuse_a_run_a_driver_holds(tmp_path):
    # issue 28: neither took the run's lock; a merge racing the driver's own merge swaps folders under it,
    # and a rescore appends to shards a driver is still writing. Now both refuse in one line naming it.
    run = asyncio.run(make_run(tmp_path, TASKS))
    shards_before = sorted(p.name for p in (run.local_path / "shards").iterdir())
    data_before = {p.name: p.read_bytes() for p in (run.local_path / "data").iterdir()}
    driver = holder_process(str(run.local_path))
    try:
        for command in (
            ["merge", str(run.local_path), "--min-reward", "1"],
            ["rescore", str(run.local_path)],
        ):
            done = CliRunner().invoke(cli.app, command)
            assert done.exit_code == 2, done.output
            said = " ".join(done.output.split())
            assert f"is in use by another raygen driver: host {socket.gethostname()} pid {driver.pid}" in said
            assert done.output.count("error") == 1 and "Traceback" not in done.output
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert sorted(p.name for p in (run.local_path / "shards").iterdir()) == shards_before
    assert {p.name: p.read_bytes() for p in (run.local_path / "data").iterdir()} == data_before
    # Its holder gone, the lock is taken over; each command leaves no lock behind.
    for command in (["rescore", str(run.local_path)], ["merge", str(run.local_path)]):
        done = CliRunner().invoke(cli.app, command)
        assert done.exit_code == 0, done.output
        assert not (run.local_path / "driver.lock").exists()
