"""Why raygen's records do not travel as Ray Data's output: an async ``map_batches`` UDF yields each row
as it finishes, yet the driver's ``iter_batches`` gets them only when the task's slowest row is done.

One Ray task of 8 rows (batch_size 2) on one actor: row 0 takes 20 s, the others 0.5 s. Prints one JSON
line: when each row finished and when it reached the driver (seconds from the start). Run by
``bench/durability.py`` in its own process (its own local Ray)."""

from __future__ import annotations

import asyncio
import json
import time

import ray
import ray.data

STRAGGLER_S = 20.0


class Rows:
    async def __call__(self, batch):
        async def one(x: int) -> int:
            await asyncio.sleep(STRAGGLER_S if x == 0 else 0.5)
            return x

        for done in asyncio.as_completed([one(int(x)) for x in batch["id"]]):
            x = await done
            yield {"id": [x], "done_at": [time.time()]}


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    t0 = time.time()
    ds = ray.data.range(8, override_num_blocks=1).map_batches(
        Rows, batch_size=2, compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.5
    )
    rows = []
    for batch in ds.iter_batches(batch_size=None):
        now = time.time()
        rows += [
            {"id": int(i), "done": d - t0, "delivered": now - t0}
            for i, d in zip(batch["id"], batch["done_at"], strict=True)
        ]
    ray.shutdown()
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
