"""Results records and the TOML results file.

A results file is created when a run starts (never replacing an earlier one) and rewritten
atomically as each record finishes (and after every alias), so an interrupted run keeps everything
measured before it.
TOML has no null: a figure that does not exist is left out, never written as 0.
"""

from __future__ import annotations

import os
import statistics
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import tomli_w

from llm_bench.engines.base import Engine
from llm_bench.engines.metrics import SpecCounters
from llm_bench.engines.stream import StreamMeasurement
from llm_bench.support.stats import Tail, percentile, tail_of

FORMAT = "llm-bench/1"
# The workload of the reference protocol's records; files written before it was named so call it "protocol".
STANDARD = "standard"
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
    # Thinking models: ttft_ms is the first generated token (reasoning or answer); these say when the
    # first event and the first answer token came, and how much of the output was reasoning.
    first_event_ms: float | None = None
    first_answer_ms: float | None = None
    reasoning_tokens: int | None = None  # absent: the answer carried no reasoning
    reasoning_source: str | None = None  # "server" (completion_tokens_details) or "deltas" (chunks counted)
    backend: str | None = None  # through a LiteLLM proxy: the backend that answered (x-litellm-model-api-base)
    proxy_overhead_ms: float | None = None  # the proxy's own time on the request (x-litellm-overhead-duration-ms)


class Part(typing.Protocol):
    """A workload's own part of its records (``workloads.base.Workload.part``): what only that workload
    measures, kept in ``AliasRecord.part`` and written under ``[aliases.<workload>]``. Its type, a dataclass,
    reads it back with ``from_toml(data)``; ``load_results`` is given the part types by workload
    (``workloads.PARTS``), so this layer names no workload."""

    @property
    def distinction(self) -> str:
        """What sets its record apart from the alias's standard one (``depth 4096``): the configuration's
        name is ``alias [distinction]``."""
        ...

    def to_toml(self) -> dict[str, Any]: ...

    # Its records keep tail percentiles of their runs in the file (ttft_ms_p90, ...: concurrency levels).
    tails: typing.ClassVar[bool]


# workload (a record's ``workload``) -> its part type, a class with ``from_toml(data) -> Part``
PartTypes = Mapping[str, Any]


