"""Results files read back as points of a history: one measured configuration of one file, with the build and
the rig it ran on, and the skip records the watch writes when it did not measure.

What makes two points the same configuration (``Point.series``): the alias and the workload (and its category,
concurrency or depth), the preset's arguments as the router reports them (without the server binary, whose path
is the build's, and the port and host the router gives each instance), the model (its ``--hf-repo`` reference, or
its path and size), the protocol, and the specialisation the NixOS marker names. Not the target: ``run``'s
``--label`` is free text ("before", "after" an update), shown beside the result but never a reason to stop
comparing (a user labelling runs around an update would otherwise never see its regression).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from llm_bench.fingerprint import fingerprint_facts, is_available
from llm_bench.gpu.roofline import model_bytes
from llm_bench.interference.window import disturbance
from llm_bench.preset_args import parse_args
from llm_bench.results import (
    FORMAT,
    AliasRecord,
    ResultsFileError,
    file_format,
    read_toml,
    reserved_order,
    result_set_of,
)
from llm_bench.workloads import PARTS

SKIP_FORMAT = "llm-bench-history-skip/1"
# The instance's own address, given by the router per start, and whether its log is coloured (the router passes
# --log-colors on in a terminal, off under systemd: issue 52): not part of what a preset measures.
VOLATILE_FLAGS = frozenset({"--port", "--host", "--log-colors"})
MODEL_FLAGS = ("--model", "-m")
HF_FLAGS = ("--hf-repo", "-hf", "-hfr")
# Memory in use before the first load above this much is "busy": another process holds the GPU.
BUSY_MIB = 1024.0


class HistoryInputError(ValueError):
    """A file or folder that cannot be read as history; the message names it and the fix."""


@dataclass(frozen=True)
class Build:
    """Which llama.cpp served a point: its identity (what makes two builds the same) and its names."""

    identity: tuple[str, ...]
    version: str
    package_path: str
    nixpkgs_revision: str
    server_build: str

    def describe(self) -> str:
        rev = self.nixpkgs_revision[:12] if is_available(self.nixpkgs_revision) else "nixpkgs revision unknown"
        path = self.package_path if is_available(self.package_path) else "package path unknown"
        version = self.version if is_available(self.version) else (
            self.server_build if is_available(self.server_build) else "version unknown")
        return f"llama.cpp {version} ({path}, nixpkgs {rev})"


def _fact(facts: dict[str, Any], key: str, fallback: str | None = None) -> str:
    value = facts.get(key)
    if isinstance(value, str) and value:
        return value
    return fallback if fallback else "not available: the file does not record it"


def build_of(meta: dict[str, Any], record: AliasRecord | None) -> Build:
    """The build from the fingerprint, else (files from before it) from the run's marker copy and /props."""
    facts = (meta.get("fingerprint") or {}).get("build") or {}
    package = meta.get("llama_cpp_package") or {}
    server = (record.server_build if record is not None else None) or meta.get("server_build")
    build = Build(
        identity=(),
        version=_fact(facts, "package_version", package.get("version")),
        package_path=_fact(facts, "package_path", package.get("path")),
        nixpkgs_revision=_fact(facts, "nixpkgs_revision"),
        server_build=_fact(facts, "server_build", server),
    )
    # The package's store path names every input of the binary (the source, nixpkgs, CUDA), so it is the
    # build; without a marker, the server's own build string; the system generation is the last resort.
    identity = tuple(v for v in (build.package_path, build.server_build) if is_available(v))
    if not identity:
        identity = (_fact(facts, "system"),)
    return Build(identity, build.version, build.package_path, build.nixpkgs_revision, build.server_build)


