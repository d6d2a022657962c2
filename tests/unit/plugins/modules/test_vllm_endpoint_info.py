"""plugins/modules/vllm_endpoint_info.py against a stand-in server that answers with the
/metrics text captured from vLLM 0.32 on the pair."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.modules import vllm_endpoint_info as mod
from support.captures import tool_output
from support.modules import run_module

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "operate"
KEY = "test-key"
MODEL = "tiny-qwen3-moe"


class StandIn(BaseHTTPRequestHandler):
    """/health, /v1/models and /v1/completions behind a key; /metrics idle, then loaded."""

    scrapes: list[str] = []
    broken_completion = False
    health = 200
    seen: list[str] = []

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def _send(self, status, body, content_type="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self):
        return self.headers.get("Authorization") == f"Bearer {KEY}"

    def do_GET(self):
        self.seen.append(f"GET {self.path}")
        if self.path == "/health":
            self._send(self.health, "")
        elif self.path == "/metrics":
            name = self.scrapes.pop(0) if len(self.scrapes) > 1 else self.scrapes[0]
            self._send(200, tool_output(FIXTURES / name), "text/plain")
        elif self.path == "/v1/models":
            if not self._authorized():
                self._send(401, {"error": "Unauthorized"})
                return
            data = [{"id": MODEL, "root": "/var/lib/dgx-spark/models/tiny", "max_model_len": 512}]
            self._send(200, {"object": "list", "data": data})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        self.seen.append(f"POST {self.path}")
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions" or not self._authorized():
            self._send(401, {"error": "Unauthorized"})
        elif self.broken_completion:
            self._send(500, {"error": {"message": "EngineCore encountered an issue."}})
        else:
            assert body["model"] == MODEL and body["temperature"] == 0
            tokens = body["max_tokens"]
            usage = {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": 2 + tokens}
            self._send(200, {"choices": [{"text": " Paris." if tokens > 1 else " Paris"}],
                             "usage": usage})  # fmt: skip


@pytest.fixture
def server():
    StandIn.scrapes = ["metrics_vllm_0.32_idle.txt", "metrics_vllm_0.32_after_bench.txt"]
    StandIn.broken_completion = False
    StandIn.health = 200
    StandIn.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_serving_endpoint(server, capsys):
    code, out = run_module(
        mod, {"url": server, "api_key": KEY, "model": MODEL, "metrics_interval": 0.2}, capsys
    )
    assert code == 0 and out["changed"] is False
    assert out["health"]["ok"]
    assert out["models"] == [MODEL]
    assert out["model"]["root"] == "/var/lib/dgx-spark/models/tiny"
    assert out["completion"]["ok"] and out["completion"]["latency_ms"] > 0
    assert out["completion"]["text"] == " Paris" and out["completion"]["completion_tokens"] == 1
    assert out["healthy"] is True and out["reason"] == ""
    metrics = out["metrics"]
    # The second scrape is the benchmark's /metrics: 46 requests cut at their length.
    assert (metrics["running"], metrics["requests_finished"], metrics["requests_aborted"],
            metrics["requests_errored"]) == (0, 46, 0, 0)  # fmt: skip
    assert metrics["generation_tokens_per_s"] > 0 and metrics["interval_s"] >= 0.2
    assert KEY not in json.dumps(out)


def test_a_wrong_key_and_a_broken_engine_are_reported_not_fatal(server, capsys):
    code, out = run_module(mod, {"url": server, "api_key": "wrong", "model": MODEL}, capsys)
    assert code == 0
    assert out["health"]["ok"] and out["models"] == []
    assert not out["completion"]["ok"] and "401" in out["completion"]["error"]
    assert out["healthy"] is False
    assert out["reason"] == "the completion failed: HTTP 401: Unauthorized"
    StandIn.broken_completion = True
    code, out = run_module(mod, {"url": server, "api_key": KEY, "model": MODEL}, capsys)
    assert not out["completion"]["ok"] and "EngineCore" in out["completion"]["error"]
    assert out["completion"]["status"] == 500 and out["healthy"] is False


def test_nothing_listening(capsys):
    code, out = run_module(mod, {"url": "http://127.0.0.1:9", "timeout": 2}, capsys)
    assert code == 0
    assert not out["health"]["ok"] and out["health"]["error"]
    assert out["health"]["status"] is None
    assert out["completion"] == {"ok": False, "latency_ms": None, "error": "not asked"}
    assert "error" in out["metrics"]
    assert out["healthy"] is False and out["reason"].startswith("/health: no answer (")


def test_a_probe_asks_once_and_reads_no_metrics(server, capsys):
    """The one-shot probe of a pair that should serve (the no-op check, vllm_serve's plan.yml)."""
    args = {"url": server, "api_key": KEY, "model": MODEL, "prompt": "The capital of France is",
            "request_timeout": 5, "metrics": False}  # fmt: skip
    code, out = run_module(mod, args, capsys)
    assert code == 0 and out["healthy"] and out["completion"]["text"] == " Paris"
    assert StandIn.seen == ["GET /health", "GET /v1/models", "POST /v1/completions"]
    assert out["metrics"] == {}


def test_a_down_endpoint_is_judged_at_once_without_a_completion(server, capsys):
    StandIn.health = 503
    args = {"url": server, "api_key": KEY, "model": MODEL, "metrics": False}
    code, out = run_module(mod, args, capsys)
    assert code == 0 and out["healthy"] is False
    assert out["reason"] == "/health: HTTP 503"
    assert StandIn.seen == ["GET /health"]


def test_more_tokens_and_only_health_and_models(server, capsys):
    args = {"url": server, "api_key": KEY, "model": MODEL, "max_tokens": 8, "metrics": False}
    code, out = run_module(mod, args, capsys)
    assert out["completion"]["text"] == " Paris." and out["completion"]["completion_tokens"] == 8
    StandIn.seen = []
    code, out = run_module(mod, {**args, "completion": False}, capsys)
    assert out["healthy"] and out["models"] == [MODEL]
    assert out["completion"]["error"] == "not asked"
    assert StandIn.seen == ["GET /health", "GET /v1/models"]
