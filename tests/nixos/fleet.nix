# The fleet on three VMs: two boxes run the flake's llama.cpp router on CPU with a tiny model,
# the third nixpkgs' services.litellm configured by llmBench.fleet (box1 first, box2 the
# fallback; box1's API key only in the proxy's environmentFile). box1 has a training unit
# under llmBench.arbiter: starting it stops the router there and the proxy answers from box2;
# neither `systemctl start llama-cpp` nor starting multi-user.target (what
# switch-to-configuration does) brings the router back while it runs; when it ends, whether it
# succeeded, failed or was stopped, the router starts again and the proxy answers from box1.
#
# Needs NixOS and KVM (pkgs.testers.runNixOSTest); it cannot run on the CI bed, where
# tests/test_nix_fleet.py evaluates the same units and tests/test_fleet_litellm.py runs the
# real proxy with the module's config file in front of two real routers.
{ pkgs, self, llmBenchSrc }:

let
  common = import ./common.nix { inherit pkgs self llmBenchSrc; };
  key = "box1-vm-test-key";

  box =
    extra:
    { ... }:
    {
      imports = [
        common.machine
        self.nixosModules.fleet
        extra
      ];
      # nixpkgs' `settings` (the flake's lock has NixOS/nixpkgs#528626).
      services.llama-cpp = {
        settings.host = "0.0.0.0";
        openFirewall = true;
        presets.tiny.model = "${common.tiny}/target.gguf";
      };
    };
in
pkgs.testers.runNixOSTest {
  name = "llm-bench-fleet";

  nodes.box1 = box {
    services.llama-cpp.settings.api-key = key;
    # Runs until /run/train-done appears, and exits with the status written in it.
    systemd.services.train.script = ''
      until [ -e /run/train-done ]; do sleep 0.2; done
      exit "$(cat /run/train-done)"
    '';
    llmBench.arbiter.train.engines = [ "llama-cpp" ];
  };

  nodes.box2 = box { };

  nodes.proxy =
    { ... }:
    {
      imports = [ self.nixosModules.fleet ];
      virtualisation.memorySize = 2048;
      llmBench.fleet = {
        enable = true;
        models.tiny.backends = {
          box1 = {
            url = "http://box1:48123/v1";
            model = "tiny";
            order = 1;
            apiKeyVariable = "BOX1_API_KEY";
          };
          box2 = {
            url = "http://box2:48123/v1";
            model = "tiny";
            order = 2;
          };
        };
      };
      services.litellm = {
        port = 4000;
        environmentFile = "/run/secrets/litellm.env";
      };
      environment.systemPackages = [ pkgs.curl ];
    };

  testScript = ''
    ask = (
        "curl -sf -o /dev/null -D - http://127.0.0.1:4000/v1/chat/completions"
        " -H 'content-type: application/json'"
        """ -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}'"""
        " | tr -d '\\r' | grep -i '^x-litellm-model-id:'"
    )

    def served_by():
        return proxy.succeed(ask).split(":", 1)[1].strip()

    start_all()
    for box in (box1, box2):
        box.wait_for_unit("llama-cpp.service")
        box.wait_for_open_port(48123)

    with subtest("the key reaches the proxy only through its environment file"):
        config = proxy.succeed("systemctl cat litellm.service | grep -o -- '--config [^ ]*' | cut -d' ' -f2")
        proxy.fail(f"grep -q ${key} {config.strip()}")
        proxy.succeed("install -d -m 0700 /run/secrets && echo BOX1_API_KEY=${key} > /run/secrets/litellm.env")
        proxy.succeed("systemctl restart litellm.service")
        proxy.wait_until_succeeds("curl -sf http://127.0.0.1:4000/v1/models", timeout=180)

    with subtest("the first choice answers"):
        assert served_by() == "tiny@box1"

    with subtest("a training job stops the router, and the proxy answers from the fallback"):
        box1.succeed("systemctl start train.service")
        box1.fail("systemctl is-active llama-cpp.service")
        assert served_by() == "tiny@box2"

    with subtest("the router stays stopped while the training job runs"):
        # ExecCondition skips the start (the unit is not failed); the exit status is not the verdict.
        box1.execute("systemctl start llama-cpp.service")
        box1.execute("systemctl start multi-user.target")
        box1.succeed("systemctl is-active train.service")
        box1.fail("systemctl is-active llama-cpp.service")
        box1.succeed("journalctl -u llama-cpp.service | grep 'stays stopped while train.service is active'")

    with subtest("the router returns when the job ends, and the proxy goes back to it"):
        box1.succeed("echo 0 > /run/train-done")
        box1.wait_for_unit("llama-cpp.service")
        box1.wait_for_open_port(48123)
        proxy.wait_until_succeeds(f"{ask} | grep -q tiny@box1", timeout=60)

    with subtest("a failed training job gives the GPU back too"):
        box1.succeed("rm /run/train-done && systemctl start train.service")
        box1.fail("systemctl is-active llama-cpp.service")
        box1.succeed("echo 1 > /run/train-done")
        box1.wait_until_succeeds("systemctl is-failed train.service")
        box1.wait_for_unit("llama-cpp.service")

    with subtest("so does a training job stopped by hand"):
        box1.succeed("rm /run/train-done && systemctl start train.service")
        box1.fail("systemctl is-active llama-cpp.service")
        box1.succeed("systemctl stop train.service")
        box1.wait_for_unit("llama-cpp.service")
  '';
}
