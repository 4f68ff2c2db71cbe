"""Where the server's log comes from: a file, a command's output, or llama-cpp.service's journal."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

JOURNAL_UNIT = "llama-cpp.service"


@dataclass(frozen=True)
class LogSource:
    file: Path | None = None
    command: str | None = None

    def describe(self) -> str:
        return str(self.file) if self.file else f"`{self.command}`"

    def read(self) -> str:
        if self.file is not None:
            return self.file.read_text(errors="replace")
        result = subprocess.run(self.command or "true", shell=True, capture_output=True, text=True, timeout=60,
                                errors="replace")
        return result.stdout

    @classmethod
    def journal(cls, unit: str = JOURNAL_UNIT) -> LogSource:
        return cls(command=f"journalctl -u {unit} -b --no-pager -o cat")


def journal_available(unit: str = JOURNAL_UNIT) -> bool:
    if not (shutil.which("journalctl") and shutil.which("systemctl")):
        return False
    try:
        return subprocess.run(["systemctl", "is-active", "--quiet", unit], timeout=10,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def log_source(file: Path | None, command: str | None) -> LogSource | None:
    """The given file or command; neither: llama-cpp.service's journal when that unit is active."""
    if file is not None:
        return LogSource(file=file)
    if command:
        return LogSource(command=command)
    return LogSource.journal() if journal_available() else None
