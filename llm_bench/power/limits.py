"""Power-limit sweeps, and the restore that makes them safe.

Before the first limit is changed, the original limits are written to a state file
(``$LLM_BENCH_STATE_DIR/power-restore.json``, default ``$XDG_STATE_HOME/llm-bench/`` or
``~/.local/state/llm-bench/``). The sweep restores them on a normal end, an error, Ctrl-C and
SIGTERM, then removes the file. A process killed outright (SIGKILL, power loss) cannot; the
next llm-bench start of any command finds the file, restores the limits and says so.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llm_bench.gpu.nvml import Nvml, PowerLimitError
from llm_bench.support.numbers import fmt
from llm_bench.support.plotting import figure

Log = Callable[[str], None]
STATE_ENV = "LLM_BENCH_STATE_DIR"
STATE_NAME = "power-restore.json"


def state_path(env: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if env is None else env
    if environ.get(STATE_ENV):
        return Path(environ[STATE_ENV]) / STATE_NAME
    base = Path(environ["XDG_STATE_HOME"]) if environ.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    return base / "llm-bench" / STATE_NAME


def _pid_is_llm_bench(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # alive, and we cannot tell what it is: leave its limits alone
    return b"llm-bench" in cmdline or b"llm_bench" in cmdline


def save_originals(path: Path, originals: dict[int, float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(path.name + ".partial")
    staged.write_text(json.dumps({
        "pid": os.getpid(),
        "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "limits_w": {str(i): w for i, w in originals.items()},
    }, indent=1))
    os.replace(staged, path)  # on disk, whole, before the first limit changes
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore(nvml: Nvml, originals: dict[int, float], log: Log) -> list[str]:
    """Set every GPU back to its original limit; returns the failures (empty when all went back)."""
    failures = []
    for index, watts in sorted(originals.items()):
        try:
            current = nvml.power_limits(index)
        except Exception:  # cannot read it: set it anyway
            current = None
        if current is not None and abs(current.current_w - watts) < 0.5:
            log(f"GPU{index}: power limit is at its original {watts:.0f} W")
            continue
        try:
            nvml.set_power_limit(index, watts)
            log(f"GPU{index}: power limit restored to {watts:.0f} W")
        except PowerLimitError as e:
            failures.append(str(e))
            log(f"GPU{index}: could not restore the power limit to {watts:.0f} W: {e}")
    return failures


def restore_leftover(log: Log, nvml: Nvml | None = None, path: Path | None = None) -> bool | None:
    """Called at every llm-bench start: restore limits a killed sweep left behind.

    Returns None when there was nothing to do, True when limits were restored, False when the
    file is kept (its sweep is still running, or restoring failed).
    """
    path = path or state_path()
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
        originals = {int(i): float(w) for i, w in state["limits_w"].items()}
    except (OSError, ValueError, KeyError) as e:
        log(f"llm-bench: ignoring an unreadable power-limit state file {path} ({e}); remove it by hand")
        return False
    pid = int(state.get("pid", 0))
    if pid and pid != os.getpid() and _pid_is_llm_bench(pid):
        return False  # a sweep in progress elsewhere owns these limits
    log(f"llm-bench: found {path}: a power sweep (pid {pid}, started {state.get('saved_at', '?')}) ended without "
        "restoring the GPU power limits; restoring them now")
    with (nvml or Nvml()) as gpus:
        if not gpus.available:
            log(f"llm-bench: cannot restore power limits: {gpus.unavailable}; {path} is kept for the next start")
            return False
        failures = restore(gpus, originals, log)
    if failures:
        log(f"llm-bench: {path} is kept so that the next start tries again")
        return False
    path.unlink(missing_ok=True)
    return True


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that every ``finally`` runs."""


