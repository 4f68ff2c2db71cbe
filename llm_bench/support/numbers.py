"""How llm-bench writes numbers for people: one place, so every table and log line agrees."""

from __future__ import annotations

MISSING = "-"


def fmt(value: float | None, digits: int = 1, missing: str = MISSING) -> str:
    """A figure with ``digits`` decimals; ``missing`` (never 0) where there is no figure."""
    return missing if value is None else f"{value:.{digits}f}"
