"""Resume semantics (docs/resume.md): identity, the ledger, config refusal, accounting, retries.

The first part needs no Ray: run folders are built from records written with ShardWriter, and
``raygen.run.driver.run`` plans (``dry_run``) or merges them (nothing pending, so Ray never starts).
The second part (marked ``ray``/``slow``) drives ``raygen run`` from the command line against the
simulator: a randomized sequence of dataset edits and SIGKILLs of the driver's process group, checked
against the simulator's own request log; and the retry policy for infrastructure failures.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from resume_harness import (
    done_keys,
    first_prompt,
    kill_group,
    prompt_sha,
    read_outputs,
    run_cli,
    sample_keys,
    session_starts,
    shard_records,
    sim_log_from,
    start_group,
    status_table,
    stop_leftovers,
    wait_for,
    write_dataset,
)

from raygen.config import RunConfig
from raygen.errors import FAILURE_KINDS, RETRYABLE, ConfigError
from raygen.formats.records import ReasoningCounts, Trajectory
from raygen.input.pending import PendingChunk, keys_path
from raygen.input.rows import PromptRow, Sample
from raygen.output.shards import ShardWriter
from raygen.run.driver import run
from raygen.run.folder_commands import remerge, run_status, write_keys
from raygen.run.generation import Generation, describe_changes
from raygen.run.ledger import Ledger, worker_lost_record

# ---------------------------------------------------------------------------------------------- no Ray


def _rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"prompt": f"task {i}: count the files", "category": "abc"[i % 3]} for i in range(start, start + n)
    ]


def _config(tmp: Path, dataset: Path, **sections: Any) -> RunConfig:
    data = {"dataset": str(dataset), "output": {"output_dir": str(tmp / "runs"), "run_name": "r"}}
    data.update(sections)
    return RunConfig.model_validate(data)


def _record(
    key: str, prompt: str, index: int, *, attempt: int = 1, status: str = "completed", reasoning=1
) -> str:
    return Trajectory(
        id=key,
        sample_key=key,
        prompt_index=index,
        attempt=attempt,
        category="abc"[index % 3],
        messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": "done"}],
        completed=status == "completed",
        exit_status=status,
        reasoning=ReasoningCounts(with_reasoning=reasoning, without_reasoning=1 - reasoning),
    ).model_dump_json()


def _fake_run(
    config: RunConfig, rows: list[dict], outcomes: dict[int, list[tuple[int, str]]] | None = None
) -> Path:
    """A run folder as a finished ``raygen run`` leaves it: manifest, keys.txt and one record per row
    (``outcomes[i]`` overrides row i with (attempt, exit_status) records; "no_reasoning" is a completed
    session without reasoning)."""
    write_dataset(Path(config.dataset), rows)
    generation = Generation.build(config)
    run_dir = Path(config.output.output_dir) / str(config.output.run_name)
    run_dir.mkdir(parents=True)
    manifest = {
        "config": config.model_dump(mode="json"),
        "config_fingerprint": generation.fingerprint,
        "generation": generation.settings,
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    keys = sample_keys(rows)
    write_keys(run_dir, {k for k, _ in keys})
    writer = ShardWriter(run_dir, "test", 1000, 60.0)
    for index, (key, prompt) in enumerate(keys):
        for attempt, status in (outcomes or {}).get(index, [(1, "completed")]):
            if status == "no_reasoning":
                writer.add(_record(key, prompt, index, attempt=attempt, reasoning=0))
            else:
                writer.add(_record(key, prompt, index, attempt=attempt, status=status))
    writer.close()
    return run_dir


def test_taxonomy_matches_the_issue():
    # The issue names these infrastructure failures as retryable; model/task outcomes are not failures.
    infrastructure = {"provider_unavailable", "env_start", "worker_lost", "rate_limited", "env_lost"}
    infrastructure.add("provider_malformed")  # issue 15: a body that is not a completion is retried
    # A check that could not run is retried; so is a session the run's budget stopped (issue 25), a
    # harness that crashed (docs/agents.md) and an MCP server that died or hung (docs/tools.md).
    retried = {"verify_error", "budget_reached", "agent_failed", "mcp_server_lost"}
    assert infrastructure | retried == set(RETRYABLE)
    assert set(FAILURE_KINDS) > RETRYABLE
    assert "provider_bad_request" not in RETRYABLE and "internal" not in RETRYABLE


def test_docs_taxonomy_table_matches_the_code():
    text = (Path(__file__).resolve().parents[1] / "docs" / "resume.md").read_text(encoding="utf-8")
    table = re.findall(r"^\| `(\w+)` \| (yes|no) \| (.+?) \|$", text, re.M)
    assert {k: (r == "yes", m) for k, r, m in table} == {
        k: (k in RETRYABLE, v) for k, v in FAILURE_KINDS.items()
    }


def test_ledger_decides_what_runs_next():
    ledger = Ledger()
    ledger.record("ok", 1, "max_turns")  # a model outcome: final
    ledger.record("bad", 1, "error:provider_bad_request")  # not retryable: final
    ledger.record("flaky", 1, "error:provider_unavailable")
    ledger.record("late", 2, "error:env_start")
    ledger.record("late", 1, "completed")  # any non-failed attempt makes the sample final
    assert ledger.next_attempt("new", 3) == 1
    assert ledger.next_attempt("ok", 3) is None
    assert ledger.next_attempt("bad", 3) is None
    assert ledger.next_attempt("flaky", 3) == 2
    assert ledger.next_attempt("flaky", 1) is None  # attempts used up
    assert ledger.next_attempt("late", 3) is None


def test_ledger_and_merge_agree_on_torn_and_invalid_records(tmp_path):
    rows = _rows(3)
    config = _config(tmp_path, tmp_path / "p.jsonl")
    run_dir = _fake_run(config, rows[:1])
    write_dataset(Path(config.dataset), rows)
    write_keys(run_dir, {k for k, _ in sample_keys(rows)})
    (key_b, _), (key_c, prompt_c) = sample_keys(rows)[1:]
    shard = run_dir / "shards" / "torn-000000.jsonl"
    # B: parses but has no prompt_index (the merge cannot place it); C: a torn line cut mid-record.
    shard.write_text(json.dumps({"sample_key": key_b, "exit_status": "completed"}) + "\n")
    shard.write_text(shard.read_text() + _record(key_c, prompt_c, 2)[:-30] + "\n")
    ledger = Ledger.scan(run_dir)
    assert ledger.next_attempt(key_b, 3) == 1 and ledger.next_attempt(key_c, 3) == 1
    status = run_status(run_dir)
    assert (status.total, status.kept, status.pending) == (3, 1, 2)
    planned = run(config, resume=True, dry_run=True)
    assert planned.pending == 2


def test_lost_samples_become_retryable_worker_lost_records(tmp_path):
    samples = [
        Sample(
            row=PromptRow(prompt=f"p{i}"),
            sample_key=f"k{i}",
            prompt_index=i,
            line=i + 1,
            toolsets=["file"],
            attempt=a,
        )
        for i, a in enumerate((1, 2, 1))
    ]
    with PendingChunk(tmp_path / "pending-00000.jsonl") as pending_chunk:
        for sample in samples:
            pending_chunk.write(sample)
    pending = pending_chunk.path
    ledger = Ledger()
    ledger.record("k0", 1, "completed")
    ledger.record("k1", 1, "error:rate_limited")  # an earlier attempt only: attempt 2 never came back
    lost = list(ledger.undelivered([pending]))
    assert [s.sample_key for s in lost] == ["k1", "k2"]
    record = worker_lost_record(lost[0], model="m", config_fingerprint="f", detail="gone")
    assert (record.exit_status, record.attempt, record.sample_key) == ("error:worker_lost", 2, "k1")
    ledger.record(record.sample_key, record.attempt, record.exit_status)
    assert ledger.lost_worker_before(lost[0])
    assert ledger.next_attempt("k1", 3) == 3
    assert ledger.next_attempt("k1", 2) is None  # counts towards max_attempts like any failure


def test_write_pending_gives_lost_samples_a_task_of_their_own(tmp_path):
    from raygen.distributed.pipeline import write_pending

    samples = [
        Sample(row=PromptRow(prompt=f"p{i}"), sample_key=f"k{i}", prompt_index=i, line=i + 1, toolsets=[])
        for i in range(7)
    ]
    files, count = write_pending(samples, tmp_path, 3, alone=lambda s: s.sample_key in ("k1", "k5"))
    chunks = [[json.loads(line)["sample_key"] for line in f.read_text().splitlines()] for f in files]
    assert count == 7
    assert sorted(k for chunk in chunks for k in chunk) == [f"k{i}" for i in range(7)]
    assert ["k1"] in chunks and ["k5"] in chunks
    assert all(len(chunk) <= 3 for chunk in chunks)
    # Beside each chunk, its samples' keys and attempts in the same order (what the ledger reads).
    keys = [[line.split("\t") for line in keys_path(f).read_text().splitlines()] for f in files]
    assert keys == [[[k, "1"] for k in chunk] for chunk in chunks]


def test_after_a_pass_only_the_samples_returned_are_parsed(tmp_path):
    samples = [
        Sample(row=PromptRow(prompt=f"p{i}"), sample_key=f"k{i}", prompt_index=i, line=i + 1, toolsets=[])
        for i in range(4)
    ]
    with PendingChunk(tmp_path / "pass1-00000.jsonl") as chunk:
        for sample in samples:
            chunk.write(sample)
    lines = chunk.path.read_text().splitlines()
    lines[0] = lines[2] = "not json"  # parsing these would fail: the keys file says they came back
    chunk.path.write_text("\n".join(lines) + "\n")
    ledger = Ledger()
    for key in ("k0", "k2"):
        ledger.record(key, 1, "completed")
    assert [s.sample_key for s in ledger.undelivered([chunk.path])] == ["k1", "k3"]
    ledger.record("k1", 1, "completed")
    ledger.record("k3", 1, "error:provider_unavailable")
    assert [(s.sample_key, s.attempt) for s in ledger.still_pending([chunk.path], 3)] == [("k3", 2)]


@pytest.mark.parametrize("edit", ["reorder", "delete", "duplicate", "insert", "edit_text"])
def test_resume_after_dataset_edit_plans_only_new_samples(tmp_path, edit):
    rows = _rows(12)
    config = _config(tmp_path, tmp_path / "p.jsonl")
    _fake_run(config, rows)
    rng = random.Random(edit)
    if edit == "reorder":
        rng.shuffle(rows)
        new = 0
    elif edit == "delete":
        del rows[3:6]
        new = 0
    elif edit == "duplicate":
        rows[5:5] = [dict(rows[2]), dict(rows[2]), dict(rows[9])]  # identical rows are separate samples
        new = 3
    elif edit == "insert":
        rows[1:1] = _rows(4, start=100)
        new = 4
    else:
        rows[7] = {**rows[7], "prompt": rows[7]["prompt"] + " (reworded)"}
        new = 1
    write_dataset(Path(config.dataset), rows)
    planned = run(config, resume=True, dry_run=True)
    assert planned.pending == new
    assert (Path(config.output.output_dir) / "r" / "manifest.json").exists()


def test_finished_resume_remerges_the_current_dataset_only(tmp_path):
    rows = _rows(10)
    config = _config(tmp_path, tmp_path / "p.jsonl")
    run_dir = _fake_run(config, rows)
    kept_rows = rows[:4] + rows[6:]
    random.Random(1).shuffle(kept_rows)
    write_dataset(Path(config.dataset), kept_rows)
    result = run(config, resume=True)  # nothing pending: no Ray, just the merge
    assert result.sessions_run == 0
    out = read_outputs(run_dir)
    assert collections.Counter(first_prompt(r) for r in out["kept"]) == collections.Counter(
        r["prompt"] for r in kept_rows
    )
    assert result.merge.stale == 2
    status = run_status(run_dir)
    assert (status.total, status.kept, status.pending) == (8, 8, 0)


def test_resume_of_a_run_killed_before_its_manifest_starts_it(tmp_path):
    config = _config(tmp_path, tmp_path / "p.jsonl")
    write_dataset(Path(config.dataset), _rows(5))
    planned = run(config, resume=True, dry_run=True)
    assert planned.pending == 5
    (tmp_path / "runs" / "r" / "shards").mkdir(parents=True)  # something was recorded: refuse
    with pytest.raises(ConfigError, match="no manifest"):
        run(config, resume=True, dry_run=True)
    unnamed = config.model_copy(update={"output": config.output.model_copy(update={"run_name": None})})
    with pytest.raises(ConfigError, match="--run-name"):  # never a fresh timestamped run by mistake
        run(unnamed, resume=True, dry_run=True)


def test_changed_generation_config_is_refused_with_what_changed(tmp_path):
    config = _config(tmp_path, tmp_path / "p.jsonl")
    _fake_run(config, _rows(4))
    changed = config.model_copy(
        update={
            "session": config.session.model_copy(update={"max_turns": 3}),
            "sampling": config.sampling.model_copy(update={"temperature": 0.7}),
        }
    )
    with pytest.raises(ConfigError) as err:
        run(changed, resume=True, dry_run=True)
    assert "max_turns: 10 -> 3" in str(err.value)
    assert "sampling.temperature: null -> 0.7" in str(err.value)
    assert "--force" in str(err.value)
    # Settings outside the fingerprint (retries, filters, workers, the simulator) resume freely.
    harmless = config.model_copy(
        update={
            "retry": config.retry.model_copy(update={"max_attempts": 7}),
            "ray": config.ray.model_copy(update={"workers": 5}),
        }
    )
    assert run(harmless, resume=True, dry_run=True).pending == 0
    assert run(changed, resume=True, force=True, dry_run=True).pending == 0


def test_describe_changes_names_tools_and_long_values():
    old = {
        "tool_schemas": [{"function": {"name": "a"}}, {"function": {"name": "b", "x": 1}}],
        "system_prompt": "s" * 200,
    }
    new = {
        "tool_schemas": [{"function": {"name": "b", "x": 2}}, {"function": {"name": "c"}}],
        "system_prompt": "t" * 200,
    }
    changes = describe_changes(old, new)
    assert changes[1] == "tool_schemas: added c / removed a / changed b"
    assert changes[0].startswith("system_prompt: <202 chars") and "s" * 20 not in changes[0]


def accounted(status) -> int:
    return status.kept + sum(status.rejected.values()) + sum(status.failed.values()) + status.pending


def test_status_sums_to_the_dataset_and_follows_the_latest_merge(tmp_path):
    rows = _rows(7)
    config = _config(tmp_path, tmp_path / "p.jsonl", retry={"max_attempts": 2})
    outcomes = {
        1: [(1, "no_reasoning")],
        2: [(1, "error:provider_unavailable")],  # retryable, attempts left: pending
        3: [(1, "error:provider_unavailable"), (2, "error:env_start")],  # retryable, used up: failed
        4: [(1, "error:provider_bad_request")],  # not retryable: failed
        5: [(1, "error:rate_limited"), (2, "completed")],  # retried, then kept
    }
    run_dir = _fake_run(config, rows[:6], outcomes)
    write_dataset(Path(config.dataset), rows)
    write_keys(run_dir, {k for k, _ in sample_keys(rows)})  # row 6 has no record yet
    status = run_status(run_dir)
    assert status.kept == 2 and status.rejected == {"no_reasoning": 1}
    assert status.failed == {"env_start": 1, "provider_bad_request": 1}
    assert status.pending == 2
    assert accounted(status) == status.total == 7
    assert run(config, resume=True, dry_run=True).pending == 2  # the resume agrees with status
    remerge(run_dir, {"no_reasoning": False})
    after = run_status(run_dir)
    assert (after.kept, after.rejected, accounted(after)) == (3, {}, 7)
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["kept"] == len(read_outputs(run_dir)["kept"]) == 3


# ------------------------------------------------------------------------- CLI, Ray and the simulator

ROWS = 60


def _new_row(uid: int, rng: random.Random) -> dict[str, Any]:
    return {
        "prompt": f"Task {uid:04d}: list the files in the working directory.",
        "category": rng.choice("xyz"),
    }


def _edit(rows: list[dict], rng: random.Random, next_uid: int) -> tuple[list[dict], int, list[str]]:
    """Reorder, insert, delete and duplicate rows, in a random order and amount."""
    rows = list(rows)
    done = []
    for op in rng.sample(["reorder", "insert", "delete", "duplicate"], 4):
        if op == "reorder":
            rng.shuffle(rows)
        elif op == "insert":
            for _ in range(rng.randint(1, 5)):
                rows.insert(rng.randrange(len(rows) + 1), _new_row(next_uid, rng))
                next_uid += 1
        elif op == "delete":
            for _ in range(rng.randint(1, 5)):
                rows.pop(rng.randrange(len(rows)))
        else:
            for _ in range(rng.randint(1, 3)):
                rows.insert(rng.randrange(len(rows) + 1), dict(rng.choice(rows)))
        done.append(op)
    return rows, next_uid, done


def _pending_by_prompt(rows: list[dict], done: set[str]) -> collections.Counter[str]:
    return collections.Counter(prompt_sha(prompt) for key, prompt in sample_keys(rows) if key not in done)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Rounds of (edit the dataset, run or resume, maybe SIGKILL the process group), with what each saw."""
    seed = int(os.environ.get("RAYGEN_RESUME_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"randomized resume test: RAYGEN_RESUME_SEED={seed}")
    rng = random.Random(seed)
    tmp = tmp_path_factory.mktemp("resume")
    dataset, sim_log = tmp / "prompts.jsonl", tmp / "sim-log.jsonl"
    config = {
        "sim": {
            "latency_s": 0.05,
            "hallucinate_rate": 0.15,
            "no_reasoning_rate": 0.15,
            # Stragglers: a kill finds sessions that finished long ago beside ones still running.
            "slow_rate": 0.05,
            "slow_factor": 50.0,
            "seed": seed % 1000,
            "log_path": str(sim_log),
        },
        "ray": {"workers": 2, "sessions_per_worker": 8},
        "env": {"type": "local", "root": str(tmp / "workdirs")},
        "output": {
            "output_dir": str(tmp / "runs"),
            "run_name": "rr",
            "shard_max_records": 4,
            "shard_flush_s": 0.5,
            "data_shard_records": 25,
        },
        "retry": {"pass_delay_s": 0.2},
    }
    cfg_path = tmp / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    run_dir = tmp / "runs" / "rr"
    rows = [_new_row(uid, rng) for uid in range(ROWS)]
    next_uid = ROWS
    # Two kills (the second very early, or again once shards appear), then two resumes to the end.
    kinds = ["kill_after_shards", rng.choice(["kill_early", "kill_after_shards"]), "complete", "complete"]
    rounds = []
    for number, kind in enumerate(kinds):
        edits = []
        if number:
            rows, next_uid, edits = _edit(rows, rng, next_uid)
        write_dataset(dataset, rows)
        done_before = done_keys(run_dir, 3)
        offset = sim_log.stat().st_size if sim_log.exists() else 0
        shards_before = len(list(run_dir.glob("shards/*.jsonl")))
        args = ["run", str(dataset), "--config", str(cfg_path)] + (["--resume"] if number else [])
        proc = start_group(args, tmp / f"round{number}.log")
        observed: dict[str, Any] = {"kind": kind, "edits": edits, "seed": seed, "rows": list(rows)}
        try:
            if kind == "kill_early":
                delay = rng.uniform(0.3, 8.0)
                wait_for(lambda: False, delay, proc)
                observed["kill_at"] = f"{delay:.1f}s after start"
            elif kind == "kill_after_shards":
                more = rng.randint(1, 3)
                target = shards_before + more
                wait_for(lambda t=target: len(list(run_dir.glob("shards/*.jsonl"))) >= t, 400, proc)
                wait_for(lambda: False, rng.uniform(0.0, 1.0), proc)
                observed["kill_at"] = f">= {more} new shard(s)"
            if kind.startswith("kill") and proc.poll() is None:
                observed["stray"] = kill_group(proc)
                observed["killed"] = True
            else:
                proc.wait(timeout=600)
                observed["killed"] = False
        finally:
            if proc.poll() is None:
                kill_group(proc, settle_s=5)
            stop_leftovers(proc.pid)
        observed["rc"] = proc.returncode
        observed["log_tail"] = (tmp / f"round{number}.log").read_text(errors="replace")[-3000:]
        observed["done_before"] = done_before
        observed["pending_before"] = _pending_by_prompt(rows, done_before)
        observed["starts"] = session_starts(sim_log_from(sim_log, offset))
        observed["done_after"] = done_keys(run_dir, 3)
        if not observed["killed"]:
            observed["outputs"] = read_outputs(run_dir)
            observed["statistics"] = json.loads((run_dir / "statistics.json").read_text())
        if (run_dir / "keys.txt").exists():
            observed["status"] = status_table(run_dir)
        keys_now = {k for k, _ in sample_keys(rows)}
        recorded = len((observed["done_after"] - done_before) & keys_now)
        print(
            f"round {number} {kind} {observed.get('kill_at', '')} edits={edits}: rows {len(rows)}, "
            f"pending before {sum(observed['pending_before'].values())}, "
            f"sessions sent {sum(observed['starts'].values())}, recorded by this run {recorded}, "
            f"killed={observed['killed']}"
        )
        rounds.append(observed)
    return {
        "rounds": rounds,
        "run_dir": run_dir,
        "tmp": tmp,
        "dataset": dataset,
        "config": cfg_path,
        "sim_log": sim_log,
    }


# The rounds run in the module fixture, set up by whichever of these tests runs first: each may need the time.
_ROUNDS_TIME = pytest.mark.timeout(1800)


def _why(observed: dict) -> str:
    return (
        f"seed={observed['seed']} round={observed['kind']} edits={observed['edits']}\n{observed['log_tail']}"
    )


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_every_round_ran_or_was_killed_cleanly(history):
    rounds = history["rounds"]
    assert rounds[-1]["killed"] is False and rounds[-2]["killed"] is False
    assert any(r["killed"] for r in rounds), "no round was killed"
    for observed in rounds:
        if observed["killed"]:
            assert observed["stray"] == [], _why(observed)
        else:
            assert observed["rc"] == 0, _why(observed)


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_no_recorded_session_is_sent_to_the_model_again(history):
    for observed in history["rounds"]:
        resent = observed["starts"] - observed["pending_before"]
        assert not resent, f"sessions already recorded were sent again: {dict(resent)}\n{_why(observed)}"


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_completed_runs_run_exactly_the_pending_sessions(history):
    # Everything not recorded before -- new rows, sessions in flight at the last kill -- ran once.
    for observed in history["rounds"]:
        if not observed["killed"]:
            assert observed["starts"] == observed["pending_before"], _why(observed)


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_outputs_hold_every_prompt_of_the_dataset_exactly_once(history):
    for observed in history["rounds"]:
        if observed["killed"]:
            continue
        out = observed["outputs"]
        records = out["kept"] + out["rejected"] + out["failed"]
        assert not out["failed"], _why(observed)
        assert collections.Counter(first_prompt(r) for r in records) == collections.Counter(
            r["prompt"] for r in observed["rows"]
        ), _why(observed)
        keys = [r["sample_key"] for r in records]
        assert sorted(keys) == sorted(k for k, _ in sample_keys(observed["rows"])), _why(observed)


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_status_sums_to_the_dataset_size(history):
    for observed in history["rounds"]:
        status = observed.get("status")
        if status is None:  # killed before keys.txt existed
            continue
        parts = sum(v for k, v in status.items() if k != "total")
        assert parts == status["total"], _why(observed)
        if not observed["killed"]:
            assert status["total"] == len(observed["rows"]) and status["pending"] == 0, _why(observed)


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_statistics_reconcile_with_the_output_files(history):
    for observed in history["rounds"]:
        if observed["killed"]:
            continue
        out, counts = observed["outputs"], observed["statistics"]["counts"]
        assert counts["kept"] == len(out["kept"])
        assert counts["rejected"] == dict(collections.Counter(r["rejection_reason"] for r in out["rejected"]))
        assert counts["total"] == len(out["kept"]) + len(out["rejected"]) + len(out["failed"])
        calls = sum(r["api_calls"] for r in out["kept"] + out["rejected"])
        assert observed["statistics"]["api_calls"]["total"] == calls


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_resuming_a_finished_run_calls_no_model(history, tmp_path):
    run_dir = tmp_path / "runs" / "again"
    shutil.copytree(history["run_dir"], run_dir)
    before = read_outputs(run_dir)
    offset = history["sim_log"].stat().st_size
    args = ("run", str(history["dataset"]), "--config", str(history["config"]))
    proc = run_cli(*args, "--output-dir", str(tmp_path / "runs"), "--run-name", "again", "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 to run" in proc.stderr
    assert sim_log_from(history["sim_log"], offset) == []
    assert read_outputs(run_dir) == before


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_changed_config_is_refused_unless_forced(history, tmp_path):
    run_dir = tmp_path / "runs" / "changed"
    shutil.copytree(history["run_dir"], run_dir)
    offset = history["sim_log"].stat().st_size
    args = (
        "run",
        str(history["dataset"]),
        "--config",
        str(history["config"]),
        "--output-dir",
        str(tmp_path / "runs"),
    )
    refused = run_cli(*args, "--run-name", "changed", "--resume", "--max-turns", "3")
    assert refused.returncode == 2
    message = " ".join(refused.stderr.split())  # rich wraps long lines
    assert "(max_turns: 10 -> 3)" in message and "--force" in message
    forced = run_cli(*args, "--run-name", "changed", "--resume", "--max-turns", "3", "--force")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "0 to run" in forced.stderr
    assert sim_log_from(history["sim_log"], offset) == []
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["generation"]["max_turns"] == 3


@_ROUNDS_TIME
@pytest.mark.ray
@pytest.mark.slow
def test_merge_reruns_with_other_filters_without_the_model(history, tmp_path):
    run_dir = tmp_path / "merged"
    shutil.copytree(history["run_dir"], run_dir)
    before = read_outputs(run_dir)
    no_reasoning = sum(r["rejection_reason"] == "no_reasoning" for r in before["rejected"])
    assert no_reasoning, "the simulator produced no session without reasoning"
    proc = run_cli("merge", str(run_dir), "--no-filter-reasoning")
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = read_outputs(run_dir)
    assert len(after["kept"]) == len(before["kept"]) + no_reasoning
    status = status_table(run_dir)
    assert status["kept"] == len(after["kept"]) and "rejected: no_reasoning" not in status
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["kept"] == len(after["kept"])


# ---------------------------------------------------------------------------- infrastructure retries


def _cli_run(tmp: Path, rows: list[dict], config: dict[str, Any], *flags: str):
    """``raygen run`` of ``rows`` with ``config`` (plus a simulator log and a local env under ``tmp``)."""
    write_dataset(tmp / "p.jsonl", rows)
    config = {
        **config,
        "sim": {"latency_s": 0.02, "log_path": str(tmp / "sim.jsonl"), **config.get("sim", {})},
        "ray": {"workers": 2, "sessions_per_worker": 8},
        "env": {"type": "local", "root": str(tmp / "wd")},
        "output": {"output_dir": str(tmp / "runs"), "run_name": "r", "shard_max_records": 8},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(config))
    proc = run_cli("run", str(tmp / "p.jsonl"), "--config", str(tmp / "run.yaml"), *flags)
    return tmp / "runs" / "r", proc


def _attempts_by_key(run_dir: Path) -> dict[str, list[tuple[int, str]]]:
    by_key: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for record in shard_records(run_dir):
        by_key[record["sample_key"]].append((record["attempt"], record["exit_status"]))
    return {k: sorted(v) for k, v in by_key.items()}


@pytest.mark.ray
@pytest.mark.slow
def test_infrastructure_failures_are_retried_in_later_passes(tmp_path):
    rows = [{"prompt": f"Job {i}: list the files."} for i in range(20)]
    max_attempts = 6
    config = {
        "sim": {"error_rate": 0.35},  # 5xx; one HTTP retry each, so about 4 in 10 sessions fail a pass
        "model": {"max_retries": 1, "retry_max_wait_s": 0.05},
        "retry": {"max_attempts": max_attempts, "pass_delay_s": 0.05},
        "filters": {"no_reasoning": False, "hallucinated_tools": False},
    }
    run_dir, proc = _cli_run(tmp_path, rows, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pass 2: retrying" in proc.stderr
    attempts = _attempts_by_key(run_dir)
    assert sorted(attempts) == sorted(k for k, _ in sample_keys(rows))
    retried_then_kept = 0
    for key, tries in attempts.items():
        numbers, statuses = [n for n, _ in tries], [s for _, s in tries]
        assert numbers == list(range(1, len(tries) + 1)), (key, tries)  # each attempt once, none skipped
        assert all(s == "error:provider_unavailable" for s in statuses[:-1]), (key, tries)
        assert not statuses[-1].startswith("error:") or len(tries) == max_attempts, (key, tries)
        retried_then_kept += len(tries) > 1 and not statuses[-1].startswith("error:")
    assert retried_then_kept > 0
    status = status_table(run_dir)
    assert status["total"] == len(rows) and status["pending"] == 0
    assert status["kept"] + status.get("failed: provider_unavailable", 0) == len(rows)


@pytest.mark.ray
@pytest.mark.slow
def test_final_failures_are_never_retried(tmp_path):
    rows = [{"prompt": f"Job {i}: list the files."} for i in range(8)]
    config = {"model": {"model": "nonexistent-model"}, "retry": {"max_attempts": 3, "pass_delay_s": 0.05}}
    run_dir, proc = _cli_run(tmp_path, rows, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pass 2" not in proc.stderr
    attempts = _attempts_by_key(run_dir)
    assert all(tries == [(1, "error:provider_bad_request")] for tries in attempts.values()), attempts
    assert len(attempts) == len(rows)
    log = sim_log_from(tmp_path / "sim.jsonl", 0)
    assert len(log) == len(rows) and {e["status"] for e in log} == {404}  # one request per sample, ever
    status = status_table(run_dir)
    assert status["failed: provider_bad_request"] == len(rows) and status["pending"] == 0
    again = run_cli("run", str(tmp_path / "p.jsonl"), "--config", str(tmp_path / "run.yaml"), "--resume")
    assert again.returncode == 0 and "0 to run" in again.stderr
    assert len(sim_log_from(tmp_path / "sim.jsonl", 0)) == len(rows)


def test_chunks_hold_up_to_four_actors_slots_and_shrink_towards_the_end(tmp_path):
    from raygen.config import RayConfig
    from raygen.distributed.pipeline import chunk_rows_for, write_pending

    ray = RayConfig(workers=2, sessions_per_worker=32)
    assert chunk_rows_for(3000, ray) == 128  # capped at 4 x 32
    assert chunk_rows_for(600, ray) == 75  # a quarter of what is left per actor
    assert chunk_rows_for(100, ray) == 32  # never below one actor's slots
    assert chunk_rows_for(0, ray) == 32  # size unknown (a retry pass)
    big = RayConfig(workers=2, sessions_per_worker=5000)
    assert chunk_rows_for(10_000, big) == 5000

    samples = [
        Sample(row=PromptRow(prompt=f"p{i}"), sample_key=f"k{i}", prompt_index=i, line=i + 1, toolsets=[])
        for i in range(3000)
    ]
    files, count = write_pending(samples, tmp_path, lambda written: chunk_rows_for(3000 - written, ray))
    sizes = [len(f.read_text().splitlines()) for f in files]
    assert count == 3000 and sum(sizes) == 3000
    assert sizes[0] == 128 and max(sizes) == 128
    assert sizes == sorted(sizes, reverse=True)  # shrinking
    assert sizes[-1] <= 32


def test_actors_hold_three_tasks_only_when_the_pass_runs_in_several_rounds():
    from raygen.config import RayConfig
    from raygen.distributed.pipeline import tasks_per_actor_for

    assert tasks_per_actor_for(1500, RayConfig(workers=2, sessions_per_worker=32)) == 3
    assert tasks_per_actor_for(200, RayConfig(workers=2, sessions_per_worker=32)) == 2
    assert tasks_per_actor_for(10_000, RayConfig(workers=2, sessions_per_worker=5000)) == 2
    assert tasks_per_actor_for(0, RayConfig(workers=2, sessions_per_worker=32)) == 2
