"""Speed at context depth: the protocol's prompt after N tokens of filler, for each depth.

Each depth is measured like the standard workload (the protocol's runs, each a cold prompt, the
server's own timings), with ``depths`` tokens of filler text before the prompt; depth 0 is the
standard workload's request. A depth is set in tokens by the server's own count: before the runs, the
filler's characters per token are measured with two one-token requests (the prompt alone, and the
prompt after a sample of the filler). A depth that does not fit the model's context is skipped with
the reason; a server that reuses any cached prompt token at a depth is named in a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from llm_bench.engines import Engine
from llm_bench.engines.errors import ServerError, ServerUnreachable
from llm_bench.engines.stream import ChatRequest
from llm_bench.prompts import shipped_prompt
from llm_bench.results import AliasRecord, known
from llm_bench.support.numbers import fmt as figure
from llm_bench.support.plotting import ChartError
from llm_bench.support.plotting import figure as chart_figure
from llm_bench.tables import Cell, Row, Table, notes_of
from llm_bench.validation import FieldError, check_fields
from llm_bench.workloads.base import Chart, Flag, Keep, Log, RunParameters, Workload
from llm_bench.workloads.common import WorkloadInterrupted, chat_request, derive, measured_runs, reused_prompt

FILLER_HEADING = "Background notes (context for later; the task follows after them):\n\n"
# Characters of filler whose tokens are counted to measure the filler's characters per token.
SAMPLE_CHARS = 2000


@dataclass
class DepthPoint:
    """The depth workload's part of a record (``[aliases.depth]``): one context depth, in tokens of filler
    before the question; the runs at it are the record's runs (each run's prompt_tokens is the server's
    count of the whole prompt)."""

    tokens: int
    filler_chars: int | None = None
    chars_per_token: float | None = None  # the filler's, by the server's own count, measured before the runs
    skipped: str | None = None  # why it was not measured (beyond the model's context)
    tails: ClassVar[bool] = False

    @property
    def distinction(self) -> str:
        return f"depth {self.tokens}"

    def to_toml(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> DepthPoint:
        return cls(**known(cls, data))


def point_of(record: AliasRecord) -> DepthPoint | None:
    """The record's depth, where it is a depth record."""
    return record.part if isinstance(record.part, DepthPoint) else None


@dataclass(frozen=True)
class DepthSettings:
    # Tokens of filler before the prompt; a depth beyond the model's context is skipped with the reason.
    depths: tuple[int, ...] = field(default=(0, 4096, 16384, 32768), metadata={"min": 0})
    chars_per_token: float = field(default=4.0, metadata={"above": 0.0})  # used only where the server gives no count

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.depths:
            raise FieldError("depths", "must list at least one depth in tokens of filler, e.g. [0, 4096]")


def filler(chars: int) -> str:
    """About ``chars`` characters of numbered prose sections, cut at a word boundary."""
    if chars <= 0:
        return ""
    prose = shipped_prompt("prose").strip()
    parts, n, total = [FILLER_HEADING], 1, len(FILLER_HEADING)
    while total < chars:
        section = f"Section {n}. {prose}\n\n"
        parts.append(section)
        total += len(section)
        n += 1
    text = "".join(parts)[:chars]
    cut = text.rfind(" ")
    return (text[:cut] if cut > len(FILLER_HEADING) else text) + "\n\n"


@dataclass(frozen=True)
class Calibration:
    """The server's own token counts: the prompt alone (with the chat template), and the filler's
    characters per token."""

    prompt_tokens: int
    chars_per_token: float


def _prompt_tokens(engine: Engine, request: ChatRequest, prompt: str) -> int:
    """The server's count of the whole prompt, from a one-token answer (usage.prompt_tokens)."""
    body: dict[str, Any] = replace(request, prompt=prompt, max_tokens=1).body()
    body.pop("stream_options", None)
    body["stream"] = False
    tokens = (engine.chat(body).get("usage") or {}).get("prompt_tokens")
    if not isinstance(tokens, int):
        raise ServerError(f"the server did not report usage.prompt_tokens for {request.model!r}, so a context depth "
                          "cannot be set in tokens")
    return tokens


