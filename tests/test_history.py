"""`llm-bench history` without a server: hand-built results files over time, judged step by step."""

from __future__ import annotations

import json
import tomllib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llm_bench.cli import main
from llm_bench.cli.exits import COULD_NOT_RUN, NEWEST_IS_REGRESSION
from llm_bench.history.command import prune, run_history, write_skip
from llm_bench.history.points import config_args, read_inputs
from llm_bench.history.steps import FIRST, REGRESSION, RIG_CHANGE, TWINS, history_of, judge
from llm_bench.report.verdict import FASTER, WITHIN_NOISE
from llm_bench.results import AliasRecord, ResultSet, RunRecord, write_toml

T0 = datetime(2026, 11, 1, 3, 0, tzinfo=timezone.utc)
FAST = [50.0, 50.4, 49.8, 50.2, 49.9, 50.1]
SLOW = [37.5, 37.9, 37.2, 37.6, 37.4, 37.8]  # 25 % slower: llama.cpp#24514's size
ARGS = ["/nix/store/x-llama-cpp-7123/bin/llama-server", "--port", "41001", "--host", "127.0.0.1",
        "-m", "/models/smol.gguf", "-c", "2048", "-t", "2"]


def write_result(folder: Path, n: int, decode: list[float], package: str = "/nix/store/aaaa-llama-cpp-7123",
                 version: str = "7123", power_limit_w: float = 350.0, protocol: dict | None = None,
                 args: list[str] | None = None, alias: str = "smol", used_mib: float = 300.0,
                 ttft: float = 120.0, driver: str = "580.95.05", label: str = "watch",
                 specialisation: str = "base") -> Path:
    meta: dict[str, Any] = {
        "format": "llm-bench/1", "started_at": (T0 + timedelta(days=n)).isoformat(timespec="seconds"),
        "label": label, "complete": True,
        "protocol": protocol or {"max_tokens": 64, "runs": 6, "prompt_name": "code"},
        "fingerprint": {
            "build": {"system": f"/nix/store/sys{n}-nixos-system", "nixos_version": "25.05",
                      "nixpkgs_revision": f"{n:02d}" + "ab" * 19, "configuration_revision": "not available: unset",
                      "specialisation": specialisation, "package_name": "llama-cpp", "package_version": version,
                      "package_path": package, "package_rev": "not available: null", "server_build": f"b{version}"},
            "rig": {"driver": driver, "cpu_governor": "performance",
                    "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 3090", "power_limit_enforced_w": power_limit_w,
                              "power_limit_default_w": 350.0, "pcie_gen": 4, "pcie_width": 16, "pcie_gen_max": 4,
                              "pcie_width_max": 16, "persistence_mode": "enabled", "memory_used_mib": used_mib}]},
        },
    }
    record = AliasRecord(alias, target=label, preset_args=args or ARGS,
                         runs=[RunRecord(decode_tps=d, ttft_ms=ttft + i) for i, d in enumerate(decode)])
    path = folder / f"llm-bench-{n:02d}.toml"
    write_toml(path, ResultSet(meta, [record]).to_toml())
    return path


def steps_of(folder: Path) -> list:
    return run_history([folder]).history.steps


def test_a_slower_build_is_one_regression_named_by_both_builds(tmp_path: Path) -> None:
    write_result(tmp_path, 1, FAST)
    write_result(tmp_path, 2, FAST)  # the same build again
    write_result(tmp_path, 3, SLOW, package="/nix/store/bbbb-llama-cpp-7130", version="7130")
    steps = steps_of(tmp_path)
    assert [s.kind for s in steps] == [FIRST, TWINS, REGRESSION]
    regression = steps[-1]
    assert regression.decode is not None and regression.decode.high is not None and regression.decode.high < 0.8
    text = regression.describe()
    assert "llama.cpp 7123 (/nix/store/aaaa-llama-cpp-7123, nixpkgs 02ababababab)" in text
    assert "llama.cpp 7130 (/nix/store/bbbb-llama-cpp-7130, nixpkgs 03ababababab)" in text
    assert twins_within_noise(steps[1])


def twins_within_noise(step) -> bool:
    return step.kind == TWINS and step.decode.kind == WITHIN_NOISE


