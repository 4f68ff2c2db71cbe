# llmBench.watch on a CPU machine: the base engine is measured at boot; a switch to llm-fa86 (a
# stand-in build under another name whose unit gets a fifth of one CPU: slower for real, same
# preset arguments) restarts the watch, which measures the new engine, and `llm-bench history`
# names the regression between the two builds, as the unit's journal does. The switch itself
# returns while the measurement runs.
{ pkgs, self, llmBenchSrc }:

let
  common = import ./common.nix { inherit pkgs self llmBenchSrc; };
  history = "/var/lib/llm-bench/history";
in
pkgs.testers.runNixOSTest {
  name = "llm-bench-watch";

  nodes.machine =
    { lib, ... }:
    {
      imports = [ common.machine ];
      llmBench.watch = {
        enable = true;
        presets = [ "qwen3.8-27b-base" ];
        runs = 5;
        maxTokens = 64;
      };
      specialisation.llm-fa86.configuration.systemd.services.llama-cpp.serviceConfig.CPUQuota = "20%";
    };

  testScript =
    { nodes, ... }:
    let
      base = nodes.machine.system.build.toplevel;
    in
    ''
      import json

      def results():
          out = machine.succeed("find ${history} -name '*.toml' | sort")
          return out.split()

      def measured(count):
          # The watch's script has finished (exited, RemainAfterExit) with `count` results on disk.
          machine.wait_until_succeeds(
              "test \"$(systemctl show -P SubState llm-bench-watch.service)\" = exited", timeout=900
          )
          assert len(results()) == count, results()

      machine.wait_for_unit("llama-cpp.service")
      with subtest("the base engine is measured after boot"):
          measured(1)

      with subtest("a reboot-like restart of the same engine measures nothing"):
          machine.succeed("systemctl restart llm-bench-watch.service")
          measured(1)
          machine.succeed("journalctl -u llm-bench-watch.service | grep -q 'nothing to measure'")

      with subtest("a switch to a slower engine returns at once and the watch measures it"):
          machine.succeed(
              "${base}/specialisation/llm-fa86/bin/switch-to-configuration test 2>&1"
          )
          state = machine.succeed("systemctl show -P ActiveState llm-bench-watch.service").strip()
          assert state in ("active", "activating"), state
          measured(2)

      with subtest("llm-bench history names the regression between the two builds"):
          status, out = machine.execute("llm-bench history ${history}")
          print(out)
          assert status == 4, (status, out)
          assert "REGRESSION" in out and "llama-cpp-fa86" in out, out
          as_json = json.loads(machine.succeed("llm-bench history --format json ${history} || true"))
          print(as_json)
          machine.succeed("journalctl -u llm-bench-watch.service | grep -q REGRESSION")

      with subtest("no model is left loaded"):
          models = json.loads(machine.succeed("curl -sf http://127.0.0.1:48123/models"))["data"]
          loaded = [m["id"] for m in models if m.get("status", {}).get("value") == "loaded"]
          assert loaded == [], loaded
    '';
}