def calibrate(engine: Engine, request: ChatRequest, settings: DepthSettings) -> Calibration:
    base = _prompt_tokens(engine, request, request.prompt)
    sample = filler(SAMPLE_CHARS)
    with_sample = _prompt_tokens(engine, request, sample + request.prompt)
    measured = len(sample) / (with_sample - base) if with_sample > base else settings.chars_per_token
    return Calibration(base, measured)


def depth(engine: Engine, alias: str, protocol: RunParameters, base: AliasRecord, log: Log, keep: Keep) -> None:
    settings = DEPTH.settings_in(protocol)
    request = chat_request(alias, protocol, protocol.prompt, prompt_cache=False)  # each depth a cold prompt
    records: list[AliasRecord] = []  # this alias's depths, for the check that any fits
    try:
        cal = calibrate(engine, request, settings) if any(settings.depths) else None
    except ServerError as e:
        failed = derive(base, workload=DEPTH.record_name, cold_load_s=None)
        failed.errors.append(f"depth: counting the filler's tokens failed: {e}")
        keep(failed)
        raise WorkloadInterrupted(e) from e
    n_ctx = engine.context_length(alias)
    if cal is not None:
        log(f"  depth: the filler takes {cal.chars_per_token:.2f} characters per token, the prompt "
            f"{cal.prompt_tokens} tokens (the server's count)" + (f"; context {n_ctx} tokens" if n_ctx else ""))
    for tokens in settings.depths:
        cpt = cal.chars_per_token if cal is not None else settings.chars_per_token
        point = DepthPoint(tokens, filler_chars=int(tokens * cpt) if tokens else 0,
                           chars_per_token=cpt if cal is not None and tokens else None)
        record = derive(base, workload=DEPTH.record_name, cold_load_s=None, part=point)
        records.append(record)
        needed = tokens + (cal.prompt_tokens if cal else 0) + request.max_tokens
        if n_ctx is not None and needed > n_ctx:
            point.skipped = (f"{tokens} tokens of filler, the prompt and {request.max_tokens} tokens to generate "
                             f"need {needed} tokens; the model's context is {n_ctx} (n_ctx reported by the server)")
            log(f"  depth {tokens}: skipped ({point.skipped})")
            keep(record)
            continue
        at_depth = replace(request, prompt=filler(point.filler_chars or 0) + request.prompt)
        try:
            measured_runs(engine, at_depth, protocol.runs, record, log, keep, label=f"Depth {tokens} run")
        except WorkloadInterrupted as e:  # the record is kept, with its error
            if isinstance(e.cause, ServerUnreachable):
                raise
            log(f"  depth {tokens}: FAILED: {e}")  # the next depth is still measured
            continue
        check_cold(record, tokens)
        keep(record)
    if all((at := point_of(r)) is not None and at.skipped for r in records):
        records[0].errors.append(
            f"no depth of [protocol.depth] depths = {list(settings.depths)} fits the model's context of {n_ctx} "
            "tokens; choose depths below it (--depths)")
        log(f"  FAILED: {records[0].errors[-1]}")


def check_cold(record: AliasRecord, tokens: int) -> None:
    """Every run at a depth must have processed its whole prompt, by the server's own cache counter."""
    # a run that reused most of its prompt already has measured_runs' warning
    for i, run in enumerate(record.runs, 1):
        if run.cache_n and not reused_prompt(run):
            record.warnings.append(f"depth {tokens} run {i}: the server reused {run.cache_n} of {run.prompt_tokens} "
                                   "prompt tokens from its cache although the prompt cache was off")
    if record.runs and all(r.cache_n is None for r in record.runs):
        record.warnings.append(f"depth {tokens}: the server reports no cache counter (cache_n / cached_tokens), so "
                               "that every prompt was processed whole is not confirmed")


# --- the report: one row per configuration and depth, and decode t/s against depth ---

def depth_rows(rows: Sequence[Row]) -> list[Row]:
    chosen = [r for r in rows if r.record.workload == DEPTH.record_name and point_of(r.record) is not None]
    return sorted(chosen, key=lambda r: (configuration_of(r), _tokens(r)))


def _tokens(row: Row) -> int:
    point = point_of(row.record)
    return point.tokens if point is not None else 0


def configuration_of(row: Row) -> str:
    """The configuration a depth row belongs to: the row's group (its name without the depth)."""
    return row.group


def _median(row: Row, metric: str) -> float | None:
    s = row.record.summary(metric)
    return None if s is None else s.median


