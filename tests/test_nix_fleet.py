"""modules/fleet.nix evaluated with nixpkgs' own services.litellm module (needs NIXPKGS_LIB).

The harness (tests/nix/eval-module.nix) has nixpkgs' litellm.nix in every evaluation's module
list, as NixOS's module-list does; the fleet module only sets its options. The arbiter's
units are read from the evaluated systemd.services, and its ExecCondition script is run with
a stand-in systemctl. The proxy itself runs in tests/test_fleet_litellm.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.nix.helpers import REPO, NixError, nix_eval, nix_string, nixpkgs_root

FLEET = REPO / "modules" / "fleet.nix"
HARNESS = REPO / "tests" / "nix" / "eval-module.nix"


def evaluate(config: str, attr: str) -> object:
    """`attr` of the evaluation of the fleet module with `config` (a Nix module)."""
    root = nixpkgs_root()
    return nix_eval(
        f"let h = import {HARNESS} {{ libPath = {root}/lib; }}; e = h.eval [ {FLEET} ({config}) ];"
        f" in {attr}"
    )


def settings_of(config: str) -> dict:
    return evaluate(config, "e.config.services.litellm.settings")  # type: ignore[return-value]


def assertions_of(config: str) -> list[str]:
    return evaluate(config, "h.failedAssertions e.config")  # type: ignore[return-value]


def fleet(backends: str, extra: str = "") -> str:
    return f"{{ llmBench.fleet.enable = true; llmBench.fleet.models.qwen.backends = {backends}; {extra} }}"


TWO_BOXES = fleet("""{
  box1 = { url = "http://box1.lan:48123/v1"; model = "qwen3.8-27b-mtp2"; };
  box2 = { url = "http://box2.lan:8000/v1"; model = "qwen3.8-27b"; order = 2; apiKeyVariable = "BOX2_API_KEY"; };
}""", 'services.litellm.environmentFile = "/run/secrets/litellm.env";')


def test_the_declaration_becomes_nixpkgs_litellm_settings() -> None:
    settings = settings_of(TWO_BOXES)
    assert settings["model_list"] == [
        {"model_name": "qwen", "model_info": {"id": "qwen@box1"},
         "litellm_params": {"model": "openai/qwen3.8-27b-mtp2", "api_base": "http://box1.lan:48123/v1",
                            "api_key": "no-key"}},
        {"model_name": "qwen@box2", "model_info": {"id": "qwen@box2"},
         "litellm_params": {"model": "openai/qwen3.8-27b", "api_base": "http://box2.lan:8000/v1",
                            "api_key": "os.environ/BOX2_API_KEY"}},
    ]
    assert settings["router_settings"] == {
        "num_retries": 2, "allowed_fails": 1, "cooldown_time": 5, "fallbacks": [{"qwen": ["qwen@box2"]}],
    }
    # nixpkgs' module's own defaults for the rest.
    assert settings["litellm_settings"] == settings["general_settings"] == settings["environment_variables"] == {}
    assert assertions_of(TWO_BOXES) == []


def test_the_options_written_are_declared_by_nixpkgs_module_alone() -> None:
    declared = evaluate(TWO_BOXES, "map toString e.options.services.litellm.settings.declarations")
    assert declared == [str(nixpkgs_root() / "nixos/modules/services/misc/litellm.nix")]
    assert evaluate(TWO_BOXES, "e.config.services.litellm.enable") is True


def test_the_unit_runs_the_proxy_with_the_rendered_file_and_the_key_file() -> None:
    """ExecStart's --config is the YAML of exactly these settings; keys come only from the file."""
    unit = evaluate(TWO_BOXES, "e.config.systemd.services.litellm.serviceConfig")
    rendered = evaluate(TWO_BOXES, 'let f = (h.pkgs.formats.yaml { }).generate "config.yaml" e.config.services.litellm.settings;'
                                   " in { path = f.outPath; inherit (f) text; }")
    assert unit["ExecStart"].endswith(f"--config {rendered['path']}"), unit["ExecStart"]
    assert json.loads(rendered["text"])["model_list"][1]["litellm_params"]["api_key"] == "os.environ/BOX2_API_KEY"
    assert unit["EnvironmentFile"] == ["/run/secrets/litellm.env"]
    environment = evaluate(TWO_BOXES, "e.config.systemd.services.litellm.environment")
    # Offline start; nixpkgs' own variables stay.
    assert environment["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and environment["DO_NOT_TRACK"] == "True"


def test_orders_become_fallback_groups() -> None:
    """Each further order is one group, `qwen@<boxes>`, tried in increasing order; boxes of one
    order share a group (LiteLLM balances within it)."""
    settings = settings_of(fleet("""{
      a = { url = "http://a/v1"; model = "m"; order = 1; };
      b = { url = "http://b/v1"; model = "m"; order = 1; };
      z = { url = "http://z/v1"; model = "m"; order = 2; };
      d = { url = "http://d/v1"; model = "m"; order = 7; };
      c = { url = "http://c/v1"; model = "m"; order = 7; };
    }"""))
    groups = {d["model_info"]["id"]: d["model_name"] for d in settings["model_list"]}
    assert groups == {"qwen@a": "qwen", "qwen@b": "qwen", "qwen@z": "qwen@z", "qwen@c": "qwen@c+d",
                      "qwen@d": "qwen@c+d"}
    assert settings["router_settings"]["fallbacks"] == [{"qwen": ["qwen@z", "qwen@c+d"]}]


def test_one_order_has_no_fallbacks_and_groups_stay_apart() -> None:
    settings = settings_of("""{ llmBench.fleet = { enable = true;
      models.qwen.backends.a = { url = "http://a/v1"; model = "q"; };
      models.smol.backends = { a = { url = "http://a/v1"; model = "s"; }; b = { url = "http://b/v1"; model = "s"; order = 2; }; };
      numRetries = 0; allowedFails = 0; cooldownTime = 60; timeout = 120;
    }; }""")
    assert settings["router_settings"] == {"num_retries": 0, "allowed_fails": 0, "cooldown_time": 60, "timeout": 120,
                                           "fallbacks": [{"smol": ["smol@b"]}]}
    assert [d["model_info"]["id"] for d in settings["model_list"]] == ["qwen@a", "smol@a", "smol@b"]


def test_user_settings_of_services_litellm_merge_with_the_fleets() -> None:
    settings = settings_of(fleet('{ a = { url = "http://a/v1"; model = "q"; extraParams.stream_timeout = 30; }; }', """
      services.litellm.settings.router_settings.routing_strategy = "least-busy";
      services.litellm.settings.general_settings.master_key = "os.environ/LITELLM_MASTER_KEY";
      services.litellm.environmentFile = "/run/secrets/litellm.env";
    """))
    assert settings["router_settings"]["routing_strategy"] == "least-busy"
    assert settings["router_settings"]["num_retries"] == 2
    assert settings["general_settings"] == {"master_key": "os.environ/LITELLM_MASTER_KEY"}
    assert settings["model_list"][0]["litellm_params"]["stream_timeout"] == 30


def test_a_fleet_without_keys_needs_no_environment_file() -> None:
    """nixpkgs declares environmentFile without a default; the fleet defaults it to null."""
    config = fleet('{ a = { url = "http://a/v1"; model = "q"; }; }')
    assert assertions_of(config) == []
    assert evaluate(config, "e.config.systemd.services.litellm.serviceConfig.EnvironmentFile") == []


def test_keys_without_an_environment_file_are_refused() -> None:
    messages = assertions_of(fleet('{ a = { url = "http://a/v1"; model = "q"; apiKeyVariable = "A_KEY"; }; }'))
    assert any("read their API keys from A_KEY" in m and "services.litellm.environmentFile is null" in m
               for m in messages), messages


def test_a_key_file_given_as_a_nix_path_is_refused(tmp_path: Path) -> None:
    """A path literal would be copied into the world-readable store."""
    secrets = tmp_path / "litellm.env"
    secrets.write_text("A_KEY=secret\n")
    messages = assertions_of(fleet('{ a = { url = "http://a/v1"; model = "q"; apiKeyVariable = "A_KEY"; }; }',
                                   f"services.litellm.environmentFile = {secrets};"))
    assert any("copies the keys" in m and "world-readable Nix store" in m for m in messages), messages


def test_extra_params_cannot_carry_a_key_or_replace_the_backend() -> None:
    messages = assertions_of(fleet('{ a = { url = "http://a/v1"; model = "q";'
                                   ' extraParams = { api_key = "sk-live-123"; api_base = "http://b/v1"; timeout = 9; }; }; }'))
    assert len(messages) == 1, messages
    assert "backends.a.extraParams sets api_base, api_key: use the backend's url, model and apiKeyVariable" in messages[0]


def test_a_key_variable_must_be_a_variable_name() -> None:
    with pytest.raises(NixError, match="apiKeyVariable"):
        settings_of(fleet('{ a = { url = "http://a/v1"; model = "q"; apiKeyVariable = "sk-live-123"; }; }'))


def test_bad_declarations_are_assertions() -> None:
    empty = assertions_of("{ llmBench.fleet.enable = true; llmBench.fleet.models.qwen = { }; }")
    assert any("llmBench.fleet.models.qwen.backends is empty" in m for m in empty), empty
    none = assertions_of("{ llmBench.fleet.enable = true; }")
    assert any("declare at least one model group" in m for m in none), none
    at = assertions_of('{ llmBench.fleet.enable = true; llmBench.fleet.models."q@x".backends.a = { url = "http://a/v1"; model = "q"; }; }')
    assert any("may not contain `@`" in m for m in at), at


def test_allowed_fails_three_warns_with_the_litellm_that_has_the_trap() -> None:
    """LiteLLM before 1.109.3 (nixpkgs' 1.100.1 among them: its cooldown_handlers.py) takes allowed_fails = 3,
    its default, as unset: no cooldown of a lone box. 1.109.3's source has it fixed: no warning there."""
    three = fleet('{ a = { url = "http://a/v1"; model = "q"; }; }', "llmBench.fleet.allowedFails = 3;")
    warnings = evaluate(three, "e.config.warnings")
    assert len(warnings) == 1 and "LiteLLM 1.100.1 treats as unset" in warnings[0], warnings
    assert evaluate(fleet('{ a = { url = "http://a/v1"; model = "q"; }; }'), "e.config.warnings") == []
    fixed = three.replace("llmBench.fleet.allowedFails = 3;", "llmBench.fleet.allowedFails = 3; "
                          'services.litellm.package = { type = "derivation"; name = "litellm-1.109.3"; '
                          'pname = "litellm"; version = "1.109.3"; outPath = "/nix/store/x-litellm-1.109.3"; '
                          'meta.mainProgram = "litellm"; };')
    assert evaluate(fixed, "e.config.warnings") == []


def test_disabled_fleet_leaves_litellm_alone() -> None:
    assert evaluate("{ }", "e.config.services.litellm.enable") is False
    assert evaluate("{ }", "e.config.systemd.services ? litellm") is False


# The arbiter

BOX = """{
  systemd.services.vllm.serviceConfig.ExecStart = "/bin/vllm";
  systemd.services.llama-cpp.serviceConfig.ExecStart = "/bin/llama-server";
  systemd.services.train-lora.serviceConfig = { ExecStart = "/bin/train"; ExecStartPre = [ "/bin/fetch-data" ]; };
  systemd.services.train-big.serviceConfig.ExecStart = "/bin/train-big";
  llmBench.arbiter.train-lora.engines = [ "vllm" ];
  llmBench.arbiter.train-big.engines = [ "vllm" "llama-cpp" ];
}"""


def units() -> dict:
    return evaluate(BOX, "h.lib.mapAttrs (_: s: { inherit (s) serviceConfig onSuccess onFailure; }) e.config.systemd.services")  # type: ignore[return-value]


def test_the_training_unit_stops_the_engines_first_and_starts_them_when_it_ends() -> None:
    found = units()
    systemctl = "/nix/store/" in found["train-lora"]["serviceConfig"]["ExecStartPre"][0]
    assert systemctl
    lora = found["train-lora"]
    # Privileged (+), before the unit's own ExecStartPre, blocking until vLLM has stopped.
    assert lora["serviceConfig"]["ExecStartPre"][0].startswith("+/nix/store/")
    assert lora["serviceConfig"]["ExecStartPre"][0].endswith("-systemd-258/bin/systemctl stop vllm.service")
    assert lora["serviceConfig"]["ExecStartPre"][1] == "/bin/fetch-data"
    assert lora["onSuccess"] == lora["onFailure"] == ["vllm.service"]
    big = found["train-big"]
    assert big["serviceConfig"]["ExecStartPre"] == [
        big["serviceConfig"]["ExecStartPre"][0]
    ] and big["serviceConfig"]["ExecStartPre"][0].endswith("stop vllm.service llama-cpp.service")
    assert big["onSuccess"] == big["onFailure"] == ["vllm.service", "llama-cpp.service"]
    assert assertions_of(BOX) == []


def test_each_engine_waits_for_every_training_unit_it_gives_way_to() -> None:
    found = units()
    vllm = found["vllm"]["serviceConfig"]["ExecCondition"]
    assert len(vllm) == 2 and all(c.startswith("+/nix/store/") for c in vllm), vllm
    assert {c.rsplit("-after-", 1)[1] for c in vllm} == {"train-lora", "train-big"}
    llama = found["llama-cpp"]["serviceConfig"]["ExecCondition"]
    assert [c.rsplit("-after-", 1)[1] for c in llama] == ["train-big"]
    # Conflicts= would stop the training when an engine starts: not used.
    assert "Conflicts" not in json.dumps(found)


def test_unknown_units_are_assertions() -> None:
    messages = assertions_of('{ llmBench.arbiter.train.engines = [ "vlm" "vllm" ];'
                             ' systemd.services.vllm.serviceConfig.ExecStart = "/bin/vllm"; }')
    assert any("no systemd.services.train on this machine" in m for m in messages), messages
    assert any("llmBench.arbiter.train.engines: no systemd.services.vlm " in m for m in messages), messages
    assert len(messages) == 2, messages  # vllm is there
    # A unit run by `script` (NixOS turns it into ExecStart) counts too.
    assert assertions_of('{ llmBench.arbiter.train.engines = [ "vllm" ]; systemd.services.train.script = "train";'
                         ' systemd.services.vllm.serviceConfig.ExecStart = "/bin/vllm"; }') == []


@pytest.mark.parametrize(("state", "starts"), [
    ("inactive", True), ("failed", True),
    ("active", False), ("activating", False), ("deactivating", False), ("reloading", False),
])
def test_the_engine_starts_only_while_the_training_unit_is_down(tmp_path: Path, state: str, starts: bool) -> None:
    """The ExecCondition script, run with a systemctl that answers as systemd does for `show
    --property=ActiveState --value UNIT`: exit 0 starts the engine, 1 skips the start."""
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\necho {state}\n')
    systemctl.chmod(0o755)
    script = nix_eval(f"import {REPO}/modules/lib/arbiter-condition.nix"
                      f" {{ systemctl = {nix_string(str(systemctl))}; engine = \"vllm\"; unit = \"train-lora\"; }}")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert (tmp_path / "calls").read_text() == "show --property=ActiveState --value train-lora.service\n"
    assert result.returncode == (0 if starts else 1), result
    if not starts:
        assert f"vllm.service stays stopped while train-lora.service is {state}" in result.stdout
