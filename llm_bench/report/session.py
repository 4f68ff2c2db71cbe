"""The session workload in the report (``llm_bench.workloads.session``): a summary row per
configuration (last turn's TTFT with the cache and cold, their ratio, each replay's time) and every
turn with the server's own cache counters."""

from __future__ import annotations

from collections.abc import Sequence

from llm_bench.report.rows import Row, notes_of
from llm_bench.report.table import Cell, Table, num
from llm_bench.results import SessionResult, SessionTurn


def session_rows(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.record.workload == "session" and r.record.session is not None]


def configuration_of(row: Row) -> str:
    return row.configuration.removesuffix(" [session]")


def _processed(turns: Sequence[SessionTurn]) -> int | None:
    counted = [t.processed_tokens for t in turns if t.processed_tokens is not None]
    return sum(counted) if counted else None


def last_turn_ratio(result: SessionResult) -> float | None:
    """Cold over warm TTFT of the last turn both replays measured."""
    if not result.warm or not result.cold or len(result.cold) != len(result.warm):
        return None
    warm, cold = result.warm[-1].ttft_ms, result.cold[-1].ttft_ms
    return cold / warm if warm and cold else None


def session_table(rows: Sequence[Row]) -> Table | None:
    chosen = session_rows(rows)
    if not chosen:
        return None
    header = ["Configuration", "Turns", "Context tokens", "Processed warm", "Processed cold", "Last TTFT warm ms",
              "Last TTFT cold ms", "Cold/warm", "Session warm s", "Session cold s", "Flagged turns", "Notes"]
    lines = []
    for row in chosen:
        result = row.record.session
        assert result is not None
        warm = result.warm[-1] if result.warm else None
        cold = result.cold[-1] if result.cold else None
        ratio = last_turn_ratio(result)
        flagged = [t.turn for t in result.warm if t.reuse_flag]
        context = warm.prompt_tokens if warm else None
        notes = "; ".join(n for n in (f"stopped early: {result.stopped}" if result.stopped else "",
                                      notes_of(row.record)) if n)
        lines.append([
            Cell(configuration_of(row), {"configuration": configuration_of(row)}),
            Cell(f"{len(result.warm)}/{result.turns}", {"turns_measured": len(result.warm), "turns": result.turns}),
            Cell(num(context, 0), {"context_tokens": context}),
            Cell(num(_processed(result.warm), 0), {"processed_tokens_warm": _processed(result.warm)}),
            Cell(num(_processed(result.cold), 0), {"processed_tokens_cold": _processed(result.cold)}),
            Cell(num(warm.ttft_ms if warm else None, 0), {"last_ttft_ms_warm": warm.ttft_ms if warm else None}),
            Cell(num(cold.ttft_ms if cold else None, 0), {"last_ttft_ms_cold": cold.ttft_ms if cold else None}),
            Cell("-" if ratio is None else f"{ratio:.1f}x", {"last_ttft_cold_over_warm": ratio}),
            Cell(num(result.warm_s), {"session_s_warm": result.warm_s}),
            Cell(num(result.cold_s), {"session_s_cold": result.cold_s}),
            Cell(", ".join(map(str, flagged)) or "-", {"flagged_turns": flagged}),
            Cell(notes, {"stopped": result.stopped, "errors": list(row.record.errors),
                         "warnings": list(row.record.warnings)}),
        ])
    return Table("Agent session (replayed with the prompt cache, and cold)", "session", header, lines)


def session_turns_table(rows: Sequence[Row]) -> Table | None:
    chosen = session_rows(rows)
    if not chosen:
        return None
    header = ["Configuration", "Turn", "Added", "Context tokens", "Cached warm", "Processed warm", "TTFT warm ms",
              "TTFT cold ms", "Decode t/s warm", "Decode t/s cold", "Flag"]
    lines = []
    for row in chosen:
        result = row.record.session
        assert result is not None
        cold = {t.turn: t for t in result.cold}
        for turn in result.warm:
            other = cold.get(turn.turn)
            lines.append([
                Cell(configuration_of(row), {"configuration": configuration_of(row)}),
                Cell(str(turn.turn), {"turn": turn.turn}),
                Cell(turn.added, {"added": turn.added}),
                Cell(num(turn.prompt_tokens, 0), {"context_tokens": turn.prompt_tokens}),
                Cell(num(turn.cache_n, 0), {"cached_tokens_warm": turn.cache_n}),
                Cell(num(turn.processed_tokens, 0), {"processed_tokens_warm": turn.processed_tokens}),
                Cell(num(turn.ttft_ms, 0), {"ttft_ms_warm": turn.ttft_ms}),
                Cell(num(other.ttft_ms if other else None, 0), {"ttft_ms_cold": other.ttft_ms if other else None}),
                Cell(num(turn.decode_tps), {"decode_tps_warm": turn.decode_tps}),
                Cell(num(other.decode_tps if other else None), {"decode_tps_cold": other.decode_tps if other else None}),
                Cell(turn.reuse_flag or "", {"reuse_flag": turn.reuse_flag}),
            ])
    return Table("Session turns", "session_turns", header, lines)
