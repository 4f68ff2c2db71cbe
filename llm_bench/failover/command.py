"""The flow of ``llm-bench failover``: probe the proxy, start the load, stop the primary, wait, start it
again, wait for its return, and keep every request on disk as it ends.

Whatever happens after the stop command ran (its failure, a failed check, Ctrl-C, any error), the start
command runs before the function returns or raises: a failover run never leaves the primary down.
"""

from __future__ import annotations

import platform
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from llm_bench import __version__
from llm_bench.engines.client import proxy_route
from llm_bench.engines.errors import RequestRefused, ServerError, ServerUnreachable
from llm_bench.engines.openai import OpenAIEngine
from llm_bench.engines.stream import ChatRequest
from llm_bench.failover.load import SteadyLoad
from llm_bench.failover.records import Command, FailoverRun, Request
from llm_bench.results import reserve_path, results_stem, write_toml

Log = Callable[[str], None]

# A primary that still answers a request sent this long after the stop command returned was not stopped
# (a request in flight at the stop may still end on it).
STOP_GRACE_S = 1.0
COMMAND_OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class FailoverSettings:
    url: str
    model: str
    stop_command: str
    start_command: str
    prompt: str
    primary: str | None = None  # the primary's api_base as the proxy names it; default: whoever answers first
    before_s: float = 10.0
    down_s: float = 20.0
    after_s: float = 10.0
    return_timeout_s: float = 120.0
    streams: int = 1
    max_tokens: int = 32
    max_requests: int = 2000
    request_timeout_s: float = 60.0
    command_timeout_s: float = 300.0
    output_dir: Path = Path(".")
    api_key: str | None = None


