"""plugins/modules/vllm_soak.py against a stand-in server on loopback that streams completions
the way vLLM's /v1/completions does with ``stream`` (server-sent events, the running usage
in every chunk), and can freeze mid-stream as a wedged collective does.

A soak's minute is shortened (``MINUTE``) so that each test takes seconds."""

from __future__ import annotations

import functools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible.module_utils.urls import open_url
from ansible_collections.dgx_spark.cluster.plugins.modules import vllm_soak as mod
from support.modules import run_module

KEY = "test-key"
MODEL = "tiny-qwen3-moe"
OPENER = functools.partial(open_url, validate_certs=False)


class Streamer:
    """/v1/completions streamed: ``tokens`` chunks ``every`` seconds apart per request; after
    ``freeze_after`` tokens in all, every stream stops sending (the connection stays open)
    until the test ends."""

    def __init__(self, tokens: int = 8, every: float = 0.01, freeze_after: int | None = None):
        self.bodies: list[dict] = []
        self.sent = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        streamer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                streamer.bodies.append(body)
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    data = json.dumps({"error": "Unauthorized"}).encode()
                    self.send_response(401)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for n in range(1, tokens + 1):
                        with streamer.lock:
                            frozen = freeze_after is not None and streamer.sent >= freeze_after
                            streamer.sent += not frozen
                        if frozen:
                            streamer.release.wait(30)
                            return
                        chunk = {"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                                 "choices": [{"index": 0, "text": f" w{n}", "logprobs": None,
                                              "finish_reason": None if n < tokens else "length"}],
                                 "usage": {"prompt_tokens": 9, "completion_tokens": n,
                                           "total_tokens": 9 + n}}  # fmt: skip
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                        time.sleep(every)
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):  # the soak ended the request
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def short_minutes(monkeypatch):
    monkeypatch.setattr(mod, "MINUTE", 1.5)


def _params(url: str, **extra) -> dict:
    return {"url": url, "api_key": KEY, "model": MODEL, "minutes": 1, "stall_s": 1,
            "streams": 3, "max_tokens": 8, "prompt": "Once", **extra}  # fmt: skip


def test_a_steady_endpoint_passes_with_tokens_every_minute(short_minutes):
    server = Streamer()
    try:
        report = mod.run(_params(server.url), OPENER)
    finally:
        server.close()
    assert report["passed"], report["msg"]
    assert report["seconds"] == pytest.approx(1.5, abs=0.3)
    assert report["tokens"] > 3 * 8 and report["requests"] >= 3
    assert report["failed_requests"] == 0, report["errors"]
    assert report["longest_stall"]["seconds"] < 1
    assert len(report["minutes"]) == 1 and report["minutes"][0]["tokens"] == report["tokens"]
    assert report["msg"].startswith("soak passed: 1.5 s under 3 streams")
    body = server.bodies[0]
    assert (body["model"], body["max_tokens"], body["stream"], body["ignore_eos"]) == (
        MODEL, 8, True, True)  # fmt: skip


def test_a_frozen_endpoint_fails_at_the_limit_naming_the_stall(monkeypatch):
    monkeypatch.setattr(mod, "MINUTE", 30.0)
    server = Streamer(tokens=50, every=0.01, freeze_after=40)
    started = time.monotonic()
    try:
        report = mod.run(_params(server.url), OPENER)
    finally:
        server.close()
    took = time.monotonic() - started
    assert not report["passed"]
    # Stopped at the stall (1 s), not after the half minute, the streams left within 2 s.
    assert report["seconds"] < 5 and took < 8, (report["seconds"], took)
    assert report["tokens"] == 40
    stall = report["longest_stall"]
    assert stall["ongoing"] and stall["streams"] == [1, 2, 3]
    # The soak stops once no token came for the limit (1 s): the stall it names is that long.
    assert 1 <= stall["seconds"] < 2
    assert report["msg"].startswith("soak failed: stall of at least 1.")
    assert "limit soak_stall_s 1 s; streams 1, 2, 3 waiting on a request" in report["msg"]


def test_an_endpoint_that_refuses_fails_naming_the_refusal(short_minutes):
    server = Streamer()
    try:
        report = mod.run(_params(server.url, api_key="wrong"), OPENER)
    finally:
        server.close()
    assert not report["passed"] and report["tokens"] == 0
    assert report["failed_requests"] >= 3
    assert "HTTP 401: Unauthorized" in report["msg"], report["msg"]


def test_nothing_listening_fails_as_no_answer(short_minutes):
    server = Streamer()
    url = server.url
    server.close()  # the port is free again: connections are refused
    report = mod.run(_params(url, streams=1), OPENER)
    assert not report["passed"]
    assert "no answer (" in report["msg"], report["msg"]


def test_the_module_reports_without_changing_anything(short_minutes, capsys):
    server = Streamer()
    try:
        code, result = run_module(mod, _params(server.url), capsys, check_mode=True)
    finally:
        server.close()
    assert code == 0 and result["changed"] is False and result["passed"], result
    assert result["table"][0].startswith("minute    1:")
    assert KEY not in json.dumps(result)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"minutes": 0}, "soak_minutes is 0; allowed: whole minutes 1-1440 (option minutes)"),
        ({"stall_s": 4000}, "soak_stall_s is 4000; allowed: whole seconds 1-3600 (option stall_s)"),
        ({"streams": 65}, "soak_streams is 65; allowed: whole streams 1-64 (option streams)"),
        ({"max_tokens": 0}, "max_tokens is 0; allowed: 1 or more"),
    ],
)
def test_bad_arguments_are_refused_before_any_request(extra, said, capsys):
    server = Streamer()
    try:
        code, result = run_module(mod, _params(server.url, **extra), capsys)
    finally:
        server.close()
    assert code == 1 and result["failed"]
    assert result["msg"] == said
    assert server.bodies == []
