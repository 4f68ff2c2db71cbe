"""llm-bench capacity without a server: the search's steps, a level's verdict from its requests, the window's
phases, the answer sentence, the plan's [capacity] and the command line's refusals (exit 2)."""

from __future__ import annotations

import json
import re
import tomllib
from html import escape

import pytest
import tomli_w
from click.testing import CliRunner

from llm_bench.capacity.answer import answer_sentence, markdown
from llm_bench.capacity.chart import draw_capacity_chart
from llm_bench.capacity.loops import Budget, Phases, clock
from llm_bench.capacity.prompts import PlanPrompt, SessionPrompts
from llm_bench.capacity.records import (
    OVERLOADED,
    WINDOW,
    AliasCapacity,
    Level,
    RequestRecord,
    Search,
    SlotEvidence,
    judge,
    low_tail,
)
from llm_bench.capacity.search import MAX_HALVINGS, bracket, next_rate, next_streams
from llm_bench.capacity.settings import CapacitySettings, Objective, capacity_plan_from_mapping
from llm_bench.cli import main
from llm_bench.cli.exits import COULD_NOT_RUN
from llm_bench.engines.stream import ChatRequest
from llm_bench.plan import PlanError
from llm_bench.testbed.router import free_port
from llm_bench.workloads.session import parse_session

OBJECTIVE = Objective(min_stream_tps=20.0, max_ttft_s=2.0)


def walk_streams(capacity: int, ceiling: int = 64) -> tuple[list[int], str]:
    """The levels the closed-loop search visits on a server that carries exactly ``capacity`` streams."""
    outcomes: dict[float, bool] = {}
    visited = []
    while True:
        n, why = next_streams(outcomes, ceiling)
        if n is None:
            return visited, why
        visited.append(n)
        outcomes[n] = n <= capacity


def test_closed_loop_search_doubles_then_bisects_to_the_largest_n():
    assert walk_streams(6) == ([1, 2, 4, 8, 6, 7], "found")
    assert walk_streams(1) == ([1, 2], "found")
    assert walk_streams(0) == ([1], "none-meets")
    assert walk_streams(5, ceiling=5) == ([1, 2, 4, 5], "ceiling")
    assert walk_streams(3, ceiling=5) == ([1, 2, 4, 3], "found")


def test_a_pass_above_a_break_is_not_believed():
    # noise: 8 met the objective although 4 broke it; the answer stays below the first break
    assert bracket({1: True, 2: True, 4: False, 8: True}) == bracket({1: True, 2: True, 4: False})
    assert next_streams({1: True, 2: True, 4: False, 8: True}, 64) == (3, "")


def test_open_loop_search_brackets_the_rate_within_the_resolution():
    outcomes: dict[float, bool] = {}
    visited = []
    while True:
        rate, why = next_rate(outcomes, start=10.0, resolution=0.1)
        if rate is None:
            break
        visited.append(rate)
        outcomes[rate] = rate <= 33.0
    assert visited[:3] == [10.0, 20.0, 40.0]
    b = bracket(outcomes)
    assert why == "found" and b.carried <= 33.0 < b.broken_at and b.broken_at / b.carried - 1 <= 0.1


def test_open_loop_search_halves_down_and_gives_up():
    outcomes: dict[float, bool] = {}
    while True:
        rate, why = next_rate(outcomes, start=16.0, resolution=0.1)
        if rate is None:
            break
        outcomes[rate] = False
    assert why == "none-meets" and sorted(outcomes) == [16.0 / 2 ** k for k in range(MAX_HALVINGS, -1, -1)]


def request(ttft_ms: float, decode_tps: float, lag_ms: float = 1.0, prompt_ms: float | None = 100.0,
            error: str | None = None, phase: str = WINDOW, level: float = 4) -> RequestRecord:
    return RequestRecord(level=level, phase=phase, scheduled_s=0.0, sent_s=0.001, lag_ms=lag_ms,
                         ttft_ms=None if error else ttft_ms, decode_tps=None if error else decode_tps,
                         prompt_ms=None if error else prompt_ms,
                         wait_ms=None if error or prompt_ms is None else ttft_ms - prompt_ms,
                         output_tokens=None if error else 100, error=error)


