"""roles/vllm_serve/tasks/wait.yml: one completion per decision, the served model checked.

The role's wait entry runs on a local connection against a vLLM stand-in on loopback (the
head's endpoint), once per way a serving run reaches it: after a start (run.yml's wait got
the completion), with nothing restarted (plan.yml's probe got it), and alone (by its tag:
nothing got one, so it asks).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.role_entry import run_entry_point

KEY = "wait-test-key-0123456789"
MODEL = "Qwen3.5-122B-A10B-FP8"  # inventories/sparks serves it


class StandIn:
    """/health, /v1/models (serving ``models``) and /v1/completions; records each request."""

    def __init__(self):
        self.models = [MODEL]
        self.seen: list[tuple[str, str, dict | None]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                stand_in.seen.append((self.command, self.path, body))
                answer = {}
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    status, answer = (200, {}) if self.path == "/health" else (401, answer)
                elif self.path == "/v1/models":
                    status, answer = 200, {"data": [{"id": m} for m in stand_in.models]}
                elif self.path == "/v1/completions":
                    tokens = body["max_tokens"]
                    status, answer = 200, {"choices": [{"text": " asked here"}],
                                           "usage": {"completion_tokens": tokens}}  # fmt: skip
                else:
                    status = 200
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def completions(self) -> list[dict]:
        return [body for _method, path, body in self.seen if path == "/v1/completions"]


@pytest.fixture
def vllm():
    stand_in = StandIn()
    yield stand_in
    stand_in.server.shutdown()
    stand_in.server.server_close()


def wait(tmp_path, vllm, monkeypatch, **decided):
    """The wait entry on the pair's head, with the results the decision registered: the run
    and each task's result on the head, by task name."""
    monkeypatch.setenv("ANSIBLE_STDOUT_CALLBACK", "ansible.builtin.json")
    extra = {"vllm_serve_port": vllm.port, "vllm_serve_api_key": KEY, **decided}
    proc = run_entry_point(tmp_path, "vllm_serve", "wait", "--limit", "spark-1",
                           "-e", json.dumps(extra))  # fmt: skip
    tasks = json.loads(proc.stdout[proc.stdout.index("{") :])["plays"][0]["tasks"]
    return proc, {task["task"]["name"]: task["hosts"].get("spark-1", {}) for task in tasks}


SKIPPED = {"skipped": True, "changed": False}
ROLE = "dgx_spark.cluster.vllm_serve : "
ASK = f"{ROLE}Ask /v1/models for the served model, and for a completion unless the decision got one"
REPORT = f"{ROLE}Report the endpoint"


@pytest.mark.parametrize(
    ("decided", "text"),
    [
        # A restart: the start's wait proved it with the smoke completion.
        ({"_vllm_serve_wait": {"healthy": True, "text": " Paris."},
          "_vllm_serve_probe": {"healthy": False, "reason": "x", "completion": {"text": ""}}},
         " Paris."),
        # Nothing restarted: the probe of the running pair got one token.
        ({"_vllm_serve_wait": SKIPPED,
          "_vllm_serve_probe": {"healthy": True, "completion": {"text": " Paris"}}},
         " Paris"),
    ],
)  # fmt: skip
def test_the_decisions_completion_is_reported_and_none_is_asked(
    tmp_path, vllm, monkeypatch, decided, text
):
    proc, results = wait(tmp_path, vllm, monkeypatch, **decided)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = results[REPORT]["msg"]
    assert report.startswith(f"{MODEL} serves at http://"), report
    assert report.endswith(f"completion: {json.dumps(text)}"), report
    assert vllm.completions() == []
    assert ("GET", "/v1/models", None) in vllm.seen


def test_alone_it_asks_the_smoke_completion_once(tmp_path, vllm, monkeypatch):
    proc, results = wait(tmp_path, vllm, monkeypatch)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert results[REPORT]["msg"].endswith('completion: " asked here"'), results[REPORT]
    assert vllm.completions() == [{"model": MODEL, "prompt": "The capital of France is",
                                   "max_tokens": 8, "temperature": 0}]  # fmt: skip


def test_a_model_that_is_not_served_fails_the_wait(tmp_path, vllm, monkeypatch):
    vllm.models = ["another-model"]
    started = {"_vllm_serve_wait": {"healthy": True, "text": " Paris."}}
    proc, results = wait(tmp_path, vllm, monkeypatch, **started)
    assert proc.returncode != 0 and REPORT not in results
    assert results[ASK]["failed"] and results[ASK]["models"] == ["another-model"]
    assert KEY not in proc.stdout + proc.stderr
