"""raygen report: one offline HTML file, hostile text embedded safely, numbers that add up, a bounded
viewer sample; plus the pieces it is built from (histograms, stratified sampler, JSON embedding)."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import NASTY, NASTY_ID, build_run
from typer.testing import CliRunner

from raygen.cli.main import app
from raygen.errors import ConfigError
from raygen.eval.profile import TOKEN_EDGES, Histogram, RunProfile, turn_edges
from raygen.eval.report import build_report, write_report
from raygen.eval.runread import iter_run_records, load_run
from raygen.eval.strata import StratifiedSampler
from raygen.eval.viewer import embed_json, viewer_entry

DATA_BLOCK = re.compile(r'<script type="application/json" id="rg-data">(.*?)</script>', re.DOTALL)


def embedded(html: str) -> dict:
    """The viewer data as the browser would see it: up to the FIRST ``</script>``."""
    match = DATA_BLOCK.search(html)
    assert match, "no data block"
    return json.loads(match.group(1))


@pytest.fixture(scope="module")
def small_html(small_run: Path) -> str:
    return build_report(small_run)[0]


def test_page_loads_nothing_from_anywhere(small_html: str):
    assert not re.search(
        r"""<(script|img|iframe|link|source|video|audio|embed|object)\b[^>]*\b(src|href)=""", small_html, re.I
    )
    assert not re.search(r"""url\(|@import|https?://[^"'<\s]*\.(js|css|png|svg|woff2?)""", small_html, re.I)
    # Only the SVG namespace is an http URL in attribute position, and it is an identifier, not a fetch.
    attr_urls = set(re.findall(r"""=\s*["'](https?://[^"']*)""", small_html))
    assert attr_urls <= {"http://www.w3.org/2000/svg"}


def test_hostile_prompt_cannot_break_out_of_the_data_block(small_html: str):
    template = (Path(__file__).parents[2] / "raygen/eval/report_template.html").read_text()
    # The prompt holds </script><script>...: no tag of it may appear in the page as markup.
    assert small_html.count("<script") == template.count("<script")
    assert "</script><script>window.__pwned" not in small_html
    data = embedded(small_html)
    nasty = next(t for t in data["trajectories"] if t["id"] == NASTY_ID)
    user = next(turn for turn in nasty["turns"] if turn["role"] == "user")
    assert user["text"] == NASTY


def test_embed_json_round_trips_and_hides_markup():
    value = {"t": "</script><!-- x --> & <b>\u2028\u2029 </think>", "n": [1, 2.5, None, True]}
    text = embed_json(value)
    assert not set("<>&") & set(text)
    assert "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == value


def test_histograms_count_each_session_once_and_agree_with_statistics(small_run: Path):
    info = load_run(small_run)
    profile = RunProfile(max_turns=10)
    for item in iter_run_records(small_run):
        profile.add(item.record)
    doc = profile.to_dict()
    per_cat = info.statistics["per_category"]
    assert set(doc["per_category"]) == set(per_cat)
    for cat, hists in doc["per_category"].items():
        stats = per_cat[cat]
        total = stats["counts"]["total"]
        for hist in hists.values():
            assert sum(hist["counts"]) == hist["n"] == total
        # Two independent sources: the merge's sums and this pass over the output files.
        assert hists["tokens"]["mean"] * total == pytest.approx(stats["tokens"]["total"])
        assert hists["turns"]["mean"] == pytest.approx(stats["api_calls"]["mean_per_session"])
        assert hists["duration_s"]["mean"] == pytest.approx(stats["duration_s"]["mean"])
    assert doc["overall"]["tokens"]["n"] == info.statistics["counts"]["total"]


def test_histogram_bins_are_half_open_and_the_last_is_open():
    tokens = Histogram(TOKEN_EDGES)
    for value in (0, 999, 1000, 1999, 2000, 5_000_000):
        tokens.add(value)
    assert tokens.counts[:3] == [2, 2, 1] and tokens.counts[-1] == 1
    turns = Histogram(turn_edges(10), unit="n")
    for value in (0, 1, 10, 11):
        turns.add(value)
    assert turns.counts[0] == 1 and turns.counts[1] == 1 and turns.counts[-1] == 2
    assert turns.labels()[-1] == "10+" and turns.labels()[3] == "3"


def test_sampler_ignores_offer_order_and_shares_fairly():
    items = [(("a" if i < 5 else "b" if i < 100 else "c"), f"k{i}") for i in range(300)]
    samples = []
    for seed_order in (1, 2):
        shuffled = items[:]
        random.Random(seed_order).shuffle(shuffled)
        sampler = StratifiedSampler(per_stratum=40, seed=7)
        for stratum, key in shuffled:
            sampler.offer(stratum, key, key)
        samples.append(sampler.strata())
    assert samples[0] == samples[1]
    taken = sampler.take(45)
    assert {s: len(v) for s, v in taken.items()} == {"a": 5, "b": 20, "c": 20}
    assert all(set(v) <= set(samples[0][s]) for s, v in taken.items())
    other = StratifiedSampler(per_stratum=40, seed=8)
    for stratum, key in items:
        other.offer(stratum, key, key)
    assert other.strata()["c"] != samples[0]["c"]


def test_viewer_sample_covers_every_category_and_outcome(small_run: Path):
    html, scanned, count = build_report(small_run, sample_size=12, seed=3)
    data = embedded(html)
    strata = Counter((t["category"], t["outcome"]) for t in data["trajectories"])
    expected = {(c, o) for c in ("bash", "sql", "python", "edge") for o in ("kept", "rejected", "failed")}
    assert set(strata) == expected and count == 12 and scanned == 121
    again = embedded(build_report(small_run, sample_size=12, seed=3)[0])
    assert [t["key"] for t in again["trajectories"]] == [t["key"] for t in data["trajectories"]]


def test_big_records_are_cut_to_the_budget(make_run):
    run = make_run("huge", 30, nasty=False)
    # Blow up every record's tool output in place (files keep their layout: one record per line).
    for path in sorted(run.glob("data/*.jsonl")) + sorted(run.glob("rejected/*.jsonl")):
        lines = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            for message in record["messages"]:
                if message["role"] == "tool":
                    message["content"] = json.dumps({"output": "x" * 200_000, "exit_code": 0})
            lines.append(json.dumps(record))
        path.write_text("\n".join(lines) + "\n")
    html, _, count = build_report(run, viewer_budget=200_000)
    data_bytes = len(DATA_BLOCK.search(html).group(1).encode())
    assert count == 30
    assert data_bytes < 200_000 * 1.2
    assert "characters cut" in html


def test_viewer_entry_keeps_short_records_whole():
    record = {
        "id": "r",
        "sample_key": "k",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "<think>plan</think>ok",
                "tool_calls": [
                    {"id": "c", "function": {"name": "terminal", "arguments": '{"command": "ls -l\\nwc"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c", "name": "terminal", "content": "not json"},
        ],
    }
    entry = viewer_entry(record, "kept", None, budget=10_000)
    user, assistant, tool = entry["turns"]
    assert user["text"] == "hi"
    assert assistant["reasoning"] == "plan" and assistant["text"] == "ok"
    assert assistant["calls"][0]["fields"] == {"command": "ls -l\nwc"}
    assert tool == {"role": "tool", "call_id": "c", "name": "terminal", "text": "not json"}


def test_stale_statistics_are_flagged(make_run):
    run = make_run("stale", 24, nasty=False)
    stats = json.loads((run / "statistics.json").read_text())
    stats["counts"]["kept"] += 5
    (run / "statistics.json").write_text(json.dumps(stats))
    html, _, _ = build_report(run)
    assert "re-run `raygen merge`" in html


def test_unmerged_or_foreign_folders_are_refused(tmp_path: Path, small_run: Path):
    with pytest.raises(ConfigError, match="not a raygen run folder"):
        build_report(tmp_path)
    half = tmp_path / "half"
    half.mkdir()
    (half / "manifest.json").write_text((small_run / "manifest.json").read_text())
    with pytest.raises(ConfigError, match="raygen merge"):
        build_report(half)


def test_cli_writes_the_report(small_run: Path, tmp_path: Path):
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["report", str(small_run), "--out", str(out), "--sample", "20"])
    assert result.exit_code == 0, result.output
    assert len(embedded(out.read_text())["trajectories"]) == 20
    bad = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert bad.exit_code == 2 and "not a raygen run folder" in bad.output


@pytest.mark.slow
def test_twenty_thousand_sessions_stay_small(tmp_path: Path, capsys):
    """~30 s to build the run (merge), a few s for the report; the timing is printed, not asserted."""
    run = build_run(tmp_path, "big", 20_000)
    started = time.perf_counter()
    result = write_report(run)
    with capsys.disabled():
        print(
            f"\nreport of {result.records_scanned:,} sessions: {time.perf_counter() - started:.1f} s, "
            f"{result.size_bytes / 1e6:.2f} MB, {result.trajectories_embedded} embedded"
        )
    assert result.records_scanned == 20_001
    assert result.trajectories_embedded == 500
    assert result.size_bytes < 5_000_000


def test_empty_and_uncategorized_runs_still_render(make_run):
    empty = make_run("empty", 0, nasty=False)
    html, scanned, count = build_report(empty)
    assert scanned == 0 and count == 0 and embedded(html)["trajectories"] == []
    plain = make_run("plain", 12, nasty=False, categories=(None,))
    data = embedded(build_report(plain)[0])
    assert {t["category"] for t in data["trajectories"]} == {"(none)"}
