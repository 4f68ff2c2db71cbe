"""API keys: every command that talks to a server sends one from the same options, and the key goes to a
metrics URL only on the server's own origin."""

from __future__ import annotations

import http.server
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from llm_bench.engines import open_engine
from tests.commands import invoke

KEY = "sekrit-key-123"



@pytest.fixture
def guarded(router_factory, bed, monkeypatch):
    monkeypatch.setenv("BENCH_KEY", KEY)
    return router_factory(bed, extra_args=["--api-key", KEY])


def test_run_soak_and_doctor_reach_a_router_that_demands_a_key(guarded, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    without = invoke("run", "--url", guarded.url, "--output-dir", str(tmp_path / "no"), "--runs", "1")
    assert without.exit_code == 2  # could not run: the server refused the listing
    assert "401" in without.output and "--api-key-file" in without.output  # says what to do

    ran = invoke("run", "--url", guarded.url, "--alias", "tiny-plain", "--runs", "1", "--max-tokens", "8",
                 "--api-key-file", str(key_file), "--output-dir", str(tmp_path / "run"))
    assert ran.exit_code == 0, ran.output

    soaked = invoke("soak", "--url", guarded.url, "--api-key-env", "BENCH_KEY", "--alias", "tiny-plain",
                    "--duration", "60", "--max-requests", "2", "--max-tokens", "8", "--mix", "prose",
                    "--output-dir", str(tmp_path / "soak"))
    assert soaked.exit_code == 0, soaked.output
    data = tomllib.loads(next((tmp_path / "soak").glob("*soak*.toml")).read_text())["soak"]
    assert data["requests_total"] == 2 and data["requests_failed"] == 0

    diagnosed = invoke("doctor", "--url", guarded.url, "--api-key-env", "BENCH_KEY", "--alias", "tiny-plain",
                       "--max-tokens", "8")
    assert "401" not in diagnosed.output and "Unauthorized" not in diagnosed.output, diagnosed.output
    assert "tiny-plain" in diagnosed.output


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]]

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self.seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
        body = b"# HELP x\nvllm:num_requests_running 0\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def recording_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_key_goes_to_the_metrics_url_only_on_the_servers_origin():
    with recording_server() as (server_url, on_server), recording_server() as (other_url, on_other):
        for metrics_url in (None, f"{server_url}/metrics", f"{other_url}/metrics"):
            engine = open_engine("openai", server_url, timeout=5, api_key=KEY, metrics_url=metrics_url)
            try:
                assert engine.metrics_text() is not None
            finally:
                engine.close()
        explicit = open_engine("openai", server_url, timeout=5, api_key=KEY, metrics_url=f"{other_url}/metrics",
                               metrics_key=True)
        try:
            explicit.metrics_text()
        finally:
            explicit.close()
    assert [s["authorization"] for s in on_server] == [f"Bearer {KEY}", f"Bearer {KEY}"]
    assert [s["authorization"] for s in on_other] == ["", f"Bearer {KEY}"]  # only when asked for


def test_run_sends_the_key_to_a_foreign_metrics_url_only_with_metrics_key(guarded, tmp_path):
    with recording_server() as (other_url, on_other):
        seen = []
        for extra in ([], ["--metrics-key"]):
            result = invoke("run", "--engine", "openai", "--url", guarded.url, "--alias", "tiny-plain",
                            "--api-key-env", "BENCH_KEY",
                            "--metrics-url", f"{other_url}/metrics", "--runs", "1", "--max-tokens", "8",
                            "--output-dir", str(tmp_path), *extra)
            assert result.exit_code == 0, result.output
            seen.append({s["authorization"] for s in on_other})
            on_other.clear()
    assert seen == [{""}, {f"Bearer {KEY}"}]  # the metrics URL was read both times; the key went only when asked
