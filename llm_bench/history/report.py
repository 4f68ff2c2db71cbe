"""A skip record of the history (``llm-bench history --skipped``, written by llmBench.watch when it does not
measure) read back for ``llm-bench report``: its source. So ``report /var/lib/llm-bench/history/*.toml``
reads every file the watch writes (the run results through the run source, these beside them) instead of
refusing the skips as unknown files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm_bench.history.points import SKIP_FORMAT, HistoryInputError, Skip, when_of
from llm_bench.report.sources import Shown, Source
from llm_bench.results import ResultsFileError, file_format
from llm_bench.tables import Cell, Table, markdown


def load_skip(path: Path, data: dict[str, Any]) -> Skip:
    if file_format(data) != SKIP_FORMAT:
        raise ResultsFileError(f"{path} is not a history skip record (no meta.format = {SKIP_FORMAT!r})")
    meta = data["meta"]
    try:
        when = when_of(meta, path)
    except HistoryInputError as e:
        raise ResultsFileError(str(e)) from e
    return Skip(path, when, str(meta.get("alias") or "-"), str(meta.get("reason") or "no reason recorded"))


def skips_table(skips: Sequence[Skip]) -> Table:
    rows = [[Cell(s.started_at.strftime("%Y-%m-%d %H:%M")), Cell(s.alias), Cell(s.reason), Cell(s.path.name)]
            for s in sorted(skips, key=lambda s: s.started_at)]
    return Table("Measurements not made (history skip records)", "history_skips",
                 ["When", "Alias", "Why", "File"], rows)


def show_skips(skips: Sequence[Skip]) -> Shown:
    table = skips_table(skips)
    return Shown(markdown=markdown(table), tables=(table,))


SOURCE = Source("history", SKIP_FORMAT, "history --skipped (llmBench.watch)", load=load_skip, show=show_skips,
                beside_rows=True)