def test_twins_are_never_a_regression_even_when_their_runs_differ(tmp_path: Path) -> None:
    write_result(tmp_path, 1, FAST)
    write_result(tmp_path, 2, SLOW)  # same build, slower: the noise (or the machine), not a regression
    step = steps_of(tmp_path)[-1]
    assert step.kind == TWINS and step.decode.kind != WITHIN_NOISE


def test_a_faster_build_and_one_within_noise(tmp_path: Path) -> None:
    write_result(tmp_path, 1, SLOW)
    write_result(tmp_path, 2, FAST, package="/nix/store/bbbb-llama-cpp-7130", version="7130")
    write_result(tmp_path, 3, [v * 1.003 for v in FAST], package="/nix/store/cccc-llama-cpp-7140", version="7140")
    assert [s.kind for s in steps_of(tmp_path)] == [FIRST, FASTER, WITHIN_NOISE]


@pytest.mark.parametrize(("change", "named"), [
    ({"power_limit_w": 270.0}, "GPU0 power limit 350 W -> 270 W"),
    ({"used_mib": 20000.0}, "GPU0 memory before the load free -> busy"),
    ({"driver": "590.44.01"}, "driver 580.95.05 -> 590.44.01"),
])
def test_a_rig_change_on_the_same_build_is_not_blamed_on_it(tmp_path: Path, change: dict, named: str) -> None:
    write_result(tmp_path, 1, FAST)
    write_result(tmp_path, 2, SLOW, **change)
    step = steps_of(tmp_path)[-1]
    assert step.kind == RIG_CHANGE and step.rig == (named,) and step.rig_note == f"rig: {named}"
    assert CliRunner().invoke(main, ["history", str(tmp_path)]).exit_code == 0


@pytest.mark.parametrize(("change", "named"), [
    ({"driver": "590.44.01"}, "driver 580.95.05 -> 590.44.01"),
    ({"power_limit_w": 270.0}, "GPU0 power limit 350 W -> 270 W"),
])
def test_a_slower_new_build_is_a_regression_whatever_changed_with_it(tmp_path: Path, change: dict,
                                                                     named: str) -> None:
    """A nixos-rebuild after nix flake update moves llama.cpp and the driver together: it must alert, and
    say what else changed, as a co-suspect."""
    write_result(tmp_path, 1, FAST)
    write_result(tmp_path, 2, SLOW, package="/nix/store/bbbb-llama-cpp-7130", version="7130", **change)
    step = steps_of(tmp_path)[-1]
    assert step.kind == REGRESSION and step.rig == (named,)
    assert step.describe().endswith(f"; co-suspects, changed with the build: {named}")
    out = CliRunner().invoke(main, ["history", str(tmp_path)])
    assert out.exit_code == NEWEST_IS_REGRESSION, out.output
    assert f"changed with the build (co-suspects): {named}" in out.output  # the table's note
    assert f"co-suspects, changed with the build: {named}" in out.output  # the line under it and the error


def test_a_faster_new_build_with_a_rig_change_is_faster_and_names_what_changed_with_it(tmp_path: Path) -> None:
    write_result(tmp_path, 1, SLOW)
    write_result(tmp_path, 2, FAST, package="/nix/store/bbbb-llama-cpp-7130", version="7130", driver="590.44.01")
    step = steps_of(tmp_path)[-1]
    assert step.kind == FASTER and step.rig_note == "changed with the build (co-suspects): driver 580.95.05 -> 590.44.01"


def test_the_label_is_shown_and_never_a_reason_to_stop_comparing(tmp_path: Path) -> None:
    """Runs of one preset labelled a1, a2 and b (b on a build 0.75x as fast) are one series, as with one label."""
    write_result(tmp_path, 1, FAST, label="a1")
    write_result(tmp_path, 2, FAST, label="a2")
    write_result(tmp_path, 3, SLOW, package="/nix/store/bbbb-llama-cpp-7130", version="7130", label="b")
    history = run_history([tmp_path]).history
    assert [s.kind for s in history.steps] == [FIRST, TWINS, REGRESSION] and not history.refusals
    assert [s.point.name for s in history.steps] == ["a1 / smol on base", "a2 / smol on base", "b / smol on base"]
    out = CliRunner().invoke(main, ["history", str(tmp_path), "--format", "json"])
    assert out.exit_code == NEWEST_IS_REGRESSION, out.output
    rows = json.loads(out.output[:out.output.rindex("}") + 1])["history"]
    assert [r["label"] for r in rows] == ["a1", "a2", "b"] and {r["series"] for r in rows} == {"smol on base"}


