"""run_command (engines/switch.py, what sweep and the engine hand-over run switches with): a Ctrl-C that comes
while the command is being started, after the fork and before Popen returns, still kills the command, so a
switch cannot complete behind the sweep's switch back (seen once in a whole-suite run of test_sweep's Ctrl-C
test: the marker named the interrupted target after the switch back)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from llm_bench.engines import switch


def test_a_ctrl_c_while_the_command_starts_kills_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = tmp_path / "switched"
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # delivered before Popen returns to run_command
        time.sleep(0.2)
        return proc

    monkeypatch.setattr(switch.subprocess, "Popen", popen_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        switch.run_command(f"sleep 1; touch {done}", what="switching to x", timeout=60)
    time.sleep(2)
    assert not done.exists()  # the command was killed, not left to finish its switch
    # Ctrl-C is Ctrl-C again once the command has started.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
