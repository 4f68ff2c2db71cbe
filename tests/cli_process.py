"""A real ``llm-bench`` process for tests that must act on it while it runs (Ctrl-C, a fault at a given moment):
its stderr is read line by line as it comes, and a test waits for the line that says the state it needs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from llm_bench.support.poll import poll_until

REPO = Path(__file__).resolve().parents[1]


class LlmBench:
    def __init__(self, *args: str, cwd: Path = REPO, stdout: Path | None = None):
        self.lines: list[str] = []
        self.stdout_path = stdout
        with open(stdout or os.devnull, "w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "llm_bench", *args], cwd=cwd, text=True,
                                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out,
                                            stderr=subprocess.PIPE)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 120) -> str:
        """The first stderr line holding ``text``, once it has come; fails if the process ends first."""
        def seen() -> str | None:
            found = next((line for line in self.lines if text in line), None)
            if found is None and self.process.poll() is not None:
                self.reader.join(5)
                found = next((line for line in self.lines if text in line), None)
                if found is None:
                    raise AssertionError(f"llm-bench ended (exit {self.process.returncode}) before {text!r}:\n"
                                         f"{self.stderr[-3000:]}")
            return found
        line = poll_until(seen, timeout=timeout, interval=0.02)
        assert line is not None, f"no {text!r} within {timeout} s:\n{self.stderr[-3000:]}"
        return line

    def interrupt(self) -> None:
        """What Ctrl-C delivers."""
        self.process.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 300) -> int:
        try:
            code = self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self.reader.join(10)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text() if self.stdout_path else ""
