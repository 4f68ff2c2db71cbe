#!/usr/bin/env python3
"""Break the product code on purpose, one curated mutation at a time, and check that the tests notice.

Mutations live beside the tests, in ``tests/mutations/*.toml`` (one file per area):

    [[mutation]]
    name = "TTFT stored in seconds"            # short, unique across all files
    file = "llm_bench/workloads/common.py"     # repo-relative
    find = "m.ttft_s * 1000.0"                 # must occur exactly once in the file
    replace = "m.ttft_s"
    tests = ["tests/test_figures.py::test_ttft_is_send_to_first_content_token_in_milliseconds"]
    fast = true                                # its tests need no llama-server (CI runs these)

The repository (its git-tracked and untracked, not ignored files: no .venv, no .git) is copied once
to a temporary folder. The selected tests are first run there unmutated: they must pass, or every
mutation would look caught. Then for each mutation the file is changed, its tests run with
``pytest -x`` in a fresh process forked from the copy's worker (cwd and PYTHONPATH = the copy, so a test
that starts ``python -m llm_bench`` or ``llm-bench`` in a subprocess runs the mutated code too; checked
before anything runs), and the file is restored. With ``--jobs N`` (fast mutations only: theirs start no
llama-server) N copies try mutations side by side, one at a time each. Each mutation is KILLED (a test failed), SURVIVED (all passed: a wrong figure the
suite does not notice) or ERROR (its text is not in the file once, or its tests could not be run).

Exit status: 0 all killed; 1 a mutation survived or could not be applied; 2 bad mutation files,
the copy does not import its own code, or the tests fail unmutated.
"""

from __future__ import annotations

import argparse
import compileall
import concurrent.futures
import fnmatch
import json
import os
import py_compile
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTATIONS = Path("tests") / "mutations"
PACKAGE = "llm_bench"
KEYS = {"name": str, "file": str, "find": str, "replace": str, "tests": list, "fast": bool}


class MutationFileError(ValueError):
    pass


class WorkerError(RuntimeError):
    pass


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    fast: bool
    source: str  # the mutations file it is declared in


def load_mutations(root: Path = ROOT) -> list[Mutation]:
    """Every mutation of every ``tests/mutations/*.toml``; a malformed entry is a MutationFileError."""
    found: list[Mutation] = []
    for path in sorted((root / MUTATIONS).glob("*.toml")):
        where = path.relative_to(root)
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise MutationFileError(f"{where} is not valid TOML: {e}") from e
        unknown = set(data) - {"mutation"}
        if unknown:
            raise MutationFileError(f"{where}: only [[mutation]] tables belong here, not {sorted(unknown)}")
        for n, entry in enumerate(data.get("mutation", []), 1):
            missing = [k for k in KEYS if k not in entry]
            extra = sorted(set(entry) - set(KEYS))
            wrong = [k for k, kind in KEYS.items() if k in entry and not isinstance(entry[k], kind)]
            if missing or extra or wrong:
                raise MutationFileError(
                    f"{where}, mutation {n} ({entry.get('name', 'unnamed')!r}): "
                    + "; ".join(filter(None, [missing and f"missing {missing}", extra and f"unknown keys {extra}",
                                              wrong and f"wrong types for {wrong}"]))
                    + f" (keys: {', '.join(f'{k} ({t.__name__})' for k, t in KEYS.items())})")
            if not entry["tests"] or not all(isinstance(t, str) and t for t in entry["tests"]):
                raise MutationFileError(f"{where}, mutation {entry['name']!r}: tests must list pytest node ids")
            found.append(Mutation(entry["name"], entry["file"], entry["find"], entry["replace"],
                                  tuple(entry["tests"]), entry["fast"], str(where)))
    return found