def test_tails_are_percentiles_only_with_samples_enough_else_the_extremes():
    assert low_tail([float(v) for v in range(1, 10)], 10).label == "min"  # 9 < 10 samples: no one below p10
    ten = low_tail([float(v) for v in range(1, 11)], 10)
    assert ten.label == "p10" and 1.0 < ten.value < 2.0
    few = judge([request(500 + i, 30) for i in range(19)], OBJECTIVE, (0.0, 60.0), None)
    assert few.ttft_p95.label == "max" and few.ttft_p95.value == 518
    enough = judge([request(500 + i, 30) for i in range(20)], OBJECTIVE, (0.0, 60.0), None)
    assert enough.ttft_p95.label == "p95" and enough.ttft_p95.value < 519


def test_a_level_meets_the_objective_only_in_both_tails():
    window = (0.0, 60.0)
    ok = [request(1000, 25) for _ in range(20)]
    assert judge(ok, OBJECTIVE, window, None).meets is True
    slow = judge(ok[:-3] + [request(1000, 12)] * 3, OBJECTIVE, window, None)
    assert slow.meets is False and slow.broken() == ["decode"]
    late = judge(ok[:-2] + [request(2500, 25)] * 2, OBJECTIVE, window, None)
    assert late.meets is False and late.broken() == ["TTFT"]
    failed = judge(ok[:-1] + [request(0, 0, error="ServerError: HTTP 500")], OBJECTIVE, window, None)
    assert failed.meets is False and failed.failed == 1
    # per minute of window: 20 requests in 60 s, 17 of which met the objective on their own
    assert slow.throughput_per_min == 20 and slow.goodput_per_min == 17


def test_warmup_and_cooldown_requests_are_not_counted():
    window = [request(1000, 25) for _ in range(20)]
    outside = [request(9000, 1, phase="warmup"), request(9000, 1, phase="cooldown")]
    judgement = judge(window + outside, OBJECTIVE, (0.0, 60.0), None)
    assert judgement.meets is True and judgement.counted == 20


def test_a_lagging_client_is_refused_not_judged():
    # 1 % of a 2 s TTFT objective is 20 ms
    lagging = [request(1000, 25, lag_ms=2.0) for _ in range(19)] + [request(1000, 25, lag_ms=25.0)]
    judgement = judge(lagging, OBJECTIVE, (0.0, 60.0), None)
    assert judgement.client_bound and judgement.meets is None
    assert judge(lagging[:-1], OBJECTIVE, (0.0, 60.0), None).client_bound is False


def test_cut_short_levels_are_not_judged_but_an_overloaded_one_breaks():
    requests = [request(1000, 25) for _ in range(20)]
    assert judge(requests, OBJECTIVE, None, "max_requests").meets is None
    assert judge(requests, OBJECTIVE, None, OVERLOADED).meets is False


def level(value: float, ttft_ms: float, decode: float = 25.0, prompt_ms: float = 100.0, slots: int | None = 4,
          queued: bool = False) -> Level:
    lv = Level("closed", value, "2026-12-01T00:00:00+00:00", [request(ttft_ms, decode, prompt_ms=prompt_ms,
                                                                      level=value)] * 20, 60.0, (0.0, 60.0))
    if slots is not None:
        lv.slots = SlotEvidence(slots=slots, samples=10, busy_max=slots, all_busy_samples=10 if queued else 0,
                                queued_samples=5 if queued else 0, waiting_max=2 if queued else 0)
    lv.judge(OBJECTIVE)
    return lv


def test_a_ttft_break_says_whether_requests_queued_for_a_slot_or_prompts_slowed():
    assert "requests queued for a slot (5 streams on 4 slots)" in level(5, 3000).cause(OBJECTIVE)
    assert "requests queued for a slot (all 4 slots busy, up to 2 waiting)" in level(4, 3000, queued=True).cause(OBJECTIVE)
    slowed = level(4, 3000, prompt_ms=2900).cause(OBJECTIVE)
    assert "prompt processing slowed" in slowed and "prompt time 2.90 s" in slowed
    assert "waited before the server started their prompt" in level(4, 3000).cause(OBJECTIVE)
    assert "decoding slowed" in level(4, 500, decode=12).cause(OBJECTIVE)


