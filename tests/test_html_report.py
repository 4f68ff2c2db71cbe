"""The demo's HTML report in a real headless Chromium (Debian's), and the JSON/CSV exports of its table.

The page must load with no console error and no request for anything outside the file, show the summary, the
chart (inline SVG) and one table row per configuration, at a phone's width and a desktop's; the screenshots
are kept in the test's temporary folder. Every untrusted string is escaped.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.demo import SMOL_BASELINE as BASELINE
from llm_bench.demo import SMOL_CONTEXT, run_demo
from llm_bench.plan import Protocol
from llm_bench.report import load_sets, main_table, rows_of
from llm_bench.report.html import render_html
from llm_bench.results import AliasRecord, ResultSet, RunRecord
from llm_bench.workloads.depth import DEPTH
from llm_bench.workloads.session import SESSION
from tests.short_session import write_short_session

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Two of the demo's presets keep the test short: the baseline and a random drafter (a comparison with a
# verdict).
DEMO_PRESETS = ["smol-plain", "smol-random-draft"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    # and one of the demo's agent presets, for the depth and session workloads, sized down; the page is what is
    # checked here, so a short prompt and a session without tool definitions and with its messages cut further
    # (the whole demo run processed 1,859 prompt tokens here, not 3,040)
    session = write_short_session(folder / "session.json", chars=150, tool_chars=300, tools=False)
    protocol = Protocol(max_tokens=16, runs=3, prompt="Count to five.").with_settings(
        DEPTH, {"depths": (0, 128)}).with_settings(SESSION, {"max_tokens": 4, "session_file": str(session)})
    return run_demo(folder, protocol, lambda line: None, presets=(*DEMO_PRESETS, "smol-agent"))


def browser():
    """Playwright on Debian's Chromium; without them skip and say what is missing, or fail under CI,
    which installs both (./dev test)."""
    missing = ("chromium is not installed (apt-get install chromium; ./dev test installs it)" if CHROMIUM is None
               else None)
    try:
        from playwright import sync_api  # noqa: PLC0415 - optional outside the test extras
    except ImportError:
        missing = missing or "playwright is not installed (pip install '.[test]')"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing + "; CI must run the browser tests")
        pytest.skip(missing)
    return sync_api.sync_playwright()


def open_page(playwright, path: Path, width: int, height: int):
    chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = chromium.new_page(viewport={"width": width, "height": height})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: problems.append(f"request {r.url}") if not r.url.startswith("file://") else None)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return chromium, page, problems


@pytest.mark.parametrize(("name", "width", "height"), [("phone", 390, 844), ("desktop", 1280, 900)])
def test_demo_report_opens_in_headless_chromium(demo, tmp_path, name, width, height):
    assert demo.html.exists()
    with browser() as playwright:
        chromium, page, problems = open_page(playwright, demo.html, width, height)
        try:
            assert problems == []
            rows = page.locator("#main-table tbody tr")
            assert rows.count() == len(DEMO_PRESETS)
            names = sorted(rows.nth(i).locator("td").first.inner_text() for i in range(rows.count()))
            assert names == DEMO_PRESETS
            assert page.locator("#summary li").first.inner_text().startswith("fastest on llama-cpp:")
            chart = page.locator("#chart svg")
            assert chart.count() == 1 and chart.bounding_box()["width"] > 300
            # speed at depth (a row per depth, and its chart) and the replayed session (a summary row, its turns)
            assert page.locator("#depth tbody tr").count() == 2
            assert page.locator("#depth-chart svg").bounding_box()["width"] > 300
            assert page.locator("#session tbody tr").count() == 1
            assert page.locator("#session_turns tbody tr").count() >= 2
            # Wide tables scroll inside their own box; the page itself never scrolls sideways.
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            assert page.locator("#provenance").inner_text().count("demo-cpu") >= 1
            shot = tmp_path / f"demo-report-{name}.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20_000
            pdf = tmp_path / "demo-report.pdf"
            if name == "desktop":  # print CSS: the page prints (Chromium's print-to-PDF), tables within an A4 width
                page.pdf(path=str(pdf))
                assert pdf.read_bytes()[:5] == b"%PDF-"
                page.set_viewport_size({"width": 794, "height": 1123})
                page.emulate_media(media="print")
                assert page.evaluate("document.documentElement.scrollWidth") <= 794
        finally:
            chromium.close()


def test_untrusted_text_is_escaped(tmp_path):
    evil = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    record = AliasRecord(alias=evil, runs=[RunRecord(decode_tps=10.0, finish_reason="length")],
                         errors=[f"server said {evil}"], preset_args=["llama-server", "--spec-type", evil])
    result_set = ResultSet({"format": "llm-bench/1", "label": evil, "host": evil, "protocol": {"prompt_name": evil}},
                           [record])
    page = render_html([result_set], title=evil)
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    path = tmp_path / "evil.html"
    path.write_text(page)
    with browser() as playwright:
        chromium, browser_page, problems = open_page(playwright, path, 800, 600)
        try:
            assert problems == []
            assert browser_page.locator("img").count() == 0
            assert evil in browser_page.locator("#main-table").inner_text()
        finally:
            chromium.close()


def test_json_and_csv_round_trip_the_tables_numbers(demo):
    results = str(demo.results)
    common = [results, "--baseline", BASELINE]
    runner = CliRunner()
    exported = json.loads(runner.invoke(main, ["report", *common, "--format", "json"]).output)
    lines = list(csv.DictReader(io.StringIO(runner.invoke(main, ["report", *common, "--format", "csv"]).output)))
    rows = rows_of(load_sets([demo.results]))
    table = main_table(rows, next(r for r in rows if r.configuration == BASELINE))

    assert exported["baseline"] == BASELINE and exported["columns"] == table.columns
    assert [r["configuration"] for r in exported["main"]] == [c[0].text for c in table.rows]
    assert [line["configuration"] for line in lines] == [c[0].text for c in table.rows]
    for cells, data, line in zip(table.rows, exported["main"], lines):
        text = dict(zip(table.columns, (c.text for c in cells)))
        # Every figure the table shows is the exported value, rounded as the table rounds it.
        assert text["Decode t/s"] == f"{data['decode_tps_median']:.1f}"
        assert text["min-max"] == f"{data['decode_tps_min']:.1f}-{data['decode_tps_max']:.1f}"
        assert text[f"vs {BASELINE}"] == f"{data['speedup']:.2f}x"
        assert text["Client t/s"] == f"{data['client_decode_tps_median']:.1f}"
        assert text["TTFT ms"] == f"{data['ttft_ms_median']:.0f}"
        assert text["Cold load s"] == f"{data['cold_load_s']:.2f}"
        assert text["Runs"] == str(data["runs"]) == "3"
        assert text["Context"] == data["context"] == str(SMOL_CONTEXT)
        if data["draft_acceptance"] is not None:
            assert text["Draft accept"].startswith(f"{data['draft_acceptance']:.1%}")
        if data["verdict"] == "baseline":
            assert text["Verdict"] == "baseline"
        else:
            assert text["Verdict"] == (f"{data['verdict']} ({data['ratio_low']:.2f}-{data['ratio_high']:.2f}x, "
                                       f"{data['confidence']:.0%})")
        # CSV carries the same values, unrounded: floats read back exactly.
        for key, value in data.items():
            if isinstance(value, bool):
                assert line[key] == str(value)
            elif isinstance(value, float):
                assert float(line[key]) == value, key
            elif isinstance(value, (int, str)):
                assert line[key] == str(value), key
            elif value is None:
                assert line[key] == "", key
