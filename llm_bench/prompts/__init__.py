"""The prompts shipped with llm-bench: ``code``, ``prose``, ``json`` (the protocol's and the categories'),
and the quality set (``quality.toml``, read by the quality workload)."""

from __future__ import annotations

from importlib import resources

from llm_bench.validation import PlanError


def shipped_prompt(name: str) -> str:
    folder = resources.files(__package__)
    path = folder / f"{name}.txt"
    if not path.is_file():
        available = sorted(p.name.removesuffix(".txt") for p in folder.iterdir() if p.name.endswith(".txt"))
        raise PlanError(f"no shipped prompt named {name!r}; choose one of {', '.join(available)} or give a prompt file")
    return path.read_text()
