"""One command for the report's comparison: every specialisation (and other engines) in turn.

For each target the sweep switches the machine to it, checks from the marker under /etc that
the expected build is the one serving, measures its presets with the ``run`` protocol, and in
the end, on a failure or on Ctrl-C, switches back to the configuration that was active when it
started. Results accumulate in one folder; a sweep started again on the same folder measures
only what is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llm_bench.engines import DEFAULT_ENGINE, ENGINES, capabilities_of
from llm_bench.engines.switch import (
    EngineSide,
    FreeMode,
    RouterSide,
    SwitchError,
    bring_up,
    router_answers,
    run_command,
    tear_down,
)
from llm_bench.plan import (
    DEFAULT_URL,
    ApiKeySource,
    Plan,
    PlanError,
    Protocol,
    protocol_from_mapping,
)
from llm_bench.report import find_baseline, load_sets, markdown_table, rows_of, summary
from llm_bench.report.chart import draw_chart
from llm_bench.report.html import write_html
from llm_bench.results import FORMAT, ResultSet, ResultsWriter, load_results, reserved_order, results_stem
from llm_bench.runner import RunAborted, run_plan
from llm_bench.support.plotting import ChartError
from llm_bench.support.poll import poll_until
from llm_bench.support.progress import progress
from llm_bench.validation import check_keys, check_url
from llm_bench.workloads import PARTS

Log = Callable[[str], None]

MARKER_FORMAT = "llm-bench-llama-cpp-active/1"
DEFAULT_MARKER = Path("/etc/llama-cpp/active.json")
# After one switch, /run/current-system is the specialisation itself, which has no
# specialisation/ folder; the system profile always holds the base and all its specialisations.
DEFAULT_SYSTEM = "/nix/var/nix/profiles/system"
DEFAULT_SWITCH = "{system_path}/bin/switch-to-configuration test"
BASE = "base"


class SweepError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    name: str
    engine: str = DEFAULT_ENGINE
    specialisation: str = BASE
    presets: tuple[str, ...] = ()  # empty: every preset the router lists
    expect_package: str | None = None
    switch_command: str | None = None
    # openai targets
    url: str | None = None
    up_command: str | None = None
    down_command: str | None = None
    workdir: Path | None = None
    model: str | None = None
    router_mode: FreeMode = "unload"
    api_key: ApiKeySource = ApiKeySource()
    ready_timeout_s: float = 1800.0

    @property
    def routed(self) -> bool:
        """Served by the machine's router (its presets, switched to through a specialisation), rather than
        by an engine brought up beside the router."""
        return capabilities_of(self.engine).presets


@dataclass(frozen=True)
class SweepPlan:
    targets: tuple[Target, ...]
    output_dir: Path
    protocol: Protocol = Protocol()
    url: str = DEFAULT_URL
    marker: Path = DEFAULT_MARKER
    system: str = DEFAULT_SYSTEM
    switch_command: str = DEFAULT_SWITCH
    unit: str = "llama-cpp.service"
    switch_timeout_s: float = 600.0
    baseline: str | None = None
    api_key: ApiKeySource = ApiKeySource()  # the machine's router's, when it was started with --api-key


TARGET_KEYS = {f for f in Target.__dataclass_fields__} - {"api_key"} | {"api_key_file", "api_key_env"}
SWEEP_KEYS = {"targets", "output_dir", "protocol", "url", "api_key_file", "api_key_env", "marker", "system",
              "switch_command", "unit", "switch_timeout_s", "baseline"}


def _target(data: dict[str, Any], relative_to: Path) -> Target:
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise PlanError("every [[targets]] entry needs a name")
    check_keys(f"target {name!r}", data, TARGET_KEYS)
    values = {k: v for k, v in data.items() if k not in ("api_key_file", "api_key_env")}
    values["presets"] = tuple(values.get("presets", ()))
    if "workdir" in values:
        values["workdir"] = relative_to / values["workdir"]
    key_file = data.get("api_key_file")
    values["api_key"] = ApiKeySource(None if key_file is None else relative_to / key_file, data.get("api_key_env"))
    target = Target(**values)
    check_url(target.url, f"target {name!r}: url")
    if target.engine not in ENGINES:
        raise PlanError(f"target {name!r}: engine must be {' or '.join(ENGINES)}, not {target.engine!r}")
    if not target.routed:
        missing = [k for k in ("url", "up_command", "down_command") if not getattr(target, k)]
        if missing:
            raise PlanError(f"target {name!r} (engine {target.engine}) needs {', '.join(missing)}")
    return target


def sweep_plan_from_mapping(data: dict[str, Any], relative_to: Path) -> SweepPlan:
    check_keys("sweep plan", data, SWEEP_KEYS)
    targets = tuple(_target(t, relative_to) for t in data.get("targets", []))
    if not targets:
        raise PlanError("sweep plan: no [[targets]]; name at least one specialisation or engine")
    check_url(data.get("url", DEFAULT_URL), "sweep plan: url")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise PlanError(f"sweep plan: target names must be unique, got {', '.join(names)}")
    return SweepPlan(
        targets=targets,
        output_dir=relative_to / data.get("output_dir", "sweep-results"),
        protocol=protocol_from_mapping(data.get("protocol", {}), relative_to=relative_to),
        url=data.get("url", DEFAULT_URL),
        marker=Path(data.get("marker", DEFAULT_MARKER)),
        system=data.get("system", DEFAULT_SYSTEM),
        switch_command=data.get("switch_command", DEFAULT_SWITCH),
        unit=data.get("unit", "llama-cpp.service"),
        switch_timeout_s=float(data.get("switch_timeout_s", 600.0)),
        baseline=data.get("baseline"),
        api_key=ApiKeySource(None if data.get("api_key_file") is None else relative_to / data["api_key_file"],
                             data.get("api_key_env")),
    )


# --- the machine's state ---------------------------------------------------------------------

def read_marker(path: Path) -> dict[str, Any]:
    try:
        marker = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise SweepError(f"no marker at {path}: is the llm-bench llama-cpp NixOS module active on this machine? "
                         "(set `marker` in the sweep plan if it lives elsewhere)") from e
    except json.JSONDecodeError as e:
        raise SweepError(f"the marker {path} is not JSON: {e}") from e
    if marker.get("format") != MARKER_FORMAT:
        raise SweepError(f"the marker {path} has format {marker.get('format')!r}, expected {MARKER_FORMAT!r}")
    return marker


def switch_command(plan: SweepPlan, specialisation: str, override: str | None = None) -> str:
    system_path = plan.system if specialisation == BASE else f"{plan.system}/specialisation/{specialisation}"
    return (override or plan.switch_command).format(system_path=system_path, system=plan.system,
                                                     specialisation=specialisation)


def _unit_active(unit: str) -> bool:
    if not unit or shutil.which("systemctl") is None:
        return True
    return subprocess.run(["systemctl", "is-active", "--quiet", unit]).returncode == 0


def switch_to(plan: SweepPlan, specialisation: str, log: Log, override: str | None = None,
              expect_package: str | None = None) -> dict[str, Any]:
    """Run the switch, wait for the unit and the router, and return the marker once it is the expected one."""
    try:
        run_command(switch_command(plan, specialisation, override), what=f"switching to {specialisation}",
                    timeout=plan.switch_timeout_s, log=log)
    except SwitchError as e:
        raise SweepError(f"switching to {specialisation} failed: {e}") from e
    key = plan.api_key.read()
    if not poll_until(lambda: (_unit_active(plan.unit) and router_answers(plan.url, api_key=key)) or None,
                      timeout=plan.switch_timeout_s, interval=1.0):
        raise SweepError(f"after switching to {specialisation}, {plan.unit or 'the router'} did not answer "
                         f"on {plan.url} within {plan.switch_timeout_s:.0f} s")
    marker = read_marker(plan.marker)
    if marker.get("specialisation") != specialisation:
        raise SweepError(f"refusing to measure: expected specialisation {specialisation!r} after the switch, but "
                         f"{plan.marker} says {marker.get('specialisation')!r}")
    package = (marker.get("package") or {}).get("name")
    if expect_package and package != expect_package:
        raise SweepError(f"refusing to measure: {specialisation!r} should serve llama.cpp package "
                         f"{expect_package!r}, but {plan.marker} says {package!r}")
    log(f"active: {specialisation}, {package} {(marker.get('package') or {}).get('version', '')}".rstrip())
    return marker


# --- resuming --------------------------------------------------------------------------------

def measured_sets(output_dir: Path) -> list[ResultSet]:
    """Every run results file of the sweep folder, oldest first (merged sets excluded)."""
    sets = []
    for path in sorted(output_dir.glob("llm-bench-*.toml"), key=reserved_order):
        result_set = load_results(path, PARTS)
        if not result_set.meta.get("sweep_merged"):
            sets.append(result_set)
    return sets


def done_configurations(sets: list[ResultSet]) -> set[tuple[str, str]]:
    return {(r.target, r.alias) for s in sets for r in s.aliases if r.runs and not r.errors}


# --- the sweep -------------------------------------------------------------------------------

@dataclass
class SweepOutcome:
    merged: Path | None = None
    failures: dict[str, str] = field(default_factory=dict)
    measured: list[Path] = field(default_factory=list)


def _measure_routed(plan: SweepPlan, target: Target, done: set[tuple[str, str]], log: Log) -> Path | None:
    wanted = target.presets
    if wanted and all((target.name, a) in done for a in wanted):
        log(f"target {target.name}: every preset already measured, skipping")
        return None
    marker = switch_to(plan, target.specialisation, log, target.switch_command, target.expect_package)
    aliases = wanted or tuple(marker.get("presets") or ())
    todo = tuple(a for a in aliases if (target.name, a) not in done)
    if aliases and not todo:
        log(f"target {target.name}: every preset already measured")
        return None
    skipped = len(aliases) - len(todo)
    if skipped:
        log(f"target {target.name}: {skipped} preset(s) already measured, resuming with {', '.join(todo)}")
    run = Plan(url=plan.url, aliases=todo, label=target.name, output_dir=plan.output_dir, protocol=plan.protocol,
               api_key=plan.api_key)
    return run_plan(run, log, target=target.name).path


def _measure_beside(plan: SweepPlan, target: Target, done: set[tuple[str, str]], log: Log) -> Path | None:
    if target.model and (target.name, target.model) in done:
        log(f"target {target.name}: already measured, skipping")
        return None
    url, up, down = target.url, target.up_command, target.down_command
    if not (url and up and down):  # a plan without them is refused when it is read
        raise PlanError(f"target {target.name!r} (engine {target.engine}) needs url, up_command and down_command")
    engine = EngineSide(url=url, up_command=up, down_command=down, model=target.model, workdir=target.workdir,
                        api_key=target.api_key.read(), name=target.name, ready_timeout_s=target.ready_timeout_s)
    router = RouterSide(url=plan.url, mode=target.router_mode, api_key=plan.api_key.read())
    try:
        started = bring_up(engine, router, log)
    except SwitchError as e:
        raise SweepError(str(e)) from e
    try:
        run = Plan(url=url, aliases=(started.model,), label=target.name, output_dir=plan.output_dir,
                   protocol=replace(plan.protocol, unload_after=False), engine=target.engine, api_key=target.api_key)
        return run_plan(run, log, target=target.name).path
    finally:
        tear_down(engine, router, started.router, log)


def run_sweep(plan: SweepPlan, log: Log) -> SweepOutcome:
    original = read_marker(plan.marker).get("specialisation", BASE)
    log(f"sweep of {len(plan.targets)} target(s); active now: {original}; results in {plan.output_dir}")
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    done = done_configurations(measured_sets(plan.output_dir))
    if done:
        log(f"resuming: {len(done)} configuration(s) already measured in {plan.output_dir}")
    outcome = SweepOutcome()
    try:
        durations: list[float] = []
        for n, target in enumerate(plan.targets, 1):
            log(f"== target {target.name} ({target.engine}): {progress(n, len(plan.targets), durations)}")
            started = time.perf_counter()
            try:
                measure = _measure_routed if target.routed else _measure_beside
                path = measure(plan, target, done, log)
                if path is not None:
                    outcome.measured.append(path)
                    durations.append(time.perf_counter() - started)  # skipped targets would say "no time left"
            except (SweepError, RunAborted, PlanError) as e:
                outcome.failures[target.name] = str(e)
                log(f"target {target.name} FAILED: {e}")
    finally:
        _switch_back(plan, original, log)
    outcome.merged = write_merged(plan, log)
    return outcome


def _switch_back(plan: SweepPlan, original: str, log: Log) -> None:
    try:
        current = read_marker(plan.marker).get("specialisation")
    except SweepError:
        current = None
    if current == original:
        log(f"already back on {original}")
        return
    override = next((t.switch_command for t in plan.targets
                     if t.routed and t.specialisation == original and t.switch_command), None)
    log(f"switching back to {original}, the configuration active when the sweep started")
    switch_to(plan, original, log, override)


def default_baseline(plan: SweepPlan) -> str | None:
    """The control: the first preset of the base system's target, unless the plan names one."""
    if plan.baseline:
        return plan.baseline
    for t in plan.targets:
        if t.routed and t.specialisation == BASE and t.presets:
            return f"{t.name} / {t.presets[0]}"
    return None


