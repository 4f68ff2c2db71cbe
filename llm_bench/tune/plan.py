"""What to tune: the base preset, the axes, where the candidates are served, the budget, the quality gate.

A tune plan file is TOML (``llm-bench tune --plan tune.toml``); flags given on the command line win:

    name = "smollm2"                    # preset names: smollm2-self-2-q8_0, ...
    output_dir = "tune-results"
    main_url = "http://127.0.0.1:48123" # the machine's router, freed first and restored; "" for none
    finalists = 4

    [base]                              # the preset every candidate starts from
    model = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    ctx-size = 4096

    [axes]                              # the first value of each axis makes the control
    spec = [{ name = "none", spec-type = "none" },
            { name = "self", spec-type = "draft-simple", model-draft = "/models/SmolLM2-135M-Instruct.Q4_1.gguf" }]
    spec-draft-n-max = [2, 4]
    "cache-type-k+cache-type-v" = ["f16", "q8_0", "q4_0"]

    [budget]
    max_rounds = 3
    [quality]
    accept = "near-lossless"
    [protocol]                          # the full runs of the rounds (llm-bench run's settings)
    runs = 3
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from llm_bench.plan import DEFAULT_URL, PlanError, Protocol, load_plan_file, protocol_from_mapping
from llm_bench.tune.grid import Axis, Candidate, GridError, Value, expand, parse_axis
from llm_bench.validation import check_fields, check_keys


@dataclass(frozen=True)
class Budget:
    """When the rounds stop even if the leader is not yet separated from the rest by more than noise."""

    max_rounds: int = field(default=3, metadata={"min": 1})
    max_requests: int = field(default=400, metadata={"min": 1})  # measured requests of every phase together
    max_time_s: float = field(default=3600.0, metadata={"above": 0})

    def __post_init__(self) -> None:
        check_fields(self)


# The agreement threshold of a gate that does not judge by the quality verdict (accept = "off").
OFF_MIN_AGREEMENT = 0.75


@dataclass(frozen=True)
class QualityGate:
    """Who cannot win on quality against the control (docs/sweep-tune.md: "Finding the best preset", Quality).

    ``accept``: the worst quality verdict (docs/quality.md: "Quality verdicts") a winner may have; a candidate
    whose verdict could not be scored cannot win either. "any": the verdict is measured and shown but
    does not gate; "off": it is not measured, and the share of greedy outputs identical to the control's
    gates instead (``min_agreement``, then 0.75 unless given). A ``min_agreement`` given applies with any
    ``accept``."""

    accept: Literal["lossless", "near-lossless", "any", "off"] = "near-lossless"
    min_agreement: float | None = field(default=None, metadata={"min": 0.0, "max": 1.0})  # share of identical outputs
    max_recall_drop: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})  # recall below the control's

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def agreement_needed(self) -> float | None:
        """The share of identical greedy outputs a winner needs (None: the verdict judges instead)."""
        if self.min_agreement is not None:
            return self.min_agreement
        return OFF_MIN_AGREEMENT if self.accept == "off" else None


@dataclass(frozen=True)
class TunePlan:
    name: str = "tune"
    base: dict[str, Value] = field(default_factory=dict)
    axes: tuple[Axis, ...] = ()
    # Measuring presets an existing router already serves (url given) instead of serving a grid.
    url: str | None = None
    presets: tuple[str, ...] = ()
    control: str | None = None  # url mode: the control preset (default: the first of presets)
    main_url: str | None = DEFAULT_URL  # the machine's router: its models are unloaded first, reloaded after
    llama_server: Path | None = None
    output_dir: Path = Path("tune-results")
    protocol: Protocol = Protocol()
    screen_max_tokens: int = field(default=64, metadata={"min": 2})
    finalists: int = field(default=4, metadata={"min": 1})
    budget: Budget = Budget()
    quality: QualityGate = QualityGate()

    def candidates(self) -> list[Candidate]:
        """The grid (control first), or the named presets of an existing router."""
        if self.url is not None:
            names = list(self.presets)
            if self.control is not None:
                names = [self.control] + [n for n in names if n != self.control]
            if len(names) < 2:
                raise PlanError("measuring an existing router (--url) needs at least two presets: "
                                "the control and a candidate (--preset A --preset B, or --control)")
            return [Candidate(n, (), ()) for n in names]
        if not self.base:
            raise PlanError("no base preset: give [base] in the plan or --model PATH / --set KEY=VALUE")
        try:
            return expand(self.name, self.base, self.axes)
        except GridError as e:
            raise PlanError(str(e)) from e


TUNE_KEYS = {"name", "base", "axes", "url", "presets", "control", "main_url", "llama_server", "output_dir",
             "protocol", "screen_max_tokens", "finalists", "budget", "quality"}


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise PlanError(f"tune plan: [{key}] must be a table")
    return value


def _sub(cls: type, data: dict[str, Any], where: str) -> Any:
    check_keys(where, data, {f.name for f in fields(cls)})
    return cls(**data)


def tune_plan_from_mapping(data: dict[str, Any], relative_to: Path | None = None) -> TunePlan:
    check_keys("tune plan", data, TUNE_KEYS)
    try:
        axes = tuple(parse_axis(name, values) for name, values in _table(data, "axes").items())
    except GridError as e:
        raise PlanError(f"tune plan: {e}") from e
    where = relative_to or Path(".")
    values: dict[str, Any] = {k: v for k, v in data.items() if k not in ("axes", "protocol", "budget", "quality")}
    if "main_url" in values and not values["main_url"]:
        values["main_url"] = None
    values.setdefault("output_dir", "tune-results")
    for key in ("llama_server", "output_dir"):
        if key in values:
            values[key] = Path(values[key]) if Path(values[key]).is_absolute() else where / values[key]
    values["presets"] = tuple(values.get("presets", ()))
    plan = TunePlan(
        **values, axes=axes,
        protocol=protocol_from_mapping(_table(data, "protocol"), relative_to=relative_to),
        budget=_sub(Budget, _table(data, "budget"), "[budget]"),
        quality=_sub(QualityGate, _table(data, "quality"), "[quality]"),
    )
    check_scalars(plan)
    return plan


def check_scalars(plan: TunePlan) -> None:
    """The plain fields' types and ranges (the nested ones check themselves)."""
    try:
        check_fields(_Scalars(plan.name, plan.screen_max_tokens, plan.finalists, plan.url, plan.main_url))
    except PlanError as e:
        raise PlanError(f"tune plan: {e}") from e
    if not isinstance(plan.base, dict):
        raise PlanError("tune plan: [base] must be a table of llama-server keys")


