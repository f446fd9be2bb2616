"""Seeded stratified sampling in one streaming pass, with memory bounded by strata x k.

Each item gets a priority from a keyed hash of (seed, sample key); each stratum keeps the ``k`` items
with the smallest priorities (bottom-k sampling). That is a uniform random sample of the stratum, and
unlike a reservoir fed in file order it depends only on the seed and the keys: the same run sampled
with the same seed gives the same sample even after a re-merge re-cut the files, and taking the first
``j < k`` items of a stratum gives the sample a smaller ``k`` would have given.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Hashable
from typing import Any


def priority(seed: int, key: str) -> int:
    """A 64-bit pseudo-random rank of ``key`` under ``seed``."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, key=str(seed).encode("utf-8")).digest()
    return int.from_bytes(digest, "big")


class StratifiedSampler:
    """Keeps, per stratum, the ``per_stratum`` items of smallest priority; see the module docstring."""

    def __init__(self, per_stratum: int, seed: int = 0):
        if per_stratum < 0:
            raise ValueError("per_stratum must be >= 0")
        self.per_stratum = per_stratum
        self.seed = seed
        self.offered: dict[Hashable, int] = {}
        """Items seen per stratum (the stratum's population)."""
        # Max-heaps (negated priority) so the worst kept item is at the top; the key breaks ties and
        # the sequence number keeps items themselves out of comparisons.
        self._heaps: dict[Hashable, list[tuple[int, str, int, Any]]] = {}
        self._seq = 0

    def offer(self, stratum: Hashable, key: str, item: Any) -> None:
        """Consider one item; ``key`` must identify it stably (e.g. its sample key)."""
        self.offered[stratum] = self.offered.get(stratum, 0) + 1
        if self.per_stratum == 0:
            return
        self._seq += 1
        entry = (-priority(self.seed, key), key, self._seq, item)
        heap = self._heaps.setdefault(stratum, [])
        if len(heap) < self.per_stratum:
            heapq.heappush(heap, entry)
        elif entry[:2] > heap[0][:2]:  # smaller priority than the worst kept one
            heapq.heapreplace(heap, entry)

    def strata(self) -> dict[Hashable, list[Any]]:
        """Every stratum's kept items, best (smallest priority) first."""
        return {
            stratum: [entry[3] for entry in sorted(heap, key=lambda e: (-e[0], e[1]))]
            for stratum, heap in self._heaps.items()
        }

    def take(self, total: int) -> dict[Hashable, list[Any]]:
        """At most ``total`` items shared fairly among the strata: each gets an equal share, and a
        stratum with fewer items than its share leaves the rest to the others."""
        strata = self.strata()
        remaining = max(total, 0)
        taken: dict[Hashable, list[Any]] = {}
        ordered = sorted(strata, key=lambda s: (len(strata[s]), repr(s)))
        for i, stratum in enumerate(ordered):
            quota = -(-remaining // (len(ordered) - i))  # ceil: a remainder goes to the first strata
            taken[stratum] = strata[stratum][:quota]
            remaining -= len(taken[stratum])
        return taken