def write_merged(plan: SweepPlan, log: Log) -> Path | None:
    sets = measured_sets(plan.output_dir)
    if not sets:
        return None
    return merge_sets(plan.output_dir, sets, "sweep", [t.name for t in plan.targets], plan.protocol.to_toml(), log)


def merge_sets(output_dir: Path, sets: list[ResultSet], label: str, targets: list[str], protocol: dict[str, Any],
               log: Log) -> Path:
    """One results file of every record of ``sets``, each keeping its target; a later measurement of the same
    target and configuration replaces an earlier one. Marked ``sweep_merged``, so it is never merged again."""
    now = datetime.now(timezone.utc)
    meta = {"format": FORMAT, "sweep_merged": True, "label": label, "created_at": now.isoformat(timespec="seconds"),
            "targets": targets, "sources": [s.meta.get("started_at", "") for s in sets],
            "protocol": protocol, "complete": True}
    latest = {(r.target, r.configuration): r for s in sets for r in s.aliases}  # a later attempt replaces
    records = list(latest.values())
    writer = ResultsWriter(output_dir, ResultSet(meta, []), results_stem(now, "merged", kind=label))
    writer.extend(records)
    log(f"merged results: {writer.path}")
    return writer.path


def report_sweep(plan: SweepPlan, merged: Path, failures: dict[str, str], baseline: str | None, log: Log) -> str:
    """report.md, chart.png and report.html beside the merged results; returns the summary and the table."""
    sets = load_sets([merged])
    rows = rows_of(sets)
    try:
        base = find_baseline(rows, baseline or default_baseline(plan))
    except ValueError as e:
        log(f"no baseline: {e}")
        base = None
    table = markdown_table(rows, base)
    text = summary(rows, base, failures)
    (plan.output_dir / "report.md").write_text(text + "\n" + table)
    try:
        draw_chart(rows, plan.output_dir / "chart.png", base, "Decode speed by configuration, all targets")
    except ChartError as e:
        log(f"no chart: {e}")
    write_html(plan.output_dir / "report.html", sets, base.configuration if base else None, rows=rows,
               title="llm-bench sweep: decode speed by configuration", failures=failures)
    log(f"Merged results: {merged}\nReport: {plan.output_dir / 'report.md'}\nChart: {plan.output_dir / 'chart.png'}"
        f"\nHTML report: {plan.output_dir / 'report.html'}")
    return text + "\n" + table
