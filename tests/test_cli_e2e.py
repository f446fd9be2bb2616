"""The whole path from the command line: CLI -> validation -> Ray Data -> session actors -> simulator over
HTTP -> real shell commands in local workdirs -> shards -> filtered merge -> Parquet/JSONL."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys

import pytest
import yaml
from cli_runs import read_jsonl

from raygen.config import SimConfig
from raygen.model.sim_policy import plan_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def raygen(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raygen.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def e2e(tmp_path_factory, agent_tasks):
    tmp = tmp_path_factory.mktemp("e2e")
    rows = [json.loads(line) for line in agent_tasks.read_text().splitlines()]
    # every category, the edge rows (20k-char prompt, unicode, tags in text, a duplicate prompt)
    picked = [r for r in rows if r["category"] != "edge"][::12] + [r for r in rows if r["category"] == "edge"]
    picked.append(next(r for r in rows if r["id"] == "intercode-nl2bash_fs_1-000"))  # twin of edge-05
    dataset = tmp / "prompts.jsonl"
    dataset.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked))
    sim = {
        "latency_s": 0.01,
        "hallucinate_rate": 0.2,
        "no_reasoning_rate": 0.25,
        "seed": 7,
        "log_path": str(tmp / "sim-log.jsonl"),
    }
    config = {
        "sim": sim,
        "ray": {"workers": 2, "sessions_per_worker": 8},
        "env": {"type": "local", "root": str(tmp / "workdirs")},
        "output": {"output_dir": str(tmp / "runs"), "run_name": "e2e", "data_shard_records": 20},
    }
    (tmp / "workdirs").mkdir()
    cfg_path = tmp / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    proc = raygen("run", str(dataset), "--config", str(cfg_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"tmp": tmp, "rows": picked, "sim": SimConfig(**sim), "run": tmp / "runs" / "e2e", "proc": proc}


def test_every_prompt_exactly_once(e2e):
    run = e2e["run"]
    kept = read_jsonl(run.glob("data/*.jsonl"))
    rejected = read_jsonl(run.glob("rejected/*.jsonl"))
    failed = read_jsonl(run.glob("failed/*.jsonl"))
    ids = [r["id"] for r in kept + rejected + failed]
    assert sorted(ids) == sorted(r["id"] for r in e2e["rows"])
    assert len(set(r["sample_key"] for r in kept + rejected + failed)) == len(e2e["rows"])
    assert not failed
    # the simulator saw each session start exactly once (the duplicate prompt: twice)
    log = [json.loads(line) for line in (e2e["tmp"] / "sim-log.jsonl").read_text().splitlines()]
    starts = collections.Counter(entry["prompt_sha"] for entry in log if entry["turn"] == 0)
    want = collections.Counter(hashlib.sha256(r["prompt"].encode()).hexdigest()[:16] for r in e2e["rows"])
    assert starts == want


def test_tool_results_came_from_commands_that_really_ran(e2e):
    for rec in read_jsonl(e2e["run"].glob("data/*.jsonl")):
        plan = plan_for(rec["messages"][0]["content"], e2e["sim"])
        outputs = [m["content"] for m in rec["messages"] if m["role"] == "tool"]
        assert any(plan.terminal_token in o for o in outputs), rec["id"]
        assert "terminal=ok file=ok" in rec["messages"][-1]["content"]
        assert rec["env"]["backend"] == "local" and rec["env"]["node"]
    assert not list((e2e["tmp"] / "workdirs").iterdir())  # every workdir was removed


def test_filters_rejected_exactly_the_planned_sessions(e2e):
    run = e2e["run"]
    expected = {}
    for row in e2e["rows"]:
        plan = plan_for(row["prompt"], e2e["sim"])
        expected[row["id"]] = (
            "hallucinated_tool" if plan.hallucinate else "no_reasoning" if not plan.reason else None
        )
    got = {r["id"]: None for r in read_jsonl(run.glob("data/*.jsonl"))}
    got.update({r["id"]: r["rejection_reason"] for r in read_jsonl(run.glob("rejected/*.jsonl"))})
    assert got == expected
    assert any(v == "hallucinated_tool" for v in expected.values())
    assert any(v == "no_reasoning" for v in expected.values())


def test_datasets_loads_parquet_and_jsonl(e2e, tmp_path):
    code = f"""
