"""Resuming a large run mid-way (issue 27): the ``ceiling`` run (N prompts, 200,000 by default; ``--prompts
N``) is stopped with SIGTERM once about half of its records are in shards (what Slurm's preemption or a
spot reclaim sends: raygen drains, merges what it has and exits 75), then run again with ``--resume``.

It reports how long the drain took, what the second invocation ran, and whether every sample key is in
the output exactly once: no key missing, none duplicated, and how many sessions ran twice (a session
whose record was durable must never run again).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from bench.ceiling import write_tasks
from bench.common import Context, Row, child_env, tail

SHARD_RECORDS = 64
"""``output.shard_max_records``' default: records per closed shard, to tell progress from the file count."""


def run(ctx: Context) -> list[Row]:
    prompts = ctx.prompts or (5_000 if ctx.quick else 200_000)
    work = ctx.dir("ceiling_resume")
    dataset = write_tasks(work / "prompts.jsonl", prompts)
    config = {
        "model": {"type": "scripted", "latency_s": 0},
        "env": {"type": "fake"},
        "ray": {"workers": 2, "sessions_per_worker": 256},
        "output": {"output_dir": str(work / "runs"), "run_name": "ceiling"},
    }
    cfg_path = work / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    run_dir = work / "runs" / "ceiling"
    first = _invoke(cfg_path, dataset, work / "first", stop_at=prompts // 2, shards=run_dir / "shards")
    second = _invoke(cfg_path, dataset, work / "second", stop_at=None, shards=None, resume=True)
    got = {"prompts": prompts, "first": first, "second": second, **_exactly_once(run_dir, prompts)}
    ctx.results["ceiling_resume"] = got
    return _rows(got)


def _invoke(
    cfg: Path, dataset: Path, stem: Path, *, stop_at: int | None, shards: Path | None, resume: bool = False
) -> dict[str, Any]:
    """One ``driver.run`` in a child; with ``stop_at``, SIGTERM once that many records are in shards."""
    stamps = stem.with_suffix(".json")
    cmd = [sys.executable, "-m", "bench.ceiling", str(cfg), str(dataset), str(stamps)]
    cmd += ["resume"] if resume else []
    began = time.time()
    with stem.with_suffix(".log").open("w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True
        )
        signalled = None
        while proc.poll() is None:
            time.sleep(0.5)
            if stop_at is not None and signalled is None and _written(shards) >= stop_at:
                proc.send_signal(signal.SIGTERM)
                signalled = time.time()
        code = proc.wait()
    if code not in (0, 75):
        raise RuntimeError(f"ceiling run exited {code}:\n{tail(stem.with_suffix('.log'))}")
    took = json.loads(stamps.read_text()) if stamps.exists() else {}
    return {
        "exit": code,
        "wall_s": time.time() - began,
        "drain_s": None if signalled is None else time.time() - signalled,
        "sessions_run": took.get("sessions_run"),
    }


def _written(shards: Path | None) -> int:
    """About how many records are in closed shards."""
    return len(os.listdir(shards)) * SHARD_RECORDS if shards is not None and shards.exists() else 0


def _exactly_once(run_dir: Path, prompts: int) -> dict[str, Any]:
    """Records per key in the shards, and the output's keys (data, rejected, failed) counted."""
    in_shards: Counter[str] = Counter()
    for path in (run_dir / "shards").glob("*.jsonl"):
        with path.open("rb") as f:
            for line in f:
                in_shards[json.loads(line)["sample_key"]] += 1
    out: Counter[str] = Counter()
    for folder in ("data", "rejected", "failed"):
        for path in (run_dir / folder).glob("*.jsonl"):
            with path.open("rb") as f:
                for line in f:
                    out[json.loads(line)["sample_key"]] += 1
    return {
        "keys_out": len(out),
        "keys_out_twice": sum(1 for n in out.values() if n > 1),
        "keys_missing": prompts - len(out),
        "sessions_twice": sum(1 for n in in_shards.values() if n > 1),
        "records": sum(in_shards.values()),
    }


def _rows(got: dict[str, Any]) -> list[Row]:
    first, second, prompts = got["first"], got["second"], got["prompts"]
    scenario = f"resume mid-way, {prompts} prompts"
    once = got["keys_out"] == prompts and not got["keys_out_twice"] and not got["sessions_twice"]
    return [
        Row(scenario, "first invocation (SIGTERM at ~half)", f"exit {first['exit']}", "75",
            first["exit"] == 75, f"{first['sessions_run']} sessions in {first['wall_s']:.1f} s; SIGTERM "
            f"to exit {first['drain_s']:.1f} s (the sessions in flight finish, the merge runs)"),
        Row(scenario, "second invocation (--resume)", f"exit {second['exit']}", "0", second["exit"] == 0,
            f"{second['sessions_run']} sessions in {second['wall_s']:.1f} s"),
        Row(scenario, "every key exactly once", f"{got['keys_out']} keys", f"{prompts}", once,
            f"{got['keys_missing']} missing, {got['keys_out_twice']} twice in the output; {got['records']} "
            f"records in shards, {got['sessions_twice']} keys with a second session"),
    ]  # fmt: skip
