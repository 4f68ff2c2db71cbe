"""Merge results files into comparison rows and print them as the report's Markdown table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llm_bench.results import AliasRecord, ResultSet, load_results

# Long and short spellings llama-server accepts for the preset facts the table shows.
ARG_NAMES = {
    "ctx": ("--ctx-size", "-c"),
    "cache_k": ("--cache-type-k", "-ctk"),
    "cache_v": ("--cache-type-v", "-ctv"),
    "spec_type": ("--spec-type",),
    "draft_max": ("--spec-draft-n-max",),
    "model_draft": ("--spec-draft-model", "--model-draft", "-md"),
}


def parse_args(args: Sequence[str]) -> dict[str, str]:
    """Flag -> value for a llama-server argument list; bare flags map to ''."""
    parsed: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-"):
            value = ""
            if i + 1 < len(args) and not _is_flag(args[i + 1]):
                value = args[i + 1]
                i += 1
            parsed[token] = value
        i += 1
    return parsed


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not token.lstrip("-").replace(".", "", 1).isdigit()


def preset_facts(args: Sequence[str]) -> dict[str, str]:
    parsed = parse_args(args)
    facts = {}
    for fact, names in ARG_NAMES.items():
        for name in names:
            if name in parsed:
                facts[fact] = parsed[name]
                break
    return facts


def describe_preset(args: Sequence[str]) -> str:
    facts = preset_facts(args)
    parts = []
    if "cache_k" in facts or "cache_v" in facts:
        parts.append(f"KV {facts.get('cache_k', 'f16')}/{facts.get('cache_v', 'f16')}")
    spec = facts.get("spec_type")
    if spec and spec != "none":
        depth = f" n={facts['draft_max']}" if "draft_max" in facts else ""
        parts.append(f"spec {spec}{depth}")
    elif "model_draft" in facts:
        parts.append("draft model")
    return ", ".join(parts) or "-"


@dataclass(frozen=True)
class Row:
    configuration: str
    record: AliasRecord
    label: str
    engine: str

    @property
    def decode_tps(self) -> float | None:
        s = self.record.summary("decode_tps") or self.record.summary("client_decode_tps")
        return None if s is None else s.median


def load_rows(paths: Sequence[Path]) -> list[Row]:
    sets = [load_results(p) for p in paths]
    labels = {r.target or s.meta.get("label", "") for s in sets for r in s.aliases}
    return rows_from_sets(sets, qualify=len(labels) > 1)


def rows_from_sets(sets: Sequence[ResultSet], qualify: bool) -> list[Row]:
    """One row per configuration; a later measurement of the same configuration replaces an earlier one."""
    rows: dict[str, Row] = {}
    for result_set in sets:
        for record in result_set.aliases:
            label = record.target or result_set.meta.get("label", "")
            name = f"{label} / {record.configuration}" if qualify and label else record.configuration
            rows[name] = Row(name, record, label, record.engine or result_set.meta.get("engine", ""))
    return list(rows.values())


def speed_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows the headline table and the chart compare: one stream at a time."""
    return [r for r in rows if r.record.workload in ("standard", "category")]


def sort_fastest_first(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.decode_tps is None, -(r.decode_tps or 0.0)))


def find_baseline(rows: Sequence[Row], baseline: str | None) -> Row | None:
    if baseline is None:
        return None
    candidates = speed_rows(rows)
    for row in candidates:
        if baseline == row.configuration:
            return row
    for row in candidates:
        if baseline == row.record.alias and row.record.workload == "standard":
            return row
    names = ", ".join(r.configuration for r in candidates)
    raise ValueError(f"baseline {baseline!r} is not among the configurations: {names}")


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def context_of(record: AliasRecord) -> str:
    return preset_facts(record.preset_args).get("ctx", "-")


def notes_of(record: AliasRecord) -> str:
    notes = []
    if record.errors:
        notes.append("FAILED: " + "; ".join(record.errors))
    if not record.comparable:
        notes.append(f"not comparable: {record.not_comparable_reason}")
    notes.extend(record.warnings)
    return " ".join(notes).replace("|", "\\|").replace("\n", " ")


def acceptance_text(record: AliasRecord) -> str:
    spec = record.spec
    if spec is None or not spec.draft_tokens:
        return "-"
    text = f"{spec.acceptance_rate:.1%}"
    if spec.mean_acceptance_length is not None:
        text += f" (len {spec.mean_acceptance_length:.2f})"
    return text


def _table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out.extend("| " + " | ".join(cells) + " |" for cells in lines)
    return "\n".join(out) + "\n"


