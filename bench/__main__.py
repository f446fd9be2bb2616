"""``python -m bench [--quick] [--only NAME,...] [--work DIR]``: run the scenarios, print one table.

Scenarios (``--only`` takes these names, or ``governor`` for the first two):
  limits      a 30-s job against every way providers count (token bucket, fixed and sliding windows of
              1/10/60 s; rpm and tpm), with nothing configured and with the limit given: utilization, 429s
  limits3     the same on a 3-node local Ray cluster (the budget must stay global)
  limits-off  only the rows of ``limits`` with the simulator's rate-limit headers off (429 + Retry-After)
  throughput  sessions/s and CPU per session: raygen vs one asyncio process vs a process pool
  cpu         the same, raygen and the asyncio runner only, one round: CPU per session both ways of counting
  convlen     CPU per model call against conversation length (2-50 turns, 1 and 20 kB tool outputs):
              raygen's own work vs encoding the request, no Ray
  startup     time from launching ``raygen run`` (the CLI) to its first model request, vs the asyncio
              runner; where raygen's start-up goes (imports, Ray start, actors)
  scale       2,000 concurrent sessions at 30 s model latency: % of ideal, peak memory
  sandboxes   start / exec / stop latency per environment backend; Docker sessions/s at 16 and 64
  fleet       Docker at fleet scale, side by side: raygen vs the thinnest Docker runner at 16 and 64 in
              flight, median exec (channel vs docker exec), median sandbox wait with a warm pool
  verify      what a hidden check adds per session (wall s, CPU s): fresh and same mode, local and Docker
  mcp         MCP tool servers: added cost per call vs terminal, a per-session server's start on local and
              Docker, sessions/s at 64 in flight with and without a server per session (no Ray)
  proxy       the agent harnesses' model proxy: its CPU per call and the latency it and the in-sandbox
              forwarder add, short and 1-MB requests, streaming and not (docs/agents.md)
  hermes      Hermes Agent run by raygen (--agent hermes) vs Hermes's own batch_runner.py, 16 sessions in
              flight each on the same prompts and simulator: sessions/s and CPU per session
  ceiling     N prompts (--prompts, 20,000) at zero model and environment cost: time per phase (checks,
              Ray start, sessions, merge), sessions/s, CPU and peak RSS of the driver, the control actor
              and the governor (the one-per-run pieces)
  ceiling_resume  the ceiling run (--prompts, 200,000) stopped by SIGTERM at about half, then --resume:
              the drain's time, what each invocation ran, every key in the output exactly once
  durability  SIGKILL of an actor and of the driver's process group at random moments, with stragglers,
              then --resume: sessions re-sent / sessions in flight at the kill, from the simulator's log
Raw figures go to WORK/results.json. Run it in a loopback-only namespace (``make bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from bench.common import Context, Row

GROUPS = {"governor": ["limits", "limits3"]}
PARTS = ("limits-off", "cpu")
ORDER = [
    "limits",
    "limits-off",
    "limits3",
    "throughput",
    "cpu",
    "convlen",
    "startup",
    "scale",
    "sandboxes",
    "fleet",
    "verify",
    "mcp",
    "proxy",
    "hermes",
    "ceiling",
    "ceiling_resume",
    "durability",
]


def _scenarios() -> dict[str, Callable[[Context], list[Row]]]:
    from bench import (
        ceiling,
        ceiling_resume,
        convlen,
        docker_fleet,
        durability,
        governor,
        hermes_runs,
        mcp,
        proxy,
        sandboxes,
        scale,
        startup,
        throughput,
        verify_cost,
    )

    return {
        "limits": governor.limits,
        "limits3": governor.limits_cluster,
        "limits-off": governor.limits_headers_off,
        "throughput": throughput.run,
        "cpu": throughput.cpu,
        "convlen": convlen.run,
        "startup": startup.run,
        "scale": scale.run,
        "sandboxes": sandboxes.run,
        "fleet": docker_fleet.run,
        "verify": verify_cost.run,
        "mcp": mcp.run,
        "proxy": proxy.run,
        "hermes": hermes_runs.run,
        "ceiling": ceiling.run,
        "ceiling_resume": ceiling_resume.run,
        "durability": durability.run,
    }


def _split(names: str | None) -> list[str] | None:
    return [n.strip() for n in names.split(",")] if names else None


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _selected(only: str | None) -> list[str]:
    if not only:  # the parts-only scenarios are inside limits and throughput
        return [n for n in ORDER if n not in PARTS]
    names: list[str] = []
    for part in only.split(","):
        part = part.strip()
        for name in GROUPS.get(part, [part]):
            if name not in ORDER:
                raise SystemExit(f"unknown scenario {name!r}; choose from {', '.join(ORDER + list(GROUPS))}")
            if name not in names:
                names.append(name)
    return sorted(names, key=ORDER.index)


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def format_table(rows: list[Row]) -> str:
    """A Markdown table (reads fine in a terminal and pastes into README.md as is)."""
    head = ["scenario", "figure", "measured", "target", "met", "notes"]
    body = [
        [r.scenario, r.figure, r.value, r.target, {True: "yes", False: "**no**", None: ""}[r.met], r.note]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in body
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about 4 minutes)")
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--kinds", help="rate-limit scenarios only: ways of counting, e.g. 'sliding 10 s'")
    parser.add_argument("--prompts", type=int, help="prompts of the ceiling scenario [20000]")
    parser.add_argument("--work", type=Path, help="scratch folder [/tmp/raygen-bench/<timestamp>]")
    args = parser.parse_args(argv)
    names = _selected(args.only)
    work = args.work or Path("/tmp/raygen-bench") / datetime.now().strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    # 2,000 sessions hold thousands of sockets; children inherit the raised limit.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ctx = Context(work=work, quick=args.quick, kinds=_split(args.kinds), prompts=args.prompts, log=_log)
    scenarios = _scenarios()
    started = time.time()
    load_before = _load()
    ctx.log(f"{'quick' if args.quick else 'full'} run of {', '.join(names)} in {work}; {load_before}")
    rows: list[Row] = []
    try:
        for name in names:
            if not name.startswith("limits"):
                ctx.close()  # an idle Ray cluster costs CPU and memory the next scenario would measure
            t0 = time.time()
            ctx.log(f"{name} ...")
            try:
                got = scenarios[name](ctx)
            except Exception as exc:  # one broken scenario must not hide the others' figures
                traceback.print_exc()
                got = [Row(name, "error", type(exc).__name__, met=False, note=str(exc).splitlines()[0][:160])]
            rows += got
            ctx.log(f"{name} done in {time.time() - t0:.0f} s")
            print(format_table(got), file=sys.stderr, flush=True)
    finally:
        ctx.close()
    elapsed = time.time() - started
    load_after = _load()
    table = format_table(rows)
    print(table)
    mode = "quick" if args.quick else "full"
    print(f"\n{mode} run, {elapsed / 60:.1f} min; before: {load_before}; after: {load_after}")
    (work / "results.json").write_text(
        json.dumps(
            {
                "rows": [asdict(r) for r in rows],
                "figures": ctx.results,
                "elapsed_s": elapsed,
                "load_before": load_before,
                "load_after": load_after,
                "quick": args.quick,
            },
            indent=1,
            default=str,
        )
    )
    (work / "table.md").write_text(table + "\n")
    return 1 if any(r.figure == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
