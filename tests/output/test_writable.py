"""Run names and output folders checked before the first model call (issue 15, case 6).

The unit tests need nothing special. The mount tests (a full tmpfs, a read-only tmpfs) need root and
``unshare``: each runs ``raygen run`` in its own mount namespace against a hostile provider that counts
requests, so they prove that a full disk (really full: ENOSPC on a 1 MiB tmpfs, not a simulation) fails
with one line and no model call, on a first run and on a ``--resume``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raygen.errors import ConfigError
from raygen.output.writable import check_output_folder, check_run_name, storage_failure
from tests.hostile_provider import HostileProvider, answer, tool_call


@pytest.mark.parametrize("name", ["../x", "..", ".", "", "/tmp/abs", "a/b", "a\\b", "x\x00y"])
def test_a_run_name_that_is_not_one_folder_name_is_refused(name: str):
    with pytest.raises(ConfigError) as info:
        check_run_name(name)
    assert "\n" not in str(info.value) and "--run-name" in str(info.value)


@pytest.mark.parametrize("name", ["run-1", "prompts-20260101-120000", "a.b_c", "..x"])
def test_ordinary_run_names_pass(name: str):
    check_run_name(name)


def test_an_output_folder_that_is_a_file_is_one_line(tmp_path: Path):
    blocker = tmp_path / "out"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError) as info:
        check_output_folder(blocker / "run-1")
    message = str(info.value)
    assert "\n" not in message and str(blocker) in message and "is a file, not a folder" in message


def test_too_little_room_is_one_line_and_a_roomy_folder_passes(tmp_path: Path):
    check_output_folder(tmp_path / "out" / "run-1")  # missing folders are fine: they will be created
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []  # nothing left behind
    with pytest.raises(ConfigError) as info:
        check_output_folder(tmp_path / "run-1", min_free_bytes=2**62)
    assert "MiB free" in str(info.value) and "\n" not in str(info.value)


needs_mounts = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a private tmpfs"
)


async def run_in_own_mounts(
    tmp_path: Path,
    url: str,
    mount: str,
    *extra: str,
    fill: bool = True,
    config: dict | None = None,
    then_resume: bool = False,
) -> subprocess.CompletedProcess:
    """``raygen run`` with --output-dir on a fresh tmpfs (``mount`` options, filled up first with
    ``fill``), in a private mount namespace; awaited, so the hostile provider keeps serving meanwhile.
    ``then_resume``: afterwards ``--resume`` on the same mount, its output after a ``=== resume`` line."""
    dataset = tmp_path / "prompts.jsonl"
    if not dataset.exists():
        dataset.write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    config_path = tmp_path / "config.yaml"
    base = {"model": {"type": "openai", "base_url": url}, "env": {"type": "fake"}}
    config_path.write_text(yaml.safe_dump({**base, **(config or {})}))
    out = tmp_path / "mnt"
    out.mkdir(exist_ok=True)
    raygen = [sys.executable, "-m", "raygen.cli", "run", str(dataset), "--config", str(config_path)]
    filler = f"{{ dd if=/dev/zero of={out}/fill bs=4k 2>/dev/null; true; }} && " if fill else ""
    script = (
        f"mount -t tmpfs -o {mount} tmpfs {out} && {filler}"
        f"mount -o remount,$RO {out} && "
        f'setsid -w "$@" --output-dir {out} --run-name r1 {" ".join(extra)}'
    )
    if then_resume:
        # Each run in its own process group: a run that ends Ray by killing its group must not end this
        # shell before the resume.
        script += f'; echo "=== resume" >&2; setsid -w "$@" --output-dir {out} --run-name r1 --resume'
    env = {**os.environ, "OPENAI_API_KEY": "sk-hostile", "RO": "ro" if "ro" in mount.split(",") else "rw"}
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *raygen]
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 300)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout.decode(), stderr.decode())


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if "output folder" in line or "Traceback" in line]


@needs_mounts
@pytest.mark.parametrize("extra", [(), ("--resume",)])
async def test_a_full_disk_fails_in_one_line_before_any_model_call(tmp_path: Path, extra: tuple[str, ...]):
    async with HostileProvider([answer()]) as provider:
        done = await run_in_own_mounts(tmp_path, provider.url, "size=1m", *extra)
    assert done.returncode != 0
    [line] = error_lines(done)
    assert str(tmp_path / "mnt") in line and "no space left on the device" in line, done.stderr
    assert provider.requests == 0  # not one model call, on a first run or a --resume


@needs_mounts
async def test_a_read_only_output_folder_fails_in_one_line(tmp_path: Path):
    async with HostileProvider([answer()]) as provider:
        done = await run_in_own_mounts(tmp_path, provider.url, "size=1m,ro")
    [line] = error_lines(done)
    assert "read-only filesystem" in line and provider.requests == 0, done.stderr


async def test_a_run_name_climbing_out_fails_before_writing(tmp_path: Path):
    async with HostileProvider([answer()]) as provider:
        dataset = tmp_path / "prompts.jsonl"
        dataset.write_text('{"prompt": "one"}\n')
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"model": {"type": "openai", "base_url": provider.url}}))
        out = tmp_path / "out"
        out.mkdir()
        argv = [sys.executable, "-m", "raygen.cli", "run", str(dataset), "--config", str(config)]
        argv += ["--output-dir", str(out), "--run-name", "../escaped", "--env", "fake"]
        env = {**os.environ, "OPENAI_API_KEY": "sk-hostile"}
        proc = await asyncio.create_subprocess_exec(*argv, env=env, stderr=asyncio.subprocess.PIPE)
        _, stderr = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode != 0 and "--run-name '../escaped'" in stderr.decode()
    assert not (tmp_path / "escaped").exists() and provider.requests == 0


@needs_mounts
@pytest.mark.ray
async def test_a_disk_filled_mid_run_fails_in_one_line_and_a_resume_spends_no_model_call(tmp_path: Path):
    # The disk has room at the start (72 MiB); a hostile model's command fills it (the bare local backend
    # can write anywhere the worker can), so the driver's next shard write meets ENOSPC. Then --resume on
    # the same, still full disk.
    out = tmp_path / "mnt"
    fill = f"head -c 100M /dev/zero > {out}/filler; echo filled"
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "fill"}\n')
    script = {"fill": [tool_call("terminal", {"command": fill}), answer()]}
    config = {
        "env": {"type": "local", "root": str(tmp_path / "workdirs")},
        "ray": {"workers": 1, "sessions_per_worker": 2},
        "retry": {"max_attempts": 1},
    }
    async with HostileProvider(script) as provider:
        done = await run_in_own_mounts(
            tmp_path, provider.url, "size=72m", fill=False, config=config, then_resume=True
        )
    assert done.stderr.count("=== resume\n") == 1, done.stderr[-3000:]
    first, resumed = done.stderr.split("=== resume\n")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    [line] = [line for line in first.splitlines() if "no space left on the device" in line]
    assert str(out) in line and "--resume" in line
    [line] = [line for line in resumed.splitlines() if "output folder" in line]
    assert "no space left on the device" in line or "MiB free" in line
    assert done.returncode != 0 and provider.requests == 2  # the session's two calls; none on the resume


def test_a_storage_failure_is_one_line_and_other_errors_are_not_hidden():
    full = OSError(28, "No space left on device", "/runs/r1/shards/x.jsonl")
    line = storage_failure(full)
    assert line is not None and "\n" not in line
    assert "/runs/r1/shards/x.jsonl" in line and "no space left on the device" in line and "--resume" in line
    assert storage_failure(OSError(2, "No such file or directory", "x")) is None
    assert storage_failure(ValueError("bug")) is None
