"""Ctrl-C that cannot be lost.

Python raises a Ctrl-C's KeyboardInterrupt wherever the main thread happens to be; when that is a finalizer
(the ``__del__`` of a response, socket or generator that the garbage collector runs), Python prints
"Exception ignored in ..." and drops it, and the command runs on (a soak went on sending for its whole
duration). ``ctrl_c_not_lost``, around every command, sends such a Ctrl-C again a moment later.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

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