def _shallowest(rows: Sequence[Row]) -> dict[str, Row]:
    """Per configuration, its measured row of the smallest depth: what the others are compared with."""
    first: dict[str, Row] = {}
    for row in rows:
        if row.decode_tps is not None:
            first.setdefault(configuration_of(row), row)
    return first


def depth_tables(rows: Sequence[Row], _baseline: Row | None = None) -> list[Table]:
    chosen = depth_rows(rows)
    if not chosen:
        return []
    first = _shallowest(chosen)
    header = ["Configuration", "Depth", "Context tokens", "Decode t/s", "min-max", "vs shallowest", "Prompt t/s",
              "TTFT ms", "Runs", "Reused tokens", "Notes"]
    lines = []
    for row in chosen:
        point, record = point_of(row.record), row.record
        if point is None:
            continue
        name = configuration_of(row)
        decode = record.summary(row.decode_metric)
        base = first.get(name)
        ratio = row.decode_tps / base.decode_tps if base is not None and row.decode_tps and base.decode_tps else None
        context = _median(row, "prompt_tokens")
        reused = [r.cache_n for r in record.runs if r.cache_n is not None]
        notes = f"skipped: {point.skipped}" if point.skipped else notes_of(record)
        lines.append([
            Cell(name, {"configuration": name}),
            Cell(str(point.tokens), {"depth": point.tokens}),
            Cell(figure(context, 0), {"context_tokens": None if context is None else int(context)}),
            Cell(figure(row.decode_tps), {"decode_tps_median": row.decode_tps, "decode_source": record.decode_source}),
            Cell("-" if decode is None else f"{decode.min:.1f}-{decode.max:.1f}",
                 {"decode_tps_min": None if decode is None else decode.min,
                  "decode_tps_max": None if decode is None else decode.max}),
            Cell("-" if ratio is None else f"{ratio:.2f}x", {"decode_vs_shallowest": ratio}),
            Cell(figure(_median(row, "prompt_tps")), {"prompt_tps_median": _median(row, "prompt_tps")}),
            Cell(figure(_median(row, "ttft_ms"), 0), {"ttft_ms_median": _median(row, "ttft_ms")}),
            Cell(str(len(record.runs)), {"runs": len(record.runs)}),
            Cell("-" if not reused else str(max(reused)), {"reused_tokens_max": max(reused) if reused else None}),
            Cell(notes, {"skipped": point.skipped, "errors": list(record.errors), "warnings": list(record.warnings)}),
        ])
    return [Table("Speed at context depth", "depth", header, lines)]


def draw_depth_chart(rows: Sequence[Row], path: Path) -> Path:
    """Decode t/s (median, min-max whiskers) against depth, one line per configuration."""
    lines: dict[str, list[Row]] = {}
    for row in depth_rows(rows):
        if row.decode_tps is not None:
            lines.setdefault(configuration_of(row), []).append(row)
    if not lines:
        raise ChartError("no configuration has a decode rate at any depth to draw")
    with chart_figure(path, dpi=150, figsize=(9, 5)) as (_fig, ax):
        for name, points in lines.items():
            ys = [p.decode_tps or 0.0 for p in points]
            spans = [p.record.summary(p.decode_metric) for p in points]
            low = [y - s.min if s else 0.0 for y, s in zip(ys, spans, strict=True)]
            high = [s.max - y if s else 0.0 for y, s in zip(ys, spans, strict=True)]
            ax.errorbar([_tokens(p) for p in points], ys, yerr=[low, high], marker="o", capsize=3, linewidth=1.5,
                        label=name)
        ax.set_xlabel("context depth (tokens of filler before the prompt)")
        ax.set_ylabel("decode tokens/s (median; whiskers: min-max)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=9)
        ax.set_title("Decode speed at context depth")
        ax.spines[["top", "right"]].set_visible(False)
    return path


DEPTH: Workload[DepthSettings] = Workload(
    "depth", DepthSettings, depth,
    flags=(Flag("--depths", "depths", "Context depths for the depth workload, in tokens of filler before the prompt",
                item=int, many=True, example="0,4096,16384"),),
    tables=depth_tables, part=DepthPoint,
    chart=Chart("depth", "Decode tokens/s against context depth, one line per configuration; median of the runs, "
                "whiskers: min-max.", draw_depth_chart, lambda rows: bool(depth_rows(rows))))