def search_of(*levels: Level, stopped_by: str, ceiling: float | None = None, reason: str | None = None) -> Search:
    search = Search("closed", list(levels), stopped_by=stopped_by, ceiling=ceiling, ceiling_reason=reason)
    b = bracket({lv.level: bool(lv.judgement.meets) for lv in levels})
    search.carried, search.broken_at = b.carried, b.broken_at
    return search


def test_answer_sentences():
    found = search_of(level(4, 500), level(8, 3000), level(6, 500), level(7, 3000, slots=6), stopped_by="found")
    assert answer_sentence("qwen", found, OBJECTIVE) == (
        "qwen carries 6 concurrent sessions at >= 20 t/s each with p95 TTFT <= 2 s; 7 break the TTFT objective "
        "(p95 TTFT 3.00 s: requests queued for a slot (7 streams on 6 slots))")
    none = search_of(level(1, 500, decode=12), stopped_by="none-meets")
    assert answer_sentence("qwen", none, OBJECTIVE).startswith(
        "qwen does not carry even 1 concurrent session at >= 20 t/s each with p95 TTFT <= 2 s: 1 breaks the "
        "decode objective (p10 decode 12.0 t/s: decoding slowed)")
    ceiling = search_of(level(4, 500), level(5, 500), stopped_by="ceiling", ceiling=5, reason="4 slots + 1")
    assert answer_sentence("qwen", ceiling, OBJECTIVE).endswith("the search's ceiling (4 slots + 1)")
    bounded = search_of(level(2, 500), stopped_by="max_requests")
    assert "carries at least 2 concurrent sessions" in answer_sentence("qwen", bounded, OBJECTIVE)
    assert "(--max-requests)" in answer_sentence("qwen", bounded, OBJECTIVE)


def test_results_tables_and_chart(tmp_path):
    search = search_of(level(1, 400), level(2, 500), level(4, 3000), level(3, 2500), stopped_by="found")
    search.answer = answer_sentence("smol", search, OBJECTIVE)
    alias = AliasCapacity("smol", "llama-cpp", "server timings", slots=2, searches=[search])
    text = markdown([alias], OBJECTIVE)
    assert search.answer in text and text.count("| meets |") == 2
    for suffix in ("svg", "png"):
        path = draw_capacity_chart([alias], OBJECTIVE, tmp_path / f"capacity.{suffix}")
        assert path.stat().st_size > 1000
    data = alias.to_toml()
    assert [lv["level"] for lv in data["searches"][0]["levels"]] == [1, 2, 4, 3]
    level4 = data["searches"][0]["levels"][2]
    assert level4["ttft_p95"] == 3000 and level4["ttft_p95_label"] == "p95" and len(level4["requests"]) == 20


def test_phases_warmup_window_of_enough_requests_then_cooldown_until_the_window_ended():
    settings = CapacitySettings(20, 2, warmup_s=1.0, window_s=2.0, min_window_requests=3)
    start = clock()
    phases = Phases(start, settings, Budget(100, 60))
    assert phases.next(start + 0.5) == "warmup"
    assert [phases.next(start + t) for t in (1.0, 1.5)] == [WINDOW, WINDOW]
    assert phases.next(start + 3.5) == WINDOW  # the time is up, but only 2 window requests were sent
    assert phases.next(start + 3.6) == "cooldown"  # 3 window requests still running: the load stays on
    for _ in range(3):
        phases.ended(WINDOW)
    assert phases.next(start + 3.7) is None


def test_phases_stop_at_the_request_bound():
    settings = CapacitySettings(20, 2, warmup_s=0.0, window_s=60.0, min_window_requests=3)
    start = clock()
    phases = Phases(start, settings, Budget(2, 60))
    assert [phases.next(start + t) for t in (0.1, 0.2, 0.3)] == [WINDOW, WINDOW, None]
    assert phases.stopped == "max_requests"


