"""raygen's Ray metrics end to end: ``raygen run`` with ``ray.metrics_export_port`` against a rate-limited
simulator, its Prometheus endpoint scraped over HTTP while the run goes on."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

import pytest
import yaml
from cli_runs import run_records, write_dataset

pytestmark = [pytest.mark.ray, pytest.mark.slow]

_SAMPLE = re.compile(r"^(ray_raygen_\w+)\{([^}]*)\} ([0-9.eE+-]+)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """raygen's series on the endpoint, summed over processes and tags other than ``status`` / ``kind``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
    except OSError:
        return {}
    sums: dict[str, float] = defaultdict(float)
    for line in body.splitlines():
        match = _SAMPLE.match(line)
        if match:
            name, tags, value = match.groups()
            sub = re.search(r'(?:status|kind)="(\w+)"', tags)
            sums[name + (f"[{sub.group(1)}]" if sub else "")] += float(value)
    return dict(sums)


def test_sessions_tokens_429s_and_governor_rates_reach_the_prometheus_endpoint(tmp_path):
    port = free_port()
    rows = [
        {"id": f"m{i}", "prompt": f"metrics task {i}: print {i}", "toolsets": ["terminal"]} for i in range(40)
    ]
    dataset = write_dataset(tmp_path / "prompts.jsonl", rows)
    config = {
        # 16 sessions at 0.5 s a call want ~32 requests/s; the simulator allows 10/s: 429s, then pacing.
        "sim": {"latency_s": 0.5, "rate_limit_rpm": 600},
        "model": {"max_retries": 30, "retry_max_wait_s": 5},
        "env": {"type": "fake"},
        "ray": {"workers": 2, "sessions_per_worker": 8, "metrics_export_port": port},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": "metrics"},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "RAY_metrics_report_interval_ms": "500"}
    argv = [sys.executable, "-m", "raygen.cli", "run", str(dataset), "--config", str(tmp_path / "run.yaml")]
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, float] = {}  # the highest value of each series while the run lasted
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        for name, value in scrape(port).items():
            seen[name] = max(value, seen.get(name, value))
        time.sleep(0.25)
    proc.wait(timeout=60)
    log.close()
    assert proc.returncode == 0, (tmp_path / "run.log").read_text()[-4000:]

    records = [r for group in run_records(tmp_path / "runs" / "metrics").values() for r in group]
    assert len(records) == len(rows)
    print("\nhighest values scraped:", {k: seen[k] for k in sorted(seen)})
    # Counters only grow, so the last scrape before the actors exit is the highest; it may miss the last
    # half second of the run, hence "most" rather than "all".
    assert len(rows) // 2 <= seen["ray_raygen_sessions_started_total"] <= len(rows)
    assert seen["ray_raygen_sessions_finished_total[completed]"] >= len(rows) // 2
    assert seen["ray_raygen_tokens_total[prompt]"] > 0 and seen["ray_raygen_tokens_total[completion]"] > 0
    assert seen["ray_raygen_rate_limited_total"] >= 1
    assert 1 <= seen["ray_raygen_requests_in_flight"] <= 16
    assert 1 <= seen["ray_raygen_sandboxes"] <= 16
    # The governor's pace reaches the endpoint as a plausible rpm. How well it learns the 600-rpm limit is
    # tested where the timing is controlled (tests/distributed/test_governor_learning.py, the `limits`
    # benches): here, on a loaded CI machine, the evidence for a cut (two 429s within 10 s since issue 24)
    # came late and the highest pace seen was 1,396 rpm (on a quiet one <= 900).
    assert 100 <= seen["ray_raygen_governor_target_rpm"] <= 3000
    assert seen["ray_raygen_governor_measured_limit_rpm"] > 0
    assert seen["ray_raygen_governor_achieved_rpm"] > 0
