"""Every results file ``llm-bench report`` reads: one registered source per format, in the order the
report shows them. It names sources from the layers of every command that writes a file, so it sits just
below ``cli``, which hands it to ``report.command.make_report``. A new command's file is one ``Source``
beside its writer and one line here (docs/layout.md, "Adding a results-file source")."""

from __future__ import annotations

from llm_bench.capacity import report as capacity
from llm_bench.failover import report as failover
from llm_bench.history import report as history
from llm_bench.power import sweeps as power
from llm_bench.report.sources import RUN, Source
from llm_bench.soak import report as soak

SOURCES: tuple[Source, ...] = (
    RUN,
    power.SOURCE,
    capacity.SOURCE,
    soak.SOURCE,
    failover.SOURCE,
    history.SOURCE,
)