def test_each_specialisation_is_its_own_series(tmp_path: Path) -> None:
    """Two engines of one box (the marker's specialisation) are two configurations, labelled alike or not."""
    write_result(tmp_path, 1, FAST)
    write_result(tmp_path, 2, SLOW, package="/nix/store/bbbb-llamampere-7130", version="7130",
                 specialisation="llm-llamampere")
    history = run_history([tmp_path]).history
    assert [s.kind for s in history.steps] == [FIRST, FIRST] and not history.refusals
    assert [s.point.configuration for s in history.steps] == ["smol on base", "smol on llm-llamampere"]


def test_two_builds_of_one_version_with_different_store_paths_are_two_builds(tmp_path: Path) -> None:
    """stock and fa86: one llama.cpp version and server build string, two store paths (other patches, flags)."""
    write_result(tmp_path, 1, FAST, package="/nix/store/aaaa-llama-cpp-7123")
    write_result(tmp_path, 2, SLOW, package="/nix/store/ffff-llama-cpp-fa86-7123")
    step = steps_of(tmp_path)[-1]
    assert step.kind == REGRESSION
    assert "/nix/store/aaaa-llama-cpp-7123" in step.describe() and "/nix/store/ffff-llama-cpp-fa86-7123" in step.describe()


def test_a_protocol_or_model_change_is_refused_with_its_reason(tmp_path: Path) -> None:
    write_result(tmp_path, 1, FAST)
    write_result(tmp_path, 2, SLOW, package="/nix/store/bbbb-x", protocol={"max_tokens": 32, "runs": 6,
                                                                            "prompt_name": "code"})
    write_result(tmp_path, 3, SLOW, package="/nix/store/cccc-x", args=[*ARGS[:5], "-m", "/models/other.gguf",
                                                                       "-c", "2048", "-t", "2"])
    history = run_history([tmp_path]).history
    assert all(s.kind == FIRST for s in history.steps) and len(history.steps) == 3
    reasons = [r.reason for r in history.refusals]
    assert reasons[0] == "the protocol differs (max_tokens 64 vs 32)"
    assert reasons[1].startswith("the model differs (/models/smol.gguf (size unknown) vs /models/other.gguf")


def test_the_binary_port_and_host_are_not_the_configuration() -> None:
    assert config_args(["/a/bin/llama-server", "--port", "1", "--host=0.0.0.0", "-m", "m.gguf", "-t", "2"]) == \
        ("-m", "m.gguf", "-t", "2")


def test_judge_both_ways_on_the_same_pair(tmp_path: Path) -> None:
    """The regression decision itself: slower beyond noise on a new build is one; the reverse is faster."""
    a = write_result(tmp_path, 1, FAST)
    b = write_result(tmp_path, 2, SLOW, package="/nix/store/bbbb-x")
    first, second = read_inputs([a, b]).points
    assert judge(first, second).kind == REGRESSION
    assert judge(second, first).kind == FASTER
    # a 1 % slowdown with tight runs: the interval may exclude 1, but below the smallest effect it is noise
    c = write_result(tmp_path, 3, [v * 0.99 for v in FAST], package="/nix/store/cccc-x")
    assert judge(first, read_inputs([c]).points[0]).kind == WITHIN_NOISE


def test_history_of_orders_by_time_not_by_file_name(tmp_path: Path) -> None:
    late = write_result(tmp_path, 5, SLOW, package="/nix/store/bbbb-x")
    early = write_result(tmp_path, 1, FAST)
    points = read_inputs([late, early]).points
    assert [s.kind for s in history_of(points).steps] == [FIRST, REGRESSION]


