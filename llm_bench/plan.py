"""What to measure and how: the protocol parameters and the plan file that carries them.

Defaults are the reference report's protocol. A TOML plan file gives the same keys as the
command-line flags; a flag given on the command line wins over the plan.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from llm_bench.engines import ENGINES

DEFAULT_PROMPT = "code"
DEFAULT_URL = "http://127.0.0.1:48123"
WORKLOADS = ("standard", "categories", "concurrency", "prefix-cache")
# Plans and flags written before the default workload was named "standard" call it "protocol".
LEGACY_WORKLOADS = {"protocol": "standard"}


class PlanError(ValueError):
    pass


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
    max_tokens: int = 512
    runs: int = 3
    temperature: float = 1.0
    seed: int = 42
    unload_after: bool = True
    vram_threshold_mib: float = 2048.0
    strict: bool = False
    request_timeout_s: float = 600.0
    load_timeout_s: float = 900.0
    workloads: tuple[str, ...] = ("standard",)
    categories: tuple[str, ...] = ("prose", "code", "json")
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    prefix_prompt_tokens: int = 11000
    prefix_chars_per_token: float = 4.0
    prefix_max_tokens: int = 32

    def __post_init__(self) -> None:
        for name in ("workloads", "categories", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, (str, int)):
                raise PlanError(f"{name} must be a list, not {value!r}")
            object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "workloads", tuple(LEGACY_WORKLOADS.get(w, w) for w in self.workloads))
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise PlanError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
        if any(n < 1 for n in self.concurrency):
            raise PlanError("concurrency levels must be at least 1")
        if self.max_tokens < 2:
            raise PlanError(f"max_tokens must be at least 2 to measure decode speed, not {self.max_tokens}")
        if self.runs < 1:
            raise PlanError(f"runs must be at least 1, not {self.runs}")
        if self.vram_threshold_mib < 0:
            raise PlanError("vram threshold must not be negative")

    def with_prompt(self) -> Protocol:
        return self if self.prompt else replace(self, prompt=shipped_prompt(self.prompt_name))

    def to_toml(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["prompt_chars"] = len(values.pop("prompt"))
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


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
    power_floor_w: float | None = None  # warn when a GPU's power limit is below this
    roofline_min: float = 0.25  # warn when decode reaches less than this fraction of the roofline


CHECK_KEYS = {f.name for f in fields(Checks)}


@dataclass(frozen=True)
class Plan:
    url: str = DEFAULT_URL
    aliases: tuple[str, ...] = ()  # empty: every preset the router lists
    label: str = ""
    output_dir: Path = Path("results")
    protocol: Protocol = Protocol()
    engine: str = "llama-cpp"
    api_key: ApiKeySource = ApiKeySource()
    metrics_url: str | None = None  # default: the server's /metrics
    checks: Checks = Checks()


PROTOCOL_KEYS = {f.name for f in fields(Protocol)} - {"prompt"}
PLAN_KEYS = {"url", "aliases", "label", "output_dir", "protocol", "engine", "api_key_file", "api_key_env",
             "metrics_url", "checks"}


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
    except TypeError as e:
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
    if isinstance(aliases, str) or not all(isinstance(a, str) for a in aliases):
        raise PlanError("plan: aliases must be a list of preset names")
    output_dir = Path(data.get("output_dir", "results"))
    if relative_to is not None and not output_dir.is_absolute():
        output_dir = relative_to / output_dir
    engine = str(data.get("engine", "llama-cpp"))
    if engine not in ENGINES:
        raise PlanError(f"plan: unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    key_file = data.get("api_key_file")
    if key_file is not None and relative_to is not None and not Path(key_file).is_absolute():
        key_file = relative_to / key_file
    checks_data = dict(data.get("checks", {}))
    _check_keys("[checks]", checks_data, CHECK_KEYS)
    if checks_data.get("log_file") is not None:
        log_path = Path(checks_data["log_file"])
        checks_data["log_file"] = log_path if relative_to is None or log_path.is_absolute() else relative_to / log_path
    return Plan(
        checks=Checks(**checks_data),
        url=str(data.get("url", DEFAULT_URL)),
        aliases=tuple(aliases),
        label=str(data.get("label", "")),
        output_dir=output_dir,
        protocol=protocol,
        engine=engine,
        api_key=ApiKeySource(None if key_file is None else Path(key_file), data.get("api_key_env")),
        metrics_url=data.get("metrics_url"),
    )
