"""Hand the GPU from the llama.cpp router to another engine (HyperQwen, vLLM) and back.

`bring_up` frees the GPU (unloads every model the router holds, or stops its service), runs
the engine's start command and waits until a real streamed completion succeeds through the
engine's OpenAI API: HyperQwen's /health answers while the engine is still compiling, and
an engine can boot, answer /health and then die on its first real prompt, so /health proves
nothing. If anything fails on the way, the engine's stop command runs and the router is
restored before the error is raised. `tear_down` stops the engine and restores the router.

Every command is a shell command line, so the tests (and issue 6's sweep) can substitute
their own; nothing here knows about Docker beyond the default command strings.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from llm_bench.engines.base import LOADED_STATES, SLEEPING
from llm_bench.engines.client import OpenAIClient, RouterClient
from llm_bench.engines.errors import ServerError
from llm_bench.engines.stream import ChatRequest, StreamMeasurement
from llm_bench.support.poll import poll_until

Log = Callable[[str], None]
FreeMode = Literal["unload", "service", "none"]

DEFAULT_ROUTER_URL = "http://127.0.0.1:48123"
LLAMA_CPP_STOP = "systemctl stop llama-cpp.service"
LLAMA_CPP_START = "systemctl start llama-cpp.service"

# HyperQwen (syv-ai/HyperQwen): compose service and profile "single", port 18020, served
# model name "qwen3.8-27b" (single-user/start_qwen.sh: --served-model-name qwen3.8-27b).
HYPERQWEN_URL = "http://127.0.0.1:18020"
HYPERQWEN_MODEL = "qwen3.8-27b"
HYPERQWEN_PROFILE = "single"
OVERRIDE_FILE = "docker-compose.override.yml"

PROBE_PROMPT = "Reply with the single word: ready"


class SwitchError(RuntimeError):
    """The switch failed; the message says which step, and what the router's state is now."""


def _quiet(_: str) -> None:
    pass


def compose_command(
    action: str,
    *,
    env_file: str | None = ".env",
    files: tuple[str, ...] = ("docker-compose.yml", OVERRIDE_FILE),
    profile: str | None = HYPERQWEN_PROFILE,
) -> str:
    """`docker compose ... up -d` or `... down` for HyperQwen's project with the CDI override."""
    argv = ["docker", "compose"]
    if env_file:
        argv += ["--env-file", env_file]
    for f in files:
        argv += ["-f", f]
    if profile:
        argv += ["--profile", profile]
    argv += ["up", "-d"] if action == "up" else [action]
    return shlex.join(argv)


@dataclass(frozen=True)
class RouterSide:
    """The llama.cpp router that owns the GPU while the other engine is down.

    mode "unload": unload every loaded model through the router's API (needs no privileges;
    a request that names a preset would load it again, so keep clients away meanwhile); with
    `reload`, restoring loads them again and waits until they are, instead of leaving them to load
    on their next request. mode "service": run `stop_command` (e.g. stop llama-cpp.service), and
    `start_command` to restore it. mode "none": leave the router alone. `api_key`: the key of a
    router started with --api-key, sent with every request to it.
    """

    url: str = DEFAULT_ROUTER_URL
    mode: FreeMode = "unload"
    stop_command: str = LLAMA_CPP_STOP
    start_command: str = LLAMA_CPP_START
    ready_timeout_s: float = 120.0
    unload_timeout_s: float = 120.0
    api_key: str | None = field(default=None, repr=False)
    reload: bool = False
    load_timeout_s: float = 900.0


@dataclass(frozen=True)
class EngineSide:
    """The engine to bring up: its start and stop commands and its OpenAI API."""

    url: str
    up_command: str
    down_command: str
    model: str | None = None  # None: the first id of GET /v1/models
    workdir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False)
    ready_timeout_s: float = 1800.0
    poll_s: float = 5.0
    request_timeout_s: float = 120.0
    command_timeout_s: float = 3600.0
    probe_max_tokens: int = 8
    name: str = "engine"


