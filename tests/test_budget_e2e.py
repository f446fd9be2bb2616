"""Money end to end: ``raygen run`` as a user runs it, on Ray, against the built-in simulator.

- ``--max-cost`` stops admission cluster-wide before the cap; the run exits 75 with one line; what was
  spent (the sum of every record's ``cost_usd``) equals what the simulator billed (its request log) and
  passes the cap by no more than the measured bound; a resume with a larger budget finishes every
  sample exactly once;
- ``--max-session-cost`` ends the sessions that would pass it, final, trajectory kept;
- ``--pilot N`` runs N samples, projects the rest, and a resume runs exactly the rest;
- ``--dry-run`` prints the price and the forecast.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from cli_runs import read_jsonl, run_with_config

AGENT_TASKS = (
    Path(__file__).resolve().parent / "data" / "agent-tasks.jsonl"
)  # (tests/conftest.py: the vendored copy)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RESERVE_PRICE = 4.0
"""USD per 1M tokens the run is told (``pricing``): what each call's reservation is computed with."""
BILLED_PRICE = 5.0
"""USD per 1M tokens the simulator reports in ``usage.cost``: 25% more, so calls exceed their reservations."""
WORKERS, SLOTS = 2, 4


def _config(tmp: Path, log: Path, *, reported: bool = True) -> dict:
    sim = {"latency_s": 0.05, "log_path": str(log)}
    if reported:
        sim["reported_price"] = {"input": BILLED_PRICE, "output": BILLED_PRICE}
    return {
        "ray": {"workers": WORKERS, "sessions_per_worker": SLOTS},
        "sampling": {"max_tokens": 256},
        "sim": sim,
        "pricing": {"raygen-sim": {"input": RESERVE_PRICE, "output": RESERVE_PRICE}},
        "output": {"output_dir": str(tmp / "runs")},
    }


