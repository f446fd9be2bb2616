"""A pass's pending chunk files: the samples it runs, one JSON line each (what Ray reads), and beside
each chunk a ``.keys`` file with one ``sample_key<TAB>attempt`` line per sample, in the same order.

After a pass the driver asks which samples never came back and which have an attempt left. Both are
usually none, and parsing every sample to learn that cost ~9 s of CPU at a million samples (two reads of
~4.5 µs a line), most of the gap between the last session and the merge's start. With the keys beside
them it reads short lines and parses only the samples it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO

from raygen.input.rows import Sample

KEYS_SUFFIX = ".keys"


def keys_path(chunk: Path) -> Path:
    return chunk.with_suffix(KEYS_SUFFIX)


class PendingChunk:
    """Writes one chunk file and its keys file together (a ``with`` block closes both)."""

    def __init__(self, path: Path):
        self.path = path
        self._samples: TextIO = path.open("w", encoding="utf-8")
        self._keys: TextIO = keys_path(path).open("w", encoding="utf-8")

    def write(self, sample: Sample) -> None:
        self._samples.write(sample.model_dump_json() + "\n")
        self._keys.write(f"{sample.sample_key}\t{sample.attempt}\n")

    def close(self) -> None:
        self._samples.close()
        self._keys.close()

    def __enter__(self) -> PendingChunk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_chunks(folder: Path, name: str) -> None:
    """Delete the chunk files ``<name>-*.jsonl`` in ``folder`` and their keys files."""
    for old in [*folder.glob(f"{name}-*.jsonl"), *folder.glob(f"{name}-*{KEYS_SUFFIX}")]:
        old.unlink()


def select_samples(chunks: Iterable[Path], wanted: Callable[[str, int], bool]) -> Iterator[Sample]:
    """The samples of ``chunks`` for which ``wanted(sample_key, attempt)`` is true, in file order; only
    those are parsed."""
    for chunk in chunks:
        with keys_path(chunk).open(encoding="utf-8") as keys:
            picked = {
                index
                for index, line in enumerate(keys)
                if wanted(*_key_and_attempt(line))  # every sample of a pass has its keys line
            }
        if not picked:
            continue
        with chunk.open(encoding="utf-8") as samples:
            for index, line in enumerate(samples):
                if index in picked:
                    yield Sample.model_validate_json(line)


def _key_and_attempt(line: str) -> tuple[str, int]:
    key, _, attempt = line.rstrip("\n").rpartition("\t")
    return key, int(attempt)
