"""roles/vllm_serve/tasks/wait.yml: one completion per decision, the served model checked.

The role's wait entry runs on a local connection against a vLLM stand-in on loopback (the
head's endpoint), once per way a serving run reaches it: after a start (run.yml's wait got
the completion), with nothing restarted (plan.yml's probe got it), and alone (by its tag:
nothing got one, so it asks).
"""

from __future__ import annotations

import json

import pytest
from support.http_stand_in import HttpStandIn
from support.role_entry import run_entry_point

KEY = "wait-test-key-0123456789"
MODEL = "Qwen3.5-122B-A10B-FP8"  # inventories/sparks serves it


class StandIn(HttpStandIn):
    """/health, /v1/models (serving ``models``) and /v1/completions; records each request."""

    def __init__(self):
        self.models = [MODEL]
        super().__init__(self._respond)

    @property
    def seen(self) -> list[tuple[str, str, dict | None]]:
        return [(r["method"], r["path"], r["body"]) for r in self.requests]

    def _respond(self, _method, path, headers, body):
        answer = {}
        if headers.get("Authorization") != f"Bearer {KEY}":
            status, answer = (200, {}) if path == "/health" else (401, answer)
        elif path == "/v1/models":
            status, answer = 200, {"data": [{"id": m} for m in self.models]}
        elif path == "/v1/completions":
            status, answer = 200, {"choices": [{"text": " asked here"}],
                                   "usage": {"completion_tokens": body["max_tokens"]}}  # fmt: skip
        else:
            status = 200
        return status, answer, "application/json"

    def completions(self) -> list[dict]:
        return [body for _method, path, body in self.seen if path == "/v1/completions"]


@pytest.fixture
def vllm():
    stand_in = StandIn()
    yield stand_in
    stand_in.close()


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
