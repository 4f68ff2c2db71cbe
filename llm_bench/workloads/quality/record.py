"""The quality workload's part of a record (``[aliases.quality]``): what each configuration answered and
the token distributions it gave, kept so that ``score.py`` can compare configurations at report time."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from llm_bench.results import AliasRecord, known

# The ``workload`` of the quality workload's records.
QUALITY_RECORDS = "quality"


@dataclass
class QualityOutput:
    """One greedy answer of the quality workload's agreement set."""

    prompt_id: str
    text: str
    output_tokens: int | None = None
    token_ids: list[int] | None = None  # where the server reports them (logprobs with ids)
    finish_reason: str | None = None


@dataclass
class RecallProbe:
    """One needle at one depth of one filler length; skipped (with the reason) beyond the context."""

    length_tokens: int
    depth: float
    expected: str
    prompt_tokens: int | None = None
    answer: str | None = None
    found: bool | None = None
    skipped: str | None = None


@dataclass
class QuestionResult:
    """One exact-answer question."""

    question_id: str
    kind: str
    expected: str
    answer: str
    correct: bool


@dataclass
class ForcedText:
    """One segment of the reference text teacher-forced through a configuration: its token ids as this
    configuration tokenises it, and from position ``first`` on, the top-k next tokens the server listed
    (``top_ids[j]``, ``top_logprobs[j]``: after the first ``first + j`` ids)."""

    segment: str
    text: str
    prompt: str  # the leading part of text that is not scored (a chat-templated question; empty for a file)
    first: int
    token_ids: list[int]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


@dataclass
class ExactAnswer:
    """One generated exact-answer item (``llm_bench.quality.exact_items``)."""

    item_id: str
    answer: str
    correct: bool


_LISTS = {"outputs": QualityOutput, "recall": RecallProbe, "questions": QuestionResult, "forced": ForcedText,
          "exact_answers": ExactAnswer}
# Files written before the workload owned its part kept it in the record's flat keys, some named otherwise.
_LEGACY_KEYS = {"quality_comparison": "comparison", "quality_outputs": "outputs", "recall": "recall",
                "questions": "questions", "top_k": "top_k", "forced": "forced", "forced_error": "forced_error",
                "forced_seconds": "forced_seconds", "exact_answers": "exact_answers"}


@dataclass
class QualityResults:
    """Everything the quality workload measured of one configuration. A comparison that cannot be made (no
    log-probabilities, a text beyond the context, another tokeniser) is named in ``forced_error``, never
    scored."""

    comparison: str | None = None  # "tokens" (token ids reported) or "characters"
    outputs: list[QualityOutput] = field(default_factory=list)
    recall: list[RecallProbe] = field(default_factory=list)
    questions: list[QuestionResult] = field(default_factory=list)
    # Token distributions over the reference text (top_k per position) and the exact-answer items.
    top_k: int | None = None
    forced: list[ForcedText] = field(default_factory=list)
    forced_error: str | None = None
    forced_seconds: float | None = None
    exact_answers: list[ExactAnswer] = field(default_factory=list)
    tails: ClassVar[bool] = False

    @property
    def distinction(self) -> str:
        return QUALITY_RECORDS

    @property
    def measured(self) -> bool:
        """Anything to compare: answers, distributions or a named reason why there are none."""
        return bool(self.outputs or self.forced or self.forced_error or self.exact_answers)

    def to_toml(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> QualityResults:
        fields = known(cls, data)
        for name, kind in _LISTS.items():
            fields[name] = [kind(**known(kind, item)) for item in data.get(name, [])]
        return cls(**fields)

    @staticmethod
    def legacy(record: dict[str, Any]) -> dict[str, Any] | None:
        table = {new: record[old] for old, new in _LEGACY_KEYS.items() if old in record}
        return table or None


def quality_results(record: AliasRecord) -> QualityResults:
    """The record's quality results; empty for a record of another workload (or a quality record cut short
    before it measured anything)."""
    return record.part if isinstance(record.part, QualityResults) else QualityResults()