@contextmanager
def sigterm_raises() -> Iterator[None]:
    def handler(signum, frame):
        raise Terminated(f"received signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class LimitResult:
    limit_w: float
    decode_tps: float | None = None
    output_tokens: int = 0
    energy_j: float | None = None
    energy_source: str | None = None
    tokens_per_joule: float | None = None
    mean_power_w: float | None = None
    max_temperature_c: float | None = None
    mean_sm_clock_mhz: float | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_toml(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


Measure = Callable[[float], LimitResult]


def check_limits(nvml: Nvml, gpus: Sequence[int], limits_w: Sequence[float]) -> dict[int, float]:
    """Validate the sweep against each GPU's constraints; returns the original limits."""
    originals = {}
    count = nvml.count()
    for i in gpus:
        if not 0 <= i < count:
            raise PowerLimitError(f"no GPU{i}: NVML sees {count} GPU(s)")
        limits = nvml.power_limits(i)
        if limits is None:
            raise PowerLimitError(f"GPU{i} does not report a power limit")
        bad = [w for w in limits_w if (limits.min_w and w < limits.min_w) or (limits.max_w and w > limits.max_w)]
        if bad:
            raise PowerLimitError(f"GPU{i} accepts limits from {limits.min_w:.0f} to {limits.max_w:.0f} W; "
                                  f"{', '.join(f'{w:g}' for w in bad)} W is outside that range")
        originals[i] = limits.current_w
    return originals


def sweep(nvml: Nvml, gpus: Sequence[int], limits_w: Sequence[float], measure: Measure, log: Log,
          settle_s: float = 5.0, path: Path | None = None,
          on_result: Callable[[LimitResult], None] = lambda r: None) -> list[LimitResult]:
    """Measure at each limit on every chosen GPU; the originals come back on every exit path."""
    path = path or state_path()
    originals = check_limits(nvml, gpus, limits_w)
    save_originals(path, originals)
    log(f"Original power limits saved to {path}: "
        + ", ".join(f"GPU{i} {w:.0f} W" for i, w in originals.items()))
    results = []
    restored = False
    try:
        with sigterm_raises():
            for limit in limits_w:
                for i in gpus:
                    nvml.set_power_limit(i, limit)
                log(f"Power limit {limit:.0f} W on " + ", ".join(f"GPU{i}" for i in gpus)
                    + (f"; settling {settle_s:.0f} s" if settle_s else ""))
                time.sleep(settle_s)
                result = measure(limit)
                results.append(result)
                on_result(result)
                log(f"  {limit:.0f} W: {fmt(result.decode_tps)} t/s, {fmt(result.tokens_per_joule, 3)} tokens/J, "
                    f"{fmt(result.mean_power_w)} W mean, {fmt(result.max_temperature_c, 0)} C max")
    finally:
        failures = restore(nvml, originals, log)
        if not failures:
            path.unlink(missing_ok=True)
            restored = True
        else:
            log(f"Power limits NOT all restored; {path} is kept and the next llm-bench start retries")
    if not restored:
        raise PowerLimitError("could not restore every original power limit")
    return results


def draw_power_chart(results: Sequence[LimitResult], path: Path, title: str | None = None) -> Path:
    """Decode t/s and tokens per joule against the power limit; temperature written at each point."""

    done = [(r, r.decode_tps) for r in results if r.decode_tps is not None]
    if not done:
        raise ValueError("no limit has a decode rate to draw")
    with figure(path, dpi=110, figsize=(8, 4.5)) as (fig, ax):
        xs = [r.limit_w for r, _ in done]
        ax.plot(xs, [tps for _, tps in done], "o-", color="#2b6cb0", label="decode t/s")
        ax.set_xlabel("power limit (W)")
        ax.set_ylabel("decode tokens/s", color="#2b6cb0")
        ax.set_ylim(0, max(tps for _, tps in done) * 1.25)
        for r, tps in done:
            if r.max_temperature_c is not None:
                ax.annotate(f"{r.max_temperature_c:.0f} C", (r.limit_w, tps), textcoords="offset points",
                            xytext=(0, 8), ha="center", fontsize=8, color="#742a2a")
        eff = [(r.limit_w, r.tokens_per_joule) for r, _ in done if r.tokens_per_joule is not None]
        if eff:
            ax2 = ax.twinx()
            ax2.plot([w for w, _ in eff], [tpj for _, tpj in eff], "s--", color="#2f855a", label="tokens per joule")
            ax2.set_ylabel("tokens per joule", color="#2f855a")
            ax2.set_ylim(0, max(tpj for _, tpj in eff) * 1.25)
            ax2.spines[["top"]].set_visible(False)
        ax.set_xticks(xs)
        ax.set_title(title or "Power-limit sweep: decode speed and efficiency (labels: max GPU temperature)")
        ax.spines[["top"]].set_visible(False)
    return path
