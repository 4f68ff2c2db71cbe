"""What a check reports: a finding with its evidence (the line or value seen) and a fix."""

from __future__ import annotations

from dataclasses import dataclass

ERROR = "error"
WARNING = "warning"
INFO = "info"


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str
    evidence: str
    fix: str

    def text(self) -> str:
        return f"{self.severity.upper()} [{self.check}] {self.evidence} Fix: {self.fix}"

    def warning(self) -> str:
        """The form attached to a results record."""
        return f"DOCTOR {self.check}: {self.evidence} Fix: {self.fix}"
