# What a reboot brings back, with systemd-boot under EFI (the reference machine's loader),
# for each way of switching builds. `nixos-rebuild` is replayed step by step on two
# generations of the machine, `first` (what the disk image boots) and `next` (node `rebuilt`: the
# same machine with one more preset, so that the generations differ), exactly as nixos-rebuild runs
# them: `nix-env --set` of the profile, then the toplevel's (or the specialisation's)
# switch-to-configuration.
#
#   switch --specialisation llm-fa86   runs llm-fa86 now; systemd-boot's builder finds no
#                                      generation whose toplevel is the specialisation, so
#                                      loader.conf keeps the previous default (nixpkgs issue
#                                      325233): the reboot brings back the *previous*
#                                      generation's base system.
#   boot, then test --specialisation   runs llm-fa86 now; loader.conf names the new
#                                      generation's base, which the reboot brings back.
#   switch                             runs the new base now and after the reboot.
{
  pkgs,
  self,
  llmBenchSrc,
}:

let
  common = import ./common.nix { inherit pkgs self llmBenchSrc; };

  bootLoader = {
    virtualisation.useBootLoader = true;
    virtualisation.useEFIBoot = true;
    boot.loader.systemd-boot.enable = true;
    boot.loader.efi.canTouchEfiVariables = true;
  };
in
pkgs.testers.runNixOSTest {
  name = "llm-bench-llama-cpp-specialisation-boot";

  nodes = {
    rebuilt = {
      imports = [
        common.machine
        bootLoader
      ];
      services.llama-cpp.presets.next-generation.model = "${common.tiny}/target.gguf";
    };

    machine =
      { nodes, ... }:
      {
        imports = [
          common.machine
          bootLoader
        ];
        # `rebuilt` (the next generation) is built into this machine's store, as a rebuild
        # would build it; the test driver never starts it as a machine of its own.
        system.extraDependencies = [ nodes.rebuilt.system.build.toplevel ];
      };
  };

  testScript =
    { nodes, ... }:
    let
      first = nodes.machine.system.build.toplevel;
      next = nodes.rebuilt.system.build.toplevel;
    in
    ''
      import json

      URL = "http://127.0.0.1:48123"
      PROFILE = "/nix/var/nix/profiles/system"

      def running():
          """(specialisation, package, presets) of the router that runs now."""
          machine.wait_for_unit("llama-cpp.service")
          machine.wait_until_succeeds(f"curl -sf {URL}/models", timeout=120)
          marker = json.loads(machine.succeed("cat /etc/llama-cpp/active.json"))
          listed = {m["id"] for m in json.loads(machine.succeed(f"curl -sf {URL}/models"))["data"]}
          assert set(marker["presets"]) == listed, (marker, listed)
          return marker["specialisation"], marker["package"]["name"], listed

      def loader_default():
          conf = machine.succeed("cat /boot/loader/loader.conf")
          print(conf)
          # (no builtin next() here: the driver names a global after each node)
          [default] = [line.split()[1] for line in conf.splitlines() if line.startswith("default ")]
          return default

      def reboot():
          machine.shutdown()
          machine.start()
          machine.wait_for_unit("multi-user.target")

      def booted():
          return machine.succeed("readlink -f /run/booted-system").strip()

      def set_profile(toplevel):
          # nixos-rebuild's first step for switch and boot.
          machine.succeed(f"nix-env -p {PROFILE} --set {toplevel}")

      machine.start()
      machine.wait_for_unit("multi-user.target")

      with subtest("the disk boots generation 1, its base system"):
          assert loader_default() == "nixos-generation-1.conf"
          assert booted() == "${first}"
          spec, package, presets = running()
          assert (spec, package) == ("base", "llama-cpp"), (spec, package)
          assert "next-generation" not in presets
          machine.succeed("test -e /boot/loader/entries/nixos-generation-1-specialisation-llm-fa86.conf")

      with subtest("switch --specialisation: the specialisation runs, loader.conf keeps the previous default"):
          set_profile("${next}")
          machine.succeed("${next}/specialisation/llm-fa86/bin/switch-to-configuration switch")
          spec, package, presets = running()
          assert (spec, package) == ("llm-fa86", "llama-cpp-fa86"), (spec, package)
          assert "next-generation" in presets
          # Generation 2 has its entries (base and each specialisation), but is not the default.
          machine.succeed("test -e /boot/loader/entries/nixos-generation-2.conf")
          machine.succeed("test -e /boot/loader/entries/nixos-generation-2-specialisation-llm-fa86.conf")
          assert loader_default() == "nixos-generation-1.conf"

      with subtest("after the reboot: the previous generation's base system"):
          reboot()
          assert booted() == "${first}"
          spec, package, presets = running()
          assert (spec, package) == ("base", "llama-cpp"), (spec, package)
          assert "next-generation" not in presets

      with subtest("boot, then test --specialisation: the specialisation now, the new base at boot"):
          set_profile("${next}")
          machine.succeed("${next}/bin/switch-to-configuration boot")
          assert loader_default() == "nixos-generation-2.conf"
          machine.succeed("${next}/specialisation/llm-fa86/bin/switch-to-configuration test")
          spec, package, presets = running()
          assert (spec, package) == ("llm-fa86", "llama-cpp-fa86"), (spec, package)
          assert loader_default() == "nixos-generation-2.conf"
          reboot()
          assert booted() == "${next}"
          spec, package, presets = running()
          assert (spec, package) == ("base", "llama-cpp"), (spec, package)
          assert "next-generation" in presets

      with subtest("switch: the base system now and after the reboot"):
          machine.succeed("${next}/specialisation/llm-fa86/bin/switch-to-configuration test")
          assert running()[0] == "llm-fa86"
          set_profile("${next}")
          machine.succeed("${next}/bin/switch-to-configuration switch")
          assert running()[:2] == ("base", "llama-cpp")
          assert loader_default() == "nixos-generation-2.conf"
          reboot()
          assert booted() == "${next}"
          assert running()[:2] == ("base", "llama-cpp")
    '';
}