@dataclass
class RouterState:
    """What `free_gpu` did, so that `restore_router` undoes exactly that."""

    mode: FreeMode
    was_running: bool
    unloaded: list[str] = field(default_factory=list)
    # sleeping instances stopped: they held no model, so they are not loaded again (a request starts them)
    unloaded_sleeping: list[str] = field(default_factory=list)
    stopped: bool = False


@dataclass
class BringUpResult:
    router: RouterState
    model: str
    probe: StreamMeasurement
    ready_after_s: float


def run_command(command: str, *, what: str, workdir: Path | None = None, env: Mapping[str, str] | None = None,
                timeout: float = 3600.0, log: Log = _quiet) -> str:
    """Run a shell command line; raise SwitchError with its output's tail when it fails.

    The command runs in its own process group (session), and on a timeout or Ctrl-C the whole group
    is killed: whatever the shell started (a compose up, a server) must not keep running while the
    sweep moves on."""
    log(f"{what}: {command}" + (f"  (in {workdir})" if workdir else ""))
    with _sigint_deferred() as interrupted:
        try:
            proc = subprocess.Popen(
                command, shell=True, cwd=workdir, env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", start_new_session=True,
            )
        except OSError as e:  # e.g. a workdir that does not exist
            raise SwitchError(f"{what}: cannot run `{command}`: {e}") from e
    try:
        if interrupted:
            raise KeyboardInterrupt
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        kill_group(proc)
        raise SwitchError(f"{what}: `{command}` did not finish within {timeout:.0f} s; it and what it started "
                          "were killed") from e
    except BaseException:  # Ctrl-C (KeyboardInterrupt) or anything else: nothing it started may outlive us
        kill_group(proc)
        raise
    if proc.returncode != 0:
        tail = output.strip()[-2000:]
        raise SwitchError(f"{what}: `{command}` exited with code {proc.returncode}" + (f":\n{tail}" if tail else ""))
    return output


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[list[int]]:
    """Ctrl-C held back while the command starts: a KeyboardInterrupt inside Popen, after the fork and before
    Popen returns, would leave the command running with no handle to kill it (a switch that then completes
    behind the sweep's switch back). The list says whether one came; off the main thread, nothing is held."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, previous)


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group a command leads, then SIGKILL what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # the group is gone
        try:
            proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            continue  # a pipe held open by a survivor, or the leader itself: escalate
        if not _group_alive(proc.pid):
            break
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def router_answers(url: str, timeout: float = 5.0, api_key: str | None = None) -> bool:
    """The router is up: GET /models gets an answer of its own (200; or 401/403 from a router started with
    --api-key when the key is missing or wrong, so that freeing it fails loudly instead of finding nothing)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        return httpx.get(f"{url.rstrip('/')}/models", headers=headers, timeout=timeout).status_code in (200, 401, 403)
    except httpx.HTTPError:
        return False


def wait_for_router(url: str, timeout: float, poll: float = 0.5, api_key: str | None = None) -> None:
    if not poll_until(lambda: router_answers(url, api_key=api_key) or None, timeout=timeout, interval=poll):
        raise SwitchError(f"the router at {url} did not answer GET /models within {timeout:.0f} s")


