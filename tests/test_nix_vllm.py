"""services.vllm and llmBench.hyperqwen.

The command line and the dtype warning come from modules/lib/vllm-args.nix, evaluated with
nixpkgs' lib (lib.cli.toCommandLine); the modules themselves are evaluated with nixpkgs' lib.evalModules through
tests/nix/eval-module.nix (its `eval`, with a few more stub options declared here), and skip
without NIXPKGS_LIB.
"""

from __future__ import annotations

import json
import shlex

import pytest

from tests.nix.helpers import REPO, nix_eval, nix_string, nixpkgs_lib

ARGS_LIB = REPO / "modules" / "lib" / "vllm-args.nix"
HARNESS = REPO / "tests" / "nix" / "eval-module.nix"
VLLM = REPO / "modules" / "vllm.nix"
HYPERQWEN = REPO / "modules" / "hyperqwen.nix"

DFLASH2 = {"method": "dflash", "model": "incoai/Qwen3.8-27B-DFlash2", "num_speculative_tokens": 7}
MTP = {"method": "mtp", "num_speculative_tokens": 3}


def nix_value(value) -> str:
    """A Nix expression for JSON-like Python data."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return nix_string(value)
    if isinstance(value, list):
        return "[ " + " ".join(f"({nix_value(v)})" for v in value) + " ]"
    if isinstance(value, dict):
        return "{ " + " ".join(f"{nix_string(k)} = {nix_value(v)};" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def args_lib() -> str:
    return f"(import {ARGS_LIB} {{ lib = import {nixpkgs_lib()}; }})"


def serve_args(model: str = "m", **settings) -> list[str]:
    return nix_eval(f"{args_lib()}.serveArgs {{ model = {nix_string(model)}; settings = {nix_value(settings)}; }}")  # type: ignore[return-value]


def warning(**settings) -> str | None:
    return nix_eval(f"{args_lib()}.speculationWarning {nix_value(settings)}")  # type: ignore[return-value]


# --- the command line, lib.cli.toCommandLine ---------------------------------------------

def test_minimal_command_line() -> None:
    assert serve_args("Qwen/Qwen3-8B") == ["serve", "Qwen/Qwen3-8B"]


def test_final_configuration_renders_every_setting() -> None:
    args = serve_args(
        "/models/Qwen3.8-27B", **{
            "served-model-name": "qwen3.8-27b", "host": "0.0.0.0", "port": 8001, "-tp": 4,
            "gpu-memory-utilization": 0.9, "max-model-len": 65536, "dtype": "bfloat16",
            "enable-prefix-caching": True, "speculative-config": DFLASH2, "reasoning-parser": "qwen3",
            "tool-call-parser": "qwen3_coder", "enable-auto-tool-choice": True, "max-num-seqs": 8,
        })
    assert args[:2] == ["serve", "/models/Qwen3.8-27B"]
    for flag, value in [("--host", "0.0.0.0"), ("--port", "8001"), ("-tp", "4"), ("--gpu-memory-utilization", "0.9"),
                        ("--max-model-len", "65536"), ("--dtype", "bfloat16"), ("--reasoning-parser", "qwen3"),
                        ("--tool-call-parser", "qwen3_coder"), ("--served-model-name", "qwen3.8-27b"),
                        ("--max-num-seqs", "8")]:
        assert args[args.index(flag) + 1] == value, flag
    assert json.loads(args[args.index("--speculative-config") + 1]) == DFLASH2
    assert "--enable-prefix-caching" in args and "--enable-auto-tool-choice" in args
    assert "--enforce-eager" not in args


def test_booleans_render_vllms_own_negation_and_null_nothing() -> None:
    """vLLM's boolean flags are argparse BooleanOptionalAction: false must say --no-KEY, since
    leaving the flag out keeps vLLM's default (prefix caching is on)."""
    assert "--enable-prefix-caching" in serve_args(**{"enable-prefix-caching": True})
    assert "--no-enable-prefix-caching" in serve_args(**{"enable-prefix-caching": False})
    assert serve_args(**{"enable-prefix-caching": None}) == ["serve", "m"]
    assert serve_args(**{"enforce-eager": True})[-1] == "--enforce-eager"


def test_configs_render_as_one_json_argument_and_floats_exactly() -> None:
    args = serve_args(**{"compilation-config": {"mode": 0}, "gpu-memory-utilization": 0.92})
    assert json.loads(args[args.index("--compilation-config") + 1]) == {"mode": 0}
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.92"