def test_capacity_plan_file(tmp_path):
    plan = capacity_plan_from_mapping(tomllib.loads(
        'url = "http://127.0.0.1:9"\naliases = ["a"]\n[protocol]\nmax_tokens = 64\n'
        '[capacity]\nmin_stream_tps = 20\nmax_ttft_s = 2\nloops = ["closed", "open"]\nwindow_s = 5\n'), tmp_path)
    assert plan.settings.objective() == Objective(20.0, 2.0)
    assert plan.settings.loops == ("closed", "open") and plan.plan.protocol.max_tokens == 64
    with pytest.raises(PlanError, match=r"\[capacity\]: unknown key\(s\) window"):
        capacity_plan_from_mapping({"capacity": {"window": 5}})
    with pytest.raises(PlanError, match="loops must be one or more of closed, open"):
        capacity_plan_from_mapping({"capacity": {"loops": ["round"]}})
    with pytest.raises(PlanError, match="min_stream_tps must be above 0"):
        capacity_plan_from_mapping({"capacity": {"min_stream_tps": 0}})


@pytest.mark.parametrize("args, message", [
    ([], "give --min-stream-tps and --max-ttft-s"),
    (["--min-stream-tps", "20"], "give --max-ttft-s"),
    (["--min-stream-tps", "20", "--max-ttft-s", "2", "--loop", "round"], "loops must be one or more of"),
    (["--min-stream-tps", "-1", "--max-ttft-s", "2"], "min_stream_tps must be above 0"),
    (["--min-stream-tps", "20", "--max-ttft-s", "2", "--chart", "c.gif"], "must end in .png or .svg"),
])
def test_bad_flags_exit_2_before_any_request(args, message, tmp_path):
    # the URL answers nothing: the refusal must come first
    result = CliRunner().invoke(main, ["capacity", "--url", f"http://127.0.0.1:{free_port()}",
                                       "--output-dir", str(tmp_path), *args])
    assert result.exit_code == COULD_NOT_RUN, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.toml"))


def test_an_unreachable_server_exits_2_without_a_results_file(tmp_path):
    result = CliRunner().invoke(main, ["capacity", "--url", f"http://127.0.0.1:{free_port()}", "--min-stream-tps",
                                       "20", "--max-ttft-s", "2", "--output-dir", str(tmp_path)])
    assert result.exit_code == COULD_NOT_RUN and "cannot connect" in result.output
    assert not list(tmp_path.glob("*.toml"))


# --- a capacity results file in `llm-bench report`: its answers, its levels and its curve in the HTML report ---

def spread_level(loop: str, value: float, decode: tuple[float, float], ttft: tuple[float, float]) -> Level:
    """20 window requests whose decode t/s and TTFT rise evenly from the first figure by the second per request:
    the p10 and the median (and the p95 and the median) differ, as in a real level."""
    lv = Level(loop, value, "2026-12-01T00:00:00+00:00",
               [request(ttft[0] + ttft[1] * i, decode[0] + decode[1] * i, level=value) for i in range(20)], 60.0,
               (0.0, 60.0))
    lv.judge(OBJECTIVE)
    return lv


def capacity_results_file(path):
    closed = search_of(spread_level("closed", 1, (40, 1.0), (300, 10)), spread_level("closed", 2, (30, 0.5), (400, 20)),
                       spread_level("closed", 4, (15, 1.0), (2000, 50)), spread_level("closed", 3, (22, 0.3), (900, 30)),
                       stopped_by="found")
    opened = Search("open", [spread_level("open", 6.0, (35, 0.2), (500, 5)), spread_level("open", 12.0, (12, 0.4),
                                                                                            (2600, 40))])
    opened.stopped_by, opened.carried, opened.broken_at = "found", 6.0, 12.0
    aliases = [AliasCapacity("smol-a", "llama-cpp", "server timings", slots=4, searches=[closed]),
               AliasCapacity("smol-b", "llama-cpp", "server timings", slots=2, searches=[opened])]
    for alias in aliases:
        for search in alias.searches:
            search.answer = answer_sentence(alias.alias, search, OBJECTIVE)
    meta = {"format": "llm-bench-capacity/1", "label": "by-hand", "host": "bed", "engine": "llama-cpp",
            "objective": {"min_stream_tps": OBJECTIVE.min_stream_tps, "max_ttft_s": OBJECTIVE.max_ttft_s}}
    path.write_text(tomli_w.dumps({"meta": meta, "aliases": [a.to_toml() for a in aliases]}))
    return tomllib.loads(path.read_text())


