"""``llm-bench history``'s flow: read the files and folders, judge every step, prune to the newest N per
configuration, and write a skip record when the watch did not measure (with why)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from llm_bench.fingerprint import Sources
from llm_bench.gpu.nvml import Nvml
from llm_bench.history.points import SKIP_FORMAT, Inputs, made_order, read_inputs
from llm_bench.history.steps import History, history_of
from llm_bench.provenance import provenance
from llm_bench.results import reserve_path, results_stem, write_toml


@dataclass(frozen=True)
class Outcome:
    history: History
    inputs: Inputs

    @property
    def newest_is_regression(self) -> bool:
        return bool(self.history.newest_regressions())


def run_history(paths: Sequence[Path], min_effect: float | None = None) -> Outcome:
    inputs = read_inputs(paths)
    return Outcome(history_of(inputs.points, min_effect), inputs)


def prune(outcome: Outcome, folders: Sequence[Path], keep: int) -> list[Path]:
    """Delete the files under ``folders`` none of whose results is among the newest ``keep`` of its configuration
    (skip records: the newest ``keep`` of their alias); files of other kinds are left alone. The deleted files."""
    if keep < 1:
        raise ValueError(f"--keep {keep}: keep at least the newest result of each configuration (1 or more)")
    kept: set[Path] = set()
    every: set[Path] = set()
    series: dict[tuple[str, ...], list] = {}
    for p in outcome.inputs.points:
        series.setdefault(p.series, []).append(p)
        every.add(p.path)
    for members in series.values():
        kept.update(p.path for p in sorted(members, key=made_order)[-keep:])
    skips: dict[str, list] = {}
    for s in outcome.inputs.skips:
        skips.setdefault(s.alias, []).append(s)
        every.add(s.path)
    for members in skips.values():
        kept.update(s.path for s in sorted(members, key=made_order)[-keep:])
    roots = [f.resolve() for f in folders]
    removed = []
    for path in sorted(every - kept):
        if any(path.resolve().is_relative_to(root) for root in roots):
            path.unlink()
            removed.append(path)
    return removed


def write_skip(output_dir: Path, alias: str, reason: str, nvml: Nvml | None = None,
               sources: Sources | None = None) -> Path:
    """A skip record in the history: the alias the watch did not measure, why, and the rig at that moment."""
    now = datetime.now(timezone.utc)
    with nvml or Nvml() as gpus:
        meta = provenance(SKIP_FORMAT, gpus, now, sources=sources) | {"alias": alias, "reason": reason,
                                                                      "complete": True}
    path = reserve_path(output_dir, results_stem(now, f"skip-{alias}"))
    write_toml(path, {"meta": {k: v for k, v in meta.items() if v is not None}})
    return path