@pytest.mark.parametrize("dtype", ["half", "float16"])
@pytest.mark.parametrize("spec", [{"speculative-config": DFLASH2}, {"speculative-config": MTP}, {"-sc": MTP},
                                  {"spec-method": "mtp"}, {"speculative-config.method": "mtp"}],
                         ids=["dflash2", "mtp", "sc", "spec-method", "dotted"])
def test_fp16_with_speculation_warns_and_names_the_cause(dtype, spec) -> None:
    text = warning(dtype=dtype, **spec)
    assert text is not None
    assert f'dtype = "{dtype}"' in text and next(iter(spec)) in text
    assert "vLLM issue #55250" in text and "overflows in float16" in text
    assert "Mean acceptance length: 1.00" in text and "rejects every draft token" in text


@pytest.mark.parametrize("settings", [
    {"dtype": "bfloat16", "speculative-config": DFLASH2},
    {"dtype": "auto", "speculative-config": MTP},
    {"dtype": None, "speculative-config": MTP},
    {"dtype": "half", "speculative-config": None},
    {"dtype": "float16"},
])
def test_no_warning_otherwise(settings) -> None:
    assert warning(**settings) is None


# --- nixpkgs' lib.evalModules ----------------------------------------------------------

# The NixOS options llmBench.hyperqwen sets that tests/nix/eval-module.nix does not declare,
# and a stand-in vllm package (the stub pkgs has none).
EXTRA_STUBS = """
{ lib, ... }: {
  options = {
    virtualisation.docker = {
      enable = lib.mkOption { type = lib.types.bool; default = false; };
      package = lib.mkOption { type = lib.types.attrs; default = { version = "28.3.3"; outPath = "/nix/store/dddd-docker-28.3.3"; }; };
      daemon.settings = lib.mkOption { type = lib.types.attrsOf lib.types.anything; default = { }; };
    };
    hardware.nvidia-container-toolkit.enable = lib.mkOption { type = lib.types.bool; default = false; };
    users.groups = lib.mkOption {
      default = { };
      type = lib.types.attrsOf (lib.types.submodule { options.members = lib.mkOption { type = lib.types.listOf lib.types.str; default = [ ]; }; });
    };
  };
  # A CUDA build as nixpkgs' recipe leaves it: env.VLLM_TARGET_DEVICE, a top-level attribute.
  config.services.vllm.package = lib.mkDefault {
    type = "derivation"; name = "vllm-0.32.0"; pname = "vllm"; version = "0.32.0";
    outPath = "/nix/store/vvvv-vllm-0.32.0"; VLLM_TARGET_DEVICE = "cuda";
  };
}
"""
# The NVIDIA driver, which services.vllm (cuda, the default) asserts.
DRIVER = '{ services.xserver.videoDrivers = [ "nvidia" ]; }'



def evaluate(*modules: str, driver: bool = True, stubs: str = EXTRA_STUBS) -> dict:
    """The base system's units and settings, and each specialisation's (`specialised`)."""
    lib = nixpkgs_lib()
    harness = f"(import {HARNESS} {{ libPath = {lib}; }})"
    mods = " ".join(f"({m})" for m in (str(VLLM), str(HYPERQWEN), stubs, *([DRIVER] if driver else []), *modules))
    expr = f"""
      let
        h = {harness};
        describe = c: let units = c.systemd.services; in {{
          warnings = c.warnings;
          failedAssertions = h.failedAssertions c;
          vllm = if units ? vllm then {{
            execStart = units.vllm.serviceConfig.ExecStart;
            environment = units.vllm.environment;
            environmentFile = units.vllm.serviceConfig.EnvironmentFile or null;
            wantedBy = units.vllm.wantedBy;
          }} else null;
          hyperqwen = if units ? hyperqwen then {{
            inherit (units.hyperqwen.serviceConfig) ExecStart ExecStop WorkingDirectory Type;
            conflicts = units.hyperqwen.conflicts or [ ];
            restartIfChanged = units.hyperqwen.restartIfChanged or true;
            wantedBy = units.hyperqwen.wantedBy;
          }} else null;
          llamaCpp = if c.services.llama-cpp.enable then {{
            wantedBy = units.llama-cpp.wantedBy;
            conflicts = units.llama-cpp.conflicts or [ ];
          }} else null;
          firewall = c.networking.firewall.allowedTCPPorts;
          graphics = c.hardware.graphics.enable;
          docker = {{ inherit (c.virtualisation.docker) enable; settings = c.virtualisation.docker.daemon.settings; }};
          toolkit = c.hardware.nvidia-container-toolkit.enable;
          dockerMembers = c.users.groups.docker.members or [ ];
        }};
        c = (h.eval [ {mods} ]).config;
      in describe c // {{
        specialised = builtins.mapAttrs (_: s: describe s.configuration) c.specialisation;
      }}
    """
    return nix_eval(expr)  # type: ignore[return-value]


