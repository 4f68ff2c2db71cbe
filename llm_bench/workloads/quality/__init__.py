"""The quality workload: ``measure.py`` sends the shipped quality set; ``score.py`` compares what was
answered with a reference configuration at report time."""

from __future__ import annotations

from llm_bench.workloads.quality.measure import (
    QUALITY,
    code_found,
    is_correct,
    load_quality_set,
    quality,
    recall_prompt,
    trim_answer,
)
from llm_bench.workloads.quality.settings import QualitySettings

__all__ = ["QUALITY", "QualitySettings", "code_found", "is_correct", "load_quality_set", "quality", "recall_prompt", "trim_answer"]
