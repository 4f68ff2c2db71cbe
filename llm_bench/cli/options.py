"""What every llm-bench command shares: progress output, the server options and the protocol flags.

Conventions, the same in every command: a list flag may be repeated and each value may hold several
items separated by commas (``--concurrency 1,2 --concurrency 4``); units are in the flag's name and
the same as in a plan file; defaults shown in help texts come from the code's own defaults.
"""

from __future__ import annotations

import types
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from llm_bench.cli.exits import CouldNotRun
from llm_bench.engines import DEFAULT_ENGINE, DEFAULT_STREAMS, ENGINES, Engine, engine_help, open_engine
from llm_bench.engines.stream import THINKING
from llm_bench.plan import DEFAULT_URL, ApiKeySource, PlanError, Protocol, protocol_from_mapping
from llm_bench.validation import FieldError, describe, url_problem
from llm_bench.workloads import NAMES, REGISTRY
from llm_bench.workloads.base import Flag, Workload

DEFAULTS = Protocol()


def log(message: str) -> None:
    click.echo(message, err=True)


def default_of(name: str) -> str:
    """A protocol default as a help text shows it."""
    return shown(getattr(DEFAULTS, name))


def shown(value: Any) -> str:
    """A default as a help text shows it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def split_list(values: tuple[str, ...]) -> tuple[str, ...]:
    """Repeated flags, each possibly comma-separated, as one flat tuple."""
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def _list_callback(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    return split_list(value)


def list_option(*names: str, **kwargs: Any):
    """A list flag by the one convention: repeatable, and comma-separated within one value."""
    return click.option(*names, multiple=True, callback=_list_callback, **kwargs)


class UrlParam(click.ParamType):
    """A server URL, checked before anything starts: one no request could go to is a usage error (exit 2)
    naming the flag and the value. ``path_ok``: a path on the server (/metrics) will do; ``off``: words
    that mean "no server" (tune's --main-url none)."""

    name = "url"

    def __init__(self, path_ok: bool = False, off: tuple[str, ...] = ()):
        self.path_ok = path_ok
        self.off = off

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if text.strip().lower() in self.off:
            return text
        problem = url_problem(text, self.path_ok)
        if problem is not None:
            self.fail(f"{text!r} is not a usable URL ({problem})", param, ctx)
        return text


URL = UrlParam()


def apply(f, options):
    for option in reversed(options):
        f = option(f)
    return f


def server_options(f, url_option=None):
    """Where the server is and how to reach it; every command that talks to a server takes these."""
    return apply(f, [
        url_option or click.option("--url", type=URL, help=f"Server URL (default {DEFAULT_URL})."),
        click.option("--engine", type=click.Choice(ENGINES), help=engine_help()),
        click.option("--api-key-file", type=click.Path(dir_okay=False, path_type=Path),
                     help="Read a Bearer API key from this file's first line (never written to results or logs)."),
        click.option("--api-key-env", help="Read a Bearer API key from this environment variable."),
        click.option("--metrics-url", type=UrlParam(path_ok=True), help="Prometheus metrics of an OpenAI engine (default: URL/metrics)."),
        click.option("--metrics-key", is_flag=True, default=None,
                     help="Send the API key to a --metrics-url on another host too (on the server's own it always goes)."),
    ])


def boxes_server_options(f):
    """server_options with ``--url`` repeatable: one per box (llm_bench.boxes)."""
    return server_options(f, click.option(
        "--url", "urls", type=URL, multiple=True,
        help=f"Server URL (default {DEFAULT_URL}); repeat it to measure several boxes into one report."))


def api_key_source(api_key_file: Path | None, api_key_env: str | None) -> ApiKeySource | None:
    return ApiKeySource(api_key_file, api_key_env) if (api_key_file or api_key_env) else None


def protocol_options(f):
    """Flags shared by every command that measures; None means 'not given, keep the plan's value'."""
    return apply(f, [
        click.option("--runs", type=int, help=f"Measured runs per alias (default {default_of('runs')})."),
        click.option("--max-tokens", type=int,
                     help=f"Output tokens per request, generated to the end (default {default_of('max_tokens')})."),
        click.option("--temperature", type=float, help=f"Sampling temperature (default {default_of('temperature')})."),
        click.option("--seed", type=int, help=f"Sampling seed (default {default_of('seed')})."),
        click.option("--prompt", "prompt_name",
                     help=f"Shipped prompt: code, prose or json (default {default_of('prompt_name')})."),
        click.option("--prompt-file", type=click.Path(dir_okay=False, path_type=Path),
                     help="Use this file's text as the prompt."),
        click.option("--unload/--no-unload", "unload_after", default=None,
                     help=f"Unload each alias after measuring it (default {default_of('unload_after')})."),
        click.option("--vram-threshold-mib", type=float,
                     help="VRAM in use before a load above this marks the alias not comparable "
                          f"(default {default_of('vram_threshold_mib')})."),
        click.option("--strict", is_flag=True, default=None, help="Refuse to measure an alias that is not comparable."),
        click.option("--timeout", "request_timeout_s", type=float,
                     help=f"Seconds before a request counts as failed (default {default_of('request_timeout_s')})."),
        list_option("--workload", "workloads",
                    help=f"Workloads to run per alias: {', '.join(NAMES)} (default {default_of('workloads')})."),
        click.option("--prompt-cache/--no-prompt-cache", "prompt_cache", default=None,
                     help="Let the server reuse a cached prompt prefix in measured requests (default "
                          f"{default_of('prompt_cache')}: every request processes its whole prompt)."),
        click.option("--precision", callback=_fraction_callback,
                     help="Keep measuring each alias until its median decode rate is known to this precision "
                          "(half-width of its 95 % interval over the median), e.g. 2% or 0.02; "
                          "default: exactly --runs."),
        click.option("--max-runs", type=int,
                     help=f"The most runs --precision may take per alias (default {default_of('max_runs')})."),
        click.option("--thinking", type=click.Choice(THINKING),
                     help="Ask thinking models not to think (off), to think (on), or leave it to the server "
                          f"(sent as chat_template_kwargs.enable_thinking; default {default_of('thinking')})."),
        *(workload_option(w, flag) for w in REGISTRY for flag in w.flags),
    ])


def flag_dest(w: Workload[Any], flag: Flag) -> str:
    """The parameter name a workload's flag arrives under."""
    return f"{w.name.replace('-', '_')}__{flag.setting}"


def workload_option(w: Workload[Any], flag: Flag):
    text = f"{flag.help} (default {shown(getattr(w.settings(), flag.setting))})."
    if flag.many:
        return list_option(flag.name, flag_dest(w, flag), help=text)
    return click.option(flag.name, flag_dest(w, flag), type=flag.item, help=text)


def parse_fraction(text: str, flag: str, zero_ok: bool = False) -> float:
    """'2%' or '0.02' as 0.02; anything else is a usage error naming the flag."""
    try:
        value = float(text.strip()[:-1]) / 100.0 if text.strip().endswith("%") else float(text)
    except ValueError as e:
        raise click.BadParameter(f"{text!r} is not a fraction; write e.g. 2% or 0.02", param_hint=flag) from e
    if not (0.0 <= value if zero_ok else 0.0 < value) or value >= 1.0:
        raise click.BadParameter(f"{text!r} must be {'from 0' if zero_ok else 'above 0'} and below 100 %",
                                 param_hint=flag)
    return value


def _fraction_callback(_ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    return None if value is None else parse_fraction(value, f"--{param.name.replace('_', '-')}")


PROTOCOL_FLAGS = {f.name for f in fields(Protocol)} - {"settings"} | {"prompt_file"}


def apply_protocol_flags(protocol: Protocol, flags: dict[str, Any]) -> Protocol:
    given = {k: v for k, v in flags.items() if k in PROTOCOL_FLAGS and v is not None and v != ()}
    prompt_file = given.pop("prompt_file", None)
    protocol = protocol_from_mapping(given, base=protocol, where="command line")
    if prompt_file is not None:
        protocol = protocol_from_mapping({"prompt_file": str(prompt_file)}, base=protocol, where="--prompt-file")
    for w in REGISTRY:
        for flag in w.flags:
            value = flags.get(flag_dest(w, flag))
            if value is not None and value != ():
                protocol = protocol.with_settings(w, {flag.setting: _items(flag, value)}, {flag.setting: flag.name})
    return protocol


def _items(flag: Flag, value: Any) -> Any:
    """A list flag's items, each of the flag's type."""
    if not flag.many:
        return value
    try:
        return tuple(flag.item(item) for item in value)
    except ValueError as e:
        listed = types.GenericAlias(tuple, (flag.item, ...))
        raise FieldError(flag.name, f"takes {describe(listed)}, e.g. {flag.example} ({e})") from e


def open_server(url: str | None, engine: str | None, api_key_file: Path | None, api_key_env: str | None,
                metrics_url: str | None, metrics_key: bool | None = None,
                timeout: float = DEFAULTS.request_timeout_s, streams: int = DEFAULT_STREAMS) -> Engine:
    """The engine the server options name, with its key read; a key that cannot be read is a usage error.
    ``streams``: the most simultaneous streams the caller opens (the connection pool's size)."""
    try:
        key = (api_key_source(api_key_file, api_key_env) or ApiKeySource()).read()
    except PlanError as e:
        raise CouldNotRun(str(e)) from e
    return open_engine(engine or DEFAULT_ENGINE, url or DEFAULT_URL, timeout=timeout, api_key=key,
                       metrics_url=metrics_url, metrics_key=bool(metrics_key), streams=streams)
