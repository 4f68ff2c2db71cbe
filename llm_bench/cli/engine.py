"""``llm-bench engine hyperqwen up|down``: hand the GPU between the llama.cpp router and HyperQwen."""

from __future__ import annotations

import os
from pathlib import Path

import click

from llm_bench.cli.exits import CouldNotRun, RanWithFailures
from llm_bench.cli.options import URL, api_key_source, log
from llm_bench.engines.errors import ServerError
from llm_bench.engines.switch import (
    DEFAULT_ROUTER_URL,
    HYPERQWEN_MODEL,
    HYPERQWEN_PROFILE,
    HYPERQWEN_URL,
    LLAMA_CPP_START,
    LLAMA_CPP_STOP,
    OVERRIDE_FILE,
    RouterSide,
    SwitchError,
    bring_up,
    hyperqwen_engine,
    tear_down,
)
from llm_bench.plan import ApiKeySource, PlanError

API_KEY_ENV = "VLLM_API_KEY"


def key_from_env_file(path: Path) -> str | None:
    """VLLM_API_KEY=... from HyperQwen's .env, where the compose setup keeps it."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    key = None
    for line in lines:
        name, sep, value = line.strip().partition("=")
        if sep and name.strip().removeprefix("export ").strip() == API_KEY_ENV:
            key = value.strip().strip("'\"") or None
    return key


def read_api_key(path: Path | None, env_file: Path | None = None, env: str | None = None) -> str | None:
    """The bearer key: --api-key-file or --api-key-env, read as every command reads them
    (plan.ApiKeySource), else $VLLM_API_KEY, else VLLM_API_KEY in the compose env file (the one
    source only this command has). It goes into the Authorization header only, never into output."""
    try:
        source = api_key_source(path, env) or (
            ApiKeySource(env=API_KEY_ENV) if os.environ.get(API_KEY_ENV, "").strip() else None)
        if source is not None:
            return source.read()
    except PlanError as e:
        raise CouldNotRun(str(e)) from e
    return key_from_env_file(env_file) if env_file is not None else None


def switch_options(f):
    options = [
        click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
                     envvar="LLM_BENCH_HYPERQWEN_DIR", default=Path("."), show_default=True,
                     help="HyperQwen checkout holding docker-compose.yml, the override and .env "
                          "(env LLM_BENCH_HYPERQWEN_DIR)."),
        click.option("--env-file", default=".env", show_default=True,
                     help="Compose env file, relative to --dir ('' for none)."),
        click.option("--override", default=OVERRIDE_FILE, show_default=True,
                     help="CDI override (deploy/hyperqwen/docker-compose.override.yml), relative to --dir or absolute."),
        click.option("--profile", default=HYPERQWEN_PROFILE, show_default=True, help="Compose profile: single or batch."),
        click.option("--up-command", help="Replace the whole start command (run by the shell in --dir)."),
        click.option("--down-command", help="Replace the whole stop command (run by the shell in --dir)."),
        click.option("--url", type=URL, default=HYPERQWEN_URL, show_default=True, help="HyperQwen's OpenAI API."),
        click.option("--model", default=HYPERQWEN_MODEL, show_default=True,
                     help="Served model name for the readiness completion ('' = first of /v1/models)."),
        click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
                     help=f"File holding the bearer key (default: ${API_KEY_ENV}, else {API_KEY_ENV} in the env file)."),
        click.option("--api-key-env", help="Environment variable holding the bearer key (instead of --api-key-file)."),
        click.option("--router-url", type=URL, default=DEFAULT_ROUTER_URL, show_default=True, help="The llama.cpp router."),
        click.option("--router-api-key-file", type=click.Path(dir_okay=False, path_type=Path),
                     help="File holding the router's key, when it was started with --api-key (never logged)."),
        click.option("--router-api-key-env", help="Environment variable holding the router's key (instead of the file)."),
        click.option("--free-gpu", "free_mode", type=click.Choice(["unload", "service", "none"]), default="unload",
                     show_default=True,
                     help="unload: unload the router's models through its API; service: stop/start its service."),
        click.option("--stop-command", default=LLAMA_CPP_STOP, show_default=True,
                     help="Stops the router (--free-gpu service)."),
        click.option("--start-command", default=LLAMA_CPP_START, show_default=True,
                     help="Starts the router again (--free-gpu service)."),
        click.option("--ready-timeout", "ready_timeout_s", type=float, default=1800.0, show_default=True,
                     help="Seconds to wait for HyperQwen's first completion (first boots compile for minutes)."),
        click.option("--router-timeout", type=float, default=120.0, show_default=True,
                     help="Seconds to wait for the router to answer again."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def build(directory, env_file, override, profile, up_command, down_command, url, model, api_key_file, api_key_env,
          router_url, router_api_key_file, router_api_key_env, free_mode, stop_command, start_command,
          ready_timeout_s, router_timeout):
    engine = hyperqwen_engine(
        directory, url=url, model=model or None, env_file=env_file or None, override=override,
        profile=profile, up_command=up_command, down_command=down_command,
        api_key=read_api_key(api_key_file, Path(directory) / env_file if env_file else None, api_key_env),
        ready_timeout_s=ready_timeout_s,
    )
    try:
        router_key = (api_key_source(router_api_key_file, router_api_key_env) or ApiKeySource()).read()
    except PlanError as e:
        raise CouldNotRun(str(e)) from e
    router = RouterSide(url=router_url, mode=free_mode, stop_command=stop_command,
                        start_command=start_command, ready_timeout_s=router_timeout, api_key=router_key)
    return engine, router


@click.group()
def engine() -> None:
    """Hand the GPU between the llama.cpp router and another engine."""


@engine.group()
def hyperqwen() -> None:
    """HyperQwen (syv-ai/HyperQwen, vLLM in Docker Compose) beside the router; see docs/hyperqwen.md."""


@hyperqwen.command()
@switch_options
def up(**options) -> None:
    """Free the GPU, start HyperQwen, wait until it serves a real completion.

    If it does not, HyperQwen is stopped, the router is restored and the exit code is 1.
    """
    engine_side, router = build(**options)
    try:
        result = bring_up(engine_side, router, log)
    except (SwitchError, ServerError) as e:
        raise RanWithFailures(str(e)) from e
    unloaded = ", ".join(result.router.unloaded) or "none"
    click.echo(f"HyperQwen is serving {result.model!r} at {engine_side.url} "
               f"(ready after {result.ready_after_s:.0f} s; router models unloaded: {unloaded})")


@hyperqwen.command()
@switch_options
def down(**options) -> None:
    """Stop HyperQwen and restore the router (start its service, wait for GET /models)."""
    engine_side, router = build(**options)
    try:
        tear_down(engine_side, router, log=log)
    except (SwitchError, ServerError) as e:
        raise RanWithFailures(str(e)) from e
    click.echo(f"HyperQwen is down; the router at {router.url} answers" if router.mode != "none"
               else "HyperQwen is down")
