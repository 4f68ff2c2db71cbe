"""The rendered presets INI files, accepted by the test bed's real llama.cpp router.

The files given to the router are tests/nix/expected/*.ini, which test_nix_pure.py proves are
exactly what Nix renders for the base system and each specialisation. The router must list
exactly their presets (no phantom `default`, nothing missing), and the argument list it reports
for a preset (`status.args` of `GET /models`, what it will run on load) must carry every key of
the preset and of `[*]`. A grid of 6 presets, with floats, is rendered and served the same way.

Model sources: the real files name Hugging Face repositories, which the router lists without
downloading anything. To show the arguments also *run*, the same preset sets are rendered
again with the model sources pointed at the test bed's tiny GGUF models, and the control
presets are loaded for real.

What stock llama.cpp does not accept: the llamAmpere presets `ampere-turbo4` and
`ampere-turbo2` ask for the fork's `turbo4` KV cache type. Stock llama.cpp's router lists them
(it does not check values when it reads the INI), but the model process refuses the cache
type when the preset is loaded; only the llamAmpere build can run them. `ampere-auto` relies
on the fork drafting by default, which stock llama.cpp does not do (it loads as a plain,
non-speculative preset there). The MTP and DFlash presets need the Qwen3.8 model's MTP head
or a DFlash drafter, which tiny test models do not have, so they are checked as listed
arguments only.
"""

from __future__ import annotations

import time

import httpx
import pytest

from llm_bench.support.poll import poll_until
from tests.nix.helpers import EXPECTED, nix_eval, nix_string, render_preset_set, renderer

# The argument each INI key becomes in the router's argument list (llama-server reports the
# last spelling of an option, e.g. `spec-draft-hf` -> `--hf-repo-draft`).
ARG_OF_KEY = {
    "ctx-size": "--ctx-size",
    "cache-type-k": "--cache-type-k",
    "cache-type-v": "--cache-type-v",
    "flash-attn": "--flash-attn",
    "fit": "--fit",
    "hf-repo": "--hf-repo",
    "model": "--model",
    "spec-draft-hf": "--hf-repo-draft",
    "spec-draft-model": "--model-draft",
    "spec-draft-n-max": "--spec-draft-n-max",
    "spec-type": "--spec-type",
    "min-p": "--min-p",
    "temp": "--temperature",
}
# Boolean keys: `no-mmproj = true` turns the projector off.
FLAG_OF_KEY = {("no-mmproj", "true"): "--no-mmproj-auto"}


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """The presets of a rendered file (the renderer writes only `key = value` and headers)."""
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        if line.startswith("["):
            current = line[1:-1]
            sections[current] = {}
        elif current is not None:
            key, value = (part.strip() for part in line.split("=", 1))
            sections[current][key] = value
    return sections


def listed_models(url: str) -> dict[str, dict]:
    response = httpx.get(f"{url}/models", timeout=10)
    response.raise_for_status()
    return {m["id"]: m for m in response.json()["data"]}


def assert_args(preset: str, settings: dict[str, str], args: list[str]) -> None:
    for key, value in settings.items():
        if (key, value) in FLAG_OF_KEY:
            assert FLAG_OF_KEY[(key, value)] in args, (preset, key, args)
            continue
        flag = ARG_OF_KEY[key]
        pairs = list(zip(args, args[1:]))
        assert (flag, value) in pairs, f"{preset}: {key} = {value} is not `{flag} {value}` in {args}"


def presets_of(text: str) -> dict[str, dict[str, str]]:
    sections = parse_ini(text)
    common = sections.pop("*", {})
    return {name: {**common, **own} for name, own in sections.items()}


@pytest.mark.parametrize("name", ["base", "llm-fa86", "llm-llamampere"])
def test_router_lists_every_preset_with_its_arguments(router_factory, name: str) -> None:
    ini = EXPECTED / f"{name}.ini"
    expected = presets_of(ini.read_text())
    router = router_factory(ini.read_text())
    listed = listed_models(router.url)
    assert set(listed) == set(expected), f"missing {set(expected) - set(listed)}, unexpected {set(listed) - set(expected)}"
    for preset, settings in expected.items():
        assert listed[preset]["status"]["value"] == "unloaded"
        assert_args(preset, settings, listed[preset]["status"]["args"])


def load(url: str, model: str, timeout: float = 120.0) -> dict:
    """Ask the router to load a preset; return its final /models entry (loaded or failed)."""
    httpx.post(f"{url}/models/load", json={"model": model}, timeout=30)
    asked = time.monotonic()
    last: list[dict] = []

    def settled() -> dict | None:
        entry = listed_models(url)[model]
        last[:] = [entry]
        status = entry["status"]
        if status["value"] == "loaded" or status.get("failed") or status["value"] in {"failed", "error"}:
            return entry
        if status["value"] == "unloaded" and time.monotonic() > asked + 2:
            # Back to unloaded after a load attempt: the model process exited.
            return entry
        return None

    entry = poll_until(settled, timeout=timeout, interval=0.3)
    if entry is None:
        raise AssertionError(f"{model} neither loaded nor failed within {timeout:.0f} s: {last}")
    return entry


