"""The package's layout promises: no test code reachable from it, data flowing one way, and
results files written before the layout change still loading and reporting identically."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from llm_bench.engines import Engine, LlamaCppEngine, OpenAIEngine
from llm_bench.plan import Protocol
from llm_bench.report import load_rows, markdown_table
from llm_bench.results import load_results
from llm_bench.workloads import PARTS

PACKAGE = Path(__file__).resolve().parents[1] / "llm_bench"

# Which layer may import which: a module never imports from a layer above its own.
LAYERS = ["support", "quality", "validation", "prompts", "testbed", "engines", "results", "preset_args", "tables",
          "gpu", "fingerprint", "provenance", "interference", "diagnostics", "workloads", "plan", "runner", "report", "sweep", "boxes",
          "demo", "tune", "soak", "power", "capacity", "failover", "history", "sources", "cli"]


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "llm_bench" and len(parts) > 1 else None


def test_no_module_of_the_package_imports_from_tests() -> None:
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if any(m == "tests" or m.startswith("tests.") for m in imports_of(p))]
    assert offenders == []


def defines_something(path: Path) -> bool:
    return any(isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))
               for node in ast.parse(path.read_text()).body)


def test_every_module_has_a_layer_and_a_line_in_docs_layout() -> None:
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text()
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or defines_something(p)]
    names = [p.relative_to(PACKAGE) for p in modules]
    assert sorted({n.parts[0].removesuffix(".py") for n in names} - {"__init__", "__main__"} - set(LAYERS)) == []
    assert [str(n) for n in names if f"`{n}`" not in layout] == []


def test_docs_layout_lists_the_layers_in_this_order() -> None:
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text()
    listed = layout.split("with the layers in this order (lowest first):", 1)[1].lstrip().split("\n\n", 1)[0]
    assert re.findall(r"`(\w+)`", listed) == LAYERS


def test_no_module_reaches_back_up() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own not in LAYERS:
            continue
        for module in imports_of(path):
            other = layer_of(module)
            if other in LAYERS and LAYERS.index(other) > LAYERS.index(own):
                upward.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert upward == []


OLD_FILE = '''\
[meta]
format = "llm-bench/1"
llm_bench_version = "0.1.0"
started_at = "2026-11-29T03:00:00+00:00"
complete = true
host = "nixos-3090"
label = "stock"
engine = "llama-cpp"
server_url = "http://127.0.0.1:48123"

[meta.protocol]
prompt_name = "code"
max_tokens = 512
runs = 3
workloads = ["protocol"]

[[aliases]]
alias = "qwen-base"
target = "stock"
engine = "llama-cpp"
workload = "protocol"
comparable = true
preset_args = ["--ctx-size", "65536"]

[[aliases.runs]]
decode_tps = 40.0
ttft_ms = 900.0
output_tokens = 512

[[aliases.runs]]
decode_tps = 41.0
ttft_ms = 910.0
output_tokens = 512

[[aliases]]
alias = "qwen-mtp2"
target = "stock"
engine = "llama-cpp"
workload = "protocol"
comparable = true
preset_args = ["--ctx-size", "65536", "--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]

[[aliases.runs]]
decode_tps = 60.0
ttft_ms = 950.0
output_tokens = 512
'''


def test_a_results_file_from_before_the_rename_loads_and_reports_as_standard(tmp_path: Path) -> None:
    path = tmp_path / "old.toml"
    path.write_text(OLD_FILE)
    records = load_results(path, PARTS).aliases
    assert [r.workload for r in records] == ["standard", "standard"]
    table = markdown_table(load_rows([path]))
    assert "qwen-base" in table and "qwen-mtp2" in table and "60.0" in table and "40.5" in table


def test_a_plan_or_flag_saying_protocol_means_the_standard_workload() -> None:
    assert Protocol(workloads=("protocol", "concurrency")).workloads == ("standard", "concurrency")
    assert Protocol().workloads == ("standard",)


def test_both_engines_implement_the_engine_interface() -> None:
    for engine in (LlamaCppEngine("http://127.0.0.1:9", timeout=1), OpenAIEngine("http://127.0.0.1:9", timeout=1)):
        try:
            assert isinstance(engine, Engine)
        finally:
            engine.close()


# What an exception may hold besides its message: the error it wraps, the results file where what was measured
# already is, an HTTP status, a bad plan value's field and rule. Measured records reach the file as they are made
# (a recorder, a level the caller holds), never up the stack inside an exception.
EXCEPTION_ATTRIBUTES = {"cause", "path", "status", "field", "rule"}


def attributes_set_on_self(node: ast.ClassDef) -> set[str]:
    return {target.attr for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"}


def exception_classes() -> dict[str, ast.ClassDef]:
    """Every class of the package that derives, by name, from an exception (its bases are read, not imported)."""
    classes = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node
    bases = {name: {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                    if isinstance(b, (ast.Name, ast.Attribute))} for name, node in classes.items()}

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in ("Exception", "BaseException", "KeyboardInterrupt") or name.endswith("Error"):
            return True
        return any(is_exception(b, seen | {name}) for b in bases.get(name, ()) if b not in seen)

    return {name: node for name, node in classes.items() if any(is_exception(b) for b in bases[name])}


def test_no_exception_class_carries_measured_records() -> None:
    found = exception_classes()
    assert {"LevelAborted", "LevelInterrupted", "RunInterrupted", "WorkloadInterrupted"} <= set(found)
    carried = {name: sorted(attributes_set_on_self(node) - EXCEPTION_ATTRIBUTES) for name, node in found.items()}
    assert {name: extra for name, extra in carried.items() if extra} == {}
