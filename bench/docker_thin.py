"""The thinnest Docker agent runner one can write, the yardstick of ``bench.docker_fleet``: one process,
asyncio, ``openai.AsyncOpenAI`` and the ``docker`` SDK. Per session: create and start a container (the
same image, keep-alive, limits and no network as raygen's), one ``docker exec`` per tool call, remove
the container. The model is offered raygen's ``terminal`` tool only; the loop is ``bench.baselines``'s.
No image checks, no labels, no timeouts that kill a command tree, no output caps, no records: what is
left when everything raygen adds is taken away.

``python -m bench.docker_thin --base-url URL --dataset FILE --concurrency N --image IMAGE --out FILE``;
the output is JSON with every session's start and end time, its sandbox wait and its exec times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import openai

from bench.baselines import MAX_TURNS, MODEL, TOOLS, _command, _tool_message, async_client, drive


class Thin:
    def __init__(self, image: str, concurrency: int):
        self.image = image
        self.client = docker.from_env(timeout=300, max_pool_size=4 * concurrency)
        # Its own threads: asyncio's default pool (cores + 4) would cap the containers at once.
        self.pool = ThreadPoolExecutor(4 * concurrency)
        self.waits: list[float] = []
        self.execs: list[float] = []

    async def blocking(self, fn, *args, **kwargs) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    def _start(self) -> Any:
        container = self.client.containers.create(
            self.image,
            ["sleep", "2147483647"],
            init=True,
            network_mode="none",
            working_dir="/work",
            nano_cpus=int(1e9),
            mem_limit="2g",
            pids_limit=1024,
            detach=True,
            labels={"raygen-bench": "thin"},
        )
        container.start()
        return container

    async def session(self, llm: openai.AsyncOpenAI, prompt: str) -> bool:
        began = time.monotonic()
        container = await self.blocking(self._start)
        self.waits.append(time.monotonic() - began)
        try:
            messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
            for _ in range(MAX_TURNS):
                resp = await llm.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
                message = resp.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    return True
                for call in message.tool_calls:
                    began = time.monotonic()
                    code, output = await self.blocking(
                        container.exec_run, ["sh", "-c", _command(call.function.arguments)]
                    )
                    self.execs.append(time.monotonic() - began)
                    messages.append(_tool_message(call.id, output.decode("utf-8", "replace"), code or 0))
            return False
        finally:
            await self.blocking(container.remove, force=True)


async def run(base_url: str, prompts: list[str], concurrency: int, image: str) -> dict[str, Any]:
    thin = Thin(image, concurrency)
    llm = async_client(base_url, max(concurrency, 100), max(concurrency, 100))
    result = await drive(prompts, concurrency, lambda prompt: thin.session(llm, prompt))
    await llm.close()
    thin.pool.shutdown()
    return {**result, "waits": thin.waits, "execs": thin.execs}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.docker_thin")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--concurrency", required=True, type=int)
    parser.add_argument("--image", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    prompts = [json.loads(line)["prompt"] for line in args.dataset.read_text().splitlines() if line.strip()]
    result = asyncio.run(run(args.base_url, prompts, args.concurrency, args.image))
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
