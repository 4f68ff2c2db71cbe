"""The llamAmpere fork: it defaults --spec-type to auto, so a control preset there needs an explicit
``spec-type = none``. Recognising the fork, and the check on the presets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_bench.diagnostics.findings import WARNING, Finding
from llm_bench.preset_args import SPEC_TYPE, names_speculation

FORK_NAMES = ("llamampere",)


def fork_build(marker: dict | None = None, build_info: str | None = None, binary: str | None = None,
               named: str | None = None) -> str | None:
    """Where the llamAmpere fork was recognised (its evidence), or None."""
    package = ((marker or {}).get("package") or {}).get("name") if isinstance(marker, dict) else None
    for evidence, value in ((f"--build {named}", named),
                            (f"/etc/llama-cpp/active.json package {package}", package),
                            (f"/props build_info {build_info}", build_info),
                            (f"server binary {binary}", binary)):
        if value and any(name in value.lower() for name in FORK_NAMES):
            return evidence
    return None


def is_control(args: Sequence[str]) -> bool:
    """A preset with no speculative-decoding argument at all: meant as the no-speculation control."""
    return not names_speculation(args)


def check_fork_control(fork: str | None, preset_args: Mapping[str, Sequence[str]]) -> list[Finding]:
    if fork is None:
        return []
    return [Finding(
        "fork-control", WARNING,
        f"{alias}: the server is the llamAmpere fork ({fork}), which defaults {SPEC_TYPE[0]} to auto, and this preset "
        "sets no spec-type: it is not a no-speculation control there.",
        f"add `spec-type = none` to the preset {alias} (Nix: spec-type = \"none\";)")
        for alias, args in preset_args.items() if is_control(args)]
