# Switching builds: `switch-to-configuration test` into llm-fa86, then llm-llamampere, then
# back to the base system. Each time the presets and the marker change, llama-cpp.service
# restarts (new main PID), and switch-to-configuration's own report of the units it stopped,
# restarted and started (parsed by ./switch_units.py, which pytest also checks) names
# llama-cpp.service and nothing else.
{ pkgs, self, llmBenchSrc }:

let
  common = import ./common.nix { inherit pkgs self llmBenchSrc; };
in
pkgs.testers.runNixOSTest {
  name = "llm-bench-llama-cpp-specialisation-switch";

  nodes.machine = {
    imports = [ common.machine ];
    # A user's preset and `"*"` setting, which every specialisation must keep.
    services.llama-cpp.presets.user-preset.model = "${common.tiny}/target.gguf";
    services.llama-cpp.presets."*".ctx-size = 4096;
  };

  testScript = { nodes, ... }:
    let
      # /run/current-system follows each switch; the base toplevel does not.
      base = nodes.machine.system.build.toplevel;
    in
    builtins.readFile ./switch_units.py
    + ''
      import json

      URL = "http://127.0.0.1:48123"

      def running_services():
          """Every running service but llama-cpp, with its main PID and start time."""
          out = machine.succeed(
              "systemctl list-units --type=service --state=running --no-legend --plain"
              " | awk '{print $1}'"
          )
          state = {}
          for unit in out.split():
              if unit == "llama-cpp.service":
                  continue
              state[unit] = machine.succeed(
                  f"systemctl show -p MainPID -p ActiveEnterTimestampMonotonic --value {unit}"
              ).split()
          return state

      def llama_pid():
          return machine.succeed("systemctl show -p MainPID --value llama-cpp.service").strip()

      def presets():
          machine.wait_until_succeeds(f"curl -sf {URL}/models", timeout=120)
          return {m["id"] for m in json.loads(machine.succeed(f"curl -sf {URL}/models"))["data"]}

      def switch(toplevel, name, package, want):
          before_pid = llama_pid()
          before = running_services()
          out = machine.succeed(f"{toplevel}/bin/switch-to-configuration test 2>&1")
          print(out)
          assert_only_unit_switched(out, "llama-cpp.service")
          machine.wait_for_unit("llama-cpp.service")
          after_pid = llama_pid()
          assert after_pid != before_pid, f"llama-cpp.service did not restart ({before_pid})"
          listed = presets()
          assert listed == want, f"{name}: missing {want - listed}, unexpected {listed - want}"
          ini = machine.succeed("cat /etc/llama-cpp/presets.ini")
          assert "ctx-size = 4096" in ini.split("[*]", 1)[1].split("\n\n", 1)[0], ini
          marker = json.loads(machine.succeed("cat /etc/llama-cpp/active.json"))
          assert marker["specialisation"] == name, marker
          assert marker["package"]["name"] == package, marker
          assert set(marker["presets"]) == listed, (marker, listed)
          after = running_services()
          changed = {u for u in before if u in after and before[u] != after[u]}
          assert not changed, f"switching to {name} restarted {changed}"
          machine.succeed("test -d /var/lib/llama-cpp")

      base_presets = {"qwen3.8-27b-base", "qwen3.8-27b-mtp2", "qwen3.8-27b-turbo-coder-mtp2", "qwen3.8-27b-dflash2-4",
                      "user-preset"}
      ampere = {"ampere-none", "ampere-mtp2", "ampere-mtp4", "ampere-turbo4", "ampere-turbo2", "ampere-auto"} | {
          f"ampere-turbo{bits}-d{depth}" for bits in (3, 4, 5, 6) for depth in (1, 3)} | {"user-preset"}

      machine.wait_for_unit("llama-cpp.service")
      assert presets() == base_presets, presets()
      machine.succeed("echo cached > /var/lib/llama-cpp/marker-file")

      with subtest("switch to llm-fa86"):
          switch("${base}/specialisation/llm-fa86", "llm-fa86", "llama-cpp-fa86", base_presets | {"qwen3.8-27b-kv84"})

      with subtest("switch to llm-llamampere"):
          switch("${base}/specialisation/llm-llamampere", "llm-llamampere", "llamampere", ampere)

      with subtest("switch back to the base system"):
          switch("${base}", "base", "llama-cpp", base_presets)

      with subtest("the model cache survived every switch"):
          machine.succeed("grep -q cached /var/lib/llama-cpp/marker-file")
    '';
}
