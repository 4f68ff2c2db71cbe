"""A URL that is not a llama.cpp router gets a one-line diagnosis, never an HTML dump or a traceback."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from click.testing import CliRunner

from llm_bench.cli import main


class HtmlEverywhere(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        body = b"<!doctype html><html><body><h1>Welcome</h1>" + b"<p>filler</p>" * 200 + b"</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextmanager
def serving(handler) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run(url: str, tmp_path):
    return CliRunner().invoke(main, ["run", "--url", url, "--output-dir", str(tmp_path)])


def test_a_web_server_answering_404_is_diagnosed_in_one_line(tmp_path):
    # a plain static file server: GET /models is its HTML 404 page
    with serving(functools.partial(Quiet, directory=str(tmp_path))) as url:
        result = run(url, tmp_path / "out")
    assert result.exit_code == 2  # could not run: nothing was measured
    assert "does not speak the llama.cpp router API: GET /models answered HTTP 404 (an HTML page, not JSON)" \
        in result.output
    assert "--engine openai" in result.output
    assert "<" not in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) <= 2


def test_a_200_answer_that_is_not_json_is_a_clear_error(tmp_path):
    with serving(HtmlEverywhere) as url:
        result = run(url, tmp_path / "out")
        openai = CliRunner().invoke(main, ["run", "--engine", "openai", "--url", url, "--output-dir", str(tmp_path)])
    assert result.exit_code == 2  # could not run: nothing was measured
    assert "HTTP 200 with an HTML page, not the router's model list" in result.output
    assert "<" not in result.output and "Traceback" not in result.output
    assert openai.exit_code == 2
    assert "answered HTTP 200 with an HTML page, not JSON" in openai.output
    assert "<" not in openai.output and "Traceback" not in openai.output
