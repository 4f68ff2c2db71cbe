"""Results records and the TOML results file.

A results file is created when a run starts (never replacing an earlier one) and rewritten
atomically after every alias, so an interrupted run keeps everything measured before it.
TOML has no null: a figure that does not exist is left out, never written as 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import math
import os
import statistics
import tomllib
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy
import tomli_w

from llm_bench.engines.metrics import SpecCounters

FORMAT = "llm-bench/1"
# Files written before the default workload was named "standard" call it "protocol".
LEGACY_STANDARD = "protocol"


@dataclass
class RunRecord:
    """One measured request."""

    ttft_ms: float | None = None
    decode_tps: float | None = None
    server_decode_tps: float | None = None
    decode_ms: float | None = None
    client_decode_tps: float | None = None
    prompt_tps: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    token_chunks: int | None = None
    finish_reason: str | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    wall_s: float | None = None
    cache_n: int | None = None  # prompt tokens the server reused from its cache (its own count)
    batch: int | None = None  # concurrency workload: which batch of simultaneous streams (1-based)
    backend: str | None = None  # through a LiteLLM proxy: the backend that answered (x-litellm-model-api-base)
    proxy_overhead_ms: float | None = None  # the proxy's own time on the request (x-litellm-overhead-duration-ms)


@dataclass
class QualityOutput:
    """One greedy answer of the quality workload's agreement set."""

    prompt_id: str
    text: str
    output_tokens: int | None = None
    token_ids: list[int] | None = None  # where the server reports them (logprobs with ids)
    finish_reason: str | None = None


@dataclass
class RecallProbe:
    """One needle at one depth of one filler length; skipped (with the reason) beyond the context."""

    length_tokens: int
    depth: float
    expected: str
    prompt_tokens: int | None = None
    answer: str | None = None
    found: bool | None = None
    skipped: str | None = None


@dataclass
class QuestionResult:
    """One exact-answer question."""

    question_id: str
    kind: str
    expected: str
    answer: str
    correct: bool


QUALITY_LISTS = {"quality_outputs": QualityOutput, "recall": RecallProbe, "questions": QuestionResult}


@dataclass
class Summary:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float | None]) -> Summary | None:
        present = [v for v in values if v is not None]
        if not present:
            return None
        return cls(statistics.median(present), min(present), max(present))


def tail_of(values: Sequence[float], q: float) -> Tail:
    """The q-th percentile of values where they are enough for it (see min_samples), else their max, so labelled."""
    if len(values) >= min_samples(q):
        return Tail(percentile(list(values), q), f"p{q:g}", len(values))
    return Tail(max(values), "max", len(values))


