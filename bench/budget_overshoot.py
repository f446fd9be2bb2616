"""How far a run passes ``--max-cost``, against the bound, for several reservation sizes (docs/cost.md).

``python -m bench.budget_overshoot [--prompts N] [--cap USD] [--slots N]`` runs ``raygen run`` (the CLI,
on a local Ray, against the built-in simulator) once per setting of ``budget.reserve_completion_tokens``
and of the billed price, and prints one row each from the run's ``statistics.json``: what was spent, the
overshoot, the bound it must obey (what the calls in flight spent beyond their reservations), the calls
in flight when admission ended, and what the stop wasted (sessions cut mid-way). Run it in a
loopback-only namespace, like the tests: ``unshare -n bash -c 'ip link set lo up && python -m ...'``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

TASKS = Path(__file__).resolve().parents[1] / "tests" / "data" / "agent-tasks.jsonl"
PRICE = 4.0
"""USD per 1M tokens the run reserves at (``pricing``)."""
MAX_TOKENS = 256


def one_run(work: Path, name: str, reserve: int, billed: float, args: argparse.Namespace) -> dict:
    config = {
        "ray": {"workers": 2, "sessions_per_worker": args.slots // 2},
        "sampling": {"max_tokens": MAX_TOKENS},
        "sim": {
            "latency_s": 0.2,
            "latency_jitter_s": 0.15,
            "reported_price": {"input": billed, "output": billed},
        },
        "pricing": {"raygen-sim": {"input": PRICE, "output": PRICE}},
        "budget": {"max_cost_usd": args.cap, "reserve_completion_tokens": reserve},
        "output": {"output_dir": str(work)},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "raygen.cli", "run", str(TASKS), "-c", str(path),
            "--limit", str(args.prompts), "--run-name", name]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    stats = json.loads((work / name / "statistics.json").read_text())
    budget = stats["this_invocation"]["budget"]
    return {
        "reserve_tokens": reserve,
        "billed/reserved price": billed / PRICE,
        "exit": done.returncode,
        "spent_usd": budget["spent_usd"],
        "overshoot_usd": budget["overshoot_usd"],
        "bound_usd": budget["excess_usd"],
        "overshoot_%": 100 * budget["overshoot_usd"] / args.cap,
        "in_flight_at_stop": budget["in_flight_at_stop"],
        "max_in_flight": budget["max_in_flight"],
        "kept": stats["counts"]["kept"],
        "cut_sessions": stats["counts"]["failed"].get("budget_reached", 0),
        "wasted_usd": stats["cost"]["waste_usd"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--cap", type=float, default=0.3)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument(
        "--settings", default="256:4,64:4,0:4,256:5,64:5,0:5", help="RESERVE:BILLED_PRICE,..."
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="raygen-budget-") as tmp:
        for i, setting in enumerate(args.settings.split(",")):
            reserve, billed = setting.split(":")
            rows.append(one_run(Path(tmp), f"b{i}", int(reserve), float(billed), args))
            print(json.dumps(rows[-1]), flush=True)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()) + " |")


if __name__ == "__main__":
    main()