def rig_of(meta: dict[str, Any]) -> dict[str, Any]:
    """The rig facts a change of which explains a change of speed: per GPU the enforced power limit, the
    PCIe link's width (its generation drops at idle, so it is not compared), whether memory was busy
    before the first load; the driver and the CPU governor. Facts a file could not read are left out."""
    rig = (meta.get("fingerprint") or {}).get("rig") or {}
    out: dict[str, Any] = {}
    for key, name in (("driver", "driver"), ("cpu_governor", "CPU governor")):
        if is_available(rig.get(key)) and rig.get(key) is not None:
            out[name] = rig[key]
    gpus = rig.get("gpus")
    for gpu in gpus if isinstance(gpus, list) else []:
        i = gpu.get("index")
        for key, name, unit in (("power_limit_enforced_w", "power limit", " W"), ("pcie_width", "PCIe width", "x"),
                                ("pcie_width_max", "PCIe max width", "x"), ("name", "model", "")):
            value = gpu.get(key)
            if value is not None and is_available(value):
                out[f"GPU{i} {name}"] = f"{value:g}{unit}" if isinstance(value, (int, float)) else value
        used = gpu.get("memory_used_mib")
        if isinstance(used, (int, float)):
            out[f"GPU{i} memory before the load"] = "busy" if used > BUSY_MIB else "free"
    return out


def rig_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two rigs, fact by fact, where both files could read it."""
    return [f"{k} {before[k]} -> {after[k]}" for k in before if k in after and before[k] != after[k]]


def config_args(args: Sequence[str]) -> tuple[str, ...]:
    """A preset's arguments as far as they are the configuration: no binary, no per-start port or host."""
    rest = list(args[1:] if args and not args[0].startswith("-") else args)
    out: list[str] = []
    skip = False
    for token in rest:
        if skip:
            skip = False
            continue
        flag = token.split("=", 1)[0]
        if flag in VOLATILE_FLAGS:
            skip = "=" not in token
            continue
        out.append(token)
    return tuple(out)


def model_of(args: Sequence[str], recorded_bytes: int | None) -> str:
    """The model: its Hugging Face reference, or its path and size (the size as recorded, else as on disk)."""
    parsed = parse_args(args)
    for flag in HF_FLAGS:
        if parsed.get(flag):
            return f"hf:{parsed[flag]}"
    for flag in MODEL_FLAGS:
        if parsed.get(flag):
            size = recorded_bytes if recorded_bytes is not None else model_bytes(parsed[flag])
            return f"{parsed[flag]} ({size} bytes)" if size is not None else f"{parsed[flag]} (size unknown)"
    return "model not named by the preset's arguments"


@dataclass(frozen=True)
class Point:
    """One configuration's result in one file."""

    path: Path
    started_at: datetime
    alias: str
    name: str  # target (the label) and configuration: what the table shows
    args: tuple[str, ...]
    model: str
    protocol: str  # canonical JSON of meta.protocol
    build: Build
    rig: dict[str, Any]
    record: AliasRecord
    fingerprint: list[tuple[str, str]] = field(default_factory=list)
    specialisation: str = ""  # the marker's, where a file records one: another engine is another series

    @property
    def configuration(self) -> str:
        """The alias and its workload's part, without the label; and the specialisation where the marker names one."""
        name = self.record.configuration
        return f"{name} on {self.specialisation}" if self.specialisation else name

    @property
    def series(self) -> tuple[str, ...]:
        return (self.configuration, json.dumps(self.args), self.model, self.protocol)

    def decode_values(self, metric: str) -> list[float | None]:
        return [getattr(run, metric) for run in self.record.runs]

    def ttft_values(self) -> list[float | None]:
        return [run.ttft_ms for run in self.record.runs]


@dataclass(frozen=True)
class Skip:
    """A measurement the watch did not make, and why (a skip record)."""

    path: Path
    started_at: datetime
    alias: str
    reason: str


@dataclass
class Inputs:
    points: list[Point] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # files read and set aside, each with why


def made_order(item: Point | Skip) -> tuple[datetime, str, tuple[str, int]]:
    """Sort key, oldest first: when it was measured (to the second), then, for files of one second, the order
    ``reserve_path`` made them in; by name, the newer ``STEM-2.toml`` would come before ``STEM.toml``."""
    return item.started_at, str(item.path.parent), reserved_order(item.path)