def test_files_of_one_second_are_judged_and_kept_in_the_order_they_were_made(tmp_path: Path) -> None:
    """reserve_path's second file of a second, STEM-2.toml, is the newer one, though by name it sorts first."""
    stem = tmp_path / "llm-bench-20261102-030000-watch"
    write_result(tmp_path, 1, FAST).rename(f"{stem}.toml")
    write_result(tmp_path, 1, SLOW, package="/nix/store/bbbb-x").rename(f"{stem}-2.toml")
    skips = tmp_path / "llm-bench-20261102-030000-skip-smol"
    for reason, name in (("older", f"{skips}.toml"), ("newer", f"{skips}-2.toml")):
        skip = write_skip(tmp_path, "smol", reason)
        data = tomllib.loads(skip.read_text())
        data["meta"]["started_at"] = "2026-11-02T03:00:00+00:00"
        write_toml(Path(name), data)
        skip.unlink()
    outcome = run_history([tmp_path])
    assert [s.kind for s in outcome.history.steps] == [FIRST, REGRESSION]
    assert outcome.history.steps[-1].point.path.name == f"{stem.name}-2.toml"
    assert sorted(p.name for p in prune(outcome, [tmp_path], keep=1)) == [f"{skips.name}.toml", f"{stem.name}.toml"]


def test_cli_exit_code_when_the_newest_step_is_a_regression(tmp_path: Path) -> None:
    write_result(tmp_path, 1, FAST)
    write_result(tmp_path, 2, SLOW, package="/nix/store/bbbb-llama-cpp-7130", version="7130")
    out = CliRunner().invoke(main, ["history", str(tmp_path), "--chart", str(tmp_path / "h.png"),
                                    "--html", str(tmp_path / "h.html")])
    assert out.exit_code == NEWEST_IS_REGRESSION, out.output
    assert "| REGRESSION |" in out.output
    assert (tmp_path / "h.png").stat().st_size > 0
    assert "regression" in (tmp_path / "h.html").read_text()
    # a twin after it: the newest step is no longer a regression, and the regression is still listed once
    write_result(tmp_path, 3, SLOW, package="/nix/store/bbbb-llama-cpp-7130", version="7130")
    out = CliRunner().invoke(main, ["history", str(tmp_path), "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [r["step"] for r in data["history"]] == [FIRST, REGRESSION, TWINS]
    assert len(data["regressions"]) == 1 and data["regressions"][0]["newest"] is False
    csv = CliRunner().invoke(main, ["history", str(tmp_path), "--format", "csv"]).output
    assert csv.splitlines()[0].startswith("configuration,model,series,label,specialisation,started_at,file,build")
    assert len(csv.splitlines()) == 4


def test_unreadable_input_is_exit_2_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    write_result(tmp_path, 1, FAST)
    (tmp_path / "broken.toml").write_text("meta = [")
    out = CliRunner().invoke(main, ["history", str(tmp_path)])
    assert out.exit_code == COULD_NOT_RUN
    assert "broken.toml is not valid TOML" in out.output and "move it out of the folder" in out.output
    assert "Traceback" not in out.output
    missing = CliRunner().invoke(main, ["history", str(tmp_path / "nope")])
    assert missing.exit_code == COULD_NOT_RUN and "no such file or folder" in missing.output


def test_keep_the_newest_n_per_configuration_and_skip_records(tmp_path: Path) -> None:
    for n in range(1, 5):
        write_result(tmp_path, n, FAST)
    write_result(tmp_path, 9, FAST, alias="other")
    out = CliRunner().invoke(main, ["history", str(tmp_path), "--skipped", "GPU memory busy: 20000 MiB > 2048 MiB",
                                    "--alias", "smol"])
    assert out.exit_code == 0, out.output
    outcome = run_history([tmp_path])
    assert [s.reason for s in outcome.inputs.skips] == ["GPU memory busy: 20000 MiB > 2048 MiB"]
    assert "fingerprint" in (next(tmp_path.glob("*skip-smol*.toml"))).read_text()
    removed = prune(outcome, [tmp_path], keep=2)
    assert sorted(p.name for p in removed) == ["llm-bench-01.toml", "llm-bench-02.toml"]
    listed = CliRunner().invoke(main, ["history", str(tmp_path)]).output
    assert "skipped" in listed and "GPU memory busy" in listed