def free_gpu(router: RouterSide, log: Log = _quiet) -> RouterState:
    """Unload the router's models or stop its service; return what was done. When unloading fails partway,
    what was unloaded is restored before the error is raised."""
    running = router_answers(router.url, api_key=router.api_key)
    state = RouterState(mode=router.mode, was_running=running)
    if router.mode == "none":
        log(f"leaving the router at {router.url} alone (--free-gpu none)")
        return state
    if router.mode == "service":
        run_command(router.stop_command, what="stopping the router", log=log)
        state.stopped = True
        return state
    if not running:
        log(f"router at {router.url} does not answer: nothing to unload")
        return state
    try:
        with RouterClient(router.url, api_key=router.api_key, timeout=30.0) as client:
            # a sleeping instance is a process with its GPU context, and a request would reload it onto the GPU
            busy = [m for m in client.models() if m.status in (*LOADED_STATES, SLEEPING)]
            for info in busy:
                log(f"unloading {info.id} ({info.status})")
                client.unload(info.id)
                (state.unloaded_sleeping if info.status == SLEEPING else state.unloaded).append(info.id)
            for info in busy:
                client.wait_for_status(info.id, "unloaded", router.unload_timeout_s)
    except ServerError:
        reload_models(router, state, log)
        raise
    if not busy:
        log("the router holds no loaded or sleeping model")
    return state


def reload_models(router: RouterSide, state: RouterState, log: Log = _quiet) -> None:
    """Load again what `free_gpu` unloaded and wait until the router says so; a model that will not load is
    said, not raised (the others still come back)."""
    if not state.unloaded:
        return
    with RouterClient(router.url, api_key=router.api_key, timeout=60.0) as client:
        for alias in state.unloaded:
            log(f"restoring the router: loading {alias} again")
            try:
                if client.model(alias).status != "loaded":
                    client.load(alias)
                client.wait_for_status(alias, "loaded", router.load_timeout_s)
            except ServerError as e:
                log(f"restoring {alias} on {router.url} failed: {e}")


def restore_router(router: RouterSide, state: RouterState | None = None, log: Log = _quiet) -> None:
    """Undo `free_gpu`: start the service again (service mode) and wait for GET /models.

    Without a state (a separate `down`), service mode starts the service and unload mode
    checks that the router answers; models unloaded earlier load again on their next request.
    """
    if router.mode == "none":
        return
    if router.mode == "service":
        if state is None or state.stopped:
            run_command(router.start_command, what="starting the router", log=log)
    elif state is not None and not state.was_running:
        return  # it was not running before; nothing to wait for
    log(f"waiting for the router at {router.url}")
    wait_for_router(router.url, router.ready_timeout_s, api_key=router.api_key)
    log("router is back")
    if router.mode == "unload" and router.reload and state is not None:
        reload_models(router, state, log)


def served_model(client: OpenAIClient) -> str:
    data = client.get_json("/v1/models").get("data") or []
    if not data:
        raise ServerError("GET /v1/models lists no model")
    return str(data[0]["id"])


def wait_until_serving(engine: EngineSide, log: Log = _quiet,
                       is_alive: Callable[[], bool] | None = None) -> tuple[str, StreamMeasurement, float]:
    """Poll with a real streamed completion until one succeeds; /health is never consulted.

    Returns (model, measurement, seconds waited). Raises SwitchError at the deadline with
    the last error the engine gave.
    """
    start = time.monotonic()
    last_error = "no answer yet"
    attempts = 0
    with OpenAIClient(engine.url, api_key=engine.api_key, timeout=engine.request_timeout_s) as client:

        def attempt() -> tuple[str, StreamMeasurement] | None:
            nonlocal attempts, last_error
            attempts += 1
            try:
                model = engine.model or served_model(client)
                probe = client.stream_chat(ChatRequest(
                    model=model, prompt=PROBE_PROMPT, max_tokens=engine.probe_max_tokens,
                    temperature=0.0, seed=0, ignore_eos=False,
                ))
                if probe.token_chunks > 0 or (probe.output_tokens or 0) > 0:
                    return model, probe
                last_error = "the completion streamed no token"
            except (ServerError, httpx.HTTPError, ValueError, KeyError, AttributeError, TypeError) as e:
                last_error = str(e) or type(e).__name__
            if is_alive is not None and not is_alive():
                raise SwitchError(f"{engine.name} stopped before serving a completion; last error: {last_error}")
            if attempts == 1 or attempts % 12 == 0:
                log(f"waiting for {engine.name} to serve a completion ({time.monotonic() - start:.0f} s): {last_error}")
            return None

        served = poll_until(attempt, timeout=engine.ready_timeout_s, interval=engine.poll_s)
    if served is None:
        raise SwitchError(
            f"{engine.name} at {engine.url} did not serve a completion within "
            f"{engine.ready_timeout_s:g} s ({attempts} attempts); last error: {last_error}"
        )
    model, probe = served
    waited = time.monotonic() - start
    log(f"{engine.name} served a completion after {waited:.0f} s ({probe.output_tokens} tokens, model {model!r})")
    return model, probe, waited


