"""The quality workload's settings (``[protocol.quality]`` in a plan) and the reference text the runner
carries in them from the first configuration to the rest. Apart from measure.py and forced.py, so that
both read them and neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from llm_bench.validation import FieldError, check_fields


@dataclass(frozen=True)
class ReferenceText:
    """One segment of the reference text: ``text`` in full, ``prompt`` its leading part that is not scored
    (the chat-templated question; empty for a user's file), and the reference's token ids of ``text``."""

    segment: str
    text: str
    prompt: str
    token_ids: tuple[int, ...]
    made_by: str  # the configuration whose answers (or tokeniser) made it


@dataclass(frozen=True)
class QualitySettings:
    # Long-context recall: filler lengths in tokens (sized for a 24 GB card; a length beyond the model's
    # context is skipped with the reason) and needle depths (0 = start).
    recall_lengths: tuple[int, ...] = field(default=(8192, 32768), metadata={"min": 64})
    recall_depths: tuple[float, ...] = field(default=(0.1, 0.5, 0.9), metadata={"min": 0.0, "max": 1.0})
    # A cap on the output tokens of the agreement prompts (each has its own max_tokens).
    max_tokens: int | None = field(default=None, metadata={"min": 1})
    chars_per_token: float = field(default=4.0, metadata={"above": 0.0})  # the filler's length is set in characters
    # Token distributions: the top_k next-token log-probabilities at every position of the reference text
    # (vLLM lists at most its --max-logprobs, 20 by default). The text: the first configuration's greedy
    # answers of up to text_tokens each to the shipped [[divergence]] prompts, or the user's own file.
    # 0: none measured (then no verdict).
    top_k: int = field(default=20, metadata={"min": 0})
    text_tokens: int = field(default=512, metadata={"min": 1})
    text_file: Path | None = None
    # The exact-answer items: this many of each of the 4 families at each difficulty (0: none).
    exact_items_per_kind: int = field(default=20, metadata={"min": 0})
    exact_difficulties: tuple[Literal["easy", "medium", "hard"], ...] = ("easy", "medium", "hard")
    # Set by the runner once the first configuration has made the reference text (never by a plan).
    reference_text: tuple[ReferenceText, ...] = field(default=(), metadata={"carried": True})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.text_file is not None and not self.text_file.is_file():
            raise FieldError("text_file", f"must be a text file that exists, not {str(self.text_file)!r}")
