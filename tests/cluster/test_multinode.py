"""A real multi-node Ray cluster on one machine: a head and two worker nodes started with `ray start` on
loopback, each with its own temp dir, ports and sandbox resources; `raygen run --ray-address` joins it.

    node   raygen_sandbox_local  raygen_sandbox_fake  raygen_sandbox_docker
    head   4                     4                    -
    w1     4                     4                    -
    w2     -                     4                    8

With 2 workers of 4 sessions each (one actor = 4 sandboxes), a `local` run must use exactly head and w1
(w2 offers no local sandbox), and a `fake` run has a spare node to move to when one is killed.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from cli_runs import read_jsonl
from ray_node import (
    MARK_VARIABLE,
    NODES_PREFIX,
    free_port_block,
    kill_tagged,
    marked_processes,
    wait_unmarked,
)

NODE_VARIABLE = "RAYGEN_TEST_NODE"
"""Names the node a process belongs to (Ray workers inherit their raylet's environment)."""

pytestmark = [pytest.mark.multinode, pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY_NODE = Path(__file__).with_name("ray_node.py")
EXAMPLES = ROOT / "examples" / "prompts.jsonl"
SESSIONS_PER_WORKER = 4
NODES = {
    "head": (2, {"raygen_sandbox_local": 4, "raygen_sandbox_fake": 4}),
    "w1": (1, {"raygen_sandbox_local": 4, "raygen_sandbox_fake": 4}),
    "w2": (1, {"raygen_sandbox_docker": 8, "raygen_sandbox_fake": 4}),
}


def start_node(name: str, index: int, cluster: dict) -> subprocess.Popen:
    cpus, sandboxes = NODES[name]
    ports = cluster["ports"]
    node_ports = ports + 3 + 10 * index  # pinned: agents started under load otherwise race the raylet
    args = [
        "start",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={cpus}",
        f"--resources={json.dumps({**sandboxes, f'rg_node_{name}': 1})}",  # marks the node for the test
        f"--temp-dir={cluster['tmp'] / name}",
        f"--dashboard-agent-listen-port={node_ports}",
        f"--dashboard-agent-grpc-port={node_ports + 1}",
        f"--metrics-export-port={node_ports + 2}",
        f"--runtime-env-agent-port={node_ports + 3}",
    ]
    if name == "head":
        args += [
            "--head",
            f"--port={ports}",
            f"--ray-client-server-port={ports + 2}",
            "--include-dashboard=false",  # not needed, and less start-up work on a busy machine
        ]
    else:
        args.append(f"--address={cluster['address']}")
    log = (cluster["tmp"] / f"{name}.log").open("w")
    # Ray gives a raylet about 30 s to register, which this shared machine can miss under load: a start
    # that fails is tried again (as cluster/slurm/raygen.sbatch does). Its own process group: the test
    # stops (or kills) exactly this node and what it started.
    retry = 'for attempt in 1 2 3; do "$@" && exit 0; echo "start failed; again"; sleep 3; done; exit 1'
    return subprocess.Popen(
        ["bash", "-c", retry, "ray-node", sys.executable, str(RAY_NODE), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**cluster["env"], NODE_VARIABLE: node_tag(cluster, name)},  # inherited by its Ray workers
        start_new_session=True,
    )


def node_tag(cluster: dict, name: str) -> str:
    return f"{cluster['mark']}-{name}"


def wait_nodes(cluster: dict, count: int) -> list[dict]:
    """The cluster's nodes once ``count`` are alive; fails as soon as a node process gave up."""
    waiter = subprocess.Popen(
        [sys.executable, str(RAY_NODE), "wait-nodes", cluster["address"], str(count), "400"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster["env"],
    )
    try:
        deadline = time.monotonic() + 450
        while waiter.poll() is None:
            dead = [name for name, proc in cluster["procs"].items() if proc.poll() is not None]
            assert not dead, f"Ray node(s) {dead} failed to start; see {cluster['tmp']}/<node>.log"
            assert time.monotonic() < deadline, "the cluster did not come up in time"
            time.sleep(1)
        out, err = waiter.communicate()
    finally:
        waiter.kill()
        waiter.wait()
    assert waiter.returncode == 0, f"{out}\n{err[-3000:]}"
    (line,) = [line for line in out.splitlines() if line.startswith(NODES_PREFIX)]
    return json.loads(line.removeprefix(NODES_PREFIX))


def stop_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM the node's process group, then SIGKILL what is left of it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace_s)
            time.sleep(1)  # the group's other members exit right after its leader
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def cluster():
    tmp = Path(tempfile.mkdtemp(prefix="rgmn-", dir="/tmp"))  # short: Ray's socket paths stay < 108 bytes
    ports = free_port_block(40)
    mark = f"multinode-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        MARK_VARIABLE: mark,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        # Every process of the cluster, the raygen drivers included, shares the mode and the token.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    state = {
        "tmp": tmp,
        "ports": ports,
        "address": f"127.0.0.1:{ports}",
        "env": env,
        "mark": mark,
        "procs": {},
    }
    try:
        state["procs"]["head"] = start_node("head", 0, state)
        wait_nodes(state, 1)  # a worker gives up if the head is not registered soon enough
        for index, name in enumerate(["w1", "w2"], start=1):
            state["procs"][name] = start_node(name, index, state)
        nodes = wait_nodes(state, 3)
        state["node_ids"] = {
            name: next(n["node_id"] for n in nodes if f"rg_node_{name}" in n["resources"]) for name in NODES
        }
        yield state
    finally:
        for proc in reversed(state["procs"].values()):
            stop_group(proc)
        left = wait_unmarked(mark, 30)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"processes of the test cluster survived it: {left}"


@pytest.fixture(autouse=True)
def _revive_killed_nodes(request):
    """A node a test killed is started again after it: the module's later tests need all three (the
    budget test failed twice in CI after the kill test had killed w1, the other node with local
    sandboxes, so only the head could spend)."""
    yield
    cluster = request.node.funcargs.get("cluster")
    for name in sorted(cluster.pop("killed", ())) if cluster else ():
        revive_node(cluster, name)


def make_dataset(path: Path, count: int) -> list[dict]:
    """``count`` distinct prompts cycling through the examples."""
    base = [json.loads(line) for line in EXAMPLES.read_text().splitlines() if line.strip()]
    rows = []
    for i in range(count):
        row = dict(base[i % len(base)])
        if i >= len(base):
            row["id"] = f"{row['id']}-v{i // len(base)}"
            row["prompt"] = f"{row['prompt']} (variant {i // len(base)})"
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def raygen_cmd(dataset: Path, config: Path, cluster: dict, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "raygen.cli",
        "run",
        str(dataset),
        "--config",
        str(config),
        "--ray-address",
        cluster["address"],
        *extra,
    ]


def final_records(run: Path) -> tuple[list[dict], list[dict]]:
    kept = read_jsonl(run.glob("data/*.jsonl"))
    others = read_jsonl(run.glob("rejected/*.jsonl")) + read_jsonl(run.glob("failed/*.jsonl"))
    return kept, others


def test_sessions_spread_over_nodes_and_the_governor_holds_the_limit(cluster, tmp_path):
    rows = make_dataset(tmp_path / "prompts.jsonl", 30)
    rpm, provider_rpm = 150.0, 200.0
    sim_log = tmp_path / "sim.jsonl"
    config = {
        # The provider allows 200 rpm; the governor's 150 rpm is shared by every worker on every node.
        "sim": {"latency_s": 0.05, "rate_limit_rpm": provider_rpm, "log_path": str(sim_log)},
        "governor": {"rpm": rpm},
        "env": {"type": "local", "root": str(tmp_path / "workdirs")},
        "ray": {"workers": 2, "sessions_per_worker": SESSIONS_PER_WORKER},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": "spread"},
    }
    (tmp_path / "workdirs").mkdir()
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        raygen_cmd(tmp_path / "prompts.jsonl", tmp_path / "run.yaml", cluster),
        capture_output=True,
        text=True,
        env=cluster["env"],
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]

    kept, others = final_records(tmp_path / "runs" / "spread")
    assert sorted(r["id"] for r in kept + others) == sorted(r["id"] for r in rows)
    assert not others
    # Placement: both nodes offering local sandboxes ran sessions; w2, which offers none, ran none.
    ids = cluster["node_ids"]
    assert {r["env"]["node"] for r in kept} == {ids["head"], ids["w1"]}

    # Cluster-wide pacing: in any 20 s window the provider saw no more requests than 150 rpm allows
    # (plus the bucket's one-second burst and a few seconds of delivery jitter). Two workers pacing
    # themselves independently would send twice that, and draw 429s from the 200 rpm provider.
    log = [json.loads(line) for line in sim_log.read_text().splitlines()]
    assert len(log) >= 2 * len(rows)
    stamps = sorted(entry["ts"] for entry in log)
    window_s, jitter_s = 20.0, 3.0
    busiest = max(sum(1 for t in stamps[i:] if t < start + window_s) for i, start in enumerate(stamps))
    allowed = rpm / 60 * (window_s + jitter_s) + rpm / 60
    assert busiest <= allowed, (busiest, allowed)
    statuses = collections.Counter(entry["status"] for entry in log)
    assert statuses[429] <= 0.05 * len(log), statuses


def test_a_worker_node_killed_mid_run_loses_no_prompt(cluster, tmp_path):
    rows = make_dataset(tmp_path / "prompts.jsonl", 40)
    run = tmp_path / "runs" / "kill"
    config = {
        "sim": {"latency_s": 1.0},  # ~3 s per session: the run outlasts the kill by far
        "env": {"type": "fake"},
        "ray": {"workers": 2, "sessions_per_worker": SESSIONS_PER_WORKER},
        "retry": {"pass_delay_s": 1.0},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": "kill", "shard_flush_s": 0.3},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    out = (tmp_path / "raygen.log").open("w")
    driver = subprocess.Popen(
        raygen_cmd(tmp_path / "prompts.jsonl", tmp_path / "run.yaml", cluster),
        stdout=out,
        stderr=subprocess.STDOUT,
        env=cluster["env"],
    )
    ids = cluster["node_ids"]
    worker_names = {ids["w1"]: "w1", ids["w2"]: "w2"}
    victim = None
    deadline = time.monotonic() + 600
    while victim is None and time.monotonic() < deadline and driver.poll() is None:
        done = read_jsonl(run.glob("shards/*.jsonl"))
        victim = next(
            (worker_names[r["env"]["node"]] for r in done if r["env"]["node"] in worker_names), None
        )
        time.sleep(0.3)
    assert victim is not None, (tmp_path / "raygen.log").read_text()[-4000:]
    kill_node(cluster, victim)  # the node dies with everything on it
    killed_at = datetime.now(UTC)
    done_at_kill = len(read_jsonl(run.glob("shards/*.jsonl")))
    assert done_at_kill < len(rows), "the run finished before the kill: nothing was tested"

    try:
        code = driver.wait(900)
    finally:
        driver.kill()
        out.close()
    log = (tmp_path / "raygen.log").read_text()
    if code != 0:  # a run that gave up still keeps its shards: --resume finishes it
        proc = subprocess.run(
            [*raygen_cmd(tmp_path / "prompts.jsonl", tmp_path / "run.yaml", cluster), "--resume"],
            capture_output=True,
            text=True,
            env=cluster["env"],
            timeout=900,
        )
        assert proc.returncode == 0, f"{log[-3000:]}\n--- resume:\n{proc.stderr[-3000:]}"

    kept, others = final_records(run)
    ids_seen = collections.Counter(r["id"] for r in kept + others)
    assert ids_seen == collections.Counter(r["id"] for r in rows)  # every prompt exactly once
    assert not [r for r in others if r.get("exit_status", "").startswith("error")], others
    # No session ended on the dead node after the kill (same machine, same clock): the rest, and the
    # sessions it was running, ran on the nodes still alive.
    on_victim = [r for r in kept if r["env"]["node"] == ids[victim]]
    assert all(datetime.fromisoformat(r["timing"]["ended_at"]) <= killed_at for r in on_victim)
    assert not marked_processes_of(cluster, victim)


def kill_node(cluster: dict, name: str) -> None:
    """SIGKILL one node: its process group, its descendants and every process carrying its tag, pass after
    pass until none is left (a raylet may start a worker meanwhile). The group alone was not enough once:
    Ray runs workers in their own process groups, and a session actor outlived its raylet by seconds
    (under load) and still delivered results, so "killed" must mean every process of the node at once."""
    cluster.setdefault("killed", set()).add(name)
    kill_tagged(cluster["procs"][name].pid, f"{NODE_VARIABLE}={node_tag(cluster, name)}")


def revive_node(cluster: dict, name: str) -> None:
    """Start a killed node again and wait until the cluster has it back under a new node id and no
    longer counts the dead one as alive (Ray notices a dead raylet only once its health checks fail)."""
    old_id = cluster["node_ids"][name]
    cluster["procs"][name] = start_node(name, list(NODES).index(name), cluster)
    deadline = time.monotonic() + 300
    while True:
        nodes = wait_nodes(cluster, len(NODES))
        ids = [n["node_id"] for n in nodes if f"rg_node_{name}" in n["resources"]]
        if old_id not in ids and len(ids) == 1:
            cluster["node_ids"][name] = ids[0]
            return
        assert time.monotonic() < deadline, f"node {name} did not come back: {nodes}"
        time.sleep(2)


def marked_processes_of(cluster: dict, name: str) -> list[str]:
    """Processes of one node (its temp dir is on their command lines, except renamed Ray workers)."""
    return [p for p in marked_processes(cluster["mark"]) if str(cluster["tmp"] / name) + "/" in p]


def _spend_to_the_cap(cluster: dict, folder: Path, prompts: int, cap: float) -> tuple[list, float, dict]:
    """A run of ``prompts`` under ``--max-cost cap``: its records, what the simulator billed, and the
    run's budget statistics."""
    reserve_price, billed_price = 4.0, 5.0
    folder.mkdir()
    make_dataset(folder / "prompts.jsonl", prompts)
    sim_log = folder / "sim.jsonl"
    billed = {"input": billed_price, "output": billed_price}
    config = {
        "sim": {"latency_s": 2.5, "log_path": str(sim_log), "reported_price": billed},
        "pricing": {"raygen-sim": {"input": reserve_price, "output": reserve_price}},
        "sampling": {"max_tokens": 256},
        "env": {"type": "local", "root": str(folder / "workdirs")},
        "ray": {"workers": 2, "sessions_per_worker": SESSIONS_PER_WORKER},
        "output": {"output_dir": str(folder / "runs"), "run_name": "budget"},
    }
    (folder / "workdirs").mkdir()
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    cmd = raygen_cmd(folder / "prompts.jsonl", folder / "run.yaml", cluster, "--max-cost", str(cap))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=cluster["env"], timeout=900)
    assert proc.returncode == 75, proc.stderr[-5000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("budget reached: $")
    run = folder / "runs" / "budget"
    log = [json.loads(line) for line in sim_log.read_text().splitlines()]
    billed_usd = sum(e["tokens"] for e in log if e["status"] == 200) * billed_price / 1e6
    budget = json.loads((run / "statistics.json").read_text())["this_invocation"]["budget"]
    return read_jsonl(run.glob("shards/*.jsonl")), billed_usd, budget


def test_a_budget_reached_mid_run_stops_admission_on_every_node(cluster, tmp_path):
    """One budget for the cluster (issue 25): sessions on both nodes reserve from the same actor, so the
    run stops under the cap plus the measured bound; two budgets, one a node, would spend about twice."""
    # A budget of ~25 sessions at 4 in flight an actor and 2.5 s a call: ~50 s of spending if one actor
    # spent it alone, so both nodes' actors are up long before it is spent. (CI failed here when the kill
    # test before it had killed w1; _revive_killed_nodes starts it again.)
    prompts, cap = 150, 0.25
    ids = cluster["node_ids"]
    records, billed_usd, budget = _spend_to_the_cap(cluster, tmp_path / "run", prompts, cap)
    assert {r["env"]["node"] for r in records if r["api_calls"]} == {ids["head"], ids["w1"]}
    spent = sum(r["cost_usd"] for r in records)
    assert spent == pytest.approx(billed_usd, rel=1e-9)
    assert cap * 0.5 < spent <= cap + budget["excess_usd"] + 1e-12
    assert len({r["sample_key"] for r in records if not r["exit_status"].startswith("error:")}) < prompts
