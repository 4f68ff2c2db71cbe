#!/usr/bin/env python3
"""Refuse a llama.cpp router presets INI whose keys the given llama-server does not know, and a
command line whose flags it does not know.

    check-preset-keys --server /path/to/bin/llama-server [--flag=--models-max ...] presets.ini

llama-server refuses an unknown key in a `--models-preset` file when it starts ("option '...'
not recognized in preset '...'"), so the service would fail and restart. This runs the
server's own `--help`, collects every spelling it accepts for a preset key (long and short
options without their dashes, negated `--no-` forms, environment variables, as
common/preset.cpp maps them), and fails naming each preset, key and the nearest known key.
Only keys are checked, not values: a value the server cannot use (a KV cache type a build
lacks) fails when the preset loads, not when the router reads the file.

Each `--flag` names a flag of the service's own command line (with its dashes: `--models-max`,
`-c`); llama-server refuses an unknown one at start too ("error: invalid argument"), so a fork
without `--sleep-idle-seconds` would fail at every start. Each must be an option `--help` lists.

Standard library only; the NixOS module runs it while building the INI (pkgs/check-preset-keys).
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# Keys the router reads from a preset that are not command-line options, so `--help` does
# not list them (common_params_add_preset_options in llama.cpp's common/arg.cpp).
ROUTER_PRESET_KEYS = ("load-on-startup", "stop-timeout", "dedup-cache-models")

# common/preset.cpp skips this key (reserved for a format version).
SKIPPED_KEYS = ("version",)

OPTION_LINE = re.compile(r"^(-{1,2}[^\s,]+(?:,\s*-{1,2}[^\s,]+)*)")
ENV = re.compile(r"\(env: ([A-Za-z_][A-Za-z0-9_]*)\)")


def known_keys(help_text: str) -> tuple[set[str], list[str]]:
    """Every key spelling the server accepts, and the long option names (for suggestions)."""
    keys: set[str] = set()
    long_names: list[str] = []
    current: list[str] = []
    for line in help_text.splitlines():
        match = OPTION_LINE.match(line)
        if match:
            current = [arg.strip() for arg in match.group(1).split(",")]
            for arg in current:
                name = arg.lstrip("-")
                keys.add(name)
                if arg.startswith("--"):
                    long_names.append(name)
        env = ENV.search(line)
        if env and current:
            keys.add(env.group(1))
            # A boolean option also answers to LLAMA_ARG_NO_... (common_arg::get_env).
            if any(arg.startswith("--no-") for arg in current) and env.group(1).startswith("LLAMA_ARG_"):
                keys.add("LLAMA_ARG_NO_" + env.group(1)[len("LLAMA_ARG_"):])
    keys.update(ROUTER_PRESET_KEYS)
    long_names.extend(ROUTER_PRESET_KEYS)
    return keys, long_names


def preset_keys(text: str) -> list[tuple[str, str]]:
    """(preset, key) for every key of the INI, in the dialect llama-server reads."""
    found = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            end = line.find("]")
            section = line[1:end].strip() if end > 0 else line[1:].strip()
            continue
        if "=" in line:
            found.append((section, line.split("=", 1)[0].strip()))
    return found


def known_flags(help_text: str) -> set[str]:
    """Every option spelling `--help` lists, with its dashes (`--ctx-size`, `-c`, `--no-mmproj`)."""
    flags: set[str] = set()
    for line in help_text.splitlines():
        match = OPTION_LINE.match(line)
        if match:
            flags.update(arg.strip() for arg in match.group(1).split(","))
    return flags


def flag_problems(flags: Sequence[str], help_text: str, server: str) -> list[str]:
    known = known_flags(help_text)
    messages = []
    for flag in flags:
        if flag in known:
            continue
        near = difflib.get_close_matches(flag, sorted(f for f in known if f.startswith("--")), n=1, cutoff=0.6)
        hint = f'; did you mean "{near[0]}"?' if near else ""
        messages.append(f'the service\'s command line, flag "{flag}": not an option of {server}{hint}')
    return messages


def problems(ini_text: str, help_text: str, server: str, extra_keys: list[str], flags: Sequence[str] = ()) -> list[str]:
    keys, long_names = known_keys(help_text)
    if not long_names or len(keys) < 20:
        return [f"{server} --help lists no options this checker can read; is it llama-server?"]
    keys.update(extra_keys)
    messages = flag_problems(flags, help_text, server)
    for preset, key in preset_keys(ini_text):
        if key in keys or key in SKIPPED_KEYS:
            continue
        pool = sorted(k for k in keys if k.isupper()) if key.isupper() else long_names
        near = difflib.get_close_matches(key.replace("_", "-") if not key.isupper() else key, pool, n=1, cutoff=0.6)
        hint = f'; did you mean "{near[0]}"?' if near else ""
        where = f'preset "{preset}"' if preset else "the top level"
        messages.append(f'{where}, key "{key}": not an option of {server}{hint}')
    return messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="the llama-server binary the presets are for")
    parser.add_argument("--allow-key", action="append", default=[], metavar="KEY",
                        help="accept KEY as well (repeatable)")
    parser.add_argument("--flag", action="append", default=[], metavar="FLAG",
                        help="a flag of the service's command line that --help must list, as --flag=--models-max "
                             "(repeatable)")
    parser.add_argument("ini", type=Path, help="the presets INI file")
    args = parser.parse_args(argv)

    try:
        proc = subprocess.run([args.server, "--help"], capture_output=True, text=True, timeout=120)
    except OSError as e:
        print(f"check-preset-keys: cannot run {args.server} --help: {e}", file=sys.stderr)
        return 2
    if proc.returncode != 0:
        print(f"check-preset-keys: {args.server} --help exited with {proc.returncode}:\n{proc.stderr[-2000:]}",
              file=sys.stderr)
        return 2

    messages = problems(args.ini.read_text(), proc.stdout, args.server, args.allow_key, args.flag)
    if messages:
        print(f"check-preset-keys: {args.ini}: llama-server would refuse these presets or flags:", file=sys.stderr)
        for message in messages:
            print(f"  {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