@dataclass
class AliasRecord:
    """One configuration under one workload: the unit of the results file and of the table."""

    alias: str
    target: str = ""
    engine: str = "llama-cpp"
    workload: str = "standard"
    category: str | None = None
    concurrency: int | None = None
    decode_source: str = "server timings"
    comparable: bool = True
    not_comparable_reason: str | None = None
    vram_used_mib_before: list[float] | None = None
    vram_unavailable: str | None = None
    preset_args: list[str] = field(default_factory=list)
    server_build: str | None = None
    cold_load_s: float | None = None
    load_transitions: list[str] = field(default_factory=list)
    spec: SpecCounters | None = None
    total_tps: float | None = None
    prefix_cold_ttft_ms: float | None = None
    prefix_warm_ttft_ms: float | None = None
    prefix_cached_tokens: int | None = None
    prefix_evidence: str | None = None
    runs: list[RunRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unloaded_after: bool | None = None
    telemetry: dict[str, Any] | None = None  # GPU samples and summary of the measured span (llm_bench.gpu.telemetry)
    model_bytes: int | None = None  # roofline: bytes read per token, approximated by the model file size
    memory_bandwidth_gbs: float | None = None  # roofline: the GPU's peak memory bandwidth
    roofline_tps: float | None = None  # bandwidth / model bytes (x mean acceptance length when drafting)
    # The quality workload (workload = "quality"); see llm_bench.workloads.quality.
    quality_comparison: str | None = None  # "tokens" (token ids reported) or "characters"
    quality_outputs: list[QualityOutput] = field(default_factory=list)
    recall: list[RecallProbe] = field(default_factory=list)
    questions: list[QuestionResult] = field(default_factory=list)
    # Adaptive run count (protocol.precision): the target, the relative half-width of the median's 95 %
    # interval reached, and why measuring stopped ("precision" or "max_runs"); absent with fixed runs.
    precision_target: float | None = None
    precision_reached: float | None = None
    stopped_by: str | None = None

    @property
    def configuration(self) -> str:
        if self.category:
            return f"{self.alias} [{self.category}]"
        if self.concurrency is not None:
            return f"{self.alias} [x{self.concurrency}]"
        if self.workload in ("prefix-cache", "quality"):
            return f"{self.alias} [{self.workload}]"
        return self.alias

    def summary(self, metric: str) -> Summary | None:
        return Summary.of([getattr(run, metric) for run in self.runs])

    def percentile(self, metric: str, q: float) -> float | None:
        values = [v for v in (getattr(run, metric) for run in self.runs) if v is not None]
        return percentile(values, q) if values else None

    def tail(self, metric: str, q: float) -> Tail | None:
        """The q-th percentile where the runs are enough for it (see MIN_SAMPLES), else their max, so labelled."""
        values = [v for v in (getattr(run, metric) for run in self.runs) if v is not None]
        return tail_of(values, q) if values else None

    def to_toml(self) -> dict[str, Any]:
        record: dict[str, Any] = {"alias": self.alias, "target": self.target, "engine": self.engine,
                                  "workload": self.workload}
        for metric in ("decode_tps", "client_decode_tps", "ttft_ms", "prompt_tps"):
            s = self.summary(metric)
            if s is not None:
                record[f"{metric}_median"] = s.median
                record[f"{metric}_min"] = s.min
                record[f"{metric}_max"] = s.max
        if self.concurrency is not None:
            # a tail percentile only where there are samples enough for it; the _max above stands in otherwise
            for q in (50, 90, 99):
                for metric in ("ttft_ms", "decode_tps"):
                    tail = self.tail(metric, q)
                    if tail is not None and tail.label != "max":
                        record[f"{metric}_p{q}"] = tail.value
        if self.spec is not None and self.spec.draft_tokens:
            record.update(_drop_none({
                "draft_acceptance": self.spec.acceptance_rate,
                "draft_n": int(self.spec.draft_tokens),
                "draft_n_accepted": int(self.spec.accepted_tokens),
                "draft_rounds": None if self.spec.drafts is None else int(self.spec.drafts),
                "mean_acceptance_length": self.spec.mean_acceptance_length,
                "acceptance_per_position": list(self.spec.per_position_rates) or None,
            }))
        for key in ("prompt_tokens", "output_tokens"):
            s = self.summary(key)
            if s is not None:
                record[key] = int(s.median)
        record["comparable"] = self.comparable
        rest = {k: getattr(self, k) for k in self.__dataclass_fields__
                if k not in record and k not in ("runs", "spec", *QUALITY_LISTS)}
        record.update(_drop_none(rest))
        for name in QUALITY_LISTS:
            if getattr(self, name):
                record[name] = [_drop_none(asdict(item)) for item in getattr(self, name)]
        record["runs"] = [_drop_none(asdict(run)) for run in self.runs]
        return record

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> AliasRecord:
        fields = {k: v for k, v in data.items()
                  if k in cls.__dataclass_fields__ and k not in ("runs", "spec", *QUALITY_LISTS)}
        for name, kind in QUALITY_LISTS.items():
            known = kind.__dataclass_fields__
            fields[name] = [kind(**{k: v for k, v in item.items() if k in known}) for item in data.get(name, [])]
        if fields.get("workload") == LEGACY_STANDARD:
            fields["workload"] = "standard"
        run_names = RunRecord.__dataclass_fields__
        runs = [RunRecord(**{k: v for k, v in r.items() if k in run_names}) for r in data.get("runs", [])]
        spec = None
        if "draft_n" in data:
            rates = data.get("acceptance_per_position", [])
            drafts = data.get("draft_rounds")
            spec = SpecCounters(float(data["draft_n"]), float(data["draft_n_accepted"]),
                                None if drafts is None else float(drafts),
                                tuple(r * drafts for r in rates) if drafts else ())
        return cls(**fields, runs=runs, spec=spec)


def percentile(values: list[float], q: float) -> float:
    """numpy's percentile (linear interpolation between closest ranks)."""
    return float(numpy.percentile(values, q))


def min_samples(q: float) -> int:
    """Samples needed before the q-th percentile is reported: enough that at least one sample lies above
    it (10 for p90, 100 for p99; p50 needs 1). With fewer, "p99" would be an interpolation toward the
    largest value, i.e. the max under another name."""
    return 1 if q <= 50 else math.ceil(round(100.0 / (100.0 - q), 9))


@dataclass(frozen=True)
class Tail:
    value: float
    label: str  # "p90", "p99", ... or "max" when the samples are too few for that percentile
    samples: int


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


@dataclass
class ResultSet:
    """Everything one invocation measured, with where it came from."""

    meta: dict[str, Any]
    aliases: list[AliasRecord] = field(default_factory=list)

    def to_toml(self) -> dict[str, Any]:
        return {"meta": _drop_none(self.meta), "aliases": [a.to_toml() for a in self.aliases]}


class ResultsFileError(ValueError):
    pass


def reserve_path(output_dir: Path, stem: str) -> Path:
    """A new file ``STEM.toml`` (or ``STEM-2.toml``, ...) created empty, so no earlier file is overwritten."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = output_dir / (f"{stem}.toml" if n == 1 else f"{stem}-{n}.toml")
        try:
            with path.open("x"):
                return path
        except FileExistsError:
            continue
    raise ResultsFileError(f"could not find a free results file name for {stem} in {output_dir}")


def write_toml(path: Path, data: dict[str, Any]) -> None:
    """Replace the file in one step, so a crash leaves the old content or the new, never half."""
    staged = path.with_name(f".{path.name}.partial")
    staged.write_text(tomli_w.dumps(data))
    os.replace(staged, path)


class ResultsWriter:
    """Owns one results file: reserved at start, rewritten after each alias."""

    def __init__(self, output_dir: Path, result_set: ResultSet, stem: str):
        self.result_set = result_set
        self.path = reserve_path(output_dir, stem)
        self.flush()

    def add(self, record: AliasRecord) -> None:
        self.extend([record])

    def extend(self, records: list[AliasRecord]) -> None:
        self.result_set.aliases.extend(records)
        self.flush()

    def finish(self, finished_at: datetime) -> None:
        self.result_set.meta["finished_at"] = finished_at.isoformat(timespec="seconds")
        self.result_set.meta["complete"] = True
        self.flush()

    def flush(self) -> None:
        write_toml(self.path, self.result_set.to_toml())


def results_stem(started_at: datetime, label: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label).strip("-") or "run"
    return f"llm-bench-{started_at.strftime('%Y%m%d-%H%M%S')}-{safe}"


def load_results(path: Path) -> ResultSet:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise ResultsFileError(f"{path}: no such results file") from e
    except tomllib.TOMLDecodeError as e:
        raise ResultsFileError(f"{path} is not valid TOML ({e}); is it an llm-bench results file?") from e
    meta = data.get("meta")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ResultsFileError(f"{path} is not an llm-bench results file (no meta.format = {FORMAT!r})")
    return ResultSet(meta, [AliasRecord.from_toml(a) for a in data.get("aliases", [])])