def problems(mutations: list[Mutation], root: Path = ROOT) -> list[str]:
    """What is wrong with the mutations as declared against the code at ``root`` (empty: nothing)."""
    out = []
    seen: dict[str, str] = {}
    for m in mutations:
        if m.name in seen:
            out.append(f"{m.source}: the name {m.name!r} is already used in {seen[m.name]}")
        seen[m.name] = m.source
        text = applied_problem(m, root)
        if text:
            out.append(f"{m.source}: {m.name!r}: {text}")
        if m.find == m.replace:
            out.append(f"{m.source}: {m.name!r}: replace is the same text as find")
        for test in m.tests:
            path = test.split("::")[0]
            if not (root / path).is_file():
                out.append(f"{m.source}: {m.name!r}: no test file {path}")
            elif "::" in test and not _defines(root / path, test.split("::")[1].split("[")[0]):
                out.append(f"{m.source}: {m.name!r}: {path} has no test {test.split('::')[1]!r}")
            if Path(path).as_posix().startswith(MUTATIONS.as_posix()) or path.endswith("test_mutations.py"):
                out.append(f"{m.source}: {m.name!r}: a mutation's tests cannot include the mutation check itself")
    return out


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", path.read_text(), re.M) is not None


def applied_problem(m: Mutation, root: Path) -> str | None:
    path = root / m.file
    if not path.is_file():
        return f"no file {m.file}"
    count = path.read_text().count(m.find)
    if count != 1:
        return f"the text to find occurs {count} times in {m.file} (it must occur exactly once): {m.find!r}"
    return None


def repo_files(root: Path) -> list[Path]:
    """What a checkout holds: tracked and untracked files git does not ignore (so no .venv, no build
    outputs); outside git, everything but .venv, .git and caches."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=root, capture_output=True, check=True).stdout
        names = [Path(n) for n in listed.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        skip = {".venv", ".git", "__pycache__", ".pytest_cache"}
        names = [p.relative_to(root) for p in root.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(root).parts)]
    return [n for n in names if (root / n).is_file() or (root / n).is_symlink()]


def make_copy(root: Path, dest: Path) -> None:
    for name in repo_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target, follow_symlinks=False)
    # Bytecode checked against a hash of its source, not its time and size: an unchanged module loads without
    # compiling, and a mutated one, or one restored within the same second, never runs from a stale .pyc.
    compileall.compile_dir(dest, quiet=2, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The copy first on the path: a subprocess (python -m llm_bench, the llm-bench script) imports the
    # mutated code, not the editable install's. No new bytecode: only make_copy's, checked by hash.
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_copy(copy: Path, env: dict[str, str], package: str) -> str | None:
    """None when a fresh interpreter, from the copy or from elsewhere, imports the package from the copy."""
    if not (copy / package).is_dir():
        return None
    probe = f"import {package}, pathlib; print(pathlib.Path({package}.__file__).resolve())"
    for cwd in (copy, Path(tempfile.gettempdir())):
        out = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True)
        where = out.stdout.strip()
        if out.returncode != 0 or not Path(where).is_relative_to(copy.resolve()):
            return (f"a subprocess started in {cwd} imports {package} from {where or out.stderr.strip()}, "
                    f"not from the copy {copy}: the tests would not run the mutated code")
    return None


def pytest_args(tests: list[str] | tuple[str, ...]) -> list[str]:
    return ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]


@dataclass(frozen=True)
class Outcome:
    status: str  # KILLED, SURVIVED, ERROR
    detail: str
    seconds: float


# Starting an interpreter, pytest and the third-party modules the tests use (matplotlib alone takes over a
# second) cost most of a fast mutation's time. A worker per copy pays it once: it imports pytest, and after
# the unmutated run every third-party module that run loaded, and forks a child per run. Nothing is ever
# imported from the copy in the worker, so each child imports the package and the tests from the copy's
# files as they are then: the mutated code.
WORKER = r"""
import importlib, json, linecache, os, select, signal, sys
from pathlib import Path

copy = Path.cwd().resolve()
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # what an import prints must not pass for a reply
import pytest

def from_copy(module):
    where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or []), None)
    return bool(where) and Path(where).resolve().is_relative_to(copy)