class FailoverError(Exception):
    """The run could not go on; ``path`` is the file that holds what was measured (None: nothing was), written
    and closed before the error reaches the caller."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message)
        self.path = path


class ProxyProblem(FailoverError):
    """Before anything was stopped: the proxy is unreachable, is not a LiteLLM proxy, or already answers
    from a fallback."""


class CommandFailed(FailoverError):
    """The stop or start command exited non-zero or ran past its time."""


class FailoverInterrupted(FailoverError):
    """Ctrl-C; the primary was started again when it had been stopped."""


@dataclass
class FailoverOutcome:
    path: Path
    run: FailoverRun
    problems: list[str] = field(default_factory=list)


class ResultsFile:
    """The run's file, rewritten whole (atomically) before and after each command, at the end, and at most
    every REWRITE_S while requests end (a fast backend answers dozens a second; rewriting the whole file
    after each would slow the load it measures)."""

    REWRITE_S = 1.0

    def __init__(self, output_dir: Path, run: FailoverRun, meta: dict):
        self.run, self.meta = run, meta
        self.path = reserve_path(output_dir, results_stem(datetime.now(timezone.utc), "failover"))
        self._lock = threading.Lock()
        self._closed = False
        self._written_at = 0.0
        self.flush()

    def add(self, request: Request) -> None:
        with self._lock:
            if self._closed:  # ended after the run did: not part of it
                return
            self.run.requests.append(request)
            if time.monotonic() - self._written_at >= self.REWRITE_S:
                self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def close(self) -> None:
        with self._lock:
            self.meta["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            self._write()
            self._closed = True

    def _write(self) -> None:
        write_toml(self.path, self.run.to_toml(self.meta))
        self._written_at = time.monotonic()


def run_command(command: Command, timeout: float, now: Callable[[], float]) -> None:
    """Run it in a shell; its exit code and the end of its output go into the record."""
    try:
        done = subprocess.run(command.command, shell=True, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=timeout)
        command.exit_code = done.returncode
        command.output = (done.stdout + done.stderr)[-COMMAND_OUTPUT_CHARS:]
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        command.output = (out.decode(errors="replace") if isinstance(out, bytes) else out)[-COMMAND_OUTPUT_CHARS:]
        command.output += f"\n(killed after {timeout:g} s)"
    finally:
        command.ended_s = now()


def _command_failure(what: str, command: Command) -> str | None:
    if command.exit_code == 0:
        return None
    how = "ran past its time" if command.exit_code is None else f"exited with code {command.exit_code}"
    tail = command.output.strip().splitlines()[-3:]
    return f"the {what} command `{command.command}` {how}" + (f": {' / '.join(tail)}" if tail else "")


def probe(engine: OpenAIEngine, request: ChatRequest, settings: FailoverSettings,
          now: Callable[[], float]) -> Request:
    """The first request, before the load: the proxy answers, names its backend, and not a fallback.

    It is not streamed: LiteLLM 1.80 adds x-litellm-attempted-fallbacks only to a whole answer (a stream's
    headers leave before its router knows)."""
    body = {**request.with_unique_start().body(), "stream": False}
    body.pop("stream_options")
    sent = now()
    try:
        response = engine.client.post("/v1/chat/completions", body)
    except ServerUnreachable as e:
        raise ProxyProblem(f"the proxy cannot be reached at {settings.url} ({e.__cause__}); is --url right?") from e
    except RequestRefused as e:
        raise ProxyProblem(f"the proxy did not answer the first request: {e}; are all its backends down, or is "
                           f"--model {settings.model!r} not one of its model groups?") from e
    except ServerError as e:
        raise ProxyProblem(f"the proxy did not answer the first request: {e}") from e
    backend, overhead_ms, fallbacks = proxy_route(response.headers)
    if backend is None:
        raise ProxyProblem(f"{settings.url} answered without naming the backend (no x-litellm-model-api-base "
                           "header): failover measures through a LiteLLM proxy; give the proxy's URL")
    if settings.primary is not None and backend != settings.primary:
        raise ProxyProblem(f"the proxy answers from {backend}, not from the primary {settings.primary}: is the "
                           "primary already down? Start it, or name the backend that answers in --primary")
    if settings.primary is None and fallbacks:
        raise ProxyProblem(f"the proxy already answers from a fallback ({backend}, after {fallbacks} attempted "
                           "fallback(s)): the primary is down before the stop; start it first")
    try:
        tokens = int(response.json()["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        tokens = None
    return Request(sent, now(), ok=True, backend=backend, fallbacks=fallbacks, output_tokens=tokens,
                   proxy_overhead_ms=overhead_ms)


def _wait(load: SteadyLoad, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
    """Up to ``seconds`` of load; sooner when ``until`` holds or the load has ended (--max-requests)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and load.running and not until():
        time.sleep(0.05)


def outage_problem(run: FailoverRun) -> str | None:
    """What went wrong between the stop and the start, judged by which backend answered what."""
    assert run.stop is not None and run.stop.ended_s is not None
    end = run.start.started_s if run.start else float("inf")
    window = [r for r in run.requests if r.sent_s >= run.stop.ended_s + STOP_GRACE_S and r.sent_s < end]
    primary = [r for r in window if r.ok and r.backend == run.primary]
    if primary:
        return (f"the stop command ran (exit code 0) but the primary {run.primary} kept answering: {len(primary)} "
                f"request(s) sent more than {STOP_GRACE_S:g} s after it returned were answered by it")
    if window and not any(r.ok for r in window):
        said = next(r.error for r in window if r.error)
        return (f"no request was answered while the primary was down ({len(window)} sent more than "
                f"{STOP_GRACE_S:g} s after the stop failed): can the proxy reach its fallback? The proxy said: {said}")
    return None


