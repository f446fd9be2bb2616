"""The report in a real headless browser (Debian's chromium, driven over the DevTools protocol): no
console errors, no request beyond the file itself, the viewer filters, searches and opens trajectories,
and hostile prompt text shows up as text without running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cdp import Browser, find_chromium
from conftest import NASTY, NASTY_ID

from raygen.eval.report import write_report

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="chromium is not installed (apt-get install chromium; `make system-deps`)"
)


async def settle(browser: Browser) -> None:
    """Let the page's debounced handlers and pending events run."""
    await browser.evaluate("new Promise(r => setTimeout(r, 250))")


@pytest.fixture(scope="module")
def report_file(small_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(small_run, tmp_path_factory.mktemp("html") / "report.html", sample_size=60).path


async def test_report_renders_and_viewer_works(report_file: Path, tmp_path: Path):
    html = report_file.read_text(encoding="utf-8")
    start = html.index('id="rg-data">') + len('id="rg-data">')
    data = json.loads(html[start : html.index("</script>", start)])
    trajectories = data["trajectories"]

    async with Browser(tmp_path / "profile") as browser:
        for domain in ("Page", "Runtime", "Log", "Network"):
            await browser.call(f"{domain}.enable")
        await browser.call("Page.navigate", url=report_file.as_uri())
        await browser.wait_for_event("Page.loadEventFired")
        await settle(browser)

        assert await browser.evaluate("window.raygenViewer.count()") == len(trajectories)
        assert await browser.evaluate("document.querySelectorAll('svg.chart').length") > 10
        # The viewer opens the first trajectory on a click and renders its turns.
        first = await browser.evaluate(
            """(() => { const b = document.querySelector('#rg-list button'); b.click();
                 const d = document.getElementById('rg-detail');
                 return {open: d.dataset.open, turns: d.querySelectorAll('.turn').length,
                         calls: d.querySelectorAll('details.call').length,
                         results: d.querySelectorAll('details.call .result').length}; })()"""
        )
        expected = trajectories[0]
        assert first["open"] == expected["id"]
        tool_calls = sum(len(t.get("calls", [])) for t in expected["turns"])
        assert first["calls"] == tool_calls and first["results"] == tool_calls
        assert first["turns"] == sum(1 for t in expected["turns"] if t["role"] != "tool")

        # Filters: category and outcome select exactly the matching trajectories.
        shown = await browser.evaluate(
            """(() => { const set = (id, v) => { const s = document.getElementById(id); s.value = v;
                   s.dispatchEvent(new Event('change')); };
                 set('rg-f-category', 'sql'); set('rg-f-outcome', 'failed');
                 return window.raygenViewer.shown().length; })()"""
        )
        assert shown == sum(1 for t in trajectories if t["category"] == "sql" and t["outcome"] == "failed")
        assert shown > 0

        # Search finds the hostile prompt; opening it shows the text literally and runs nothing.
        opened = await browser.evaluate(
            """(async () => { for (const id of ['rg-f-category', 'rg-f-outcome']) {
                   const s = document.getElementById(id); s.value = '';
                   s.dispatchEvent(new Event('change')); }
                 const q = document.getElementById('rg-search'); q.value = 'touch INJECTED';
                 q.dispatchEvent(new Event('input'));
                 await new Promise(r => setTimeout(r, 400));
                 const ids = window.raygenViewer.shown();
                 document.querySelector('#rg-list button').click();
                 const d = document.getElementById('rg-detail');
                 return {n: ids.length, open: d.dataset.open,
                         user: d.querySelector('.turn.user pre').textContent,
                         pwned: window.__pwned === undefined ? null : window.__pwned}; })()"""
        )
        assert opened == {"n": 1, "open": NASTY_ID, "user": NASTY, "pwned": None}

        errors = await browser.evaluate("window.__raygenErrors")
        await settle(browser)
        events = list(browser.events)

    assert errors == []
    exceptions = [e for e in events if e["method"] == "Runtime.exceptionThrown"]
    console_errors = [
        e
        for e in events
        if (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    assert exceptions == [] and console_errors == []
    requested = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    assert requested and all(url == report_file.as_uri() for url in requested), requested