def _billed_usd(log: Path) -> float:
    """What the simulator billed: every answered request's tokens at its reported price."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return sum(r["tokens"] for r in rows if r["status"] == 200) * BILLED_PRICE / 1e6


def _shard_records(run: Path) -> list[dict]:
    return read_jsonl(run.glob("shards/*.jsonl"))


def test_max_cost_stops_before_the_cap_and_resume_with_more_finishes_exactly_once(tmp_path):
    log = tmp_path / "sim.jsonl"
    config = _config(tmp_path, log)
    run = tmp_path / "runs" / "money"
    cap = 0.1
    args = ("--limit", "40", "--run-name", "money")
    first = run_with_config(AGENT_TASKS, config, tmp_path / "c.yaml", *args, "--max-cost", str(cap))
    assert first.returncode == 75, first.stderr[-3000:]
    last = first.stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"budget reached: \$([\d.]+) of \$0\.1; raise --max-cost and --resume", last)
    assert match, last

    records = _shard_records(run)
    spent = sum(r["cost_usd"] for r in records)
    assert spent == pytest.approx(_billed_usd(log), rel=1e-9)  # the ledger is what the provider billed
    assert {r["cost_source"] for r in records if r["api_calls"]} == {"provider"}
    budget = json.loads((run / "statistics.json").read_text())["this_invocation"]["budget"]
    assert budget["spent_usd"] == pytest.approx(spent, rel=1e-9)
    assert float(match.group(1)) == pytest.approx(spent, abs=1e-4)
    # The bound: the overshoot is at most what calls in flight spent beyond their reservations (each call
    # was billed 25% over the price it reserved at), and calls in flight are at most the session slots.
    overshoot = max(0.0, spent - cap)
    assert overshoot <= budget["excess_usd"] + 1e-12
    assert budget["in_flight_at_stop"] <= WORKERS * SLOTS and budget["max_in_flight"] <= WORKERS * SLOTS
    assert spent > cap * 0.5  # admission went on until near the cap, not far below it
    statuses = Counter(r["exit_status"] for r in records)
    assert statuses["error:budget_reached"] >= 1 and len({r["sample_key"] for r in records}) < 40 + 1
    unfinished = 40 - len({r["sample_key"] for r in records if not r["exit_status"].startswith("error:")})
    assert unfinished > 0
    cut_usd = sum(r["cost_usd"] for r in records if r["exit_status"] == "error:budget_reached")

    second = run_with_config(AGENT_TASKS, config, tmp_path / "c.yaml", *args, "--max-cost", "20", "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    records = _shard_records(run)
    finished = Counter(r["sample_key"] for r in records if not r["exit_status"].startswith("error:"))
    assert len(finished) == 40 and set(finished.values()) == {1}  # every sample finished exactly once
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["counts"]["total"] == 40 and "budget_reached" not in stats["counts"]["failed"]
    total = sum(r["cost_usd"] for r in records)
    assert stats["cost"]["total_usd"] == pytest.approx(total, rel=1e-9)
    assert total == pytest.approx(_billed_usd(log), rel=1e-9)  # both invocations, nothing lost
    # What the sessions cut by the first budget had spent was paid for, and is counted apart.
    assert stats["cost"]["superseded_usd"] == pytest.approx(cut_usd, abs=1e-12)


def test_max_session_cost_ends_long_sessions_final_with_their_trajectory(tmp_path):
    config = _config(tmp_path, tmp_path / "sim.jsonl", reported=False)
    run = tmp_path / "runs" / "capped"
    cap = 0.007  # sessions here make 3 calls of about $0.0025-0.003 each at $4 per 1M tokens
    done = run_with_config(
        AGENT_TASKS, config, tmp_path / "c.yaml", "--limit", "16", "--run-name", "capped",
        "--max-session-cost", str(cap),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    failed = read_jsonl(run.glob("failed/*.jsonl"))
    capped = [r for r in failed if r["exit_status"] == "error:session_cost_cap"]
    assert capped, Counter(r["exit_status"] for r in failed)
    for record in capped:
        assert 0 < record["cost_usd"] <= cap and record["cost_source"] == "config" and record["messages"]
        assert record["attempt"] == 1  # final: not retried
    kept = read_jsonl(run.glob("data/*.jsonl"))
    assert all(r["cost_usd"] <= cap for r in kept)
    assert len(kept) + len(failed) + len(read_jsonl(run.glob("rejected/*.jsonl"))) == 16


def test_pilot_projects_and_resume_runs_exactly_the_rest(tmp_path):
    config = _config(tmp_path, tmp_path / "sim.jsonl")
    run = tmp_path / "runs" / "pilot"
    args = ("--limit", "12", "--run-name", "pilot")
    pilot = run_with_config(AGENT_TASKS, config, tmp_path / "c.yaml", *args, "--pilot", "3")
    assert pilot.returncode == 0, pilot.stderr[-3000:]
    assert re.search(r"pilot: 3 sessions, \$[\d.]+ per session \(95% interval", pilot.stderr), pilot.stderr
    assert "projection for the 9 samples left" in pilot.stderr
    assert len(_shard_records(run)) == 3
    rest = run_with_config(AGENT_TASKS, config, tmp_path / "c.yaml", *args, "--resume")
    assert rest.returncode == 0, rest.stderr[-3000:]
    keys = Counter(r["sample_key"] for r in _shard_records(run))
    assert len(keys) == 12 and set(keys.values()) == {1}


@pytest.mark.parametrize("flag", ["--max-cost", "--max-session-cost"])
def test_a_dollar_budget_without_a_price_is_refused_in_one_line(tmp_path, flag):
    argv = [sys.executable, "-m", "raygen.cli", "run", str(AGENT_TASKS), "--limit", "2",
            "--output-dir", str(tmp_path), flag, "1", "--model", "someone/unpriced"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"{flag} needs the price of model someone/unpriced" in done.stderr
    assert not list(tmp_path.glob("*/shards"))


def test_dry_run_prints_the_price_and_the_forecast(tmp_path):
    config = _config(tmp_path, tmp_path / "sim.jsonl")
    done = run_with_config(AGENT_TASKS, config, tmp_path / "c.yaml", "--limit", "5", "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "price: raygen-sim: input $4, output $4 per 1M tokens (config)" in done.stderr
    assert re.search(r"forecast for 5 prompts: first model call [\d,]+ tokens \$[\d.]+", done.stderr)
    assert "forecast ceiling (10 turns" in done.stderr


def test_max_tokens_stops_before_the_token_cap_without_any_price(tmp_path):
    log = tmp_path / "sim.jsonl"
    config = {**_config(tmp_path, log, reported=False), "pricing": {}}
    run = tmp_path / "runs" / "tokens"
    cap = 20_000
    done = run_with_config(
        AGENT_TASKS,
        config,
        tmp_path / "c.yaml",
        "--limit",
        "40",
        "--run-name",
        "tokens",
        "--max-tokens",
        str(cap),
    )
    assert done.returncode == 75, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"budget reached: [\d,]+ of 20,000 tokens; raise --max-tokens and --resume", last), (
        last
    )
    records = _shard_records(run)
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    billed = sum(r["tokens"] for r in rows if r["status"] == 200)
    spent = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in records)
    assert spent == billed
    budget = json.loads((run / "statistics.json").read_text())["this_invocation"]["budget"]
    assert budget["spent_tokens"] == spent and cap * 0.5 < spent <= cap + budget["excess_tokens"]