def bring_up(engine: EngineSide, router: RouterSide, log: Log = _quiet,
             is_alive: Callable[[], bool] | None = None) -> BringUpResult:
    """Free the GPU, start the engine, wait for a real completion.

    On any failure after the GPU was freed: the engine's stop command runs (best effort),
    the router is restored, and SwitchError is raised.
    """
    state = free_gpu(router, log)
    try:
        run_command(engine.up_command, what=f"starting {engine.name}", workdir=engine.workdir,
                    env=engine.env, timeout=engine.command_timeout_s, log=log)
        model, probe, waited = wait_until_serving(engine, log, is_alive)
    except BaseException as failure:  # KeyboardInterrupt too: never leave the GPU to nobody
        log(f"{engine.name} did not come up: {failure}")
        notes = _undo(engine, router, state, log)
        if isinstance(failure, SwitchError):
            raise SwitchError(f"{failure}\n{notes}") from failure
        if isinstance(failure, Exception):
            raise SwitchError(f"starting {engine.name} failed: {failure}\n{notes}") from failure
        raise
    return BringUpResult(router=state, model=model, probe=probe, ready_after_s=waited)


def _undo(engine: EngineSide, router: RouterSide, state: RouterState, log: Log) -> str:
    notes = []
    try:
        run_command(engine.down_command, what=f"stopping {engine.name}", workdir=engine.workdir,
                    env=engine.env, timeout=engine.command_timeout_s, log=log)
        notes.append(f"{engine.name} was stopped")
    except SwitchError as e:
        notes.append(f"stopping {engine.name} failed too: {e}")
    try:
        restore_router(router, state, log)
        notes.append("the router was restored" if router.mode != "none" else "the router was left alone")
    except SwitchError as e:
        notes.append(f"restoring the router failed: {e}")
    return "; ".join(notes) + "."


def tear_down(engine: EngineSide, router: RouterSide, state: RouterState | None = None, log: Log = _quiet) -> None:
    """Stop the engine, then restore the router; the router is restored even if stopping fails."""
    try:
        run_command(engine.down_command, what=f"stopping {engine.name}", workdir=engine.workdir,
                    env=engine.env, timeout=engine.command_timeout_s, log=log)
    finally:
        restore_router(router, state, log)


def hyperqwen_engine(
    directory: Path,
    *,
    url: str = HYPERQWEN_URL,
    model: str | None = HYPERQWEN_MODEL,
    env_file: str | None = ".env",
    override: str = OVERRIDE_FILE,
    profile: str = HYPERQWEN_PROFILE,
    up_command: str | None = None,
    down_command: str | None = None,
    api_key: str | None = None,
    ready_timeout_s: float = 1800.0,
) -> EngineSide:
    """HyperQwen's compose project in `directory`, with the CDI override, as an EngineSide."""
    files = ("docker-compose.yml", override)
    return EngineSide(
        name="HyperQwen",
        url=url,
        model=model,
        workdir=directory,
        up_command=up_command or compose_command("up", env_file=env_file, files=files, profile=profile),
        down_command=down_command or compose_command("down", env_file=env_file, files=files, profile=profile),
        api_key=api_key,
        ready_timeout_s=ready_timeout_s,
    )
