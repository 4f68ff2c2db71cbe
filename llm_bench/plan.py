"""What to measure and how: the protocol parameters and the plan file that carries them.

Defaults are the reference report's protocol. A TOML plan file gives the same keys as the
command-line flags; a flag given on the command line wins over the plan.
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from llm_bench.diagnostics.settings import Checks
from llm_bench.engines import DEFAULT_ENGINE, ENGINES
from llm_bench.prompts import shipped_prompt
from llm_bench.results import AliasRecord
from llm_bench.validation import PlanError, check_fields, check_keys, check_url
from llm_bench.workloads import LEGACY_NAMES, NAMES, REGISTRY, workload
from llm_bench.workloads.base import Workload
from llm_bench.workloads.standard import STANDARD

S = TypeVar("S")
# The flat [protocol] keys of workloads' settings, as plans, flags and results before [protocol.<workload>]
LEGACY_KEYS = {key for w in REGISTRY for key in w.legacy}

DEFAULT_PROMPT = "code"
DEFAULT_URL = "http://127.0.0.1:48123"


def default_settings() -> dict[str, Any]:
    return {w.name: w.settings() for w in REGISTRY}


@dataclass(frozen=True, init=False)
class Protocol:
    """The parameter set a measurement follows: ``[protocol]`` in plan files, ``meta.protocol`` in results.

    Each workload's own settings are in ``settings`` (``[protocol.<workload>]`` tables); the flat
    ``[protocol]`` keys plans used for them before (``concurrency = [1, 2]``) are still taken, here as
    keyword arguments too."""

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
    workloads: tuple[str, ...] = (STANDARD.name,)
    # False: every measured request processes its whole prompt (TTFT and prompt t/s time a processed
    # prompt); True: the server may reuse a cached prefix. The prefix-cache workload always caches.
    prompt_cache: bool = False
    # Adaptive run count (off by default: exactly ``runs``). With a precision (0.02 = 2 %), an alias is
    # measured at least ``runs`` times and then until the half-width of the 95 % interval of its median
    # decode rate, relative to the median, is within it, or ``max_runs`` is reached.
    precision: float | None = field(default=None, metadata={"above": 0.0, "max": 0.5})
    max_runs: int = field(default=10, metadata={"min": 6})  # 6: the fewest runs with a 95 % median interval
    # Thinking models: "off" asks every request not to think (chat_template_kwargs.enable_thinking = false),
    # "on" to think, "server" leaves it to the server and its chat template (engines.stream.THINKING).
    thinking: Literal["off", "on", "server"] = "off"
    settings: Mapping[str, Any] = field(default_factory=default_settings)  # workload name -> its settings

    def __init__(self, settings: Mapping[str, Any] | None = None, **values: Any) -> None:
        own = {f.name: f for f in fields(self) if f.name != "settings"}
        unknown = sorted(set(values) - set(own) - LEGACY_KEYS)
        if unknown:
            raise TypeError(f"Protocol() got an unexpected keyword argument {unknown[0]!r}")
        for name, f in own.items():
            object.__setattr__(self, name, values.get(name, f.default))
        merged = {**default_settings(), **(settings or {})}
        for w in REGISTRY:
            changes = {setting: values[key] for key, setting in w.legacy.items() if key in values}
            if changes:
                merged[w.name] = w.configure(merged[w.name], changes, {v: k for k, v in w.legacy.items()})
        object.__setattr__(self, "settings", MappingProxyType(merged))
        self.__post_init__()

    def __post_init__(self) -> None:
        check_fields(self)
        if self.precision is not None and self.max_runs < self.runs:
            raise PlanError(f"max_runs ({self.max_runs}) must be at least runs ({self.runs})")
        given = [LEGACY_NAMES.get(w, w) for w in self.workloads]
        unknown = [w for w in given if w not in NAMES]
        if unknown:
            raise PlanError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
        # a workload that must run last (quality) does, whatever the order given: it must not warm anything
        # the others time
        chosen = [workload(w) for w in given]
        object.__setattr__(self, "workloads", tuple(w.name for w in sorted(chosen, key=lambda w: w.last)))

    def __getattr__(self, name: str) -> Any:
        """A flat key of a workload's settings (``protocol.concurrency``), as plans and flags spelled them before."""
        for w in REGISTRY:
            if name in w.legacy:
                return getattr(self.settings[w.name], w.legacy[name])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def with_settings(self, w: Workload[S], changes: Mapping[str, Any], spelled: Mapping[str, str] | None = None
                      ) -> Protocol:
        """This protocol with some of a workload's settings changed (``spelled``: how the user named them)."""
        return replace(self, settings={**self.settings, w.name: w.configure(self.settings[w.name], changes, spelled)})

    def carried(self, records: Sequence[AliasRecord]) -> Protocol:
        """This protocol for the configurations measured after ``records`` (``Workload.carry``)."""
        changed = {w.name: w.carry(self.settings[w.name], records) for w in map(workload, self.workloads) if w.carry}
        return replace(self, settings={**self.settings, **changed}) if changed else self

    def with_prompt(self) -> Protocol:
        return self if self.prompt else replace(self, prompt=shipped_prompt(self.prompt_name))

    def to_toml(self) -> dict[str, Any]:
        """The general settings, then a table of its own settings for each workload the protocol runs."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "settings"}
        values["prompt_chars"] = len(values.pop("prompt"))
        values.update({name: own_settings(self.settings[name]) for name in self.workloads if own_settings(self.settings[name])})
        return _toml(values)


def own_settings(settings: Any) -> dict[str, Any]:
    """A workload's settings as a plan gives them: without what the runner carries from one
    configuration to the next (``metadata={"carried": True}``)."""
    return {f.name: getattr(settings, f.name) for f in fields(settings) if not f.metadata.get("carried")}


def _toml(values: dict[str, Any]) -> dict[str, Any]:
    """TOML has no null: a setting that is off (precision) is left out; tuples are lists, paths strings."""
    return {k: _toml(v) if isinstance(v, dict) else list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path)
            else v for k, v in values.items() if v is not None}


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


CHECK_KEYS = {f.name for f in fields(Checks)}


@dataclass(frozen=True)
class Plan:
    url: str = field(default=DEFAULT_URL, metadata={"url": "server"})
    urls: tuple[str, ...] = ()  # several boxes, measured in turn into one report (llm_bench.boxes)
    aliases: tuple[str, ...] = ()  # empty: every preset the router lists
    label: str = ""
    output_dir: Path = Path("results")
    protocol: Protocol = Protocol()
    engine: str = DEFAULT_ENGINE
    api_key: ApiKeySource = ApiKeySource()
    metrics_url: str | None = field(default=None, metadata={"url": "server or path"})  # default: the server's /metrics
    # Send the API key to a metrics_url on another origin too (on the server's own it always goes).
    metrics_key: bool = False
    checks: Checks = Checks()

    def __post_init__(self) -> None:
        check_fields(self)


PROTOCOL_KEYS = {f.name for f in fields(Protocol)} - {"prompt", "settings"} | LEGACY_KEYS
PLAN_KEYS = {"url", "urls", "aliases", "label", "output_dir", "protocol", "engine", "api_key_file", "api_key_env",
             "metrics_url", "metrics_key", "checks"}


def protocol_from_mapping(data: Mapping[str, Any], base: Protocol = Protocol(), where: str = "[protocol]",
                          relative_to: Path | None = None) -> Protocol:
    """``[protocol]`` on top of ``base``: its keys, the flat keys of workloads' settings, and each
    workload's own table (``[protocol.concurrency]``: a table where a flat key of the same name is a list)."""
    data = dict(data)
    prompt_file = data.pop("prompt_file", None)
    tables = {name: data.pop(name) for name in NAMES if isinstance(data.get(name), dict)}
    check_keys(where, data, PROTOCOL_KEYS | set(NAMES))
    try:
        protocol = replace(base, **data)
    except (TypeError, PlanError) as e:
        raise PlanError(f"{where}: {e}") from e
    for name, table in tables.items():
        w = workload(name)
        inner = f"{where[:-1]}.{name}]" if where.endswith("]") else f"{where} [{name}]"
        check_keys(inner, table, {f.name for f in fields(w.settings) if not f.metadata.get("carried")})
        try:
            protocol = protocol.with_settings(w, _paths_relative(w, table, relative_to))
        except PlanError as e:
            raise PlanError(f"{inner}: {e}") from e
    if prompt_file:
        path = Path(prompt_file)
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        try:
            protocol = replace(protocol, prompt=path.read_text(), prompt_name=path.name)
        except OSError as e:
            raise PlanError(f"{where}: cannot read prompt_file {path}: {e}") from e
    return protocol