@pytest.fixture(scope="module")
def tiny_sources(tmp_path_factory, tiny_models) -> dict[str, str]:
    # The presets' q8_0 K/V cache needs a head size divisible by 32 (q8_0's block): the test
    # bed's default tiny model has 64/4 = 16, so the target here has 128/4 = 32.
    from llm_bench.testbed.tiny_gguf import TinyModelSpec, write_tiny_model

    target = write_tiny_model(
        tmp_path_factory.mktemp("nix-models") / "target-128.gguf",
        TinyModelSpec(seed=1, n_embd=128, name="tiny-target-128"),
    )
    return {
        "qwen38": str(target),
        "turboCoder": str(target),
        "dflash2Draft": str(tiny_models["draft"]),
    }


@pytest.mark.parametrize(
    "name,control",
    [("base", "qwen3.8-27b-base"), ("llm-fa86", "qwen3.8-27b-base"), ("llm-llamampere", "ampere-none")],
)
def test_control_preset_runs_with_local_models(router_factory, tiny_sources, name: str, control: str) -> None:
    text = render_preset_set(name, tiny_sources)
    expected = presets_of(text)
    assert all(s.get("model") == tiny_sources["qwen38"] for s in expected.values())
    router = router_factory(text)
    listed = listed_models(router.url)
    assert set(listed) == set(expected)
    for preset, settings in expected.items():
        assert_args(preset, settings, listed[preset]["status"]["args"])
    # The `[*]` settings (context 65536, fit, FlashAttention, q8_0 K and V, no projector)
    # really start a model.
    entry = load(router.url, control)
    assert entry["status"]["value"] == "loaded", f"{control} did not load: {entry}\n{router.log()[-3000:]}"


def test_turbo4_presets_need_the_llamampere_build(router_factory, tiny_sources) -> None:
    """Stock llama.cpp lists ampere-turbo4 but cannot load it: `turbo4` is a fork-only KV type."""
    router = router_factory(render_preset_set("llm-llamampere", tiny_sources))
    entry = load(router.url, "ampere-turbo4", timeout=60)
    assert entry["status"]["value"] != "loaded", entry
    assert "Unsupported cache type: turbo4" in router.log(), router.log()[-3000:]


def test_a_grid_of_six_presets_is_served(router_factory, tiny_sources) -> None:
    """A grid (3 KV cache types x 2 draft depths) over a base with floats, rendered by the module's
    renderer, is listed exactly by the real router, with each preset's arguments, and runs."""
    target, draft = nix_string(tiny_sources["qwen38"]), nix_string(tiny_sources["dflash2Draft"])
    text = nix_eval(f"""{renderer()}.render ({{
        "*" = {{ ctx-size = 4096; flash-attn = "on"; min-p = 0.0000005; temp = 0.7; }};
    }} // {renderer()}.grid {{
        prefix = "tiny";
        base = {{ model = {target}; spec-type = "draft-simple"; spec-draft-model = {draft}; }};
        axes = [
          {{ f16 = {{ cache-type-k = "f16"; cache-type-v = "f16"; }};
             q8 = {{ cache-type-k = "q8_0"; cache-type-v = "q8_0"; }};
             q4 = {{ cache-type-k = "q4_0"; cache-type-v = "q4_0"; }}; }}
          {{ d1 = {{ spec-draft-n-max = 1; }}; d3 = {{ spec-draft-n-max = 3; }}; }}
        ];
    }})""")
    assert "min-p = 5e-07\n" in text and "temp = 0.7\n" in text  # type: ignore[operator]
    expected = presets_of(text)  # type: ignore[arg-type]
    names = {f"tiny-{kv}-{d}" for kv in ("f16", "q8", "q4") for d in ("d1", "d3")}
    assert set(expected) == names
    router = router_factory(text)
    listed = listed_models(router.url)
    assert set(listed) == names
    for preset, settings in expected.items():
        assert_args(preset, settings, listed[preset]["status"]["args"])
    entry = load(router.url, "tiny-q4-d3")
    assert entry["status"]["value"] == "loaded", f"tiny-q4-d3 did not load: {entry}\n{router.log()[-3000:]}"


def test_the_units_command_line_serves_exactly_the_presets(router_factory, tmp_path) -> None:
    """As services.llama-cpp runs it: `--models-dir` an empty directory (nixpkgs' module asserts
    `model` or `modelsDir`), `--sleep-idle-seconds`, LLAMA_CACHE in the state directory. The router
    lists the presets and nothing else, and a preset pinned to a Hugging Face revision
    (`model-url`) is listed with that URL without downloading anything."""
    empty, state = tmp_path / "empty-directory", tmp_path / "state"
    empty.mkdir()
    state.mkdir()
    url = "https://huggingface.co/owner/repo/resolve/0123456789abcdef0123456789abcdef01234567/m-Q4_K_M.gguf"
    text = (EXPECTED / "base.ini").read_text() + f"\n[pinned]\nmodel-url = {url}\n"
    router = router_factory(text, extra_args=["--models-dir", str(empty), "--sleep-idle-seconds", "300"],
                            env={"LLAMA_CACHE": str(state), "HOME": str(state)})
    listed = listed_models(router.url)
    assert set(listed) == set(presets_of(text)), set(listed) ^ set(presets_of(text))
    args = listed["pinned"]["status"]["args"]
    assert ("--model-url", url) in list(zip(args, args[1:])), args
    assert list(state.iterdir()) == []