def run(job):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        linecache.clearcache()
        out = os.open(job["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(out, 2)
        code = pytest.main(job["args"])
        if job.get("modules"):
            Path(job["modules"]).write_text(json.dumps(
                [name for name, module in list(sys.modules.items()) if not from_copy(module)]))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    ended = select.select([os.pidfd_open(pid)], [], [], job["timeout"])[0]
    if not ended:
        os.killpg(pid, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    return os.waitstatus_to_exitcode(status) if ended else None

for line in sys.stdin:
    job = json.loads(line)
    if "preload" in job:
        for name in job["preload"]:
            try:
                importlib.import_module(name)
            except BaseException:
                pass  # a child that needs it meets the same error and reports it
        assert not any(from_copy(m) for m in list(sys.modules.values())), "the worker imported the copy's code"
        print("{}", file=replies, flush=True)
    else:
        print(json.dumps({"code": run(job)}), file=replies, flush=True)
"""


class Worker:
    """One copy's pytest runner (WORKER), started once, running one test selection at a time."""

    def __init__(self, copy: Path) -> None:
        self.copy = copy
        self.output = copy.parent / f"{copy.name}-pytest.out"
        self.modules = copy.parent / f"{copy.name}-modules.json"
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=copy, env=environment(copy),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _ask(self, job: dict) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise WorkerError(f"the pytest worker for {self.copy} ended (exit {self.proc.wait()}); "
                              "its error is printed above")
        return json.loads(reply)

    def run(self, tests: list[str] | tuple[str, ...], timeout: float,
            modules: bool = False) -> tuple[int | None, str]:
        """pytest's exit code (None: past the timeout, the run killed) and its output; with ``modules``, the
        names of the modules the run imported from outside the copy are kept for ``imported``."""
        job = {"args": pytest_args(tests), "output": str(self.output), "timeout": timeout,
               "modules": str(self.modules) if modules else None}
        code = self._ask(job)["code"]
        return code, self.output.read_text(errors="replace")

    def imported(self) -> list[str]:
        return json.loads(self.modules.read_text()) if self.modules.exists() else []

    def preload(self, modules: list[str]) -> None:
        self._ask({"preload": modules})

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def failed_tests(output: str) -> str:
    """The tests that failed, from pytest's short summary."""
    lines = [line[:200] for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if lines:
        return "; ".join(lines)
    return output.strip().splitlines()[-1][:200] if output.strip() else ""


def try_mutation(m: Mutation, worker: Worker, timeout: float) -> Outcome:
    t0 = time.monotonic()
    problem = applied_problem(m, worker.copy)
    if problem:
        return Outcome("ERROR", problem, 0.0)
    path = worker.copy / m.file
    original = path.read_text()
    path.write_text(original.replace(m.find, m.replace, 1))
    try:
        code, output = worker.run(m.tests, timeout)
    finally:
        path.write_text(original)
    seconds = time.monotonic() - t0
    if code is None:
        return Outcome("KILLED", f"the tests ran past {timeout:.0f} s", seconds)
    if code == 0:
        return Outcome("SURVIVED", "every test passed with the code broken", seconds)
    if code == 1:
        return Outcome("KILLED", failed_tests(output), seconds)
    # 2: interrupted or collection error, 4: usage (an unknown node id), 5: no tests collected
    return Outcome("ERROR", f"pytest exit {code}: {failed_tests(output)}", seconds)


def try_all(chosen: list[Mutation], workers: list[Worker], timeout: float) -> Iterator[Outcome]:
    """Each mutation's outcome, in order; each copy holds one mutation at a time."""
    free: queue.Queue[Worker] = queue.Queue()
    for worker in workers:
        free.put(worker)

    def one(m: Mutation) -> Outcome:
        worker = free.get()
        try:
            return try_mutation(m, worker, timeout)
        finally:
            free.put(worker)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(workers)) as pool:
        for future in [pool.submit(one, m) for m in chosen]:
            yield future.result()


def check_all(chosen: list[Mutation], workers: list[Worker], tests: list[str],
              args: argparse.Namespace) -> list[Outcome] | None:
    """Each mutation's outcome, printed as it comes; None when the tests fail unmutated."""
    if not args.no_baseline:
        print(f"Unmutated: {len(tests)} test selections ...", flush=True)
        # Each worker runs a share of the selections, side by side, and then holds what all of them imported.
        sharing = workers[:max(1, min(len(workers), len(tests)))]
        shares = [tests[n::len(sharing)] for n in range(len(sharing))]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(sharing)) as pool:
            runs = list(pool.map(lambda worker, share: worker.run(share, args.timeout * 2, modules=True),
                                 sharing, shares))
        for code, output in runs:
            if code != 0:
                print(f"mutation-check: the tests fail without any mutation (pytest exit {code}): "
                      f"{failed_tests(output)}\nFix them first: a mutation can only be caught by tests that pass.",
                      file=sys.stderr)
                return None
        imported = list(dict.fromkeys(name for worker in sharing for name in worker.imported()))
        for worker in workers:
            worker.preload(imported)
    width = max(len(m.name) for m in chosen)
    outcomes = []
    tried = zip(chosen, try_all(chosen, workers, args.timeout), strict=True)
    for n, (m, outcome) in enumerate(tried, 1):
        outcomes.append(outcome)
        print(f"[{n}/{len(chosen)}] {outcome.status:<8} {m.name:<{width}}  {m.file}  "
              f"({outcome.seconds:.1f} s)" + (f"\n    {outcome.detail}" if outcome.detail else ""), flush=True)
    return outcomes


def select(mutations: list[Mutation], fast: bool, name: str | None, file_glob: str | None) -> list[Mutation]:
    return [m for m in mutations
            if (not fast or m.fast)
            and (name is None or name.lower() in m.name.lower())
            and (file_glob is None or fnmatch.fnmatch(m.file, file_glob))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", action="store_true", help="only mutations marked fast (no llama-server)")
    parser.add_argument("--name", help="only mutations whose name contains this text (case-insensitive)")
    parser.add_argument("--file", dest="file_glob", help="only mutations of files matching this glob, "
                        "e.g. 'llm_bench/engines/*'")
    parser.add_argument("--list", action="store_true", help="list the selected mutations and exit")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running the selected tests unmutated first (they must pass)")
    parser.add_argument("--jobs", type=int, default=1, help="copies trying mutations side by side (only "
                        "with --fast: two llama-servers measuring at once would disturb each other)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one mutation's tests may take "
                        "(past it: KILLED)")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--package", default=PACKAGE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.jobs < 1 or (args.jobs > 1 and not args.fast):
        print("mutation-check: --jobs must be 1, or more with --fast (the other mutations' tests start "
              "llama-server, and two measuring at once disturb each other)", file=sys.stderr)
        return 2

    try:
        mutations = load_mutations(root)
    except MutationFileError as e:
        print(f"mutation-check: {e}", file=sys.stderr)
        return 2
    names = [m.name for m in mutations]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        print(f"mutation-check: mutation names must be unique; used more than once: {duplicates}", file=sys.stderr)
        return 2
    chosen = select(mutations, args.fast, args.name, args.file_glob)
    if not chosen:
        print("mutation-check: no mutation matches the selection", file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{'fast' if m.fast else 'slow'}  {m.name}  ({m.file}; {', '.join(m.tests)})")
        return 0

    with tempfile.TemporaryDirectory(prefix="mutation-check-") as tmp:
        copies = [Path(tmp) / f"repo{n}" for n in range(min(args.jobs, len(chosen)))]
        for copy in copies:
            make_copy(root, copy)
            wrong = check_imports_copy(copy, environment(copy), args.package)
            if wrong:
                print(f"mutation-check: {wrong}", file=sys.stderr)
                return 2
        tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
        workers = [Worker(copy) for copy in copies]
        try:
            outcomes = check_all(chosen, workers, tests, args)
        except WorkerError as e:
            print(f"mutation-check: {e}", file=sys.stderr)
            return 2
        finally:
            for worker in workers:
                worker.close()
    if outcomes is None:
        return 2

    counts = {s: sum(o.status == s for o in outcomes) for s in ("KILLED", "SURVIVED", "ERROR")}
    print(f"{len(outcomes)} mutations: {counts['KILLED']} killed, {counts['SURVIVED']} survived, "
          f"{counts['ERROR']} errors")
    for m, o in zip(chosen, outcomes, strict=True):
        if o.status != "KILLED":
            print(f"  {o.status}: {m.name} ({m.source}: {m.file})")
    return 0 if counts["SURVIVED"] == counts["ERROR"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