def svg_points(page: str, gid: str) -> list[tuple[float, float]]:
    """The vertices of the SVG path matplotlib wrote for the line with this id."""
    match = re.search(rf'<g id="{gid}">\s*<path d="([^"]*)"', page)
    assert match, f"no line {gid} in the page"
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", match.group(1))]
    return list(zip(numbers[::2], numbers[1::2]))


def assert_drawn_at(points: list[tuple[float, float]], xs: list[float], ys: list[float]) -> tuple[float, float]:
    """The line's vertices are these figures under one linear map per axis (the axes' scales); returns the
    y map (scale, offset) so that other lines on the same axes can be checked against it."""
    assert len(points) == len(xs) == len(ys)
    for values, drawn in ((xs, [p[0] for p in points]), (ys, [p[1] for p in points])):
        scale = (drawn[-1] - drawn[0]) / (values[-1] - values[0])
        assert [drawn[0] + (v - values[0]) * scale for v in values] == pytest.approx(drawn, abs=2e-3)
    scale = (points[-1][1] - points[0][1]) / (ys[-1] - ys[0])
    return scale, points[0][1] - ys[0] * scale


def test_capacity_results_in_the_html_report(tmp_path):
    from tests.test_html_report import browser, open_page  # noqa: PLC0415 - the browser helpers, only here

    data = capacity_results_file(tmp_path / "capacity.toml")
    html = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(tmp_path / "capacity.toml"), "--html", str(html)])
    assert result.exit_code == 0, result.output
    assert "smol-a carries 3 concurrent sessions at >= 20 t/s each" in result.output
    assert "smol-b carries 6 requests/min" in result.output
    page = html.read_text()
    for a, alias in enumerate(data["aliases"]):
        (search,) = alias["searches"]
        assert escape(search["answer"]) in page
        levels = sorted(search["levels"], key=lambda lv: lv["level"])
        xs = [lv["level"] for lv in levels]
        # the curve is the file's own figures: per-stream decode t/s p10 and median, TTFT p95 and median
        prefix = f"capacity0-curve{a}"
        decode = assert_drawn_at(svg_points(page, f"{prefix}-decode-p10"), xs, [lv["decode_p10"] for lv in levels])
        ttft = assert_drawn_at(svg_points(page, f"{prefix}-ttft-p95"), xs, [lv["ttft_p95"] / 1000 for lv in levels])
        for name, y_map, values in (("decode-median", decode, [lv["decode_median"] for lv in levels]),
                                    ("ttft-median", ttft, [lv["ttft_median"] / 1000 for lv in levels])):
            drawn = [y for _, y in svg_points(page, f"{prefix}-{name}")]
            assert drawn == pytest.approx([y_map[0] * v + y_map[1] for v in values], abs=2e-3), name
        # and the objective's lines are drawn at its thresholds, on the same scales
        for name, y_map, goal in (("decode-objective", decode, OBJECTIVE.min_stream_tps),
                                  ("ttft-objective", ttft, OBJECTIVE.max_ttft_s)):
            drawn = [y for _, y in svg_points(page, f"{prefix}-{name}")]
            assert drawn == pytest.approx([y_map[0] * goal + y_map[1]] * 2, abs=2e-3), name
    with browser() as playwright:
        chromium, browser_page, problems = open_page(playwright, html, 390, 844)
        try:
            assert problems == []
            assert browser_page.locator("#capacity0-chart svg").bounding_box()["width"] > 300
            answers = browser_page.locator("#capacity .capacity-answers li").all_inner_texts()
            assert answers == [a["searches"][0]["answer"] for a in data["aliases"]]
            # each search's levels, in the order measured, with the file's figures as the table rounds them
            for a, alias in enumerate(data["aliases"]):
                (search,) = alias["searches"]
                rows = browser_page.locator(f"#capacity0-{a}-{search['loop']} tbody tr")
                cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
                assert [c[:6] for c in cells] == [
                    [f"{lv['level']:g}", str(lv["counted"]), f"{lv['decode_p10']:.1f}", f"{lv['decode_median']:.1f}",
                     f"{lv['ttft_p95']:.0f}", f"{lv['ttft_median']:.0f}"] for lv in search["levels"]]
            assert "by-hand" in browser_page.locator("#provenance").inner_text()
            assert browser_page.evaluate("document.documentElement.scrollWidth") <= 390
        finally:
            chromium.close()


