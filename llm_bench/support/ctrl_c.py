"""Ctrl-C that cannot be lost.

Python raises a Ctrl-C's KeyboardInterrupt wherever the main thread happens to be; when that is a finalizer
(the ``__del__`` of a response, socket or generator that the garbage collector runs), Python prints
"Exception ignored in ..." and drops it, and the command runs on. ``sticky_ctrl_c`` records every Ctrl-C
before raising it, so a loop can check between steps and stop on one that was dropped.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def sticky_ctrl_c() -> Iterator[threading.Event]:
    """Within the block, SIGINT sets the event and raises KeyboardInterrupt as usual. Off the main thread
    (where no handler can be installed) the event is never set."""
    came = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield came
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        came.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, previous)
