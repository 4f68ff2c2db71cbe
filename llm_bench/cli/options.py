"""Pieces every llm-bench command shares: progress output and the protocol flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llm_bench.plan import PlanError, Protocol, protocol_from_mapping

MIB_PER_GIB = 1024.0


def log(message: str) -> None:
    click.echo(message, err=True)


def protocol_options(f):
    """Flags shared by every command that measures; None means 'not given, keep the plan's value'."""
    options = [
        click.option("--runs", type=int, help="Measured runs per alias (default 3)."),
        click.option("--max-tokens", type=int, help="Output tokens per request, generated to the end (default 512)."),
        click.option("--temperature", type=float, help="Sampling temperature (default 1.0)."),
        click.option("--seed", type=int, help="Sampling seed (default 42)."),
        click.option("--prompt", "prompt_name", help="Shipped prompt: code (default), prose or json."),
        click.option("--prompt-file", type=click.Path(dir_okay=False, path_type=Path),
                     help="Use this file's text as the prompt."),
        click.option("--unload/--no-unload", "unload_after", default=None,
                     help="Unload each alias after measuring it (default: unload)."),
        click.option("--vram-threshold-gib", type=float,
                     help="VRAM in use before a load above this marks the alias not comparable (default 2)."),
        click.option("--strict", is_flag=True, default=None, help="Refuse to measure an alias that is not comparable."),
        click.option("--timeout", "request_timeout_s", type=float, help="Seconds before a request counts as failed."),
        click.option("--workload", "workloads", multiple=True,
                     type=click.Choice(["protocol", "categories", "concurrency", "prefix-cache"]),
                     help="Workload to run per alias; repeat for several (default: protocol)."),
        click.option("--categories", help="Prompt categories for the categories workload (default prose,code,json)."),
        click.option("--concurrency", help="Simultaneous requests for the concurrency workload (default 1,2,4,8)."),
        click.option("--prefix-tokens", "prefix_prompt_tokens", type=int,
                     help="Approximate prompt tokens for the prefix-cache workload (default 11000)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def apply_protocol_flags(protocol: Protocol, flags: dict[str, Any]) -> Protocol:
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    if "categories" in given:
        given["categories"] = tuple(c.strip() for c in given["categories"].split(",") if c.strip())
    if "concurrency" in given:
        try:
            given["concurrency"] = tuple(int(n) for n in given["concurrency"].split(","))
        except ValueError as e:
            raise PlanError(f"--concurrency takes comma-separated integers, e.g. 1,2,4,8 ({e})") from e
    if "vram_threshold_gib" in given:
        given["vram_threshold_mib"] = given.pop("vram_threshold_gib") * MIB_PER_GIB
    prompt_file = given.pop("prompt_file", None)
    protocol = protocol_from_mapping(given, base=protocol, where="command line")
    if prompt_file is not None:
        protocol = protocol_from_mapping({"prompt_file": str(prompt_file)}, base=protocol, where="--prompt-file")
    return protocol
