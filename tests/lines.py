"""A process's output read line by line on a thread, so a test can wait for a line with a deadline."""

from __future__ import annotations

import queue
import re
import threading
import time


class Lines:
    """A process's stderr, line by line, read on a thread so a wait can have a deadline."""

    def __init__(self, stream):
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no line matching {pattern!r} within {timeout:.0f} s:\n{''.join(self.seen)}"
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"the process ended before {pattern!r}:\n{''.join(self.seen)}"
            self.seen.append(line)
            if re.search(pattern, line):
                return line

    def rest(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
        return "".join(self.seen)
