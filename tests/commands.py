"""What many tests do with llm-bench's command line and what it leaves behind: run a command in-process, find
the one results file it wrote, find a router's model-instance process, size the quality workload down."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from llm_bench.cli import main


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """``llm-bench ARGS`` in-process; an exception escaping the command fails the test as itself."""
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


def only_file(folder: Path, pattern: str = "*.toml") -> Path:
    """The one file in ``folder`` matching ``pattern``: a command wrote exactly one."""
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"{folder}: expected one {pattern}, found {[p.name for p in found]}"
    return found[0]


def small_quality_plan(path: Path) -> Path:
    """A plan (``--plan``) of the quality workload sized down, for tests whose checks are not its figures: the
    defaults' teacher-forced text (512 tokens an answer) and 240 exact-answer items were about 775 requests an
    alias on the tiny models. The progress steps (agreement, questions, recall) stay the defaults'."""
    path.write_text('[protocol.quality]\ntext_tokens = 16\nexact_items_per_kind = 1\nexact_difficulties = ["easy"]\n')
    return path


def instance_pid(router, alias: str) -> int:
    """The router's model-instance process serving ``alias`` (a child of the router)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == router.process.pid and alias.encode() in argv:
            return int(stat.parent.name)
    raise AssertionError(f"no instance process for {alias} under router pid {router.process.pid}")
