"""The doctor's checks around each alias of ``llm-bench run``: findings become warnings on its records."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from llm_bench.diagnostics.checks import check_fa_fallback, check_offload, check_power_floor, check_roofline
from llm_bench.diagnostics.findings import INFO, Finding
from llm_bench.diagnostics.server_log import log_source
from llm_bench.gpu import roofline
from llm_bench.gpu.nvml import Nvml
from llm_bench.plan import Checks
from llm_bench.results import AliasRecord

Log = Callable[[str], None]


class InRunChecks:
    """The doctor's checks around one alias of ``llm-bench run``; findings become record warnings."""

    def __init__(self, nvml: Nvml, log: Log, settings: Checks = Checks()):
        self.nvml = nvml
        self.log = log
        self.source = log_source(settings.log_file, settings.log_command)
        self.floor_w = settings.power_floor_w
        self.min_fraction = settings.roofline_min
        self._mark = 0

    def _read(self) -> str | None:
        if self.source is None:
            return None
        try:
            return self.source.read()
        except (OSError, subprocess.SubprocessError) as e:
            self.log(f"  doctor: could not read the server log from {self.source.describe()}: {e}")
            return None

    def start(self) -> None:
        """Before the alias is loaded: remember where its part of the log begins."""
        text = self._read()
        self._mark = len(text) if text is not None else 0

    def finish(self, records: list[AliasRecord]) -> list[Finding]:
        findings: list[Finding] = check_power_floor(self.nvml, self.floor_w)
        text = self._read()
        if text is not None:
            since = text[self._mark:] if len(text) >= self._mark else text  # a rotated log starts over
            where = f"the server log ({self.source.describe()})"
            findings += [f for f in check_offload(since, self.nvml.count(), where) if f.severity != INFO]
            findings += check_fa_fallback(since, where)
        bandwidth = self.nvml.memory_bandwidth_gbs(0) if self.nvml.available else None
        for record in records:
            if bandwidth and record.preset_args:
                roofline.apply(record, bandwidth)
            own = check_roofline(record, self.min_fraction)
            for finding in own:
                self.log(f"  !!! {finding.text()}")
            for finding in findings + own:
                if finding.warning() not in record.warnings:
                    record.warnings.append(finding.warning())
        for finding in findings:
            self.log(f"  !!! {finding.text()}")
        return findings