def when_of(meta: dict[str, Any], path: Path) -> datetime:
    text = meta.get("started_at")
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError as e:
        raise HistoryInputError(f"{path}: meta.started_at {text!r} is not a time ({e}); a results file names when "
                                "it was measured: restore it from the original or move the file out") from e
    if when.tzinfo is None:
        raise HistoryInputError(f"{path}: meta.started_at {text!r} has no time zone; llm-bench writes UTC times "
                                "(+00:00): fix the value or move the file out")
    return when


def specialisation_of(meta: dict[str, Any]) -> str:
    """The specialisation the NixOS marker named when the file was measured ('' when no marker was read)."""
    facts = (meta.get("fingerprint") or {}).get("build") or {}
    value = facts.get("specialisation")
    if not (isinstance(value, str) and is_available(value)):
        value = (meta.get("llama_cpp_package") or {}).get("specialisation")
    return value if isinstance(value, str) and value and is_available(value) else ""


def record_name(record: AliasRecord) -> str:
    return f"{record.target} / {record.configuration}" if record.target else record.configuration


def points_of(path: Path, data: dict[str, Any], into: Inputs) -> None:
    """The points (or the skip) one file holds; a file of another kind is set aside, with why."""
    found = file_format(data)
    if found == SKIP_FORMAT:
        meta = data["meta"]
        into.skips.append(Skip(path, when_of(meta, path), str(meta.get("alias") or "-"),
                               str(meta.get("reason") or "no reason recorded")))
        return
    if found != FORMAT:
        into.ignored.append(f"{path}: not followed ({'meta.format ' + repr(found) if found else 'no meta.format'}; "
                            f"history follows the results of run, tune and demo, {FORMAT!r})")
        return
    try:
        result_set = result_set_of(path, data, PARTS)
    except (KeyError, TypeError, ValueError) as e:
        raise HistoryInputError(f"{path}: its records cannot be read ({type(e).__name__}: {e}); "
                                "move the file out of the history or restore it") from e
    meta = result_set.meta
    if meta.get("sweep_merged"):
        into.ignored.append(f"{path}: not followed (a sweep's merged file; its targets' own files are followed)")
        return
    when = when_of(meta, path)
    protocol = json.dumps(meta.get("protocol") or {}, sort_keys=True)
    printed = fingerprint_facts(meta.get("fingerprint"))
    rig = rig_of(meta)
    specialisation = specialisation_of(meta)
    for record in result_set.aliases:
        if record.errors or not record.runs:
            into.ignored.append(f"{path}: {record_name(record)} not followed (it failed: "
                                f"{'; '.join(record.errors) or 'no run measured'})")
            continue
        disturbed = disturbance(record)
        if disturbed is not None:  # something else ran in its window: no step, pick or alert is made on it
            into.skips.append(Skip(path, when, record_name(record), f"measured, but {disturbed}"))
            continue
        # the specialisation is shown where the label does not already say it (sweep targets are named after it)
        name = record_name(record) + (f" on {specialisation}" if specialisation and specialisation != record.target
                                      else "")
        into.points.append(Point(path, when, record.alias, name, config_args(record.preset_args),
                                 model_of(record.preset_args, record.model_bytes), protocol,
                                 build_of(meta, record), rig, record, printed, specialisation))


def results_files(paths: Iterable[Path]) -> list[Path]:
    """The files given, and every ``*.toml`` under the folders given (hidden partial files left out)."""
    out: dict[Path, None] = {}
    for path in paths:
        if path.is_dir():
            out.update(dict.fromkeys(p for p in sorted(path.rglob("*.toml")) if not p.name.startswith(".")))
        elif path.exists():
            out[path] = None
        else:
            raise HistoryInputError(f"{path}: no such file or folder; name results files or the folder that "
                                    "holds them (the watch's: /var/lib/llm-bench/history)")
    return list(out)


def read_inputs(paths: Sequence[Path]) -> Inputs:
    inputs = Inputs()
    seen: set[Path] = set()
    for path in results_files(paths):
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        try:
            data = read_toml(path)
        except ResultsFileError as e:
            raise HistoryInputError(f"{e}; move it out of the folder (or delete it) and run history again") from e
        points_of(path, data, inputs)
    return inputs
