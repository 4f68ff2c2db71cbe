"""The GPU hand-over between the router and another engine (llm_bench.engines.switch).

A real llama-server router stands in for llama-cpp.service and a second real llama-server,
started in the background by an "up" command the way `docker compose up -d` starts
HyperQwen, stands in for HyperQwen. What llama-server cannot do (answer /health while every
completion still fails) is served by a small local HTTP server speaking the OpenAI wire
format.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import httpx
import pytest

from llm_bench.cli.engine import key_from_env_file, read_api_key
from llm_bench.engines.client import RouterClient
from llm_bench.engines.errors import RequestRefused
from llm_bench.engines.switch import (
    EngineSide,
    RouterSide,
    SwitchError,
    bring_up,
    compose_command,
    free_gpu,
    hyperqwen_engine,
    restore_router,
    router_answers,
    tear_down,
    wait_until_serving,
)
from llm_bench.testbed.presets import render_presets_ini
from llm_bench.testbed.router import free_port
from tests.commands import invoke
from tests.fake_vllm import FakeVllm, FakeVllmConfig

# One helper script for every stand-in: start/stop a background llama-server with a pid file, stopped as the
# sweep's switch command stops its router.
SWITCHBED = Path(__file__).parent / "switchbed"
HELPER = r'''
import subprocess, sys
from pathlib import Path

sys.path.insert(0, SWITCHBED)
from switch import stop_group

def stop(pidfile):
    p = Path(pidfile)
    if not p.exists():
        return
    stop_group(int(p.read_text()), grace_s=15.0)
    p.unlink()

action = sys.argv[1]
if action == "engine-up":  # binary model port pidfile log: returns at once, like `up -d`
    binary, model, port, pidfile, log = sys.argv[2:7]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [binary, "-m", model, "--host", "127.0.0.1", "--port", port, "--alias", "fake-hyperqwen",
             "-c", "512", "--no-webui"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    Path(pidfile).write_text(str(proc.pid))
elif action == "router-start":  # binary ini port pidfile log
    from llm_bench.testbed.router import start_router
    binary, ini, port, pidfile, log = sys.argv[2:7]
    router = start_router(Path(binary), Path(ini), log_path=Path(log), port=int(port))
    Path(pidfile).write_text(str(router.process.pid))
elif action == "stop":
    stop(sys.argv[2])
'''


def model_statuses(url: str, api_key: str | None = None) -> dict[str, str]:
    return {m.id: m.status for m in RouterClient(url, api_key=api_key).models()}


class Bed:
    """Commands for the stand-ins, and the files they leave."""

    def __init__(self, tmp_path: Path, binary: Path, target: Path):
        self.dir = tmp_path
        self.binary = binary
        self.target = target
        self.helper = tmp_path / "helper.py"
        self.helper.write_text(f"SWITCHBED = {str(SWITCHBED)!r}\n" + HELPER)
        self.engine_port = free_port()
        self.engine_url = f"http://127.0.0.1:{self.engine_port}"
        self.engine_pid = tmp_path / "engine.pid"
        self.ini = tmp_path / "presets.ini"
        self.ini.write_text(render_presets_ini({"*": {"ctx-size": 512}, "tiny": {"model": str(target)}}))

    def py(self, *args: object) -> str:
        return shlex.join([sys.executable, str(self.helper), *map(str, args)])

    @property
    def engine_up(self) -> str:
        return self.py("engine-up", self.binary, self.target, self.engine_port, self.engine_pid,
                       self.dir / "engine.log")

    @property
    def engine_down(self) -> str:
        return self.py("stop", self.engine_pid)

    def engine(self, **kwargs) -> EngineSide:
        settings = dict(name="fake HyperQwen", url=self.engine_url, up_command=self.engine_up,
                        down_command=self.engine_down, ready_timeout_s=60.0, poll_s=0.2,
                        request_timeout_s=30.0)
        settings.update(kwargs)
        return EngineSide(**settings)

    def router_service(self, port: int) -> tuple[str, str]:
        """start and stop commands of a router 'service' on a fixed port."""
        pid = self.dir / "router.pid"
        return (self.py("router-start", self.binary, self.ini, port, pid, self.dir / "router.log"),
                self.py("stop", pid))


@pytest.fixture
def bed(tmp_path, llama_server_bin, tiny_models):
    bed = Bed(tmp_path, llama_server_bin, tiny_models["target"])
    yield bed
    # Whatever a failing test left running.
    import subprocess
    subprocess.run(bed.engine_down, shell=True)
    subprocess.run(bed.py("stop", tmp_path / "router.pid"), shell=True)


def test_default_compose_commands() -> None:
    assert compose_command("up") == (
        "docker compose --env-file .env -f docker-compose.yml -f docker-compose.override.yml --profile single up -d"
    )
    assert compose_command("down") == (
        "docker compose --env-file .env -f docker-compose.yml -f docker-compose.override.yml --profile single down"
    )
    engine = hyperqwen_engine(Path("/srv/HyperQwen"), env_file=None, override="/etc/llm-bench/cdi.yml",
                              profile="batch")
    assert engine.up_command == ("docker compose -f docker-compose.yml -f /etc/llm-bench/cdi.yml "
                                 "--profile batch up -d")
    assert engine.workdir == Path("/srv/HyperQwen")
    assert engine.url == "http://127.0.0.1:18020" and engine.model == "qwen3.8-27b"


def test_up_unloads_the_router_and_waits_for_a_real_completion(bed, router_factory) -> None:
    router = router_factory(bed.ini)
    client = RouterClient(router.url)
    client.load("tiny")
    client.wait_for_status("tiny", "loaded", 60)
    messages: list[str] = []

    result = bring_up(bed.engine(), RouterSide(url=router.url, mode="unload"), messages.append)

    assert result.router.unloaded == ["tiny"]
    assert model_statuses(router.url) == {"tiny": "unloaded"}
    assert result.model == "fake-hyperqwen"  # from GET /v1/models
    assert (result.probe.output_tokens or 0) > 0 and result.probe.token_chunks > 0
    # The engine serves now; a second completion works too.
    with httpx.Client(base_url=bed.engine_url, timeout=30) as http:
        r = http.post("/v1/chat/completions", json={
            "model": "fake-hyperqwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
    assert any("unloading tiny" in m for m in messages)

    tear_down(bed.engine(), RouterSide(url=router.url, mode="unload"), result.router, messages.append)
    assert not bed.engine_pid.exists()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{bed.engine_url}/health", timeout=2)
    assert router_answers(router.url)


def test_service_mode_stops_the_router_and_starts_it_again(bed) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    start, stop = bed.router_service(port)
    side = RouterSide(url=url, mode="service", stop_command=stop, start_command=start, ready_timeout_s=60)
    import subprocess
    subprocess.run(start, shell=True, check=True)
    assert router_answers(url)

    result = bring_up(bed.engine(), side)
    assert result.router.stopped and result.router.was_running
    assert not router_answers(url, timeout=2)  # the "service" is stopped while the engine runs

    tear_down(bed.engine(), side, result.router)
    assert router_answers(url)
    assert model_statuses(url) == {"tiny": "unloaded"}
    assert not bed.engine_pid.exists()


def test_failed_start_restores_the_router_and_stops_the_engine(bed) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    start, stop = bed.router_service(port)
    side = RouterSide(url=url, mode="service", stop_command=stop, start_command=start, ready_timeout_s=60)
    import subprocess
    subprocess.run(start, shell=True, check=True)
    marker = bed.dir / "down-ran"

    engine = bed.engine(up_command="echo 'no such image: ghcr.io/x' >&2; exit 3",
                        down_command=f"touch {shlex.quote(str(marker))}")
    with pytest.raises(SwitchError) as info:
        bring_up(engine, side)
    message = str(info.value)
    assert "exited with code 3" in message and "no such image" in message
    assert "the router was restored" in message
    assert marker.exists()
    assert router_answers(url)


def test_engine_that_never_serves_times_out_clearly(bed, router_factory) -> None:
    router = router_factory(bed.ini)
    marker = bed.dir / "down-ran"
    engine = bed.engine(up_command="true", down_command=f"touch {shlex.quote(str(marker))}", ready_timeout_s=1.5,
                        model="qwen3.8-27b")
    with pytest.raises(SwitchError) as info:
        bring_up(engine, RouterSide(url=router.url, mode="unload"))
    message = str(info.value)
    assert f"at {bed.engine_url} did not serve a completion within 1.5 s" in message
    assert "cannot connect" in message  # the last error, in the server's (here: transport's) words
    assert marker.exists() and "the router was restored" in message
    assert router_answers(router.url)


def test_health_is_not_readiness() -> None:
    with FakeVllm(FakeVllmConfig(model="qwen3.8-27b", fail_requests=3)) as fake:
        assert httpx.get(f"{fake.url}/health").status_code == 200
        fake.state.health_calls = 0
        engine = EngineSide(url=fake.url, up_command="true", down_command="true", model=None,
                            ready_timeout_s=30, poll_s=0.05, api_key="sk-secret-not-logged")
        messages: list[str] = []
        model, probe, _ = wait_until_serving(engine, messages.append)
    assert model == "qwen3.8-27b"
    assert fake.state.chat_calls == 3 + 1
    assert fake.state.health_calls == 0
    assert probe.output_tokens == engine.probe_max_tokens
    assert any("EngineDeadError" in m for m in messages)
    assert not any("sk-secret" in m for m in messages)
    assert "sk-secret" not in repr(engine)


def test_timeout_names_the_engines_last_error() -> None:
    with FakeVllm(FakeVllmConfig(model="qwen3.8-27b", fail_requests=10**6)) as fake:
        engine = EngineSide(url=fake.url, up_command="true", down_command="true", model="qwen3.8-27b",
                            ready_timeout_s=0.5, poll_s=0.1, name="HyperQwen")
        with pytest.raises(SwitchError, match=r"HyperQwen at .* did not serve a completion within 0.5 s .*"
                                              r"EngineDeadError: engine core is still compiling"):
            wait_until_serving(engine)



def test_cli_up_and_down(bed, router_factory) -> None:
    router = router_factory(bed.ini)
    common = ["--dir", str(bed.dir), "--up-command", bed.engine_up, "--down-command", bed.engine_down,
              "--url", bed.engine_url, "--model", "", "--router-url", router.url, "--ready-timeout", "60"]
    RouterClient(router.url).load("tiny")
    RouterClient(router.url).wait_for_status("tiny", "loaded", 60)

    result = invoke("engine", "hyperqwen", "up", *common)
    assert result.exit_code == 0, result.output
    assert "HyperQwen is serving 'fake-hyperqwen'" in result.output
    assert "router models unloaded: tiny" in result.output
    assert model_statuses(router.url) == {"tiny": "unloaded"}

    result = invoke("engine", "hyperqwen", "down", *common)
    assert result.exit_code == 0, result.output
    assert not bed.engine_pid.exists()


def test_cli_failure_exits_non_zero_with_the_reason(bed, router_factory) -> None:
    router = router_factory(bed.ini)
    result = invoke("engine", "hyperqwen", "up", "--dir", str(bed.dir), "--up-command", "exit 7",
                    "--down-command", "true", "--router-url", router.url, "--url", bed.engine_url)
    assert result.exit_code == 1
    assert "exited with code 7" in result.output and "the router was restored" in result.output


def test_cli_missing_directory_is_a_clear_error(tmp_path) -> None:
    result = invoke("engine", "hyperqwen", "up", "--dir", str(tmp_path / "nope"), "--free-gpu", "none",
                    "--ready-timeout", "1")
    assert result.exit_code == 1
    assert "cannot run" in result.output and "nope" in result.output


ROUTER_KEY = "router-s3cret"


def test_a_router_started_with_api_key_is_freed_and_restored_with_its_key(bed, router_factory, monkeypatch) -> None:
    router = router_factory(bed.ini, extra_args=["--api-key", ROUTER_KEY])
    keyed = RouterClient(router.url, api_key=ROUTER_KEY)
    keyed.load("tiny")
    keyed.wait_for_status("tiny", "loaded", 60)
    messages: list[str] = []

    # Without the key the router still answers (401): freeing it fails loudly, nothing is unloaded.
    assert router_answers(router.url)
    with pytest.raises(RequestRefused, match="401") as refused:
        free_gpu(RouterSide(url=router.url), messages.append)
    assert refused.value.status == 401 and model_statuses(router.url, ROUTER_KEY) == {"tiny": "loaded"}
    assert not any("nothing to unload" in m for m in messages)

    # With it (sweep and tune send the machine's router's key the same way), the model is unloaded, and
    # loaded again on the way back when asked to.
    side = RouterSide(url=router.url, api_key=ROUTER_KEY, reload=True, load_timeout_s=60)
    state = free_gpu(side, messages.append)
    assert state.unloaded == ["tiny"] and model_statuses(router.url, ROUTER_KEY) == {"tiny": "unloaded"}
    restore_router(side, state, messages.append)
    assert model_statuses(router.url, ROUTER_KEY) == {"tiny": "loaded"}
    assert not any(ROUTER_KEY in m for m in messages)

    # engine hyperqwen up/down takes the router's key from a flag.
    monkeypatch.setenv("LLM_BENCH_ROUTER_KEY", ROUTER_KEY)
    common = ["--dir", str(bed.dir), "--up-command", bed.engine_up, "--down-command", bed.engine_down,
              "--url", bed.engine_url, "--model", "", "--router-url", router.url, "--ready-timeout", "60",
              "--router-api-key-env", "LLM_BENCH_ROUTER_KEY"]
    result = invoke("engine", "hyperqwen", "up", *common)
    assert result.exit_code == 0, result.output
    assert "router models unloaded: tiny" in result.output and ROUTER_KEY not in result.output
    assert model_statuses(router.url, ROUTER_KEY) == {"tiny": "unloaded"}
    result = invoke("engine", "hyperqwen", "down", *common)
    assert result.exit_code == 0, result.output


def test_api_key_sources(tmp_path, monkeypatch) -> None:
    env = tmp_path / ".env"
    env.write_text("SPEC=dflash2\n# VLLM_API_KEY=commented\nVLLM_API_KEY='from-env-file'\n")
    assert key_from_env_file(env) == "from-env-file"
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert read_api_key(None, env) == "from-env-file"
    monkeypatch.setenv("VLLM_API_KEY", "from-environment")
    assert read_api_key(None, env) == "from-environment"
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert read_api_key(key_file, env) == "from-file"
    assert read_api_key(None, None) == "from-environment"


def test_api_key_env_is_read_like_every_other_command(tmp_path, monkeypatch) -> None:
    env = tmp_path / ".env"
    env.write_text("VLLM_API_KEY=from-env-file\n")
    monkeypatch.setenv("MY_KEY", " from-named-variable \n")
    monkeypatch.setenv("VLLM_API_KEY", "from-environment")
    assert read_api_key(None, env, "MY_KEY") == "from-named-variable"
    monkeypatch.delenv("VLLM_API_KEY")
    assert read_api_key(None, env) == "from-env-file"  # the compose env file stays the last source
    monkeypatch.delenv("MY_KEY")
    result = invoke("engine", "hyperqwen", "up", "--dir", str(tmp_path), "--api-key-env", "MY_KEY",
                    "--free-gpu", "none", "--ready-timeout", "1")
    assert result.exit_code == 2 and "MY_KEY" in result.output  # an unreadable key: could not run
    result = invoke("engine", "hyperqwen", "down", "--dir", str(tmp_path), "--api-key-file", str(tmp_path / "no"),
                    "--free-gpu", "none")
    assert result.exit_code == 2 and "cannot read the API key file" in result.output
