# The base system's router on CPU: the unit starts, /models lists every rendered preset with
# the arguments it asked for, /etc holds the INI and the marker, and llm-bench measures the
# presets inside the VM.
{ pkgs, self, llmBenchSrc }:

let
  common = import ./common.nix { inherit pkgs self llmBenchSrc; };
in
pkgs.testers.runNixOSTest {
  name = "llm-bench-llama-cpp-router";

  nodes.machine = { lib, ... }: {
    imports = [ common.machine ];
    # A preset the tiny models can really draft for (the base presets use MTP and DFlash
    # drafters, which a tiny llama model has not got: llm-bench records their load failure).
    services.llama-cpp.presets.tiny-draft = {
      model = "${common.tiny}/target.gguf";
      spec-type = "draft-simple";
      spec-draft-model = "${common.tiny}/draft.gguf";
      spec-draft-n-max = 4;
    };
  };

  testScript = ''
    import json
    import tomllib

    machine.wait_for_unit("llama-cpp.service")
    machine.wait_until_succeeds("curl -sf http://127.0.0.1:48123/models", timeout=120)

    with subtest("/models lists every preset with its arguments"):
        models = json.loads(machine.succeed("curl -sf http://127.0.0.1:48123/models"))
        listed = {m["id"]: m for m in models["data"]}
        expected = {
            "qwen3.8-27b-base", "qwen3.8-27b-mtp2", "qwen3.8-27b-turbo-coder-mtp2",
            "qwen3.8-27b-dflash2-4", "tiny-draft",
        }
        # Exactly these: no phantom `default` preset from a top-level key, nothing missing.
        assert set(listed) == expected, f"missing {expected - set(listed)}, unexpected {set(listed) - expected}"
        args = " ".join(listed["qwen3.8-27b-mtp2"]["status"]["args"])
        for want in ("draft-mtp", "65536", "q8_0"):
            assert want in args, f"{want!r} not in {args!r}"

    with subtest("the INI and the marker are in /etc"):
        ini = machine.succeed("cat /etc/llama-cpp/presets.ini")
        assert "[qwen3.8-27b-dflash2-4]" in ini
        marker = json.loads(machine.succeed("cat /etc/llama-cpp/active.json"))
        assert marker["format"] == "llm-bench-llama-cpp-active/1", marker
        assert marker["specialisation"] == "base", marker
        assert marker["package"]["name"] == "llama-cpp", marker
        assert set(marker["presets"]) == expected, marker
        unit = machine.succeed("systemctl cat llama-cpp.service")
        assert "StartLimitBurst=3" in unit, unit

    with subtest("the running server's LLAMA_CACHE is the shared state directory"):
        # nixpkgs' unit also assigns LLAMA_CACHE (/var/cache/llama-cpp); what counts is the
        # value systemd hands the process, so read the process's own environment.
        pid = machine.succeed("systemctl show -P MainPID llama-cpp.service").strip()
        environ = machine.succeed(f"cat /proc/{pid}/environ").split("\0")
        assert "LLAMA_CACHE=/var/lib/llama-cpp" in environ, environ
        assert "HOME=/var/lib/llama-cpp" in environ, environ

    with subtest("llm-bench measures the presets"):
        # The MTP and DFlash presets cannot load on a tiny llama model; llm-bench records
        # their failure and goes on, so its exit status is not the verdict here.
        status, out = machine.execute(
            "llm-bench run --url http://127.0.0.1:48123 --output-dir /tmp/results"
            " --runs 1 --max-tokens 16 2>&1"
        )
        print(f"llm-bench exited with {status}:\n{out}")
        files = machine.succeed("ls /tmp/results/*.toml").split()
        assert files, "no results file"
        data = tomllib.loads(machine.succeed(f"cat {files[0]}"))

        by_alias = {r["alias"]: r for r in data["aliases"]}  # the results format (docs/protocol.md, Results format)
        for alias in ("qwen3.8-27b-base", "tiny-draft"):
            assert alias in by_alias, f"{alias} not measured: {sorted(by_alias)}"
            assert by_alias[alias].get("decode_tps_median", 0) > 0, by_alias[alias]
        assert by_alias["tiny-draft"].get("draft_acceptance") is not None, by_alias["tiny-draft"]
  '';
}
