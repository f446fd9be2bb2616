"""The two runners raygen is compared with, each the smallest honest version of its design:

- ``asyncio``: one process, ``openai.AsyncOpenAI`` (the SDK's default transport), N sessions at once on
  one event loop under a semaphore, no Ray;
- ``pool``: a ``multiprocessing.Pool`` of N processes, one synchronous session (``openai.OpenAI``) per
  process at a time: the design of a single-machine reference batch runner.

Both run the same agent loop as raygen against the same simulator: the model is offered raygen's own
``terminal`` tool schema, each tool call runs as ``bash -c`` in a fresh per-session working directory
(removed afterwards), its output goes back as a tool message, until the model answers without a tool
call. Run as ``python -m bench.baselines {asyncio|pool} --base-url URL --dataset FILE --concurrency N
--out FILE``; the output is JSON with every session's start and end time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai

from raygen.tools.terminal import TerminalTool

TOOLS = [TerminalTool().schema()]
MODEL = "raygen-sim"
MAX_TURNS = 10
COMMAND_TIMEOUT_S = 60.0
OUTPUT_MAX_CHARS = 16_000


def _tool_message(call_id: str, output: str, code: int) -> dict[str, Any]:
    payload = {"output": output[-OUTPUT_MAX_CHARS:], "exit_code": code}
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(payload)}


def _command(arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return ""
    return str(args.get("command", "")) if isinstance(args, dict) else ""


# ------------------------------------------------------------------------------------------ asyncio


async def _exec_async(command: str, cwd: str) -> tuple[str, int]:
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return "timed out", 124
    return out.decode("utf-8", "replace"), proc.returncode or 0


async def session_async(client: openai.AsyncOpenAI, prompt: str) -> bool:
    """One agent session; True if the model finished within MAX_TURNS."""
    workdir = tempfile.mkdtemp(prefix="bench-async-")
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        for _ in range(MAX_TURNS):
            resp = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
            message = resp.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return True
            for call in message.tool_calls:
                output, code = await _exec_async(_command(call.function.arguments), workdir)
                messages.append(_tool_message(call.id, output, code))
        return False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def async_client(base_url: str, max_connections: int, keepalive: int) -> openai.AsyncOpenAI:
    """The SDK's default async client against the simulator, with the pool sizes given."""
    limits = type(openai.DEFAULT_CONNECTION_LIMITS)(
        max_connections=max_connections, max_keepalive_connections=keepalive
    )
    return openai.AsyncOpenAI(
        api_key="sim",
        base_url=base_url,
        max_retries=3,
        timeout=600,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=600),
    )


async def drive(
    prompts: list[str], concurrency: int, session: Callable[[str], Awaitable[bool]]
) -> dict[str, Any]:
    """Run ``session(prompt)`` for every prompt, ``concurrency`` at once: each start and end time and how
    many sessions failed (returned False or raised)."""
    slots = asyncio.Semaphore(concurrency)
    starts: list[float] = []
    ends: list[float] = []
    failed = 0

    async def one(prompt: str) -> None:
        nonlocal failed
        async with slots:
            starts.append(time.time())
            try:
                ok = await session(prompt)
            except Exception:
                ok = False
            failed += not ok
            ends.append(time.time())

    await asyncio.gather(*(one(p) for p in prompts))
    return {"starts": starts, "ends": ends, "failed": failed}


async def run_asyncio(base_url: str, prompts: list[str], concurrency: int) -> dict[str, Any]:
    # The SDK's default client, with room for every session at once (its default pool stops at 1,000
    # connections, which would cap the 10,000-session comparison rather than measure the design).
    client = async_client(base_url, max(concurrency, 1000), max(concurrency, 100))
    result = await drive(prompts, concurrency, lambda prompt: session_async(client, prompt))
    await client.close()
    return result


# ------------------------------------------------------------------------------------------ pool

_CLIENT: openai.OpenAI | None = None


def _init_pool_worker(base_url: str) -> None:
    global _CLIENT
    _CLIENT = openai.OpenAI(api_key="sim", base_url=base_url, max_retries=3, timeout=600)


def session_sync(prompt: str) -> tuple[float, float, bool]:
    """One synchronous agent session in a pool process: (start, end, finished)."""
    start = time.time()
    workdir = tempfile.mkdtemp(prefix="bench-pool-")
    ok = False
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        for _ in range(MAX_TURNS):
            resp = _CLIENT.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
            message = resp.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                ok = True
                break
            for call in message.tool_calls:
                try:
                    done = subprocess.run(
                        ["bash", "-c", _command(call.function.arguments)],
                        cwd=workdir,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        timeout=COMMAND_TIMEOUT_S,
                        start_new_session=True,
                    )
                    output, code = done.stdout.decode("utf-8", "replace"), done.returncode
                except subprocess.TimeoutExpired:
                    output, code = "timed out", 124
                messages.append(_tool_message(call.id, output, code))
    except Exception:
        ok = False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return start, time.time(), ok


def run_pool(base_url: str, prompts: list[str], processes: int) -> dict[str, Any]:
    starts: list[float] = []
    ends: list[float] = []
    failed = 0
    with multiprocessing.Pool(processes, initializer=_init_pool_worker, initargs=(base_url,)) as pool:
        for start, end, ok in pool.imap_unordered(session_sync, prompts, chunksize=1):
            starts.append(start)
            ends.append(end)
            failed += not ok
    return {"starts": starts, "ends": ends, "failed": failed}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines")
    parser.add_argument("runner", choices=("asyncio", "pool"))
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--concurrency", required=True, type=int)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    prompts = [json.loads(line)["prompt"] for line in args.dataset.read_text().splitlines() if line.strip()]
    if args.runner == "asyncio":
        result = asyncio.run(run_asyncio(args.base_url, prompts, args.concurrency))
    else:
        result = run_pool(args.base_url, prompts, args.concurrency)
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
