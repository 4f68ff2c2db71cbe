# What switch-to-configuration did to systemd units, read from its output. Shared by the
# specialisation-switch VM test (its testScript starts with this file) and
# tests/test_nix_switch_units.py, which checks it on sample output.
#
# switch-to-configuration prints one line per kind of action, units comma-separated:
#   stopping the following units: llama-cpp.service
#   restarting the following units: nscd.service
#   starting the following units: llama-cpp.service
#   reloading the following units: dbus.service
#   the following new units were started: foo.service
# (also "NOT restarting the following changed units: ..." for units that opt out, and, in
# dry-activate, "would stop the following units: ..."). No __future__ import here: the VM
# test's driver runs this file's text as the start of its script.
import re

ACTIONS = ("stopping", "restarting", "starting", "reloading", "new", "not restarting")

_LINE = re.compile(
    r"^(?:(?P<action>stopping|restarting|starting|reloading|NOT restarting) the following"
    r"(?: changed)? units: (?P<units>.*)"
    r"|the following new units were started: (?P<new>.*))$"
)


def switched_units(output: str) -> dict:
    """{action: set of units} for every action switch-to-configuration reported."""
    found = {action: set() for action in ACTIONS}
    for line in output.splitlines():
        match = _LINE.match(line.strip())
        if not match:
            continue
        if match.group("new") is not None:
            action, units = "new", match.group("new")
        else:
            action, units = match.group("action").lower(), match.group("units")
        found[action].update(u.strip() for u in units.split(",") if u.strip())
    return found


def touched_units(output: str) -> set:
    """Units the switch stopped, restarted or started (reloads are not interruptions)."""
    found = switched_units(output)
    return found["stopping"] | found["restarting"] | found["starting"] | found["new"]


def assert_only_unit_switched(output: str, unit: str) -> None:
    """The switch interrupted `unit` and nothing else; fails on output that names no unit."""
    touched = touched_units(output)
    assert unit in touched, f"{unit} was not restarted; switch-to-configuration said:\n{output}"
    others = touched - {unit}
    assert not others, f"the switch also stopped, restarted or started {sorted(others)}:\n{output}"