import datasets
run = {str(e2e["run"])!r}
a = datasets.load_dataset(run + "/data", split="train")
b = datasets.load_dataset("json", data_files=run + "/data/*.jsonl", split="train")
c = datasets.load_dataset("parquet", data_files=run + "/data/*.parquet", split="train")
assert len(a) == len(b) == len(c), (len(a), len(b), len(c))
assert a[0]["conversations"][0]["from"] in ("system", "human")
print(len(a))
"""
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.strip()) == len(read_jsonl(e2e["run"].glob("data/*.jsonl")))
    assert len(list(e2e["run"].glob("data/*.parquet"))) >= 2  # really sharded


def test_statistics_reconcile_with_records(e2e):
    run = e2e["run"]
    stats = json.loads((run / "statistics.json").read_text())
    records = read_jsonl(run.glob("data/*.jsonl")) + read_jsonl(run.glob("rejected/*.jsonl"))
    assert stats["counts"]["total"] == len(records) == len(e2e["rows"])
    for tool, s in stats["tools"].items():
        assert s["count"] == sum(r["tool_stats"][tool]["count"] for r in records), tool
        assert s["success"] == sum(r["tool_stats"][tool]["success"] for r in records), tool
    assert stats["api_calls"]["total"] == sum(r["api_calls"] for r in records)
    per_cat = collections.Counter(r["category"] for r in records)
    assert {c: v["counts"]["total"] for c, v in stats["per_category"].items()} == dict(per_cat)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["dataset"]["rows"] == len(e2e["rows"]) and manifest["ended_at"]
    assert "built-in simulator" in e2e["proc"].stderr


def test_status_and_remerge_without_model(e2e):
    run = e2e["run"]
    st = raygen("status", str(run))
    assert st.returncode == 0, st.stderr
    assert "pending" in st.stdout
    before = len(read_jsonl(run.glob("data/*.jsonl")))
    m = raygen("merge", str(run), "--no-filter-reasoning")
    assert m.returncode == 0, m.stderr
    after = read_jsonl(run.glob("data/*.jsonl"))
    assert len(after) > before  # the no-reasoning sessions are now kept
    assert all(r.get("rejection_reason") != "no_reasoning" for r in read_jsonl(run.glob("rejected/*.jsonl")))


def test_malformed_dataset_fails_fast_without_model_calls(tmp_path):
    from raygen.sim.launch import start_in_thread

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": ""}\nnot json\n{"prompt": 3, "imgae": "x"}\n')
    log = tmp_path / "log.jsonl"
    with start_in_thread(SimConfig(log_path=log)) as sim:
        proc = raygen(
            "run",
            str(bad),
            "--base-url",
            sim.url,
            "--output-dir",
            str(tmp_path / "runs"),
            env={"OPENAI_API_KEY": "sk-test"},
        )
    assert proc.returncode == 2
    for line in (2, 3, 4):
        assert f"bad.jsonl:{line}:" in proc.stderr
    assert "image" in proc.stderr  # did-you-mean for imgae
    assert not log.exists() or log.read_text() == ""
    assert not (tmp_path / "runs").exists()


def test_the_default_model_is_the_simulator_announced_in_one_line(e2e):
    manifest = json.loads((e2e["run"] / "manifest.json").read_text())
    assert manifest["config"]["model"]["type"] == "sim"
    announced = [line for line in e2e["proc"].stderr.splitlines() if "built-in simulator" in line]
    assert len(announced) == 1 and announced[0].startswith(
        "no --base-url: using the built-in simulator at http"
    )


def test_a_run_made_before_model_type_sim_still_reads_and_resumes(e2e, tmp_path):
    """Runs made before ``model.type: sim`` recorded the simulator as an ``openai`` model without
    ``base_url``: status, merge and --resume still accept them (same generation fingerprint)."""
    import shutil

    run = tmp_path / "runs" / "e2e"
    shutil.copytree(e2e["run"], run)
    manifest = json.loads((run / "manifest.json").read_text())
    # How those runs spelled the simulator, in the config and in the fingerprinted generation settings.
    assert manifest["generation"]["model_type"] == "openai"
    assert manifest["generation"]["base_url"] == "builtin-simulator"
    model = {k: v for k, v in manifest["config"]["model"].items() if k != "type"}
    manifest["config"]["model"] = {
        "type": "openai",
        "base_url": None,
        "api_key_env": "OPENAI_API_KEY",
        **model,
    }
    (run / "manifest.json").write_text(json.dumps(manifest))

    assert raygen("status", str(run)).returncode == 0
    assert raygen("merge", str(run)).returncode == 0
    again = raygen(
        "run", str(e2e["tmp"] / "prompts.jsonl"), "-c", str(e2e["tmp"] / "run.yaml"),
        "--output-dir", str(tmp_path / "runs"), "--resume",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to run" in again.stderr


def test_start_is_quiet(e2e):
    """Ray's start-up notices that raygen causes or can configure stay off the screen; the one it cannot
    avoid is explained by raygen in one line printed before it."""
    err = e2e["proc"].stderr
    assert "Token authentication is enabled" not in err  # raygen's private cluster keeps token auth on
    assert "Progress bars disabled" not in err  # raygen turns Ray Data's bars off and prints its own
    words = " ".join(err.split())  # the console may wrap the note
    assert words.count("note: Ray logs one core_worker.cc error") == 1 and "ray-project/ray#53727" in words
