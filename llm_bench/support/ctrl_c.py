"""Ctrl-C that cannot be lost.

Python raises a Ctrl-C's KeyboardInterrupt wherever the main thread happens to be; when that is a finalizer
(the ``__del__`` of a response, socket or generator that the garbage collector runs), Python prints
"Exception ignored in ..." and drops it, and the command runs on. ``ctrl_c_not_lost`` (around every command)
sends such a Ctrl-C again a moment later; ``sticky_ctrl_c`` records every Ctrl-C before raising it, so a loop
that runs for hours (the soak) can check between steps and stop on one dropped anywhere else.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# Long enough for the finalizer to have returned, short enough that nobody notices.
AGAIN_AFTER_S = 0.01


@contextmanager
def ctrl_c_not_lost() -> Iterator[None]:
    """Within the block, a Ctrl-C that Python dropped in a finalizer is sent again to the main thread
    ``AGAIN_AFTER_S`` later, as a signal, so that it also ends a blocking read; a Ctrl-C dropped again is
    sent again. Nothing is sent once the block has ended."""
    previous = sys.unraisablehook
    main = threading.main_thread()
    lock = threading.Lock()
    active = True

    def again() -> None:
        with lock:
            if active:
                signal.pthread_kill(main.ident or 0, signal.SIGINT)

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            threading.Timer(AGAIN_AFTER_S, again).start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        with lock:
            active = False
        sys.unraisablehook = previous


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
