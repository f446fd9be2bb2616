"""Helpers for the resume and crash tests: run ``raygen`` as a process group, kill it, and read back what a
run folder and the simulator's request log say, independently of raygen's own ledger and merge code.

Ground truth here is the dataset file (prompts), the shard files (parsed with ``json`` only) and the
simulator's request log (one JSON line per request: ``prompt_sha``, ``turn``, ``status``).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cli_runs import write_dataset  # noqa: F401  (re-exported for the resume and crash tests)

from raygen.input.rows import PromptRow, make_sample_key

RETRYABLE_FOR_TESTS = {"rate_limited", "provider_unavailable", "env_start", "env_lost", "worker_lost"}
"""The retryable kinds as the issue defines them (kept here so a change in raygen.errors is noticed)."""


def prompt_sha(prompt: str) -> str:
    """How the simulator's request log names a session: the first user message's hash."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def sample_keys(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(sample_key, prompt) of every row, by the identity rule: row hash + occurrence among equal rows."""
    seen: collections.Counter[str] = collections.Counter()
    out = []
    for row in rows:
        content = PromptRow(**row).content_hash()
        out.append((make_sample_key(content, seen[content]), row["prompt"]))
        seen[content] += 1
    return out


def raygen_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "raygen.cli", *args]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(raygen_cmd(*args), capture_output=True, text=True, timeout=timeout)


def start_group(args: list[str], log_file: Path) -> subprocess.Popen:
    """``raygen ARGS`` in a new session (so its own process group), output to ``log_file``."""
    out = log_file.open("ab")
    try:
        return subprocess.Popen(
            raygen_cmd(*args), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        out.close()


def live_session_processes(sid: int) -> list[str]:
    """Processes of session ``sid`` that are still alive (zombies waiting to be reaped excluded)."""
    alive = []
    for entry in Path("/proc").iterdir():  # /proc rather than ps: procps may not be installed
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            alive.append(f"{entry.name} {state} {cmdline.strip()}"[:160])
    return alive


def kill_group(proc: subprocess.Popen, settle_s: float = 60.0) -> list[str]:
    """SIGKILL the whole process group of ``proc`` (driver, simulator, a local Ray's head processes);
    returns the processes of its session still alive after ``settle_s`` (Ray workers notice their raylet
    died and exit on their own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + settle_s
    while (left := live_session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def stop_leftovers(sid: int) -> None:
    """Last-resort cleanup of a test's own session (only processes in session ``sid``)."""
    for line in live_session_processes(sid):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def shard_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete record line of the final shard files (temp files and torn lines skipped)."""
    records = []
    for path in sorted((run_dir / "shards").glob("*.jsonl")) if (run_dir / "shards").is_dir() else []:
        for line in path.read_bytes().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "sample_key" in record:
                records.append(record)
    return records


def done_keys(run_dir: Path, max_attempts: int) -> set[str]:
    """Keys the shards say are final: a non-failed attempt, a non-retryable failure, or attempts used up."""
    attempts: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for record in shard_records(run_dir):
        attempts[record["sample_key"]].append((int(record.get("attempt", 1)), record.get("exit_status", "")))
    done = set()
    for key, tries in attempts.items():
        last_attempt, last_status = max(tries)
        succeeded = any(not status.startswith("error:") for _, status in tries)
        final_failure = last_status.split(":", 1)[-1] not in RETRYABLE_FOR_TESTS
        if succeeded or final_failure or last_attempt >= max_attempts:
            done.add(key)
    return done


def read_outputs(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The merged output: kept (data/), rejected/ and failed/ records."""

    def read(pattern: str) -> list[dict[str, Any]]:
        return [
            json.loads(line)
            for path in sorted(run_dir.glob(pattern))
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]

    return {
        "kept": read("data/*.jsonl"),
        "rejected": read("rejected/*.jsonl"),
        "failed": read("failed/*.jsonl"),
    }


def first_prompt(record: dict[str, Any]) -> str | None:
    return next((m.get("content") for m in record.get("messages", []) if m.get("role") == "user"), None)


def sim_log_from(path: Path, offset: int) -> list[dict[str, Any]]:
    """Request-log lines appended after byte ``offset``."""
    if not path.exists():
        return []
    with path.open("rb") as fh:
        fh.seek(offset)
        lines = fh.read().splitlines()
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def session_starts(log: list[dict[str, Any]]) -> collections.Counter[str]:
    """Turn-0 requests per prompt hash: one per session attempt sent to the model."""
    return collections.Counter(e["prompt_sha"] for e in log if e.get("turn") == 0)


def status_table(run_dir: Path) -> dict[str, int]:
    """``raygen status`` parsed into {label: number}."""
    proc = run_cli("status", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│┃ \n").split("│")]
        if len(cells) == 2 and cells[1].isdigit():
            rows[cells[0]] = int(cells[1])
    return rows


def wait_for(predicate, timeout_s: float, proc: subprocess.Popen | None = None, poll_s: float = 0.2) -> bool:
    """Poll until ``predicate()`` or timeout; False early if ``proc`` exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(poll_s)
    return False


def session_actors(sid: int) -> list[int]:
    """Pids of the session actors (Ray workers running ``SessionWorker``) of session ``sid``."""
    return [int(line.split()[0]) for line in live_session_processes(sid) if "SessionWorker" in line]


def finish(proc: subprocess.Popen, log: Path, timeout: float = 600) -> str:
    """Wait for ``proc`` (killing its group past ``timeout``), clean up its session; returns its log."""
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_group(proc, settle_s=5)
        stop_leftovers(proc.pid)
    return log.read_text(errors="replace")


def assert_each_prompt_once(run_dir: Path, rows: list[dict[str, Any]], out_log: str) -> dict[str, list]:
    """The merged output holds every row's prompt exactly once, none failed, and status agrees."""
    out = read_outputs(run_dir)
    assert not out["failed"], out_log[-3000:]
    records = out["kept"] + out["rejected"]
    assert collections.Counter(first_prompt(r) for r in records) == collections.Counter(
        r["prompt"] for r in rows
    )
    assert len({r["sample_key"] for r in records}) == len(rows)
    status = status_table(run_dir)
    assert status["total"] == len(rows) and status["pending"] == 0
    return out
