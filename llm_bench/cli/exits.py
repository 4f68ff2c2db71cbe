"""Exit codes, one table for every command (docs/report.md, "Exit codes").

0 everything ran and nothing failed; 1 it ran, but some configurations (aliases, sweep targets) failed,
or the doctor found an error; 2 it could not run: a usage error (click's own code), bad input (plan,
flags, results file, unknown alias) or a server that cannot be reached; 3 it started and had to stop
partway (the server went away): what was measured is saved; 4 ``history``: the newest step of a
configuration is a regression (a timer or CI alerts on it); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import click

OK = 0
RAN_WITH_FAILURES = 1
COULD_NOT_RUN = 2
ABORTED = 3
NEWEST_IS_REGRESSION = 4
INTERRUPTED = 130


class CouldNotRun(click.ClickException):
    """Nothing was measured: bad input or an unreachable server."""

    exit_code = COULD_NOT_RUN


class RanWithFailures(click.ClickException):
    """It ran; some configurations failed (each is recorded with the server's message)."""

    exit_code = RAN_WITH_FAILURES


class Aborted(click.ClickException):
    """Stopped partway; what was measured is on disk."""

    exit_code = ABORTED


class NewestIsRegression(click.ClickException):
    """``history``: the newest result of a configuration is slower beyond noise than the build before it."""

    exit_code = NEWEST_IS_REGRESSION


class Interrupted(click.ClickException):
    exit_code = INTERRUPTED
