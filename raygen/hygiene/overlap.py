"""Rows of the generation set that also occur in an independent evaluation set, exactly or nearly.

- Exact: the same text after normalisation (case-folded, words only, single spaces), looked up by hash.
- Near: MinHash signatures of word-bigram sets, indexed with locality-sensitive hashing
  (``datasketch.MinHashLSH``, built for a threshold 0.2 lower to miss fewer pairs near it), then the
  best candidate's estimated Jaccard similarity is compared with the threshold. Word bigrams were
  chosen on the shared agent-tasks prompts: a HumanEval prompt with an added instruction line and a
  short shell task with one word changed both score about 0.7 (median), while unrelated prompt pairs
  stay below 0.45; character 5-grams and word trigrams separated them less well.

Only the evaluation set is held in memory (one 128-value signature per row, about 1 KB); the generation
set is streamed through ``match``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from datasketch import MinHash, MinHashLSH

from raygen.errors import InputError

NUM_PERM = 128
"""MinHash permutations: estimates of Jaccard similarity are within about +-0.09 (2 sigma)."""
LSH_MARGIN = 0.2
"""How far below the reporting threshold the LSH index looks for candidates."""
_SEED = 1
_WORD = re.compile(r"\w+")


def normalize(text: str) -> str:
    """Case-folded words joined by single spaces (punctuation and layout do not count)."""
    return " ".join(_WORD.findall(text.casefold()))


def shingles(text: str) -> set[str]:
    """Word bigrams of the normalised text (the single word of a one-word text)."""
    words = normalize(text).split()
    if len(words) < 2:
        return {" ".join(words)} if words else set()
    return {f"{a} {b}" for a, b in itertools.pairwise(words)}


def signature(text: str) -> MinHash:
    """The MinHash signature of a text's shingles."""
    sig = MinHash(num_perm=NUM_PERM, seed=_SEED)
    sig.update_batch([s.encode("utf-8") for s in shingles(text)])
    return sig


def _digest(text: str) -> bytes:
    return hashlib.blake2b(normalize(text).encode("utf-8"), digest_size=16).digest()


@dataclass(frozen=True)
class OverlapMatch:
    """A prompt found in the evaluation set: ``kind`` is ``exact`` or ``near``."""

    kind: str
    eval_line: int
    similarity: float


def iter_eval_texts(path: Path, text_field: str) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of an evaluation set: JSONL objects (``text_field``), JSON strings, or plain
    text lines; blank lines and objects without a string ``text_field`` are skipped."""
    try:
        handle = path.open("r", encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read eval set {path}: {exc.strerror or exc}") from exc
    with handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                yield line_no, line.rstrip("\n")
                continue
            if isinstance(value, dict):
                value = value.get(text_field)
            if isinstance(value, str) and value.strip():
                yield line_no, value


class EvalIndex:
    """The evaluation set, indexed for exact and near-duplicate lookups."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.rows = 0
        self._exact: dict[bytes, int] = {}
        self._signatures: dict[int, MinHash] = {}
        # The index is built for a lower threshold than the one reported: LSH finds pairs near its
        # threshold only about half the time, and the estimate below decides anyway.
        self._lsh = MinHashLSH(threshold=max(0.1, threshold - LSH_MARGIN), num_perm=NUM_PERM)

    @classmethod
    def from_file(cls, path: str | Path, text_field: str = "prompt", threshold: float = 0.6) -> EvalIndex:
        """Read and index an evaluation set (see ``iter_eval_texts`` for the formats)."""
        index = cls(threshold)
        for line, text in iter_eval_texts(Path(path), text_field):
            index.add(line, text)
        return index

    def add(self, line: int, text: str) -> None:
        """Index one evaluation row (identified by its line)."""
        self.rows += 1
        self._exact.setdefault(_digest(text), line)
        if line not in self._signatures:
            sig = signature(text)
            self._signatures[line] = sig
            self._lsh.insert(line, sig)

    def match(self, text: str) -> OverlapMatch | None:
        """The evaluation row ``text`` duplicates, exact first, else the most similar near duplicate at or
        above the threshold; None if there is none."""
        exact = self._exact.get(_digest(text))
        if exact is not None:
            return OverlapMatch("exact", exact, 1.0)
        sig = signature(text)
        best: OverlapMatch | None = None
        for line in self._lsh.query(sig):
            similarity = sig.jaccard(self._signatures[line])
            if similarity >= self.threshold and (
                best is None or (similarity, -line) > (best.similarity, -best.eval_line)
            ):
                best = OverlapMatch("near", line, round(similarity, 3))
        return best
