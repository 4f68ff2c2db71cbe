"""What to measure and how: the protocol parameters and the plan file that carries them.

Defaults are the reference report's protocol. A TOML plan file gives the same keys as the
command-line flags; a flag given on the command line wins over the plan.
"""

from __future__ import annotations

import os
import tomllib
import types
import typing
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import httpx

from llm_bench.engines import ENGINES

DEFAULT_PROMPT = "code"
DEFAULT_URL = "http://127.0.0.1:48123"
WORKLOADS = ("standard", "categories", "concurrency", "prefix-cache", "quality")
# Plans and flags written before the default workload was named "standard" call it "protocol".
LEGACY_WORKLOADS = {"protocol": "standard"}


class PlanError(ValueError):
    pass


# Field validation is driven by each dataclass's own type hints, plus an optional range in the
# field's metadata ({"min": x}, {"above": x}, {"max": x}; for a tuple it applies to each item), so a
# field added later is checked without anyone writing a check for it.

def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return "true or false"
    if hint is int:
        return "a whole number"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if hint is Path:
        return "a path"
    if hint is type(None):
        return "absent"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if origin is tuple:
        plural = {int: "whole numbers", float: "numbers", str: "strings", bool: "true/false values"}
        return f"a list of {plural.get(args[0], _describe(args[0]) + ' values')}"
    return f"a {getattr(hint, '__name__', hint)}"


class _Mismatch(Exception):
    pass


def _coerce(hint: Any, value: Any) -> Any:
    """``value`` as ``hint`` asks (a TOML int where a float is wanted, a list where a tuple is), or _Mismatch."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
    elif hint is type(None):
        if value is None:
            return None
    elif origin is Literal:
        if value in args:
            return value
    elif origin in (types.UnionType, typing.Union):
        for arg in args:
            try:
                return _coerce(arg, value)
            except _Mismatch:
                pass
    elif origin is tuple:
        if isinstance(value, (list, tuple)):  # a TOML array, or a tuple given in code
            return tuple(_coerce(args[0], v) for v in value)
    elif origin in (list, dict, set, frozenset):  # containers are checked as a whole, their items by the owner
        if isinstance(value, origin):
            return value
    elif isinstance(hint, type):
        if isinstance(value, hint):
            return value
    else:
        return value  # a type hint this checker does not know: left to the field's own code
    raise _Mismatch


def _bounds(meta: Any) -> str:
    words = {"min": "at least", "above": "above", "max": "at most"}
    return ", ".join(f"{words[k]} {meta[k]}" for k in words if k in meta)


def _out_of_range(value: Any, meta: Any) -> str | None:
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if not isinstance(item, (int, float)) or isinstance(item, bool):
            continue
        if ("min" in meta and item < meta["min"]) or ("above" in meta and item <= meta["above"]) \
                or ("max" in meta and item > meta["max"]):
            return _bounds(meta)
    return None


def url_problem(value: str, path_ok: bool = False) -> str | None:
    """What is wrong with a server URL (None: nothing): it must parse, be http:// or https:// and name a host.
    ``path_ok``: a path on the server itself ("/metrics") will do too."""
    if path_ok and value.startswith("/"):
        return None
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as e:
        return f"it does not parse: {e}"
    if url.scheme not in ("http", "https") or not url.host:
        return "it needs http:// or https:// and a host, e.g. http://127.0.0.1:48123"
    return None


def check_url(value: str | None, name: str, path_ok: bool = False) -> None:
    """A PlanError naming ``name`` (a plan key or a flag) and the value, for a URL no request could go to."""
    problem = None if value is None else url_problem(value, path_ok)
    if problem is not None:
        raise PlanError(f"{name} is not a usable URL: {value!r} ({problem})")


def check_fields(obj: Any) -> None:
    """Check (and normalise in place) every field of a frozen dataclass against its type hint and range;
    the message names the field, the value and what is allowed."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value = getattr(obj, f.name)
        try:
            normalised = _coerce(hints[f.name], value)
        except _Mismatch:
            bounds = _bounds(f.metadata)
            raise PlanError(f"{f.name} must be {_describe(hints[f.name])}{f' ({bounds})' if bounds else ''}, "
                            f"not {value!r}") from None
        allowed = _out_of_range(normalised, f.metadata)
        if allowed is not None:
            shown = f"{value!r}" if not isinstance(value, (list, tuple)) else f"{list(value)!r}"
            each = " (each)" if isinstance(normalised, tuple) else ""
            raise PlanError(f"{f.name} must be {allowed}{each}, not {shown}")
        if "url" in f.metadata:  # {"url": "server"}, or {"url": "server or path"} where a path on it will do
            check_url(normalised, f.name, path_ok=f.metadata["url"] == "server or path")
        object.__setattr__(obj, f.name, normalised)


