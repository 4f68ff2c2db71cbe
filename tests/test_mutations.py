"""The mutation check (scripts/mutation-check.py): every declared mutation applies to today's code and
names tests that exist; the script tells killed from survived on a small repository of its own; and the
fast mutations (no llama-server) are all killed: this is the part CI runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "mutation-check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("mutation_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


mutation_check = load_script()


def run_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_every_mutation_applies_once_and_names_existing_tests():
    mutations = mutation_check.load_mutations(ROOT)
    assert mutations, "tests/mutations/*.toml declare no mutation"
    assert mutation_check.problems(mutations, ROOT) == []


def test_the_figures_mutations_named_in_the_issue_are_kept():
    names = {m.name for m in mutation_check.load_mutations(ROOT) if m.source.endswith("figures.toml")}
    assert {"TTFT stored in seconds", "TTFT clock started at the response head", "median -> mean",
            "p90 with 9 samples", "decode t/s from the client instead of the server",
            "no unload before the cold load", "cache_n not recorded", "acceptance = drafted / accepted (inverted)",
            "results file drops finished runs (runner, failed run)"} <= names


MINI_TESTS = '''
import subprocess, sys
from pkg.m import f

def test_f():
    assert f() == 1

def test_cli(tmp_path):
    # started elsewhere: only PYTHONPATH can lead this interpreter to the copy's package
    out = subprocess.run([sys.executable, "-m", "pkg"], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.strip() == "1"
'''

MINI_MUTATIONS = '''
[[mutation]]
name = "caught in process"
file = "pkg/m.py"
find = "return 1"
replace = "return 2"
tests = ["tests/test_m.py::test_f"]
fast = true

[[mutation]]
name = "caught only in a subprocess"
file = "pkg/m.py"
find = "return 1"
replace = "return 3"
tests = ["tests/test_m.py::test_cli"]
fast = true

[[mutation]]
name = "a comment"
file = "pkg/m.py"
find = "# one"
replace = "# two"
tests = ["tests/test_m.py"]
fast = true

[[mutation]]
name = "code that is gone"
file = "pkg/m.py"
find = "return 4"
replace = "return 5"
tests = ["tests/test_m.py"]
fast = false
'''


def mini_repo(root: Path, mutations: str = MINI_MUTATIONS) -> Path:
    files = {
        "pkg/__init__.py": "",
        "pkg/m.py": "def f():\n    return 1  # one\n",
        "pkg/__main__.py": "from pkg.m import f\n\nprint(f())\n",
        "tests/__init__.py": "",
        "tests/test_m.py": textwrap.dedent(MINI_TESTS),
        "tests/mutations/mini.toml": textwrap.dedent(mutations),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_script_tells_killed_from_survived_and_restores_each_file(tmp_path):
    repo = mini_repo(tmp_path / "repo")
    result = run_script("--root", str(repo), "--package", "pkg", timeout=120)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "KILLED   caught in process" in out
    assert "KILLED   caught only in a subprocess" in out  # python -m pkg ran the mutated copy
    assert "SURVIVED a comment" in out
    assert "ERROR    code that is gone" in out and "occurs 0 times" in out
    assert "4 mutations: 2 killed, 1 survived, 1 errors" in out
    assert (repo / "pkg" / "m.py").read_text() == "def f():\n    return 1  # one\n"  # the original is untouched

    # two copies side by side (CI's way): the same outcomes, printed in the files' order
    fast = run_script("--root", str(repo), "--package", "pkg", "--fast", "--name", "caught", "--jobs", "2",
                      timeout=120)
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert [line.split()[1:3] for line in fast.stdout.splitlines() if line.startswith("[")] == [
        ["KILLED", "caught"], ["KILLED", "caught"]]
    assert fast.stdout.index("caught in process") < fast.stdout.index("caught only in a subprocess")
    assert "2 mutations: 2 killed, 0 survived, 0 errors" in fast.stdout


def test_side_by_side_copies_are_refused_for_mutations_that_start_llama_server(tmp_path):
    repo = mini_repo(tmp_path / "repo")
    result = run_script("--root", str(repo), "--package", "pkg", "--jobs", "2", timeout=60)
    assert result.returncode == 2
    assert "--jobs must be 1, or more with --fast" in result.stderr and "KILLED" not in result.stdout


def test_tests_that_fail_unmutated_are_refused(tmp_path):
    repo = mini_repo(tmp_path / "repo")
    test_file = repo / "tests" / "test_m.py"
    test_file.write_text(test_file.read_text().replace("assert f() == 1", "assert f() == 7"))
    result = run_script("--root", str(repo), "--package", "pkg", "--name", "in process", timeout=120)
    assert result.returncode == 2
    assert "the tests fail without any mutation" in result.stderr


def test_malformed_mutation_files_are_refused_with_the_fix(tmp_path):
    repo = mini_repo(tmp_path / "repo", '[[mutation]]\nname = "x"\nfile = "pkg/m.py"\n')
    result = run_script("--root", str(repo), "--package", "pkg", timeout=60)
    assert result.returncode == 2
    assert "mini.toml, mutation 1 ('x'): missing ['find', 'replace', 'tests', 'fast']" in result.stderr
    duplicated = mini_repo(tmp_path / "dup", MINI_MUTATIONS.replace('"a comment"', '"caught in process"'))
    result = run_script("--root", str(duplicated), "--package", "pkg", timeout=60)
    assert result.returncode == 2 and "must be unique" in result.stderr


@pytest.mark.long
def test_every_fast_mutation_is_killed():
    result = run_script("--fast", "--jobs", "3", timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " 0 survived, 0 errors" in result.stdout
