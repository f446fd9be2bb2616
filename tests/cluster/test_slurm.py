"""cluster/slurm/raygen.sbatch for real: a private two-node Slurm on loopback (.ci/slurm-setup.sh; two
slurmd on this machine), the script starting a Ray head on the first node and a worker on the second with
srun, `raygen run` against the built-in simulator, and a clean shutdown, also after `scancel`.

The loopback tweaks (node IP 127.0.0.1, pinned ports, per-node temp dirs, the ray_node.py wrapper) are
the script's own settings, set here as a user would. The sandbox backend is `local`: apptainer only
runs inside a fixture container on this machine (see docs/cluster.md).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml
from cli_runs import read_jsonl
from ray_node import MARK_VARIABLE, free_port_block, marked_processes, wait_unmarked

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "cluster" / "slurm" / "raygen.sbatch"
SETUP = ROOT / ".ci" / "slurm-setup.sh"
RAY_NODE = Path(__file__).with_name("ray_node.py")
EXAMPLES = ROOT / "examples" / "prompts.jsonl"
SESSIONS_PER_WORKER = 4


@pytest.fixture(scope="module")
def slurm():
    """A two-node Slurm in this network namespace, stopped afterwards; skips if it cannot start."""
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip("Slurm is not installed (.ci/slurm-setup.sh --install-only)")
    # Not under pytest's 0700 tmp folder: munged runs as user munge and must reach its socket folder.
    workdir = Path(tempfile.mkdtemp(prefix="rgslurm-", dir="/tmp"))
    workdir.chmod(0o755)
    base = free_port_block(3)
    env = {
        **os.environ,
        "SLURM_SETUP_CTLD_PORT": str(base),
        "SLURM_SETUP_SLURMD_PORT": str(base + 1),
    }
    proc = subprocess.run(
        [str(SETUP), "--nodes", "2", str(workdir)], capture_output=True, text=True, env=env, timeout=180
    )
    try:
        if proc.returncode != 0:
            pytest.skip(f"slurmctld/slurmd could not start here: {proc.stderr[-1500:]}")
        yield {"workdir": workdir, "env": {**os.environ, "SLURM_CONF": str(workdir / "slurm.conf")}}
    finally:
        subprocess.run([str(SETUP), "--stop", str(workdir)], capture_output=True, timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


def job_env(slurm: dict, name: str, log_dir: Path) -> tuple[dict, str]:
    """The environment a user would set for the sbatch script on this machine, with private ports and
    temp dir, plus a mark that every process of the job inherits (returned)."""
    ports = free_port_block(24)
    mark = f"{name}-{uuid.uuid4().hex}"
    env = {
        MARK_VARIABLE: mark,
        **slurm["env"],
        "RAYGEN_ENV": "local",
        "RAYGEN_SANDBOXES_PER_NODE": str(SESSIONS_PER_WORKER),  # room for one session actor per node
        "RAYGEN_CMD": f"{sys.executable} -m raygen.cli",
        "RAYGEN_RAY": f"{sys.executable} {RAY_NODE}",
        "RAYGEN_PYTHON": sys.executable,
        "RAYGEN_NODE_IP": "127.0.0.1",
        "RAYGEN_RAY_PORT": str(ports),
        "RAYGEN_DASHBOARD_PORT": str(ports + 1),
        "RAYGEN_CLIENT_PORT": str(ports + 2),
        "RAYGEN_RAY_HEAD_ARGS": "--include-dashboard=false",  # less start-up work on a busy machine
        "RAYGEN_NODE_PORT_BASE": str(ports + 3),  # nodes 0 and 1: ports + 3 .. ports + 18
        "RAYGEN_RAY_TEMP_DIR": str(slurm["workdir"] / f"ray-{name}"),
        "RAYGEN_LOG_DIR": str(log_dir),
        "RAYGEN_START_TIMEOUT": "400",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    return env, mark


def write_config(path: Path, tmp: Path, run_name: str, latency_s: float, workers: int = 2) -> Path:
    config = {
        "sim": {"latency_s": latency_s, "log_path": str(tmp / f"sim-{run_name}.jsonl")},
        "env": {"type": "local", "root": str(tmp / "workdirs")},
        "output": {"output_dir": str(tmp / "runs"), "run_name": run_name, "shard_flush_s": 0.5},
        "ray": {"workers": workers, "sessions_per_worker": SESSIONS_PER_WORKER},
    }
    (tmp / "workdirs").mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def submit(flag: str, *, out: Path, config: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``sbatch FLAG`` of the unchanged launcher on two nodes, on the example prompts."""
    argv = ["sbatch", flag, "--nodes=2", f"--output={out}", str(SBATCH), str(EXAMPLES)]
    argv += ["--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


def submit_until_a_record(config: Path, out: Path, env: dict, run: Path) -> str:
    """``sbatch --parsable`` the job; returns its id once the run's first record is in a shard."""
    proc = submit("--parsable", out=out, config=config, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 600
    while not read_jsonl(run.glob("shards/*.jsonl")) and time.monotonic() < deadline:
        assert job_id in squeue(env), f"the job ended before any session finished:\n{read(out)[-4000:]}"
        time.sleep(0.5)
    assert read_jsonl(run.glob("shards/*.jsonl")), f"no session finished in time:\n{read(out)[-4000:]}"
    return job_id


def test_sbatch_runs_the_dataset_on_two_nodes_and_cleans_up(slurm, tmp_path):
    env, mark = job_env(slurm, "run", tmp_path / "ray-logs")
    # The head offers no sandbox: every session must run on the worker node that srun started.
    env["RAYGEN_HEAD_SANDBOXES"] = "0"
    config = write_config(tmp_path / "run.yaml", tmp_path, "slurm", latency_s=0.05, workers=1)
    out = tmp_path / "job.out"
    proc = submit("--wait", out=out, config=config, env=env, timeout=900)
    log = out.read_text() if out.exists() else ""
    assert proc.returncode == 0, f"{proc.stderr}\n{log[-6000:]}"
    assert "raygen exited with code 0" in log

    run = tmp_path / "runs" / "slurm"
    kept = read_jsonl(run.glob("data/*.jsonl"))
    others = read_jsonl(run.glob("rejected/*.jsonl")) + read_jsonl(run.glob("failed/*.jsonl"))
    want = sorted(json.loads(line)["id"] for line in EXAMPLES.read_text().splitlines() if line.strip())
    assert sorted(r["id"] for r in kept + others) == want  # every prompt exactly once
    assert not others  # the simulator's defaults reject nothing
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["counts"]["total"] == stats["counts"]["kept"] == len(want)
    assert "2 Ray node(s) up" in log
    head, worker = node_id(env, "rg1"), node_id(env, "rg2")
    assert head != worker and {r["env"]["node"] for r in kept} == {worker}
    assert not wait_unmarked(mark, 30), "processes of the job survived it"


def test_scancel_mid_run_leaves_no_ray_process(slurm, tmp_path):
    env, mark = job_env(slurm, "cancel", tmp_path / "ray-logs")
    # Slow model calls: the run lasts well beyond its first finished session.
    config = write_config(tmp_path / "run.yaml", tmp_path, "cancelled", latency_s=1.5)
    out = tmp_path / "job.out"
    job_id = submit_until_a_record(config, out, env, tmp_path / "runs" / "cancelled")
    shards = tmp_path / "runs" / "cancelled" / "shards"
    running = marked_processes(mark)
    assert any("raylet" in p for p in running) and any("raygen.cli run" in p for p in running)

    subprocess.run(["scancel", job_id], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 120
    while job_id in squeue(env) and time.monotonic() < deadline:
        time.sleep(1)
    assert job_id not in squeue(env)
    # Nothing the job started is left: batch script, raygen, simulator, Ray nodes and their workers.
    assert not wait_unmarked(mark, 30), "processes of the cancelled job survived it"
    done = len(read_jsonl(shards.glob("*.jsonl")))
    assert done < 20, "the run finished before the cancel: nothing was tested"
    assert "done (exit code" in read(out)  # the script's own cleanup ran


def test_usr1_drains_requeues_and_the_job_finishes_every_prompt_once(slurm, tmp_path):
    # What a time limit does with --signal=B:USR1@...: the batch script gets USR1 mid-run, raygen drains and
    # exits 75, the script requeues the job, and its second start resumes the run to the end.
    env, mark = job_env(slurm, "requeue", tmp_path / "ray-logs")
    config = write_config(tmp_path / "run.yaml", tmp_path, "requeued", latency_s=1.5)
    out = tmp_path / "job.out"
    run = tmp_path / "runs" / "requeued"
    job_id = submit_until_a_record(config, out, env, run)

    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 1200
    while "raygen exited with code 0" not in read(out) and time.monotonic() < deadline:
        time.sleep(2)
    log = read(out)
    assert "raygen exited with code 75" in log, log[-6000:]
    assert f"requeueing job {job_id}" in log and f"restart 1 of job {job_id}" in log, log[-6000:]
    assert "raygen exited with code 0" in log, log[-6000:]
    deadline = time.monotonic() + 120
    while job_id in squeue(env) and time.monotonic() < deadline:
        time.sleep(1)
    assert job_id not in squeue(env)
    assert not wait_unmarked(mark, 30), "processes of the job survived it"

    records = read_jsonl(run.glob("data/*.jsonl")) + read_jsonl(run.glob("rejected/*.jsonl"))
    records += read_jsonl(run.glob("failed/*.jsonl"))
    want = sorted(json.loads(line)["id"] for line in EXAMPLES.read_text().splitlines() if line.strip())
    assert sorted(r["id"] for r in records) == want  # every prompt exactly once
    # ... and sent to the model once: the drain let the sessions in flight finish before the requeue.
    sim_log = read_jsonl([tmp_path / "sim-requeued.jsonl"])
    starts = collections.Counter(e["prompt_sha"] for e in sim_log if e.get("turn") == 0)
    assert len(starts) == len(want) and set(starts.values()) == {1}, starts


def node_id(env: dict, slurm_node: str) -> str:
    """The Ray node id of the node the job started on ``slurm_node`` (Ray names files after it)."""
    session = Path(env["RAYGEN_RAY_TEMP_DIR"]) / slurm_node / "session_latest"
    # A start the launcher retried (RAYGEN_START_ATTEMPTS, when Ray misses its registration timeout on a
    # loaded machine) leaves one file per attempt: the node that ran is the last one started.
    port_files = sorted(session.glob("metrics_agent_port_*"), key=lambda p: p.stat().st_mtime)
    assert port_files, f"no Ray node files under {session}"
    return port_files[-1].name.rsplit("_", 1)[1]


def squeue(env: dict) -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env).stdout


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