def shipped_prompt(name: str) -> str:
    path = resources.files("llm_bench") / "prompts" / f"{name}.txt"
    if not path.is_file():
        available = sorted(p.name.removesuffix(".txt") for p in (resources.files("llm_bench") / "prompts").iterdir()
                           if p.name.endswith(".txt"))
        raise PlanError(f"no shipped prompt named {name!r}; choose one of {', '.join(available)} or give a prompt file")
    return path.read_text()


@dataclass(frozen=True)
class Protocol:
    prompt_name: str = DEFAULT_PROMPT
    prompt: str = ""
    # at least 2: decode speed needs a first token and one after it
    max_tokens: int = field(default=512, metadata={"min": 2})
    runs: int = field(default=3, metadata={"min": 1})
    temperature: float = field(default=1.0, metadata={"min": 0.0})
    seed: int = 42
    unload_after: bool = True
    vram_threshold_mib: float = field(default=2048.0, metadata={"min": 0.0})
    strict: bool = False
    request_timeout_s: float = field(default=600.0, metadata={"above": 0.0})
    load_timeout_s: float = field(default=900.0, metadata={"above": 0.0})
    workloads: tuple[str, ...] = ("standard",)
    categories: tuple[str, ...] = ("prose", "code", "json")
    concurrency: tuple[int, ...] = field(default=(1, 2, 4, 8), metadata={"min": 1})
    prefix_prompt_tokens: int = field(default=11000, metadata={"min": 1})
    prefix_chars_per_token: float = field(default=4.0, metadata={"above": 0.0})
    prefix_max_tokens: int = field(default=32, metadata={"min": 2})
    # The quality workload's long-context recall: filler lengths in tokens (sized for a 24 GB card;
    # a length beyond the model's context is skipped with the reason) and needle depths (0 = start).
    recall_lengths: tuple[int, ...] = field(default=(8192, 32768), metadata={"min": 64})
    recall_depths: tuple[float, ...] = field(default=(0.1, 0.5, 0.9), metadata={"min": 0.0, "max": 1.0})
    # A cap on the output tokens of the quality set's agreement prompts (each has its own max_tokens).
    quality_max_tokens: int | None = field(default=None, metadata={"min": 1})
    # False: every measured request processes its whole prompt (TTFT and prompt t/s time a processed
    # prompt); True: the server may reuse a cached prefix. The prefix-cache workload always caches.
    prompt_cache: bool = False
    # Adaptive run count (off by default: exactly ``runs``). With a precision (0.02 = 2 %), an alias is
    # measured at least ``runs`` times and then until the half-width of the 95 % interval of its median
    # decode rate, relative to the median, is within it, or ``max_runs`` is reached.
    precision: float | None = field(default=None, metadata={"above": 0.0, "max": 0.5})
    max_runs: int = field(default=10, metadata={"min": 6})  # 6: the fewest runs with a 95 % median interval

    def __post_init__(self) -> None:
        check_fields(self)
        if self.precision is not None and self.max_runs < self.runs:
            raise PlanError(f"max_runs ({self.max_runs}) must be at least runs ({self.runs})")
        workloads = tuple(LEGACY_WORKLOADS.get(w, w) for w in self.workloads)
        # quality runs after the speed workloads, whatever the order given: it must not warm anything they time
        workloads = tuple(w for w in workloads if w != "quality") + (("quality",) if "quality" in workloads else ())
        object.__setattr__(self, "workloads", workloads)
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise PlanError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")

    def with_prompt(self) -> Protocol:
        return self if self.prompt else replace(self, prompt=shipped_prompt(self.prompt_name))

    def to_toml(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["prompt_chars"] = len(values.pop("prompt"))
        # TOML has no null: a setting that is off (precision) is left out.
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}


def read_key_file(path: Path) -> str:
    """The key on a key file's first non-empty line (a trailing newline or comment lines after it are fine)."""
    try:
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except OSError as e:
        raise PlanError(f"cannot read the API key file {path}: {e.strerror or e}") from e
    if not lines:
        raise PlanError(f"the API key file {path} is empty")
    return lines[0]


@dataclass(frozen=True)
class ApiKeySource:
    """Where the API key comes from; only this (never the key) is kept in results."""

    file: Path | None = None
    env: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)

    def read(self) -> str | None:
        if self.file is not None:
            return read_key_file(self.file)
        if self.env is not None:
            key = os.environ.get(self.env, "").strip()
            if not key:
                raise PlanError(f"the environment variable {self.env} (API key) is not set or empty")
            return key
        return None

    def describe(self) -> str | None:
        if self.file is not None:
            return f"file {self.file}"
        if self.env is not None:
            return f"environment {self.env}"
        return None


