"""ShardWriter (size/age flushes, atomic files, no overwrite) and the tolerant shard reader."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from raygen.output import shards
from raygen.output.shards import (
    RecordReader,
    RollingShardWriter,
    ShardScanStats,
    ShardWriter,
    iter_shard_records,
    list_shards,
    read_line,
)


def rec(i: int, **extra) -> str:
    return json.dumps({"sample_key": f"k{i}", "prompt_index": i, "text": f"héllo {i} 🚀", **extra})


def all_records(run_dir: Path) -> list[dict]:
    return [r for r, _ in iter_shard_records(run_dir)]


def test_flushes_every_max_records_to_new_files(tmp_path):
    writer = ShardWriter(tmp_path, "node-1-abcd", max_records=2, flush_s=3600)
    for i in range(5):
        writer.add(rec(i))
    assert len(writer.paths) == 2 and writer.pending == 1
    writer.close()
    names = sorted(p.name for p in (tmp_path / "shards").iterdir())
    assert names == ["node-1-abcd-000000.jsonl", "node-1-abcd-000001.jsonl", "node-1-abcd-000002.jsonl"]
    assert sorted(r["prompt_index"] for r in all_records(tmp_path)) == list(range(5))
    with pytest.raises(RuntimeError):
        writer.add(rec(9))


def test_flushes_when_the_oldest_record_is_older_than_flush_s(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(shards.time, "monotonic", lambda: clock[0])
    writer = ShardWriter(tmp_path, "w", max_records=1000, flush_s=30)
    writer.add(rec(0))
    clock[0] += 29
    writer.add(rec(1))
    assert writer.paths == [] and not writer.due
    clock[0] += 1  # 30 s after the FIRST buffered record
    assert writer.due
    writer.add(rec(2))
    assert len(writer.paths) == 1 and writer.pending == 0
    assert [r["prompt_index"] for r in all_records(tmp_path)] == [0, 1, 2]


def test_never_overwrites_an_existing_shard(tmp_path):
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    existing = shard_dir / "w-000000.jsonl"
    existing.write_text(rec(0) + "\n")
    writer = ShardWriter(tmp_path, "w", max_records=10, flush_s=3600)
    writer.add(rec(1))
    path = writer.flush()
    assert path is not None and path.name == "w-000001.jsonl"
    assert existing.read_text() == rec(0) + "\n"


def test_failed_write_leaves_no_final_file_and_keeps_the_records(tmp_path, monkeypatch):
    writer = ShardWriter(tmp_path, "w", max_records=10, flush_s=3600)
    writer.add(rec(0))
    writer.add(rec(1))

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(shards.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        writer.flush()
    assert list((tmp_path / "shards").iterdir()) == []  # neither a final nor a temp file
    assert writer.pending == 2
    monkeypatch.undo()
    writer.close()
    assert [r["prompt_index"] for r in all_records(tmp_path)] == [0, 1]


async def test_async_writers_lose_and_duplicate_nothing(tmp_path):
    writer = ShardWriter(tmp_path, "async-w", max_records=7, flush_s=3600)

    async def produce(start: int) -> None:
        for i in range(start, start + 25):
            await writer.aadd(rec(i))
            await asyncio.sleep(0)

    await asyncio.gather(*(produce(n * 100) for n in range(4)))
    await writer.aclose()
    got = sorted(r["prompt_index"] for r in all_records(tmp_path))
    assert got == sorted(n * 100 + i for n in range(4) for i in range(25))
    assert len(writer.paths) == len(list((tmp_path / "shards").glob("*.jsonl"))) >= 100 // 7


def test_rejects_bad_writer_ids_and_multiline_records(tmp_path):
    for bad in ("a/b", "", "../x", ".hidden"):
        with pytest.raises(ValueError):
            ShardWriter(tmp_path, bad, max_records=1, flush_s=1)
    writer = ShardWriter(tmp_path, "w", max_records=10, flush_s=3600)
    with pytest.raises(ValueError):
        writer.add('{"a":\n1}')


def test_reader_tolerates_garbage_and_ignores_temp_files(tmp_path):
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    (shard_dir / "a-000000.jsonl").write_bytes(
        (rec(0) + "\n").encode()
        + b"{not json\n"
        + b"\n"
        + b"[1, 2, 3]\n"
        + b"\xff\xfe garbage bytes\n"
        + (rec(1) + "\r\n").encode()
        + rec(2).encode()  # last line without a newline
    )
    (shard_dir / "b-000000.jsonl.tmp").write_text('{"sample_key": "torn", "prompt_in')
    (shard_dir / "notes.txt").write_text(rec(99) + "\n")
    stats = ShardScanStats()
    got = list(iter_shard_records(tmp_path, stats))
    assert [r["prompt_index"] for r, _ in got] == [0, 1, 2]
    assert (stats.files, stats.records, stats.unparseable_lines) == (1, 3, 3)
    for record, pos in got:  # positions re-read the same records
        assert json.loads(read_line(pos)) == record


def test_reader_of_missing_shards_dir_yields_nothing(tmp_path):
    assert list(iter_shard_records(tmp_path)) == []


def test_list_shards_orders_by_mtime_then_name(tmp_path):
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    for name, mtime in (("z-000000.jsonl", 1), ("a-000000.jsonl", 2), ("m-000000.jsonl", 2)):
        (shard_dir / name).write_text(rec(0) + "\n")
        os.utime(shard_dir / name, ns=(mtime * 10**9, mtime * 10**9))
    assert [p.name for p in list_shards(tmp_path)] == ["z-000000.jsonl", "a-000000.jsonl", "m-000000.jsonl"]


def test_record_reader_reads_any_order_with_few_open_files(tmp_path):
    writers = [ShardWriter(tmp_path, f"w{n}", max_records=3, flush_s=3600) for n in range(3)]
    for i in range(30):
        writers[i % 3].add(rec(i, pad="x" * i))
    for w in writers:
        w.close()
    positions = {r["prompt_index"]: pos for r, pos in iter_shard_records(tmp_path)}
    with RecordReader(max_open=2) as reader:
        for i in reversed(range(30)):
            assert reader.read(positions[i])["pad"] == "x" * i


def test_jsonl_safe_escapes_line_separators_and_stays_equal_json():
    import json

    from raygen.output.shards import jsonl_safe

    value = {"prompt": "a\u2028b\u2029c\\u2028"}
    text = jsonl_safe(json.dumps(value, ensure_ascii=False))
    assert "\u2028" not in text and "\u2029" not in text
    assert len(text.splitlines()) == 1 and json.loads(text) == value


def test_rolling_writer_makes_each_flush_durable_in_one_growing_file(tmp_path):
    writer = RollingShardWriter(tmp_path, "driver-r", max_records=3, flush_s=3600)
    seen = []
    for i in range(7):
        writer.add(rec(i))
        writer.flush()  # what the driver's sink does once a record is due
        seen.append(sorted(p.name for p in (tmp_path / "shards").iterdir()))
        # Every flushed record is in a complete, final shard at once.
        assert sorted(r["prompt_index"] for r in all_records(tmp_path)) == list(range(i + 1))
    # The open shard is rewritten until it holds max_records, then the next one starts.
    assert seen[0] == seen[1] == seen[2] == ["driver-r-000000.jsonl"]
    assert seen[3] == seen[5] == ["driver-r-000000.jsonl", "driver-r-000001.jsonl"]
    assert len(seen[6]) == 3 and len(writer.paths) == 3
    assert not [p for p in (tmp_path / "shards").iterdir() if p.name.endswith(".tmp")]


def test_rolling_writer_keeps_unwritten_records_once_when_a_rewrite_fails(tmp_path, monkeypatch):
    writer = RollingShardWriter(tmp_path, "driver-f", max_records=10, flush_s=3600)
    writer.add(rec(0))
    writer.flush()
    writer.add(rec(1))
    put = writer.run_dir.storage.put

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.run_dir.storage, "put", full_disk)
    with pytest.raises(OSError):
        writer.flush()
    assert writer.pending == 1  # the new record only: record 0 is on disk already
    monkeypatch.setattr(writer.run_dir.storage, "put", put)
    writer.close()
    assert sorted(r["prompt_index"] for r in all_records(tmp_path)) == [0, 1]
