"""deploy/hyperqwen: the CDI compose override and .env.example, validated by parsing them.

No Docker engine runs here, so `docker compose config` cannot check them; these tests parse
the YAML (with Compose's `!override` tag) and the env file, and merge the override onto a
minimal model of syv-ai/HyperQwen's docker-compose.yml (services prepare/single/batch,
`driver: nvidia` reservation, `${BIND:-127.0.0.1}:${PORT:-18020}` port) with Compose's
merge rules (mappings merge, sequences append, `!override` replaces).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from llm_bench.engines.switch import OVERRIDE_FILE, compose_command

yaml = pytest.importorskip("yaml", reason="pyyaml is a test dependency: pip install -e '.[test]'")

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "hyperqwen"
OVERRIDE = DEPLOY / "docker-compose.override.yml"
ENV_EXAMPLE = DEPLOY / ".env.example"

GPU_SERVICES = ("single", "batch")
PORT_MAPPING = "${BIND:-127.0.0.1}:${PORT:-18020}:${PORT:-18020}"


@dataclass
class Tagged:
    tag: str
    value: object


class ComposeLoader(yaml.SafeLoader):
    pass


def _tagged(loader: yaml.SafeLoader, node: yaml.Node) -> Tagged:
    if isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    elif isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    return Tagged(node.tag, value)


ComposeLoader.add_constructor("!override", _tagged)
ComposeLoader.add_constructor("!reset", _tagged)


def load(text: str) -> dict:
    return yaml.load(text, Loader=ComposeLoader)


def merge(base: object, over: object) -> object:
    """Compose's merge: mappings merge, sequences append, !override replaces, !reset removes."""
    if isinstance(over, Tagged):
        return over.value if over.tag == "!override" else None
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(base.get(key), value) if key in base else untag(value)
        return out
    if isinstance(base, list) and isinstance(over, list):
        return base + [v for v in over if v not in base]
    return untag(over)


def untag(value: object) -> object:
    if isinstance(value, Tagged):
        return untag(value.value)
    if isinstance(value, dict):
        return {k: untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag(v) for v in value]
    return value


# The shape of HyperQwen's services after YAML anchors are expanded (written for this test,
# from the upstream file's structure; not a copy of it).
UPSTREAM_SHAPE = """
services:
  prepare:
    image: ghcr.io/syv-ai/hyperqwen:latest
    command: prepare
  single:
    image: ghcr.io/syv-ai/hyperqwen:latest
    profiles: [single]
    command: single
    ports: ["${BIND:-127.0.0.1}:${PORT:-18020}:${PORT:-18020}"]
    deploy:
      resources:
        reservations:
          devices:
            - {driver: nvidia, count: "${GPU_COUNT:-1}", capabilities: [gpu]}
  batch:
    image: ghcr.io/syv-ai/hyperqwen:latest
    profiles: [batch]
    command: batch
    ports: ["${BIND:-127.0.0.1}:${PORT:-18020}:${PORT:-18020}"]
    deploy:
      resources:
        reservations:
          devices:
            - {driver: nvidia, count: "${GPU_COUNT:-1}", capabilities: [gpu]}
"""


@pytest.fixture(scope="module")
def override() -> dict:
    return load(OVERRIDE.read_text())


def devices(service: dict) -> object:
    return service["deploy"]["resources"]["reservations"]["devices"]


@pytest.mark.parametrize("name", GPU_SERVICES)
def test_gpu_is_reserved_through_cdi(override, name) -> None:
    reserved = devices(override["services"][name])
    assert isinstance(reserved, Tagged) and reserved.tag == "!override", \
        "without !override Compose appends to HyperQwen's driver: nvidia request instead of replacing it"
    (device,) = reserved.value
    assert device["driver"] == "cdi"
    assert device["device_ids"] == ["nvidia.com/gpu=all"]
    assert device.get("capabilities") == ["gpu"]
    assert "count" not in device  # count and device_ids are exclusive in Compose


@pytest.mark.parametrize("name", GPU_SERVICES)
def test_port_binds_bind_and_port(override, name) -> None:
    ports = override["services"][name]["ports"]
    assert isinstance(ports, Tagged) and ports.tag == "!override"
    assert ports.value == [PORT_MAPPING]


def test_only_known_services_and_no_legacy_runtime(override) -> None:
    assert set(override["services"]) <= {"prepare", "single", "batch", "solo"}
    assert set(GPU_SERVICES) <= set(override["services"])
    text = OVERRIDE.read_text()
    assert not re.search(r"^\s*(runtime:|driver:\s*nvidia)", text, re.M)
    assert "image:" not in text  # the image stays HyperQwen's


def test_merged_onto_hyperqwen_leaves_one_cdi_device() -> None:
    merged = merge(load(UPSTREAM_SHAPE), load(OVERRIDE.read_text()))
    for name in GPU_SERVICES:
        service = merged["services"][name]
        assert devices(service) == [{"driver": "cdi", "device_ids": ["nvidia.com/gpu=all"], "capabilities": ["gpu"]}]
        assert service["ports"] == [PORT_MAPPING]
        assert service["command"] == name and service["profiles"] == [name]
    assert "deploy" not in merged["services"]["prepare"]  # CPU only, untouched


def test_plain_sequence_would_have_appended() -> None:
    """Why the tag matters: the same override without it keeps the nvidia request."""
    untagged = load(OVERRIDE.read_text().replace("!override", ""))
    merged = merge(load(UPSTREAM_SHAPE), untagged)
    drivers = [d["driver"] for d in devices(merged["services"]["single"])]
    assert drivers == ["nvidia", "cdi"]


def env_entries(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*=[^\s'\"]*", line), f"not a plain KEY=value line: {line!r}"
        key, _, value = line.partition("=")
        assert key not in out, f"{key} set twice"
        out[key] = value
    return out


def test_env_example() -> None:
    text = ENV_EXAMPLE.read_text()
    env = env_entries(text)
    assert env["SPEC"] in ("dflash2", "mtp")
    assert re.search(r"^#.*\bmtp\b", text, re.M), "the alternative, SPEC=mtp, is documented"
    assert 0 < float(env["GPU_UTIL"]) <= 1
    assert int(env["MAX_LEN"]) > 0
    assert env["PORT"] == "18020"
    assert env["BIND"] == "127.0.0.1"
    # KV_MEM is documented but left unset: unset = HyperQwen's pinned pool, empty = GPU_UTIL sizing.
    assert "KV_MEM" not in env
    assert re.search(r"^# KV_MEM=\d+$", text, re.M)
    # No secret in the example.
    assert env.get("VLLM_API_KEY", "") == ""


def test_switch_default_command_uses_these_files() -> None:
    up = compose_command("up").split()
    assert up[:2] == ["docker", "compose"]
    assert up[up.index("--env-file") + 1] == ".env"
    files = [up[i + 1] for i, a in enumerate(up) if a == "-f"]
    assert files == ["docker-compose.yml", OVERRIDE_FILE] and OVERRIDE.name == OVERRIDE_FILE
    assert up[up.index("--profile") + 1] == "single" and up[-2:] == ["up", "-d"]