VLLM_FINAL = """{
  services.vllm = {
    enable = true;
    model = "/models/Qwen3.8-27B";
    speculativeConfig = { method = "dflash"; model = "incoai/Qwen3.8-27B-DFlash2"; num_speculative_tokens = 7; };
    settings = {
      served-model-name = "qwen3.8-27b";
      "-tp" = 4;
      max-model-len = 65536;
      dtype = "bfloat16";
      reasoning-parser = "qwen3";
      tool-call-parser = "qwen3_coder";
      enable-auto-tool-choice = true;
    };
  };
}"""


def exec_args(exec_start: str) -> list[str]:
    return shlex.split(exec_start)


def test_module_renders_the_final_configuration() -> None:
    out = evaluate(VLLM_FINAL)
    assert out["warnings"] == [] and out["failedAssertions"] == []
    args = exec_args(out["vllm"]["execStart"])
    assert args[0] == "/nix/store/vvvv-vllm-0.32.0/bin/vllm"
    assert args[1:3] == ["serve", "/models/Qwen3.8-27B"]
    for flag, value in [("--host", "127.0.0.1"), ("--port", "8000"), ("-tp", "4"), ("--max-model-len", "65536"),
                        ("--dtype", "bfloat16"), ("--reasoning-parser", "qwen3"),
                        ("--tool-call-parser", "qwen3_coder"), ("--served-model-name", "qwen3.8-27b")]:
        assert args[args.index(flag) + 1] == value, flag
    assert json.loads(args[args.index("--speculative-config") + 1]) == DFLASH2
    assert "--enable-auto-tool-choice" in args
    # Nothing the user did not set: vLLM's own defaults (prefix caching on, 0.92 of the memory).
    assert not [a for a in args if "prefix-caching" in a or "gpu-memory" in a or "eager" in a], args
    assert out["vllm"]["wantedBy"] == ["multi-user.target"]
    assert out["vllm"]["environment"]["HF_HOME"] == "/var/cache/vllm/huggingface"
    assert out["firewall"] == [] and out["graphics"] is True
    assert out["hyperqwen"] is None and out["docker"]["enable"] is False


def test_module_warns_on_half_with_speculation() -> None:
    out = evaluate(VLLM_FINAL, '{ lib, ... }: { services.vllm.settings.dtype = lib.mkForce "half"; }')
    (text,) = out["warnings"]
    assert "vLLM issue #55250" in text and "half" in text and "speculative-config" in text
    assert exec_args(out["vllm"]["execStart"])[exec_args(out["vllm"]["execStart"]).index("--dtype") + 1] == "half"


def test_speculation_given_twice_is_an_assertion() -> None:
    out = evaluate(VLLM_FINAL, '{ services.vllm.settings.speculative-config = { method = "mtp"; }; }')
    assert any("both set" in m for m in out["failedAssertions"]), out["failedAssertions"]


def test_module_no_warning_without_speculation() -> None:
    out = evaluate('{ services.vllm = { enable = true; model = "m"; settings.dtype = "half"; }; }')
    assert out["warnings"] == []


