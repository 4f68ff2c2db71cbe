"""One tune from start to end: serve (or reach) the candidates, search, write the report, print the adoption."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import DEFAULT_URL
from llm_bench.results import ResultSet, load_results
from llm_bench.support.plotting import ChartError
from llm_bench.tune.adopt import nix_snippet, remeasure_command
from llm_bench.tune.plan import TunePlan
from llm_bench.tune.report import draw_pareto, ranked_table, summary_lines
from llm_bench.tune.search import TUNE, Outcome, run_search
from llm_bench.tune.serve import Served, find_llama_server, serving
from llm_bench.workloads import PARTS

Log = Callable[[str], None]


@dataclass
class TuneResult:
    outcome: Outcome
    report: Path  # Markdown: summary, ranked table, adoption
    chart: Path | None
    html: Path | None
    snippet: str  # empty when the winner is an existing preset (--url)
    command: str


def adoption(plan: TunePlan, outcome: Outcome) -> tuple[str, str]:
    winner = outcome.winner
    if winner is None:
        return "", ""
    command = remeasure_command(winner.name, outcome.control.name, plan.protocol,
                                plan.url or plan.main_url or DEFAULT_URL)
    if plan.url is not None:
        return "", command  # the router already serves it
    presets = {winner.name: winner.candidate.preset}
    comments = {winner.name: f"llm-bench tune winner: {winner.verdict.describe()} against {outcome.control.name}"
                if winner.verdict else "llm-bench tune winner: the control itself (no candidate beat it)"}
    if not winner.control:
        presets[outcome.control.name] = outcome.control.candidate.preset
        comments[outcome.control.name] = "the control it was compared with, to measure both after the rebuild"
    return nix_snippet(presets, comments), command


def write_outputs(plan: TunePlan, outcome: Outcome, log: Log) -> TuneResult:
    snippet, command = adoption(plan, outcome)
    folder = plan.output_dir
    chart: Path | None = folder / f"tune-{plan.name}-pareto.png"
    try:
        draw_pareto(outcome, chart)  # type: ignore[arg-type]
    except ChartError as e:
        log(f"no chart: {e}")
        chart = None
    html = write_html_report(outcome, folder / f"tune-{plan.name}.html", log)
    parts = [f"# llm-bench tune: {plan.name}", "", summary_lines(outcome), ranked_table(outcome)]
    if chart:
        parts += [f"![speed against quality]({chart.name})", ""]
    if snippet:
        parts += ["## Adopt it (NixOS)", "", "```nix", snippet.rstrip(), "```", ""]
    if command:
        parts += ["After `nixos-rebuild switch`, measure it on the machine's router:", "", "```sh", command, "```", ""]
    report = folder / f"tune-{plan.name}.md"
    report.write_text("\n".join(parts))
    return TuneResult(outcome, report, chart, html, snippet, command)


def write_html_report(outcome: Outcome, path: Path, log: Log) -> Path | None:
    """The shared HTML report (issue 11's) of the rounds' full measurements, the control as baseline."""
    try:
        from llm_bench.report.html import write_html  # noqa: PLC0415 - optional until it lands
    except ImportError as e:
        log(f"no HTML report: {e}")
        return None
    full = load_results(outcome.results, PARTS)
    only_rounds = ResultSet(full.meta, [r for r in full.aliases if r.target == TUNE])
    if not only_rounds.aliases:
        return None
    try:
        return write_html(path, [only_rounds], outcome.control.name, title=f"llm-bench tune ({outcome.results.name})")
    except (ValueError, ChartError) as e:
        log(f"no HTML report: {e}")
        return None


def run_tune(plan: TunePlan, log: Log, nvml: Nvml | None = None, fresh: bool = False,
             router_args: tuple[str, ...] = (), api_key: str | None = None) -> TuneResult:
    """Serve the grid on a temporary router (or use --url's router), search, and write the outputs.

    ``api_key``: the machine's router's key (--url's router, or the one --main-url frees and restores)."""
    candidates = plan.candidates()
    if plan.url is not None:
        outcome = run_search(plan, Served(plan.url, api_key=api_key), log, nvml, fresh)
    else:
        binary = find_llama_server(plan.llama_server)
        presets = {c.name: c.preset for c in candidates}
        with serving(presets, binary, plan.output_dir, plan.main_url, log, router_args,
                     main_key=api_key) as served:
            outcome = run_search(plan, served, log, nvml, fresh)
    return write_outputs(plan, outcome, log)