@dataclass(frozen=True)
class Checks:
    """Settings of the doctor's checks that run during every measurement (see docs/gpu.md)."""

    log_file: Path | None = None  # a file with the server's log
    log_command: str | None = None  # or a command printing it; neither: the journal when it exists
    power_floor_w: float | None = field(default=None, metadata={"min": 0.0})  # warn when a GPU's limit is below this
    # warn when decode reaches less than this fraction of the roofline
    roofline_min: float = field(default=0.25, metadata={"min": 0.0, "max": 1.0})
    # the llama.cpp build's name (e.g. "llamampere") when neither the marker nor /props says which it is
    build: str | None = None
    marker: Path = Path("/etc/llama-cpp/active.json")  # the NixOS module's note of the active package
    kernel_log: Path | None = None  # kernel log lines to watch for Xid errors; default: journalctl -k or dmesg

    def __post_init__(self) -> None:
        check_fields(self)


CHECK_KEYS = {f.name for f in fields(Checks)}


@dataclass(frozen=True)
class Plan:
    url: str = field(default=DEFAULT_URL, metadata={"url": "server"})
    urls: tuple[str, ...] = ()  # several boxes, measured in turn into one report (llm_bench.boxes)
    aliases: tuple[str, ...] = ()  # empty: every preset the router lists
    label: str = ""
    output_dir: Path = Path("results")
    protocol: Protocol = Protocol()
    engine: str = "llama-cpp"
    api_key: ApiKeySource = ApiKeySource()
    metrics_url: str | None = field(default=None, metadata={"url": "server or path"})  # default: the server's /metrics
    # Send the API key to a metrics_url on another origin too (on the server's own it always goes).
    metrics_key: bool = False
    checks: Checks = Checks()

    def __post_init__(self) -> None:
        check_fields(self)


PROTOCOL_KEYS = {f.name for f in fields(Protocol)} - {"prompt"}
PLAN_KEYS = {"url", "urls", "aliases", "label", "output_dir", "protocol", "engine", "api_key_file", "api_key_env",
             "metrics_url", "metrics_key", "checks"}


def _check_keys(where: str, given: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def protocol_from_mapping(data: dict[str, Any], base: Protocol = Protocol(), where: str = "[protocol]",
                          relative_to: Path | None = None) -> Protocol:
    data = dict(data)
    prompt_file = data.pop("prompt_file", None)
    _check_keys(where, data, PROTOCOL_KEYS)
    try:
        protocol = replace(base, **data)
    except (TypeError, PlanError) as e:
        raise PlanError(f"{where}: {e}") from e
    if prompt_file:
        path = Path(prompt_file)
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        try:
            protocol = replace(protocol, prompt=path.read_text(), prompt_name=path.name)
        except OSError as e:
            raise PlanError(f"{where}: cannot read prompt_file {path}: {e}") from e
    return protocol


def load_plan_file(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise PlanError(f"plan file {path} does not exist") from e
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"plan file {path} is not valid TOML: {e}") from e


def plan_from_mapping(data: dict[str, Any], *, relative_to: Path | None = None,
                      allowed: set[str] = PLAN_KEYS) -> Plan:
    _check_keys("plan", data, allowed)
    protocol = protocol_from_mapping(data.get("protocol", {}), relative_to=relative_to)
    aliases = data.get("aliases", ())
    if isinstance(aliases, str) or not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) for a in aliases):
        raise PlanError(f"plan: aliases must be a list of preset names, not {aliases!r}")
    urls = data.get("urls", ())
    if isinstance(urls, str) or not isinstance(urls, (list, tuple)) or not all(isinstance(u, str) for u in urls):
        raise PlanError(f"plan: urls must be a list of server URLs, one per box, not {urls!r}")
    for url in urls:
        check_url(url, "plan: urls")
    engine = data.get("engine", "llama-cpp")
    if engine not in ENGINES:
        raise PlanError(f"plan: unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    checks_data = dict(data.get("checks", {}))
    _check_keys("[checks]", checks_data, CHECK_KEYS)
    try:
        checks = Checks(**checks_data)
    except PlanError as e:
        raise PlanError(f"[checks]: {e}") from e
    try:
        api_key = ApiKeySource(data.get("api_key_file"), data.get("api_key_env"))
    except PlanError as e:  # its fields are file and env; the plan spells them api_key_file, api_key_env
        raise PlanError(f"plan: api_key_{e}") from e
    try:
        plan = Plan(checks=checks, url=data.get("url", DEFAULT_URL), urls=tuple(urls), aliases=tuple(aliases),
                    label=data.get("label", ""), output_dir=data.get("output_dir", "results"), protocol=protocol,
                    engine=engine, api_key=api_key, metrics_url=data.get("metrics_url"),
                    metrics_key=data.get("metrics_key", False))
    except PlanError as e:
        raise PlanError(f"plan: {e}") from e
    return replace(plan, output_dir=_relative(plan.output_dir, relative_to),
                   api_key=replace(api_key, file=None if api_key.file is None else _relative(api_key.file, relative_to)),
                   checks=replace(checks, log_file=None if checks.log_file is None
                                  else _relative(checks.log_file, relative_to)))


def _relative(path: Path, to: Path | None) -> Path:
    """A path in a plan file is relative to the plan's folder."""
    return path if to is None or path.is_absolute() else to / path