@dataclass(frozen=True)
class _Scalars:
    name: str
    screen_max_tokens: int = field(metadata={"min": 2})
    finalists: int = field(metadata={"min": 1})
    url: str | None = field(default=None, metadata={"url": "server"})
    main_url: str | None = field(default=None, metadata={"url": "server"})


def load_tune_plan(path: Path) -> TunePlan:
    return tune_plan_from_mapping(load_plan_file(path), relative_to=path.parent)


def parse_value(text: str) -> Value:
    """A flag's value as the plan file would hold it: whole numbers, numbers and true/false typed."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def parse_assignment(text: str, what: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise PlanError(f"{what} {text!r}: write KEY=VALUE, e.g. ctx-size=4096")
    return key.strip(), value


def with_flags(plan: TunePlan, *, sets: tuple[str, ...] = (), axes: tuple[str, ...] = (),
               model: str | None = None, **changes: Any) -> TunePlan:
    """The plan with the command line's settings on top: --set and --model extend the base, --axis adds
    (or replaces) an axis; other changes replace fields."""
    base = dict(plan.base)
    if model:
        base["model"] = model
    for item in sets:
        key, value = parse_assignment(item, "--set")
        base[key] = parse_value(value)
    axis_list = list(plan.axes)
    for item in axes:
        key, value = parse_assignment(item, "--axis")
        try:
            axis = parse_axis(key, [parse_value(v) for v in value.split(",") if v.strip()])
        except GridError as e:
            raise PlanError(str(e)) from e
        axis_list = [a for a in axis_list if a.name != key] + [axis]
    given = {k: v for k, v in changes.items() if v is not None and v != ()}
    plan = replace(plan, base=base, axes=tuple(axis_list), **given)
    check_scalars(plan)
    return plan