def _paths_relative(w: Workload[Any], table: Mapping[str, Any], to: Path | None) -> dict[str, Any]:
    """A workload's table with each path setting (a session file) relative to the plan's folder."""
    hints = typing.get_type_hints(w.settings)
    return {k: _relative(Path(v), to) if isinstance(v, str) and Path in typing.get_args(hints[k]) + (hints[k],)
            else v for k, v in table.items()}


def load_plan_file(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise PlanError(f"plan file {path} does not exist") from e
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"plan file {path} is not valid TOML: {e}") from e


def plan_from_mapping(data: dict[str, Any], *, relative_to: Path | None = None,
                      allowed: set[str] = PLAN_KEYS) -> Plan:
    check_keys("plan", data, allowed)
    protocol = protocol_from_mapping(data.get("protocol", {}), relative_to=relative_to)
    aliases = data.get("aliases", ())
    if isinstance(aliases, str) or not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) for a in aliases):
        raise PlanError(f"plan: aliases must be a list of preset names, not {aliases!r}")
    urls = data.get("urls", ())
    if isinstance(urls, str) or not isinstance(urls, (list, tuple)) or not all(isinstance(u, str) for u in urls):
        raise PlanError(f"plan: urls must be a list of server URLs, one per box, not {urls!r}")
    for url in urls:
        check_url(url, "plan: urls")
    engine = data.get("engine", DEFAULT_ENGINE)
    if engine not in ENGINES:
        raise PlanError(f"plan: unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    checks_data = dict(data.get("checks", {}))
    check_keys("[checks]", checks_data, CHECK_KEYS)
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
