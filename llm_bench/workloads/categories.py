"""The same measured runs with each shipped prompt category (prose, code, JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from llm_bench.engines import Engine
from llm_bench.prompts import shipped_prompt
from llm_bench.results import AliasRecord, known
from llm_bench.validation import check_fields
from llm_bench.workloads.base import Flag, Keep, Log, RunParameters, Workload
from llm_bench.workloads.common import chat_request, derive, measured_runs

PROMPT_CATEGORIES = ("prose", "code", "json")


@dataclass
class PromptCategory:
    """The categories workload's part of a record (``[aliases.category]``): the shipped prompt it was sent."""

    name: str
    tails: ClassVar[bool] = False

    @property
    def distinction(self) -> str:
        return self.name

    def to_toml(self) -> dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> PromptCategory:
        return cls(**known(cls, data))

    @staticmethod
    def legacy(record: dict[str, Any]) -> dict[str, Any] | None:
        """Files written before the part was the workload's kept ``category = "code"`` in the record."""
        return {"name": record["category"]} if isinstance(record.get("category"), str) else None


def category_of(record: AliasRecord) -> str | None:
    """The prompt category of a categories record; None for any other record."""
    return record.part.name if isinstance(record.part, PromptCategory) else None


@dataclass(frozen=True)
class CategoriesSettings:
    names: tuple[str, ...] = PROMPT_CATEGORIES

    def __post_init__(self) -> None:
        check_fields(self)


def categories(engine: Engine, alias: str, protocol: RunParameters, base: AliasRecord, log: Log,
               keep: Keep) -> None:
    for category in CATEGORIES.settings_in(protocol).names:
        if category not in PROMPT_CATEGORIES:
            raise ValueError(f"unknown prompt category {category!r}; choose from {', '.join(PROMPT_CATEGORIES)}")
        log(f"  category {category}:")
        record = derive(base, workload=CATEGORIES.record_name, part=PromptCategory(category), cold_load_s=None)
        request = chat_request(alias, protocol, shipped_prompt(category))
        measured_runs(engine, request, protocol.runs, record, log, keep, label=f"{category} run",
                      precision=protocol.precision, max_runs=protocol.max_runs)
        keep(record)


CATEGORIES: Workload[CategoriesSettings] = Workload(
    "categories", CategoriesSettings, categories, record="category", legacy={"categories": "names"},
    flags=(Flag("--categories", "names", "Prompt categories for the categories workload", many=True),), speed=True,
    part=PromptCategory)
