"""The one table of speculative-decoding flags (preset_args.SPECULATION) against llama.cpp's own list in
the pinned common/arg.cpp, every spelling asked each question, and every caller giving the same answer
for a preset that drafts from a model given only as a source (``-hfd``) with no spec-type."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from llm_bench import preset_args
from llm_bench.diagnostics.fork import check_fork_control, is_control
from llm_bench.engines.metrics import SpecCounters
from llm_bench.gpu.roofline import acceptance_length
from llm_bench.preset_args import (
    DRAFT_MAX,
    DRAFT_MODEL,
    DRAFT_SOURCE,
    SPEC_DEFAULT,
    SPEC_SETTINGS,
    SPECULATION,
    SPECULATIVE_FLAGS,
    VLLM_SPECULATION,
    describe_preset,
    draft_max,
    drafts_from_context,
    ini_flag,
    is_speculative,
    is_speculative_flag,
    names_speculation,
    settings_speculate,
    settings_without_speculation,
    speculation,
    without_speculation,
)
from llm_bench.report.rows import Row
from llm_bench.results import AliasRecord
from llm_bench.testbed.llama_server import read_source_file
from llm_bench.tune.grid import effective
from llm_bench.workloads.quality.record import QualityOutput, QualityResults
from llm_bench.workloads.quality.score import control_for, quality_rows

MODEL = ["llama-server", "--model", "/m/smol.gguf", "--ctx-size", "4096"]
DRAFTERS = DRAFT_MODEL + DRAFT_SOURCE


@cache
def arg_cpp_options() -> list[tuple[tuple[str, ...], bool]]:
    """Every option of the pinned arg.cpp: its spellings (negative ones too) and whether set_spec() marks it."""
    source = read_source_file("common/arg.cpp")
    options = []
    for block in source.split("add_opt(common_arg(")[1:]:
        names = re.match(r"\s*((?:\{[^}]*\}\s*,\s*)+)", block)
        if names:
            options.append((tuple(re.findall(r'"(-[^"]*)"', names.group(1))), ".set_spec()" in block))
    return options


def test_every_flag_of_the_table_is_one_llama_cpp_knows_with_its_spellings_together() -> None:
    # an entry is one llama.cpp option, or one and the older spellings llama.cpp now refuses (--draft-max)
    for option in SPECULATION:
        parts = [set(s) for s, _ in arg_cpp_options() if set(s) & set(option)]
        assert parts and set().union(*parts) == set(option), f"{option} against common/arg.cpp: {parts}"


def test_the_table_holds_every_speculative_option_llama_cpp_has() -> None:
    # set_spec() marks llama.cpp's speculative options; the drafter's KV types lack the mark but are its too
    speculative = [s for s, spec in arg_cpp_options() if spec or any("draft" in f or f.startswith("--spec-") for f in s)]
    assert speculative and [s for s in speculative if not any(set(s) <= set(o) for o in SPECULATION)] == []
    assert len(SPECULATIVE_FLAGS) == sum(len(option) for option in SPECULATION)  # no spelling twice


@pytest.mark.parametrize("flag", sorted(SPECULATIVE_FLAGS))
def test_every_spelling_is_speculative_and_its_ini_key_is_the_same_flag(flag: str) -> None:
    assert is_speculative_flag(flag) and names_speculation([*MODEL, flag, "1"])
    assert ini_flag(flag.lstrip("-")) == flag
    assert without_speculation([*MODEL, flag, "1"]) == without_speculation(MODEL)


@pytest.mark.parametrize("flag", DRAFTERS)
def test_a_drafter_alone_in_any_spelling_is_speculation_by_a_drafter(flag: str) -> None:
    args = [*MODEL, flag, "org/drafter-GGUF" if flag in DRAFT_SOURCE else "/m/d.gguf"]
    assert is_speculative(args) and speculation(args) == "draft model" and describe_preset(args) == "draft model"
    assert drafts_from_context(args) is False  # a drafter's dtype or vocabulary can be wrong
    assert not is_speculative([*args, "--spec-type", "none"])  # an explicit type decides
    assert speculation([*args, "--spec-type", "none"]) == "-"
    assert drafts_from_context([*args, "--spec-type", "ngram-simple"]) is False


@pytest.mark.parametrize("flag", DRAFT_MAX)
def test_every_spelling_of_the_draft_depth(flag: str) -> None:
    args = [*MODEL, "--spec-type", "draft-simple", "-md", "/m/d.gguf", flag, "4"]
    assert draft_max(args) == 4 and speculation(args) == "draft-simple n=4"
    assert draft_max([*MODEL, flag, "many"]) is None


def test_the_type_decides_and_n_gram_types_draft_from_the_context() -> None:
    assert speculation(MODEL) == "-" and not is_speculative(MODEL) and draft_max(MODEL) is None
    assert drafts_from_context([]) is None  # an OpenAI server reports no arguments
    for kind in ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-cache"):
        args = [*MODEL, "--spec-type", kind]
        assert is_speculative(args) and drafts_from_context(args) is True and speculation(args) == kind
    assert speculation([*MODEL, "--spec-type", "none,ngram-mod"]) == "ngram-mod"
    assert drafts_from_context([*MODEL, "--spec-type", "ngram-mod,draft-mtp"]) is False
    for flag in SPEC_DEFAULT:  # llama.cpp's default: n-gram-mod drafting
        assert is_speculative([*MODEL, flag]) and drafts_from_context([*MODEL, flag]) is True
    # a setting of the drafter alone drafts nothing, yet it is not a plain control either
    setting = SPEC_SETTINGS[0][1]
    assert not is_speculative([*MODEL, setting, "4"]) and names_speculation([*MODEL, setting, "4"])


def test_ini_settings_ask_the_same_table() -> None:
    for flag in DRAFTERS:
        settings = {"model": "/m/smol.gguf", flag.lstrip("-"): "/m/d.gguf", "spec-draft-n-max": 4}
        assert settings_speculate(settings) and effective(settings) == settings
    plain = {"model": "/m/smol.gguf", "spec-type": "none", "hfd": "org/d", "ctkd": "q8_0", "draft-max": 4,
             "spec-default": False, "cache-type-k": "q8_0"}
    assert not settings_speculate(plain)
    assert effective(plain) == settings_without_speculation(plain) == {
        "model": "/m/smol.gguf", "spec-type": "none", "cache-type-k": "q8_0"}  # the control keeps spec-type
    assert settings_speculate({"model": "/m/smol.gguf", "spec-default": True})


def record(alias: str, args: list[str], ids: list[int]) -> AliasRecord:
    return AliasRecord(alias=alias, target="t", workload="quality", server_build="b1",
                       preset_args=[*MODEL, "--port", "1234", "--alias", alias, *args],
                       part=QualityResults("tokens", [QualityOutput("code", "", len(ids), ids, "length")]))


def row(r: AliasRecord) -> Row:
    return Row(r.configuration, r, r.target, r.engine)


@pytest.mark.parametrize("flag", DRAFT_SOURCE)
def test_a_drafter_given_only_as_a_source_is_speculative_to_every_caller(flag: str) -> None:
    ids = list(range(100))
    plain = row(record("plain", [], ids))
    sourced = row(record("hfd", [flag, "org/drafter-GGUF", "--spec-draft-n-max", "4"], ids[:3] + [0] * 97))
    args = sourced.record.preset_args
    assert speculation(args) == "draft model"  # the Speculation column
    assert control_for(sourced, [plain, sourced]) is plain  # the control choice
    flagged = {q.configuration: q for q in quality_rows([plain, sourced], plain)}["hfd"]
    assert flagged.flagged is not None and "speculation changed the output" in flagged.flag_text()
    assert not is_control(args) and check_fork_control("--build llamampere", {"hfd": args}) == []
    assert drafts_from_context(args) is False
    sourced.record.spec = SpecCounters(400.0, 200.0)
    assert acceptance_length(sourced.record) == pytest.approx(1 + 0.5 * 4)  # the roofline's depth


def _string_literals(path: Path) -> Iterator[tuple[int, str]]:
    """The string constants of a module but its docstrings (prose may name a flag to explain it)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_module_but_the_table_names_a_speculative_flag() -> None:
    flags = sorted({*SPECULATIVE_FLAGS, *VLLM_SPECULATION}, key=len, reverse=True)
    named = re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, flags)) + r"|--spec-[\w-]+|--speculative[-_]\w+)(?![\w-])")
    package = Path(preset_args.__file__).parent
    found = [f"{path.relative_to(package)}:{line}: {match}" for path in sorted(package.rglob("*.py"))
             if path.name != "preset_args.py" for line, text in _string_literals(path) for match in named.findall(text)]
    assert found == []
