"""The parser of switch-to-configuration's output that the specialisation-switch VM test uses
(tests/nixos/switch_units.py), on sample output (the VM test itself needs NixOS and KVM)."""

from __future__ import annotations

import pytest

from tests.nixos.switch_units import assert_only_unit_switched, switched_units, touched_units

# As switch-to-configuration prints it when a specialisation changes only llama-cpp.service.
CLEAN = """\
stopping the following units: llama-cpp.service
activating the configuration...
setting up /etc...
restarting systemd...
reloading user units for root...
restarting sysinit-reactivation.target
starting the following units: llama-cpp.service
"""

NOISY = """\
stopping the following units: llama-cpp.service, nginx.service
activating the configuration...
reloading the following units: dbus.service
restarting the following units: nscd.service, systemd-journald.service
starting the following units: llama-cpp.service, nginx.service
the following new units were started: vllm.service
NOT restarting the following changed units: systemd-logind.service
"""


def test_clean_switch_touches_only_llama_cpp() -> None:
    assert touched_units(CLEAN) == {"llama-cpp.service"}
    assert_only_unit_switched(CLEAN, "llama-cpp.service")


def test_every_kind_of_line_is_read() -> None:
    found = switched_units(NOISY)
    assert found["stopping"] == {"llama-cpp.service", "nginx.service"}
    assert found["restarting"] == {"nscd.service", "systemd-journald.service"}
    assert found["starting"] == {"llama-cpp.service", "nginx.service"}
    assert found["reloading"] == {"dbus.service"}
    assert found["new"] == {"vllm.service"}
    assert found["not restarting"] == {"systemd-logind.service"}
    assert touched_units(NOISY) == {"llama-cpp.service", "nginx.service", "nscd.service",
                                    "systemd-journald.service", "vllm.service"}


def test_other_units_fail_the_assertion() -> None:
    with pytest.raises(AssertionError, match=r"nginx.service.*nscd.service"):
        assert_only_unit_switched(NOISY, "llama-cpp.service")
    only_restart = "restarting the following units: llama-cpp.service, sshd.service\n"
    with pytest.raises(AssertionError, match="sshd.service"):
        assert_only_unit_switched(only_restart, "llama-cpp.service")


def test_output_naming_no_unit_fails() -> None:
    """A switch that did not restart llama-cpp (or output in another format) is not a pass."""
    with pytest.raises(AssertionError, match="was not restarted"):
        assert_only_unit_switched("activating the configuration...\nsetting up /etc...\n", "llama-cpp.service")


def test_prefixed_and_dry_activate_lines() -> None:
    assert touched_units("  stopping the following units: a.service\n") == {"a.service"}
    assert switched_units("would stop the following units: a.service\n")["stopping"] == set()
