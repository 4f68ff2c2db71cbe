"""The registry of engine kinds: --engine's choices and help come from it, and opening an engine goes
through its entry with the connection settings that kind takes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.engines import (
    DEFAULT_ENGINE,
    ENGINES,
    REGISTRY,
    LlamaCppEngine,
    OpenAIEngine,
    capabilities_of,
    engine_help,
    open_engine,
)


def test_every_kind_is_in_the_help_and_the_first_is_the_default() -> None:
    assert ENGINES == ("llama-cpp", "openai") and DEFAULT_ENGINE == "llama-cpp"
    text = engine_help()
    for kind in REGISTRY.values():
        assert f"{kind.name}: {kind.describe}" in text
        assert capabilities_of(kind.name) is kind.capabilities
    assert text.startswith("llama-cpp: a llama.cpp router (default);")
    shown = " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split())
    assert "openai: any OpenAI-compatible server." in shown


def test_open_engine_goes_through_the_kinds_entry() -> None:
    router = open_engine("llama-cpp", "http://127.0.0.1:9", timeout=3.0, load_timeout=7.0, streams=2)
    other = open_engine("openai", "http://127.0.0.1:9", timeout=3.0, metrics_url="/m")
    try:
        assert isinstance(router, LlamaCppEngine) and router.load_timeout == 7.0
        assert isinstance(other, OpenAIEngine) and other.metrics_path == "/m"
    finally:
        router.close()
        other.close()
    with pytest.raises(ValueError, match="unknown engine 'vllm'; choose one of llama-cpp, openai"):
        open_engine("vllm", "http://127.0.0.1:9", timeout=3.0)
