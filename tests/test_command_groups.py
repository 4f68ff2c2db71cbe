"""Switch/up/down commands are killed whole: the shell and everything it started."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llm_bench.engines.switch import SwitchError, run_command
from llm_bench.support.poll import poll_until


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # killed, waiting only for its new parent to reap it


def background_child(tmp_path: Path) -> str:
    # the shell starts a long child in the background, notes its pid, and waits on it
    return f"sleep 300 & echo $! > {tmp_path / 'child.pid'}; wait"


def test_timeout_kills_the_command_and_what_it_started(tmp_path):
    with pytest.raises(SwitchError, match="did not finish within 1 s"):
        run_command(background_child(tmp_path), what="up", timeout=1)
    child = int((tmp_path / "child.pid").read_text())
    assert poll_until(lambda: gone(child) or None, timeout=10, interval=0.1), f"sleep {child} survived"


def test_ctrl_c_kills_the_command_and_what_it_started(tmp_path):
    waiting = tmp_path / "waiting"
    # The marker is written once run_command waits for the command: a SIGINT from then on is its to handle.
    script = ("import subprocess\n"
              "from pathlib import Path\n"
              "from llm_bench.engines import switch\n"
              "class Popen(subprocess.Popen):\n"
              "    def communicate(self, *args, **kwargs):\n"
              f"        Path({str(waiting)!r}).touch()\n"
              "        return super().communicate(*args, **kwargs)\n"
              "switch.subprocess.Popen = Popen\n"
              f"switch.run_command({background_child(tmp_path)!r}, what='switch', timeout=600)\n")
    runner = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parent.parent)
    pid_file = tmp_path / "child.pid"
    assert poll_until(lambda: (pid_file.exists() and pid_file.read_text().strip() and waiting.exists()) or None,
                      timeout=20, interval=0.02)
    child = int(pid_file.read_text())
    runner.send_signal(signal.SIGINT)  # what Ctrl-C delivers to llm-bench
    assert runner.wait(20) == -signal.SIGINT  # the KeyboardInterrupt went on up: Python ends by the signal
    assert poll_until(lambda: gone(child) or None, timeout=10, interval=0.1), f"sleep {child} survived"


def test_a_finished_command_returns_its_output():
    assert run_command("echo hello", what="t").strip() == "hello"
    with pytest.raises(SwitchError, match="exited with code 3"):
        run_command("exit 3", what="t")