def test_module_settings_firewall_and_environment() -> None:
    out = evaluate('{ services.vllm = { enable = true; model = "m"; settings = { enforce-eager = true; port = 8011; '
                   'max-num-seqs = 8; }; openFirewall = true; '
                   'environmentFile = "/run/secrets/vllm.env"; environment.CUDA_VISIBLE_DEVICES = "0,1"; }; }')
    args = exec_args(out["vllm"]["execStart"])
    assert "--enforce-eager" in args and args[args.index("--max-num-seqs") + 1] == "8"
    assert out["firewall"] == [8011]
    assert out["vllm"]["environmentFile"] == "/run/secrets/vllm.env"
    assert out["vllm"]["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_the_typed_options_of_before_move_into_settings() -> None:
    """A configuration written for the typed module still renders the same flags (with a rename
    warning from nixpkgs' mkRenamedOptionModule); the removed ones say where they went."""
    out = evaluate('{ services.vllm = { enable = true; model = "m"; tensorParallelSize = 2; port = 8001; '
                   'gpuMemoryUtilization = 0.8; prefixCaching = false; enforceEager = true; }; }')
    args = exec_args(out["vllm"]["execStart"])
    assert args[args.index("--tensor-parallel-size") + 1] == "2" and args[args.index("--port") + 1] == "8001"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.8"
    assert "--no-enable-prefix-caching" in args and "--enforce-eager" in args
    assert any("services.vllm.tensorParallelSize" in w and "settings.tensor-parallel-size" in w
               for w in out["warnings"]), out["warnings"]
    removed = evaluate('{ services.vllm = { enable = true; model = "m"; toolCallParser = "qwen3_coder"; }; }')
    assert any("tool-call-parser" in m and "enable-auto-tool-choice" in m for m in removed["failedAssertions"])


CPU_VLLM = """{ lib, ... }: {
  services.vllm.package = lib.mkForce {
    type = "derivation"; name = "vllm-0.32.0"; pname = "vllm"; version = "0.32.0";
    outPath = "/nix/store/cccc-vllm-0.32.0"; VLLM_TARGET_DEVICE = "cpu";
  };
}"""


def test_a_cpu_build_of_vllm_is_refused_naming_cuda_support() -> None:
    """nixpkgs' vllm recipe builds for the CPU unless nixpkgs' config has cudaSupport (its
    env.VLLM_TARGET_DEVICE says which); the CUDA unit would then serve on the CPU."""
    out = evaluate('{ services.vllm = { enable = true; model = "m"; }; }', CPU_VLLM)
    (message,) = out["failedAssertions"]
    assert "CPU build" in message and "nixpkgs.config.cudaSupport = true" in message
    assert "services.vllm.cuda = false" in message
    assert evaluate('{ services.vllm = { enable = true; model = "m"; cuda = false; }; }', CPU_VLLM,
                    driver=False)["failedAssertions"] == []


def test_nixpkgs_default_vllm_follows_cuda_support() -> None:
    """The default package is pkgs.vllm, a CPU build unless the system's nixpkgs config has
    cudaSupport (the stand-in follows the recipe); a package of the user's without the recipe's
    attribute is taken at its word."""
    stubs = EXTRA_STUBS.split("  # A CUDA build")[0] + "}\n"
    out = evaluate('{ services.vllm = { enable = true; model = "m"; }; }', stubs=stubs)
    assert any("CPU build" in m and "VLLM_TARGET_DEVICE" in m for m in out["failedAssertions"]), out
    lib = nixpkgs_lib()
    cuda = nix_eval(f"let h = import {HARNESS} {{ libPath = {lib}; overlay = _: {{ config = {{ cudaSupport = true; rocmSupport = false; }}; }}; }};"
                    f" c = (h.eval [ ({VLLM}) ({HYPERQWEN}) ({stubs}) ({DRIVER})"
                    ' { services.vllm = { enable = true; model = "m"; }; } ]).config; in h.failedAssertions c')
    assert cuda == [], cuda
    own = ('{ services.vllm = { enable = true; model = "m"; package = '
           '{ type = "derivation"; name = "vllm-0.32.0"; outPath = "/nix/store/x-vllm"; }; }; }')
    assert evaluate(own, stubs=stubs)["failedAssertions"] == []


def test_vllm_needs_the_driver_and_graphics() -> None:
    out = evaluate('{ services.vllm = { enable = true; model = "m"; }; }', driver=False)
    assert any("services.vllm: a CUDA build needs the NVIDIA driver" in m and "reboot once" in m
               for m in out["failedAssertions"]), out["failedAssertions"]
    off = evaluate('{ services.vllm = { enable = true; model = "m"; }; hardware.graphics.enable = false; }')
    (message,) = off["failedAssertions"]
    assert "hardware.graphics.enable = true" in message and "/run/opengl-driver/lib" in message


def test_module_disabled_adds_nothing() -> None:
    out = evaluate()
    assert out["vllm"] is None and out["hyperqwen"] is None
    assert out["docker"]["enable"] is False and out["toolkit"] is False


def test_hyperqwen_host_side() -> None:
    out = evaluate('{ llmBench.hyperqwen = { enable = true; dockerUsers = [ "alice" ]; }; }')
    assert out["failedAssertions"] == []
    assert out["docker"]["enable"] is True
    assert out["docker"]["settings"]["features"]["cdi"] is True
    assert out["toolkit"] is True
    assert out["dockerMembers"] == ["alice"]
    assert out["hyperqwen"] is None and out["specialised"] == {}  # the unit is opt-in


HQ_UNIT = '{ llmBench.hyperqwen = { enable = true; unit = { enable = true; directory = "/srv/HyperQwen"; }; }; }'


def test_hyperqwen_unit_runs_in_its_own_specialisation() -> None:
    out = evaluate(HQ_UNIT)
    assert out["failedAssertions"] == []
    assert out["hyperqwen"] is None  # never in the base system, whose router it would fight
    assert set(out["specialised"]) == {"llm-hyperqwen"}
    spec = out["specialised"]["llm-hyperqwen"]
    assert spec["failedAssertions"] == []
    unit = spec["hyperqwen"]
    assert unit["wantedBy"] == ["multi-user.target"]  # the switch into the specialisation starts it
    assert unit["WorkingDirectory"] == "/srv/HyperQwen"
    assert unit["Type"] == "oneshot"
    assert shlex.split(unit["ExecStart"]) == [
        "/nix/store/dddd-docker-28.3.3/bin/docker", "compose", "--env-file", ".env",
        "-f", "docker-compose.yml", "-f", "docker-compose.override.yml", "--profile", "single", "up", "-d",
    ]
    assert shlex.split(unit["ExecStop"])[-1] == "down"
    assert spec["docker"]["enable"] is True and spec["toolkit"] is True


ALL = REPO / "modules" / "default.nix"
NVIDIA = '{ services.xserver.videoDrivers = [ "nvidia" ]; }'


def test_a_rebuild_cannot_stop_a_running_hyperqwen() -> None:
    """With the router's modules: in the HyperQwen specialisation the router is off (nothing is
    left for activation to start that holds the GPU or conflicts with HyperQwen), and a rebuild
    into it does not restart hyperqwen.service. The base system keeps the router."""
    out = evaluate(str(ALL), NVIDIA, HQ_UNIT)
    assert out["failedAssertions"] == []
    assert out["llamaCpp"]["wantedBy"] == ["multi-user.target"] and out["hyperqwen"] is None
    spec = out["specialised"]["llm-hyperqwen"]
    assert spec["failedAssertions"] == []
    assert spec["llamaCpp"] is None
    assert spec["hyperqwen"]["restartIfChanged"] is False
    assert spec["hyperqwen"]["conflicts"] == []
    # Even a configuration that turns the router on by name does not bring it back there.
    forced = evaluate(str(ALL), NVIDIA, HQ_UNIT, "{ services.llama-cpp.enable = true; }")
    assert forced["specialised"]["llm-hyperqwen"]["llamaCpp"] is None


def test_hyperqwen_conflicts_option_is_gone_with_a_reason() -> None:
    out = evaluate(HQ_UNIT, '{ llmBench.hyperqwen.unit.conflictsWith = [ "llama-cpp.service" ]; }')
    assert any("own" in m and "specialisation" in m for m in out["failedAssertions"]), out["failedAssertions"]


def test_hyperqwen_refuses_docker_without_cdi() -> None:
    out = evaluate('{ llmBench.hyperqwen.enable = true; virtualisation.docker.package = { version = "24.0.9"; outPath = "/x"; }; }')
    (message,) = out["failedAssertions"]
    assert "Docker 24.0.9" in message and ">= 25" in message


def test_option_documentation_evaluates() -> None:
    """The manual's view of the options (descriptions, defaults, examples) evaluates."""
    lib = nixpkgs_lib()
    harness = f"(import {HARNESS} {{ libPath = {lib}; }})"
    expr = f"""
      let
        h = {harness};
        o = (h.eval [ ({VLLM}) ({HYPERQWEN}) ({EXTRA_STUBS}) ]).options;
        docs = h.lib.optionAttrSetToDocList {{ services.vllm = o.services.vllm; llmBench = o.llmBench; }};
      in map (d: {{ inherit (d) name description; default = d.default or null; example = d.example or null; }})
        (builtins.filter (d: d.visible) docs)
    """
    docs = {d["name"]: d for d in nix_eval(expr)}  # type: ignore[union-attr]
    assert "services.vllm.speculativeConfig" in docs and "llmBench.hyperqwen.unit.directory" in docs
    assert all(d["description"] for d in docs.values())
    assert docs["services.vllm.cuda"]["default"] == {"_type": "literalExpression", "text": "true"}
    assert "services.vllm.enforceEager" not in docs  # a rename now, hidden from the manual