def known(kind: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that are fields of the dataclass ``kind`` (a newer file's extra keys are left)."""
    return {k: v for k, v in data.items() if k in kind.__dataclass_fields__}


def _without_none(value: Any) -> Any:
    """TOML has no null: absent figures are left out, at every level."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


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


@dataclass
class AliasRecord:
    """One configuration under one workload: the unit of the results file and of the table."""

    alias: str
    target: str = ""
    engine: str = "llama-cpp"
    workload: str = STANDARD
    decode_source: str = "server timings"
    comparable: bool = True
    not_comparable_reason: str | None = None
    vram_used_mib_before: list[float] | None = None
    vram_unavailable: str | None = None
    preset_args: list[str] = field(default_factory=list)
    server_build: str | None = None
    cold_load_s: float | None = None
    load_transitions: list[str] = field(default_factory=list)
    load_stages_s: dict[str, float] | None = None  # the cold load's stages (llama.cpp's /models/sse), seconds each
    spec: SpecCounters | None = None
    runs: list[RunRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unloaded_after: bool | None = None
    telemetry: dict[str, Any] | None = None  # GPU samples and summary of the measured span (llm_bench.gpu.telemetry)
    model_bytes: int | None = None  # roofline: bytes read per token, approximated by the model file size
    memory_bandwidth_gbs: float | None = None  # roofline: the GPU's peak memory bandwidth
    roofline_tps: float | None = None  # bandwidth / model bytes (x mean acceptance length when drafting)
    # Adaptive run count (protocol.precision): the target, the relative half-width of the median's 95 %
    # interval reached, and why measuring stopped ("precision" or "max_runs"); absent with fixed runs.
    precision_target: float | None = None
    precision_reached: float | None = None
    stopped_by: str | None = None
    thinking: str | None = None  # the protocol's thinking when it was not "off" (the table's notes say so)
    # An OpenAI server's own account where no preset arguments give it (diagnostics.in_run.describe_served):
    # its speculation ("ngram n=3", the first word vLLM's method), its context, and where each was read.
    speculation: str | None = None
    context: int | None = None
    server_evidence: list[str] = field(default_factory=list)
    part: Any = None  # the workload's own part (a results.Part), under [aliases.<workload>] in the file
    # What else ran in the alias's measured window (llm_bench.interference.window): foreign CPU time on the
    # engine's cores, requests not ours, other GPU processes, clock reasons; ``disturbed`` and by what
    interference: dict[str, Any] | None = None
    # The run's drift check (``[checks] drift``): its first alias's decode rates at the start and re-measured at
    # the end (``alias``, ``start``, ``end``), on every record of the run; the report judges them
    drift: dict[str, Any] | None = None

    @property
    def configuration(self) -> str:
        """The alias, and what sets this record apart from the alias's standard one: its workload's part
        (a context depth, a prompt category, a concurrency level), or else any other workload's name."""
        if self.part is not None:
            return f"{self.alias} [{self.part.distinction}]"
        if self.workload != STANDARD:
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
        if self.part is not None and self.part.tails:
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
                if k not in record and k not in ("runs", "spec", "part")}
        record.update(_drop_none(rest))
        if self.part is not None:
            record[self.workload] = _without_none(self.part.to_toml())
        record["runs"] = [_drop_none(asdict(run)) for run in self.runs]
        return record

    @classmethod
    def from_toml(cls, data: dict[str, Any], parts: PartTypes) -> AliasRecord:
        """A record as the file keeps it; its workload's part read by that workload's part type."""
        fields = {k: v for k, v in data.items()
                  if k in cls.__dataclass_fields__ and k not in ("runs", "spec", "part")}
        if fields.get("workload") == LEGACY_STANDARD:
            fields["workload"] = STANDARD
        workload = str(fields.get("workload", STANDARD))
        part_type = parts.get(workload)
        if part_type is not None:
            table = data.get(workload)
            if not isinstance(table, dict):  # an older file kept the part in flat keys: migrated here, once
                table = part_type.legacy(data) if hasattr(part_type, "legacy") else None
            if table is not None:
                fields["part"] = part_type.from_toml(table)
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


def run_record(m: StreamMeasurement, engine: Engine) -> RunRecord:
    """One streamed answer as a run record; its decode rate the engine's own where it has one."""
    timings = m.timings or {}
    server_tps = timings.get("predicted_per_second")
    reasoning = m.reasoning
    return RunRecord(
        ttft_ms=None if m.ttft_s is None else m.ttft_s * 1000.0,
        decode_tps=server_tps if engine.capabilities.server_decode_rate else m.client_decode_tps,
        server_decode_tps=server_tps,
        decode_ms=timings.get("predicted_ms"),
        client_decode_tps=m.client_decode_tps,
        prompt_tps=timings.get("prompt_per_second"),
        prompt_tokens=m.prompt_tokens,
        output_tokens=m.output_tokens,
        token_chunks=m.token_chunks,
        finish_reason=m.finish_reason,
        draft_n=timings.get("draft_n"),
        draft_n_accepted=timings.get("draft_n_accepted"),
        wall_s=None if m.done_at is None else m.done_at - m.sent_at,
        cache_n=m.cached_tokens,
        first_event_ms=_ms(m.first_event_s),
        first_answer_ms=_ms(m.first_answer_s),
        reasoning_tokens=None if reasoning is None else reasoning[0],
        reasoning_source=None if reasoning is None else reasoning[1],
        backend=m.backend,
        proxy_overhead_ms=m.proxy_overhead_ms,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def spec_from_runs(runs: list[RunRecord]) -> SpecCounters | None:
    drafted = sum(r.draft_n or 0 for r in runs)
    if not drafted:
        return None
    return SpecCounters(float(drafted), float(sum(r.draft_n_accepted or 0 for r in runs)))


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


FILES_PER_STEM = 999  # STEM.toml, then STEM-2.toml up to STEM-999.toml


def reserve_path(output_dir: Path, stem: str) -> Path:
    """A new file ``STEM.toml`` (or ``STEM-2.toml``, ...) created empty, so no earlier file is overwritten."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, FILES_PER_STEM + 1):
        path = output_dir / (f"{stem}.toml" if n == 1 else f"{stem}-{n}.toml")
        try:
            with path.open("x"):
                return path
        except FileExistsError:
            continue
    raise ResultsFileError(f"could not find a free results file name for {stem} in {output_dir}")


def reserved_order(path: Path) -> tuple[str, int]:
    """Sort key: the order ``reserve_path`` made the files in. By name alone ``STEM-2.toml`` (the second file of
    that second) sorts before ``STEM.toml``; a stem that itself ends in ``-N`` still sorts first, as a prefix."""
    base, dash, n = path.stem.rpartition("-")
    return (base, int(n)) if dash and n.isdigit() and 2 <= int(n) <= FILES_PER_STEM else (path.stem, 1)


def write_toml(path: Path, data: dict[str, Any]) -> None:
    """Replace the file in one step, so a crash leaves the old content or the new, never half."""
    staged = path.with_name(f".{path.name}.partial")
    staged.write_text(tomli_w.dumps(data))
    os.replace(staged, path)


class ResultsWriter:
    """Owns one results file: reserved at start, rewritten as each record is added and after each alias."""

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


def results_stem(started_at: datetime, label: str, kind: str | None = None) -> str:
    """Every results file's name (without .toml): ``llm-bench-[KIND-]YYYYmmdd-HHMMSS-LABEL``, the label made
    safe for a file name; a kind (``sweep``) for a file made from others rather than measured."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label).strip("-") or "run"
    return f"llm-bench-{kind + '-' if kind else ''}{started_at.strftime('%Y%m%d-%H%M%S')}-{safe}"


def read_toml(path: Path) -> dict[str, Any]:
    """Any llm-bench file's data, read once; what it holds is told by its ``meta.format``."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise ResultsFileError(f"{path}: no such results file") from e
    except UnicodeDecodeError as e:
        raise ResultsFileError(f"{path} is not a text file ({e}); is it an llm-bench results file?") from e
    except OSError as e:
        raise ResultsFileError(f"{path} cannot be read: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ResultsFileError(f"{path} is not valid TOML ({e}); is it an llm-bench results file?") from e


def file_format(data: dict[str, Any]) -> str | None:
    meta = data.get("meta")
    return meta.get("format") if isinstance(meta, dict) else None


def result_set_of(path: Path, data: dict[str, Any], parts: PartTypes) -> ResultSet:
    """A results file's records; ``parts``: each workload's part type (``workloads.PARTS``)."""
    if file_format(data) != FORMAT:
        raise ResultsFileError(f"{path} is not an llm-bench results file (no meta.format = {FORMAT!r})")
    return ResultSet(data["meta"], [AliasRecord.from_toml(a, parts) for a in data.get("aliases", [])])


def load_results(path: Path, parts: PartTypes) -> ResultSet:
    return result_set_of(path, read_toml(path), parts)