def run_failover(settings: FailoverSettings, log: Log) -> FailoverOutcome:
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()

    def now() -> float:
        return time.monotonic() - t0

    request = ChatRequest(settings.model, settings.prompt, settings.max_tokens, 0.0, 42, prompt_cache=False)
    engine = OpenAIEngine(settings.url, timeout=settings.request_timeout_s, api_key=settings.api_key,
                          streams=settings.streams)
    try:
        first = probe(engine, request, settings, now)
        run = FailoverRun(settings.url, settings.model, primary=settings.primary or first.backend, requests=[first])
        meta = {"llm_bench_version": __version__, "started_at": started_at.isoformat(timespec="seconds"),
                "host": platform.node(), "settings": {k: str(v) if isinstance(v, Path) else v
                                                      for k, v in asdict(settings).items()
                                                      if k not in ("prompt", "api_key") and v is not None}}
        results = ResultsFile(settings.output_dir, run, meta)
        log(f"primary: {run.primary}; results: {results.path}")
        load = SteadyLoad(engine, request, now, streams=settings.streams, max_requests=settings.max_requests - 1,
                          on_request=results.add)
        try:
            return _measure(settings, run, load, results, now, log)
        except KeyboardInterrupt as e:
            raise FailoverInterrupted("interrupted", results.path) from e
        finally:
            _restore(settings, run, results, now, log)
            load.stop(settings.request_timeout_s)
            run.ended_s = now()
            results.close()
    finally:
        engine.close()


def _restore(settings: FailoverSettings, run: FailoverRun, results: ResultsFile, now: Callable[[], float],
             log: Log) -> None:
    """The start command, when the stop command ran and the start command did not."""
    if run.stop is None or run.start is not None:
        return
    log(f"starting the primary again: {settings.start_command}")
    run.start = Command(settings.start_command, now())
    run_command(run.start, settings.command_timeout_s, now)
    results.flush()
    failure = _command_failure("start", run.start)
    if failure:
        log(f"{failure}; the primary may still be down")
        run.problems.append(failure)


def _measure(settings: FailoverSettings, run: FailoverRun, load: SteadyLoad, results: ResultsFile,
             now: Callable[[], float], log: Log) -> FailoverOutcome:
    load.start()
    log(f"load: {settings.streams} stream(s); {settings.before_s:g} s before the stop")
    _wait(load, settings.before_s)
    log(f"stopping the primary: {settings.stop_command}")
    run.stop = Command(settings.stop_command, now())
    results.flush()  # the start command runs from here on, whatever happens
    run_command(run.stop, settings.command_timeout_s, now)
    results.flush()
    failure = _command_failure("stop", run.stop)
    if failure:
        run.problems.append(failure)
        raise CommandFailed(failure, results.path)
    log(f"stopped in {run.stop.duration_s:.1f} s; {settings.down_s:g} s of load while it is down")
    _wait(load, settings.down_s)
    # The outage is judged by requests sent after the grace: wait for one of them to end.
    evidence_from = run.stop.ended_s + STOP_GRACE_S  # type: ignore[operator]
    _wait(load, settings.request_timeout_s, lambda: any(r.sent_s >= evidence_from for r in run.requests))
    problem = outage_problem(run)
    if problem:
        run.problems.append(problem)
        log(problem)
    log(f"starting the primary: {settings.start_command}")
    run.start = Command(settings.start_command, now())
    results.flush()
    run_command(run.start, settings.command_timeout_s, now)
    results.flush()
    failure = _command_failure("start", run.start)
    if failure:
        run.problems.append(failure)
        raise CommandFailed(f"{failure}; the primary may still be down", results.path)
    start = run.start

    def returned() -> bool:
        return any(r.ok and r.backend == run.primary and r.done_s >= start.started_s for r in run.requests)

    if not any("kept answering" in p for p in run.problems):
        _wait(load, settings.return_timeout_s, returned)
        if returned():
            log(f"the primary answers again; {settings.after_s:g} s more of load")
        else:
            run.problems.append(f"the primary {run.primary} answered no request within "
                                f"{settings.return_timeout_s:g} s of the start command")
    _wait(load, settings.after_s)
    if not load.running:
        run.problems.append(f"the load ended at --max-requests {settings.max_requests} before the run did")
    return FailoverOutcome(results.path, run, run.problems)