def markdown_table(rows: Sequence[Row], baseline: Row | None = None) -> str:
    """The report's comparison table, then one table per extra workload that was measured."""
    header = ["Configuration", "Engine", "Decode t/s", "min-max", "Client t/s", "Draft accept", "TTFT ms",
              "Cold load s", "Context", "Preset", "Notes"]
    if baseline is not None:
        header.insert(3, f"vs {baseline.configuration}")
    with_roofline = any(r.record.roofline_tps for r in speed_rows(rows))
    if with_roofline:
        header.insert(header.index("Client t/s"), "Roofline t/s (reached)")
    lines = []
    for row in sort_fastest_first(speed_rows(rows)):
        r = row.record
        decode = r.summary("decode_tps")
        client = r.summary("client_decode_tps")
        ttft = r.summary("ttft_ms")
        cells = [
            row.configuration,
            f"{r.engine} ({'server' if r.decode_source == 'server timings' else 'stream'})",
            _num(row.decode_tps),
            "-" if decode is None else f"{decode.min:.1f}-{decode.max:.1f}",
            _num(client.median if client else None),
            acceptance_text(r),
            _num(ttft.median if ttft else None, 0),
            _num(r.cold_load_s, 2),
            context_of(r),
            describe_preset(r.preset_args),
            notes_of(r),
        ]
        if baseline is not None:
            cells.insert(3, speedup_text(row, baseline))
        if with_roofline:
            cells.insert(header.index("Client t/s"), roofline_text(row))
        lines.append(cells)
    parts = [_table(header, lines)] if lines else []
    parts += [t for t in (concurrency_table(rows), prefix_cache_table(rows)) if t]
    return "\n".join(parts)


def concurrency_table(rows: Sequence[Row]) -> str:
    chosen = sorted((r for r in rows if r.record.workload == "concurrency"),
                    key=lambda r: (r.label, r.record.alias, r.record.concurrency or 0))
    if not chosen:
        return ""
    header = ["Configuration", "Concurrent", "Total t/s", "Per-request t/s p50", "TTFT ms p50", "TTFT ms p90",
              "TTFT ms p99", "Draft accept", "Notes"]
    lines = [[row.configuration, str(r.concurrency), _num(r.total_tps), _num(r.percentile("decode_tps", 50)),
              _num(r.percentile("ttft_ms", 50), 0), _num(r.percentile("ttft_ms", 90), 0),
              _num(r.percentile("ttft_ms", 99), 0), acceptance_text(r), notes_of(r)]
             for row in chosen for r in [row.record]]
    return "### Concurrency\n\n" + _table(header, lines)


def prefix_cache_table(rows: Sequence[Row]) -> str:
    chosen = [r for r in rows if r.record.workload == "prefix-cache"]
    if not chosen:
        return ""
    header = ["Configuration", "Prompt tokens", "TTFT cold ms", "TTFT repeated ms", "Speed-up", "Cache evidence",
              "Notes"]
    lines = []
    for row in chosen:
        r = row.record
        cold, warm = r.prefix_cold_ttft_ms, r.prefix_warm_ttft_ms
        ratio = f"{cold / warm:.1f}x" if cold and warm else "-"
        prompt = str(r.runs[0].prompt_tokens) if r.runs and r.runs[0].prompt_tokens else "-"
        lines.append([row.configuration, prompt, _num(cold, 0), _num(warm, 0), ratio, r.prefix_evidence or "-",
                      notes_of(r)])
    return "### Prefix caching\n\n" + _table(header, lines)


def speedup(row: Row, baseline: Row) -> float | None:
    if row.decode_tps is None or not baseline.decode_tps:
        return None
    return row.decode_tps / baseline.decode_tps


def speedup_text(row: Row, baseline: Row) -> str:
    value = speedup(row, baseline)
    return "-" if value is None else f"{value:.2f}x"


def summary(rows: Sequence[Row], baseline: Row | None, failures: dict[str, str] | None = None) -> str:
    """The few lines a person wants first: the winner per engine, and what not to trust."""
    lines = ["## Summary", ""]
    measured = [r for r in speed_rows(rows) if r.decode_tps is not None and not r.record.errors]
    by_engine: dict[str, Row] = {}
    for row in sort_fastest_first(measured):
        by_engine.setdefault(row.engine, row)
    for engine, row in by_engine.items():
        versus = ""
        if baseline is not None:
            versus = f", {speedup_text(row, baseline)} the baseline {baseline.configuration}"
        lines.append(f"- fastest on {engine}: **{row.configuration}**, {row.decode_tps:.1f} t/s{versus}")
    if baseline is not None:
        lines.append(f"- baseline: {baseline.configuration}, {_num(baseline.decode_tps)} t/s")
    suspect = [r for r in rows if not r.record.comparable]
    if suspect:
        lines += ["", "Not comparable:"]
        lines += [f"- {r.configuration}: {r.record.not_comparable_reason}" for r in suspect]
    warned = [r for r in rows if r.record.warnings]
    if warned:
        lines += ["", "Warnings:"]
        lines += [f"- {r.configuration}: {w}" for r in warned for w in r.record.warnings]
    failed = [r for r in rows if r.record.errors]
    if failed or failures:
        lines += ["", "Failed:"]
        lines += [f"- {r.configuration}: {'; '.join(r.record.errors)}" for r in failed]
        lines += [f"- target {name}: {message}" for name, message in (failures or {}).items()]
    return "\n".join(lines) + "\n"


def roofline_text(row: Row) -> str:
    """The memory-bandwidth bound on decode and the fraction of it reached (llm_bench.gpu.roofline)."""
    bound = row.record.roofline_tps
    if not bound:
        return "-"
    return f"{bound:.1f} ({row.decode_tps / bound:.0%})" if row.decode_tps else f"{bound:.1f}"