def test_report_refuses_json_of_capacity_results(tmp_path):
    capacity_results_file(tmp_path / "capacity.toml")
    result = CliRunner().invoke(main, ["report", str(tmp_path / "capacity.toml"), "--format", "json"])
    assert result.exit_code == COULD_NOT_RUN and "does not cover capacity results" in result.output


def test_a_file_given_twice_is_shown_once(tmp_path, monkeypatch):
    capacity_results_file(tmp_path / "capacity.toml")
    monkeypatch.chdir(tmp_path)
    once = CliRunner().invoke(main, ["report", "capacity.toml"])
    twice = CliRunner().invoke(main, ["report", "capacity.toml", str(tmp_path / "capacity.toml")])
    assert once.exit_code == twice.exit_code == 0 and once.output
    assert twice.output == once.output


# --- prompts from a session's turns ---

SESSION = parse_session([{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                         {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2 " * 40},
                         {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u3 " * 400}], "test")


def test_each_stream_replays_its_own_conversation_turn_by_turn():
    base = ChatRequest("m", "the plan's prompt", 16, 0.0, 1, prompt_cache=True)
    prompts = SessionPrompts.of(base, SESSION)
    assert prompts.probe.turn == 1 and PlanPrompt(base).probe.turn is None  # the probe's record says so too
    level = prompts.level()
    sent = [(stream, level(stream)) for _ in range(4) for stream in (0, 1)]
    for stream in (0, 1):
        mine = [p for s, p in sent if s == stream]
        assert [p.turn for p in mine] == [1, 2, 3, 1]
        assert [len(p.request.messages) for p in mine] == [2, 4, 6, 2]
        assert all(p.request.prompt_cache and p.request.max_tokens == 16 for p in mine)
        # one conversation: every turn starts with the previous one's messages; the next conversation is new
        assert mine[2].request.messages[:4] == mine[1].request.messages == mine[1].request.messages[:4]
        assert mine[0].request.messages[0] == mine[2].request.messages[0] != mine[3].request.messages[0]
    marks = {p.request.messages[0]["content"] for _, p in sent}
    assert len(marks) == 4  # two streams, two conversations each
    assert prompts.level()(0).request.messages[0] not in [p.request.messages[0] for _, p in sent]  # a new level
    # only the turns that fit the context with max_tokens to generate: estimated from the first turn's count
    tokens = 20
    sizes = [len(json.dumps(SESSION.messages[:t.end])) for t in SESSION.turns()]
    fits_two = round(tokens * sizes[1] / sizes[0]) + 16
    assert [t.end for t in prompts.fitting(tokens, fits_two).turns] == [2, 4]
    assert [t.end for t in prompts.fitting(tokens, fits_two - 1).turns] == [2]
    assert prompts.fitting(None, fits_two).turns == prompts.turns


def test_session_settings_from_a_plan_and_a_bad_session_file(tmp_path):
    (tmp_path / "agent.json").write_text(json.dumps(list(SESSION.messages)))
    plan = capacity_plan_from_mapping({"capacity": {"session_file": "agent.json"}}, tmp_path)
    assert plan.settings.session and plan.settings.session_file == tmp_path / "agent.json"
    assert plan.settings.read_session().messages == SESSION.messages
    assert plan.settings.to_toml()["session_file"] == str(tmp_path / "agent.json")
    assert CapacitySettings(session=True).read_session().source == "shipped"
    assert CapacitySettings().read_session() is None
    (tmp_path / "not.json").write_text("{messages: [")
    for name, message in (("missing.json", "cannot be read"), ("not.json", "is not JSON")):
        result = CliRunner().invoke(main, ["capacity", "--url", f"http://127.0.0.1:{free_port()}", "--min-stream-tps",
                                           "20", "--max-ttft-s", "2", "--session-file", str(tmp_path / name),
                                           "--output-dir", str(tmp_path / "out")])
        assert result.exit_code == COULD_NOT_RUN, result.output
        assert f"session file {tmp_path / name} {message}" in result.output and "Traceback" not in result.output
        assert not (tmp_path / "out").exists()
