"""The fleet module's config file in the real LiteLLM proxy (1.100.1, the release nixpkgs ships, pinned), in front of two
real llama-server routers on loopback.

The file is the one nixpkgs' services.litellm unit would run with, rendered by nix-instantiate
from modules/fleet.nix (needs NIXPKGS_LIB). The first choice takes an API key, which reaches the
proxy only through its environment, as services.litellm.environmentFile gives it. The proxy
names the backend that answered in `x-litellm-model-api-base` (the declared URL) and
`x-litellm-model-id` (`<group>@<box>`).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from llm_bench.support.poll import poll_until
from llm_bench.testbed.litellm_proxy import LiteLLMNotFound, ProxyProcess, ProxyStartError, find_litellm
from llm_bench.testbed.router import RouterProcess
from tests.nix.helpers import litellm_config

KEY = "box1-test-key-0123456789"
ALIAS = "tiny-plain"  # a preset of the demo bed


def fleet_module(box1: RouterProcess, box2: RouterProcess) -> str:
    return f"""{{
      llmBench.fleet = {{
        enable = true;
        models.tiny.backends = {{
          box1 = {{ url = "{box1.url}/v1"; model = "{ALIAS}"; order = 1; apiKeyVariable = "BOX1_API_KEY"; }};
          box2 = {{ url = "{box2.url}/v1"; model = "{ALIAS}"; order = 2; }};
        }};
        # Short, so that the test sees the first choice take traffic again soon after it returns.
        cooldownTime = 1;
      }};
      services.litellm.environmentFile = "/run/secrets/litellm.env";
    }}"""


def post(proxy: ProxyProcess, model: str = "tiny") -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
    })


def ask(proxy: ProxyProcess, model: str = "tiny") -> httpx.Response:
    response = post(proxy, model)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] > 0
    return response


def served_by(response: httpx.Response) -> tuple[str | None, str | None]:
    return response.headers.get("x-litellm-model-api-base"), response.headers.get("x-litellm-model-id")


@pytest.mark.nix  # renders the fleet module with the tree's services.litellm
def test_the_proxy_runs_the_rendered_file_and_fails_over_to_the_second_box(
    router_factory, proxy_factory, bed: Path, tmp_path: Path
) -> None:
    box1 = router_factory(bed, extra_args=["--api-key", KEY])
    box2 = router_factory(bed)
    config = tmp_path / "config.yaml"
    config.write_text(litellm_config(fleet_module(box1, box2)))
    assert KEY not in config.read_text()
    assert json.loads(config.read_text())["model_list"][0]["litellm_params"]["api_key"] == "os.environ/BOX1_API_KEY"
    # The first choice refuses requests without its key: an answer from it proves the key flowed.
    assert httpx.post(f"{box1.url}/v1/chat/completions", json={"model": ALIAS, "messages": []}).status_code == 401

    proxy = proxy_factory(config, env={"BOX1_API_KEY": KEY})
    print(f"LiteLLM {config.name}: answering after {proxy.startup_s:.1f} s")
    listed = {m["id"] for m in httpx.get(f"{proxy.url}/v1/models").json()["data"]}
    assert listed == {"tiny", "tiny@box2"}

    first = ask(proxy)
    assert served_by(first) == (f"{box1.url}/v1", "tiny@box1")
    assert first.headers["x-litellm-attempted-fallbacks"] == "0"
    # A fallback group is a model of its own: the second box through the proxy.
    assert served_by(ask(proxy, "tiny@box2")) == (f"{box2.url}/v1", "tiny@box2")

    box1.stop()
    failed_over = ask(proxy)
    assert served_by(failed_over) == (f"{box2.url}/v1", "tiny@box2")
    assert failed_over.headers["x-litellm-attempted-fallbacks"] == "1"
    print(f"first request after the stop answered by the fallback in {failed_over.elapsed.total_seconds():.1f} s")

    # The first choice back on its port: traffic returns to it once its cooldown has passed.
    router_factory(bed, port=box1.port, extra_args=["--api-key", KEY])
    back = poll_until(lambda: served_by(ask(proxy))[1] == "tiny@box1" or None, timeout=60, interval=0.5)
    assert back, f"no request was answered by box1 within 60 s of its return; proxy log:\n{proxy.log()[-3000:]}"


@pytest.mark.nix  # renders the fleet module with the tree's services.litellm
def test_litellms_order_key_now_falls_back_by_itself(
    router_factory, proxy_factory, bed: Path, tmp_path: Path
) -> None:
    """The control for the module's design (docs/fleet.md): the same two boxes in one group with
    LiteLLM's per-deployment `order` alone: no `enable_pre_call_checks`, no fallback groups. LiteLLM
    1.80 lost the request that met the stopped first choice (a 500, "Connection error"); since its
    PR #24611 (in 1.100.1: Router's order-based fallbacks, `_target_order`) that request goes on to
    order 2 and is answered."""
    box1 = router_factory(bed)
    box2 = router_factory(bed)
    rendered = json.loads(litellm_config(fleet_module(box1, box2).replace(
        'apiKeyVariable = "BOX1_API_KEY";', "").replace('services.litellm.environmentFile = "/run/secrets/litellm.env";', "")))
    for order, deployment in enumerate(rendered["model_list"], start=1):
        deployment["model_name"] = "tiny"
        deployment["litellm_params"]["order"] = order
    rendered["router_settings"] |= {"fallbacks": []}
    config = tmp_path / "order.yaml"
    config.write_text(json.dumps(rendered))
    proxy = proxy_factory(config)

    assert served_by(ask(proxy)) == (f"{box1.url}/v1", "tiny@box1")
    box1.stop()
    met_the_stop = ask(proxy)
    assert served_by(met_the_stop) == (f"{box2.url}/v1", "tiny@box2")
    print(f"order key: the request that met the stop answered by order 2 in {met_the_stop.elapsed.total_seconds():.1f} s")
    assert served_by(ask(proxy)) == (f"{box2.url}/v1", "tiny@box2")


def test_allowed_fails_three_is_taken_as_unset(router_factory, proxy_factory, bed: Path, tmp_path: Path) -> None:
    """The trap the module warns about, measured on this LiteLLM: two proxies in front of the same two boxes,
    one with allowed_fails = 3 (its default, which cooldown_handlers.py's _is_allowed_fails_set_on_router takes
    as unset: a group's only box is never cooled down, so every request of an outage waits for its retries
    before the fallback), one with 1 (only the first request waits). Measured here on 1.100.1: 4.7, 4.7, 4.2 s
    against 4.8, 0.06, 0.03 s."""
    box1 = router_factory(bed)
    box2 = router_factory(bed)
    # what the module renders for box1 first and box2 as its fallback group (no Nix needed for it here)
    models = [{"model_name": name, "model_info": {"id": f"tiny@{box}"},
               "litellm_params": {"model": f"openai/{ALIAS}", "api_base": f"{url}/v1", "api_key": "no-key"}}
              for name, box, url in (("tiny", "box1", box1.url), ("tiny@box2", "box2", box2.url))]
    proxies = {}
    for allowed_fails in (3, 1):
        config = tmp_path / f"allowed-fails-{allowed_fails}.yaml"
        config.write_text(json.dumps({"model_list": models, "router_settings": {
            "num_retries": 2, "allowed_fails": allowed_fails, "cooldown_time": 60,
            "fallbacks": [{"tiny": ["tiny@box2"]}]}}))
        proxies[allowed_fails] = proxy_factory(config)
        ask(proxies[allowed_fails])
    box1.stop()
    times = {}
    for allowed_fails, proxy in proxies.items():
        answers = [ask(proxy) for _ in range(2)]
        assert all(served_by(a)[1] == "tiny@box2" for a in answers)
        times[allowed_fails] = [a.elapsed.total_seconds() for a in answers]
        print(f"allowed_fails = {allowed_fails}: requests after the stop took "
              f"{', '.join(f'{t:.2f}' for t in times[allowed_fails])} s")
    # the retries' back-off (0.5 s, 1 s, plus jitter) each time, against a box cooled down after its first
    assert min(times[3]) > 1.0 and times[1][1] < 0.5, times


def test_a_config_the_proxy_rejects_is_reported_with_its_log(proxy_factory, tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("model_list:\n  - model_name: tiny\n")  # no litellm_params
    with pytest.raises(ProxyStartError, match=r"(?s)litellm exited with code \d+ while starting with .*bad.yaml.*"
                                              r"KeyError: 'litellm_params'"):
        proxy_factory(config)


def test_litellm_names_a_file_that_is_not_a_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM", str(tmp_path / "missing"))
    with pytest.raises(LiteLLMNotFound, match="LITELLM=.*missing is not an executable file"):
        find_litellm()
