"""llm-bench tune, the parts that measure nothing: the grid, the plan, the Nix snippet, the Pareto front, and
freeing and restoring a real router guarded by an API key."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_bench.plan import PlanError, Protocol
from llm_bench.results import ResultSet, ResultsWriter
from llm_bench.testbed.presets import PresetError, render_presets_ini
from llm_bench.tune.adopt import nix_snippet, remeasure_command
from llm_bench.tune.grid import expand, parse_axis
from llm_bench.tune.plan import TunePlan, tune_plan_from_mapping, with_flags
from llm_bench.tune.report import pareto_front
from llm_bench.tune.search import previous_result
from llm_bench.tune.serve import ServeError, free_main, load_errors, render_ini, restore_main

SPEC = [{"name": "none", "spec-type": "none"},
        {"name": "self", "spec-type": "draft-simple", "model-draft": "/m/small.gguf"},
        {"name": "ngram", "spec-type": "ngram-simple"}]


def test_grid_control_first_depths_dropped_without_a_drafter() -> None:
    axes = [parse_axis("spec", SPEC), parse_axis("spec-draft-n-max", [2, 4]),
            parse_axis("cache-type-k+cache-type-v", ["f16", "q8_0", "q4_0"])]
    candidates = expand("s", {"model": "/m/small.gguf", "ctx-size": 2048}, axes)
    names = [c.name for c in candidates]
    # 3 KV x (1 without drafting + 2 drafters x 2 depths) = 15: a depth without a drafter is one preset.
    assert len(names) == 15 and len(set(names)) == 15
    assert names[0] == "s-none-f16"
    assert candidates[0].preset == {"model": "/m/small.gguf", "ctx-size": 2048, "spec-type": "none",
                                    "cache-type-k": "f16", "cache-type-v": "f16"}
    assert "s-self-4-q8_0" in names and "s-none-2-f16" not in names
    assert candidates[names.index("s-self-4-q8_0")].preset["spec-draft-n-max"] == 4


@pytest.mark.parametrize("values,message", [
    ([], "non-empty list"),
    (["a\nb"], "line break"),
    ([{"name": "x"}], "at least one llama-server key"),
    ([{"--ctx-size": 1}], "not a llama-server key"),
    ([[1, 2]], "string, number or boolean"),
])
def test_bad_axes_are_refused_with_the_reason(values, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_axis("ctx-size", values)


def test_plan_file_and_flags() -> None:
    plan = tune_plan_from_mapping({
        "name": "t", "base": {"model": "/m.gguf"}, "axes": {"spec": SPEC[:2]},
        "budget": {"max_rounds": 2}, "quality": {"min_agreement": 0.5}, "protocol": {"runs": 2},
        "main_url": "",
    }, relative_to=Path("/plans"))
    assert plan.main_url is None and plan.output_dir == Path("/plans/tune-results")
    assert plan.budget.max_rounds == 2 and plan.quality.min_agreement == 0.5 and plan.protocol.runs == 2
    plan = with_flags(plan, sets=("ctx-size=4096", "flash-attn=on"), axes=("spec-draft-n-max=2,3",))
    assert plan.base == {"model": "/m.gguf", "ctx-size": 4096, "flash-attn": "on"}
    assert [c.name for c in plan.candidates()] == ["t-none", "t-self-2", "t-self-3"]
    with pytest.raises(PlanError, match="unknown key"):
        tune_plan_from_mapping({"axis": {}})
    with pytest.raises(PlanError, match="min_agreement must be at least 0.0, at most 1.0, not 2"):
        tune_plan_from_mapping({"quality": {"min_agreement": 2}})
    with pytest.raises(PlanError, match="accept must be one of 'lossless', 'near-lossless', 'any', 'off', not 'lossy'"):
        tune_plan_from_mapping({"quality": {"accept": "lossy"}})
    with pytest.raises(PlanError, match="no base preset"):
        TunePlan(axes=(parse_axis("x", [1]),)).candidates()
    with pytest.raises(PlanError, match="KEY=VALUE"):
        with_flags(TunePlan(), sets=("ctx-size",))


def test_ini_has_no_version_line_and_refuses_what_it_cannot_hold() -> None:
    text = render_ini({"a": {"model": "/m.gguf", "flash-attn": True, "spec-draft-n-max": 2}})
    assert text == "[a]\nmodel = /m.gguf\nflash-attn = true\nspec-draft-n-max = 2\n"
    with pytest.raises(ServeError, match="';' or '#'"):
        render_ini({"a": {"model": "/m;x.gguf"}})


def test_the_one_presets_renderer_puts_star_first_and_refuses_what_breaks_the_ini() -> None:
    text = render_presets_ini({"b": {"model": "/b.gguf"}, "*": {"ctx-size": 512}, "a": {"flash-attn": False}})
    assert text == "[*]\nctx-size = 512\n\n[b]\nmodel = /b.gguf\n\n[a]\nflash-attn = false\n"
    assert "version" not in text
    for bad in ({"a": {"model": "/m#x.gguf"}}, {"a": {"model": "/m\nx"}}, {"a]": {}}, {" a": {}}, {"": {}},
                {"a": {"k=v": 1}}, {"a": {"x": None}}):
        with pytest.raises(PresetError):
            render_presets_ini(bad)  # type: ignore[arg-type]


def test_a_keyed_main_router_is_freed_and_restored_with_its_key(router_factory, tiny_models) -> None:
    from llm_bench.engines.client import RouterClient

    router = router_factory(render_presets_ini({"m": {"model": str(tiny_models["target"]), "ctx-size": 512}}),
                            extra_args=["--api-key", "s3cret"])
    with RouterClient(router.url, api_key="s3cret", timeout=30.0) as client:
        client.load("m")
        client.wait_for_status("m", "loaded", 120)
        messages: list[str] = []
        main = free_main(router.url, messages.append, api_key="s3cret")
        assert main.unloaded == ["m"] and client.model("m").status == "unloaded"
        restore_main(main, messages.append, timeout=120, api_key="s3cret")
        assert client.model("m").status == "loaded"
        assert not any("s3cret" in m for m in messages)
        # Without the key the router still answers (401): freeing it fails loudly instead of
        # reporting "nothing to free" and measuring beside a loaded model.
        with pytest.raises(ServeError, match="could not free the GPU"):
            free_main(router.url, messages.append)
        assert not any("does not answer" in m for m in messages)
        assert client.model("m").status == "loaded"


def test_a_server_error_after_measurements_are_on_disk_is_aborted_naming_the_file(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from llm_bench.cli.tune import tune
    from llm_bench.engines.errors import ServerError
    from llm_bench.tune import search
    from llm_bench.tune.serve import Served

    class Stub:
        def __init__(self, *_args, **_kwargs) -> None:
            self.entries = [None]
            self.control = None

        def screen(self) -> None:
            raise ServerError("the router said 500")

        def close(self) -> None:
            pass

    class Probe:
        def server_build(self):
            return None

        def close(self) -> None:
            pass

    monkeypatch.setattr(search, "Tuner", Stub)
    monkeypatch.setattr(search, "open_engine", lambda *a, **k: Probe())
    monkeypatch.setattr(search, "new_meta", lambda *a, **k: {"tune": {}})
    monkeypatch.setattr(search, "entries_from", lambda *a, **k: [])
    monkeypatch.setattr(search, "cost_text", lambda *a, **k: "")
    monkeypatch.setattr(search, "fingerprint", lambda *a, **k: "x")

    class Gpus:
        def __enter__(self):
            return self

        def __exit__(self, *_exc) -> None:
            pass

    real_writer = search.ResultsWriter

    def writer(*args, **kwargs):
        made = real_writer(*args, **kwargs)
        made.flush()  # as after a measured alias
        return made

    monkeypatch.setattr(search, "ResultsWriter", writer)
    plan = TunePlan(output_dir=tmp_path)
    plan = with_flags(plan, sets=("model=/m.gguf",), url="http://127.0.0.1:9", presets=("a", "b"))
    with pytest.raises(search.RunAborted, match=r"kept in .*tune") as caught:
        search.run_search(plan, Served("http://127.0.0.1:9"), lambda _: None, Gpus())
    assert Path(str(caught.value).split("kept in ")[1].split(":")[0]).exists()

    import sys

    cli_tune = sys.modules["llm_bench.cli.tune"]  # the package's attribute of that name is the command

    def aborted(*_a, **_k):
        raise search.RunAborted("the tune stopped partway: x; what was measured is kept in /r.toml")

    monkeypatch.setattr(cli_tune, "run_tune", aborted)
    result = CliRunner().invoke(tune, ["--url", "http://127.0.0.1:9", "--preset", "a,b"])
    assert result.exit_code == 3 and "/r.toml" in result.output


def test_load_errors_are_the_instance_error_lines() -> None:
    log = ("[38397] 0.00.197.183 E llama_init_from_model: quantized V cache requires flash_attn to be enabled\n"
           "0.31.014.618 I srv          load:   --flash-attn\n"
           "[38397] 0.00.370.658 E llama_init_from_model: quantized V cache requires flash_attn to be enabled\n")
    assert load_errors(log) == ["llama_init_from_model: quantized V cache requires flash_attn to be enabled"]


def test_nix_snippet_quotes_what_nix_needs() -> None:
    text = nix_snippet({"sm-self-2": {"model": "/srv/${x}.gguf", "ctx-size": 2048, "min-p": 5e-07, "b": False}},
                       {"sm-self-2": "winner"})
    assert text == ('# winner\nservices.llama-cpp.presets."sm-self-2" = {\n  model = "/srv/\\${x}.gguf";\n'
                    '  ctx-size = 2048;\n  min-p = 5e-07;\n  b = false;\n};\n')
    command = remeasure_command("w", "c", Protocol(runs=5, max_tokens=256), "http://h:1")
    assert command == "llm-bench run --url http://h:1 --alias w --alias c --runs 5 --max-tokens 256 --label after-tune"


def test_pareto_front() -> None:
    # (quality, speed): the fast-but-different point and the exact-but-slow one are both on the front.
    points = [(1.0, 10.0), (1.0, 12.0), (0.5, 20.0), (0.4, 15.0), (0.9, 12.0)]
    assert pareto_front(points) == [2, 1]


def test_a_router_left_by_a_killed_tune_is_stopped_and_nothing_else(tmp_path) -> None:
    import subprocess
    import sys

    from llm_bench.support.poll import poll_until
    from llm_bench.tune.serve import stop_leftover

    ini = tmp_path / "tune-presets.ini"
    ini.write_text("")
    pid_file = tmp_path / "tune-router.pid"
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    other = subprocess.Popen([*argv, "elsewhere.ini"], start_new_session=True)
    left = subprocess.Popen([*argv, str(ini)], start_new_session=True)

    def executed(proc) -> bool | None:  # /proc shows the new command line only once exec has happened
        return "time.sleep" in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace") or None

    try:
        assert poll_until(lambda: executed(other) and executed(left), timeout=10, interval=0.02)
        pid_file.write_text(str(other.pid))
        stop_leftover(pid_file, ini, lambda _: None)
        assert other.poll() is None  # a reused pid that is not ours is left alone
        pid_file.write_text(str(left.pid))
        messages: list[str] = []
        stop_leftover(pid_file, ini, messages.append)
        assert left.wait(5) is not None and "earlier, killed tune" in messages[0]
    finally:
        for p in (other, left):
            p.kill()
            p.wait()


def test_the_api_key_flags_reach_the_tune(tmp_path, monkeypatch) -> None:
    import sys

    from click.testing import CliRunner

    from llm_bench.cli.tune import tune

    cli_tune = sys.modules["llm_bench.cli.tune"]
    seen: dict = {}

    def fake_run_tune(plan, log, fresh=False, api_key=None):
        seen["key"] = api_key
        raise cli_tune.PlanError("stop here")

    monkeypatch.setattr(cli_tune, "run_tune", fake_run_tune)
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    args = ["--url", "http://127.0.0.1:9", "--preset", "a,b"]
    result = CliRunner().invoke(tune, [*args, "--api-key-file", str(key_file)])
    assert result.exit_code == 2 and seen["key"] == "from-file"
    monkeypatch.setenv("TUNE_TEST_KEY", "from-env")
    CliRunner().invoke(tune, [*args, "--api-key-env", "TUNE_TEST_KEY"])
    assert seen["key"] == "from-env"
    monkeypatch.delenv("TUNE_TEST_KEY")
    seen.clear()
    result = CliRunner().invoke(tune, [*args, "--api-key-env", "TUNE_TEST_KEY"])
    assert result.exit_code == 2 and "key" not in seen  # a key that cannot be read: could not run


def test_tune_resumes_from_the_newest_of_two_files_made_in_one_second(tmp_path):
    stem = "llm-bench-20260102-030405-tune-qwen"
    for label in ("older", "newer"):
        ResultsWriter(tmp_path, ResultSet({"format": "llm-bench/1", "label": label, "tune": {"fingerprint": "f"}}),
                      stem)
    resumed = previous_result(tmp_path, "f")
    assert resumed is not None and resumed.meta["label"] == "newer"
    assert resumed.meta["tune"]["resumed_from"] == str(tmp_path / f"{stem}-2.toml")
