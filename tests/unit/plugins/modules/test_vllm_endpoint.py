"""vllm_endpoint against a real HTTP server on loopback and a stand-in Docker client."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.dgx_spark.cluster.plugins.modules import vllm_endpoint
from support.modules import run_module


class Endpoint:
    """A server whose answers the test sets: /health status, completion status and tokens."""

    def __init__(self):
        self.health = 200
        self.completion = 200
        self.tokens = 1
        self.keys: list[str] = []
        self.bodies: list[dict] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status, body):
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):  # noqa: N802
                self._answer(endpoint.health, {})

            def do_POST(self):  # noqa: N802
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.bodies.append(json.loads(raw))
                endpoint.keys.append(self.headers.get("Authorization", ""))
                body = {
                    "choices": [{"text": " x"}],
                    "usage": {"completion_tokens": endpoint.tokens},
                }
                self._answer(endpoint.completion, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class FakeDocker:
    """The two calls the module makes of docker's low-level API."""

    class errors:  # noqa: N801
        class NotFound(Exception):
            pass

        APIError = Exception

    def __init__(self, states: list[dict], logs: str = ""):
        self.states = states  # one inspect answer per call; the last one repeats
        self.logs_text = logs
        self.log_calls: list[dict] = []
        self.api = self

    def inspect_container(self, name):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if state is None:
            raise FakeDocker.errors.NotFound(name)
        return {"State": {"Running": state["running"], "StartedAt": state["started"]},
                "RestartCount": state.get("restarts", 0)}  # fmt: skip

    def logs(self, name, tail, **options):
        # As the Docker SDK does: a since that is not a positive int is refused.
        since = options.get("since", 1)
        if not (isinstance(since, int) and since > 0):
            raise ValueError(f"since value should be datetime or positive int, not {type(since)}")
        self.log_calls.append(options)
        return self.logs_text.encode()


@pytest.fixture
def endpoint():
    server = Endpoint()
    yield server
    server.server.shutdown()


def params(url, **extra):
    return {"url": url, "api_key": "test-key-0123", "model": "m", "completion": True, "prompt": "p",
            "max_tokens": 1, "timeout": 5, "request_timeout": 5, "watch": [], **extra}  # fmt: skip


def test_healthy_only_with_a_completion(endpoint):
    result = vllm_endpoint.wait(params(endpoint.url), None)
    assert result["healthy"] and result["text"] == " x"
    assert endpoint.keys == ["Bearer test-key-0123"]
    assert endpoint.bodies == [{"model": "m", "prompt": "p", "max_tokens": 1, "temperature": 0}]


def test_the_smoke_prompt_may_ask_for_more_tokens(endpoint):
    endpoint.tokens = 3
    result = vllm_endpoint.wait(params(endpoint.url, prompt="The capital of", max_tokens=8), None)
    assert result["healthy"] and result["text"] == " x"
    assert (endpoint.bodies[0]["prompt"], endpoint.bodies[0]["max_tokens"]) == ("The capital of", 8)


def test_without_completion_health_is_enough(endpoint):
    result = vllm_endpoint.wait(params(endpoint.url, completion=False, api_key=""), None)
    assert result["healthy"] and endpoint.bodies == []


@pytest.mark.parametrize(
    ("max_tokens", "asked"), [(1, "a one-token completion"), (8, "a completion")]
)
def test_health_alone_is_not_enough(endpoint, max_tokens, asked):
    endpoint.tokens = 0
    result = vllm_endpoint.wait(params(endpoint.url, timeout=3, max_tokens=max_tokens), None)
    assert not result["healthy"]
    assert result["reason"] == f"no answer to {asked} within 3 s"
    assert result["timed_out"] is True


def test_a_refused_key_stops_at_once(endpoint):
    endpoint.completion = 401
    result = vllm_endpoint.wait(params(endpoint.url, timeout=60), None)
    assert result == {"healthy": False, "reason": "the completion was refused with HTTP 401",
                      "excerpt": "", "text": "", "states": {},
                      "timed_out": False}  # fmt: skip


def test_a_container_that_exits_stops_the_wait_with_vllms_reason(endpoint, monkeypatch):
    monkeypatch.setattr(vllm_endpoint, "docker", FakeDocker)
    endpoint.health = 503
    running = {"running": True, "started": "t0"}
    client = FakeDocker(
        [running, running, {"running": False, "started": "t0"}],
        logs="Traceback (most recent call last):\nValueError: max_model_len must be >= 1\n",
    )
    result = vllm_endpoint.wait(params(endpoint.url, timeout=60, watch=["vllm"]), client)
    assert result["reason"] == "vllm exited"
    assert result["excerpt"] == "vllm: ValueError: max_model_len must be >= 1"


def test_a_missing_container_is_reported(endpoint, monkeypatch):
    monkeypatch.setattr(vllm_endpoint, "docker", FakeDocker)
    result = vllm_endpoint.wait(params(endpoint.url, watch=["vllm"]), FakeDocker([None]))
    assert result["reason"] == "vllm not found" and not result["healthy"]


def test_module_fails_or_reports(endpoint, capsys):
    endpoint.health = 503
    args = params(endpoint.url, timeout=2)
    code, result = run_module(vllm_endpoint, {**args, "fail_on_unhealthy": False}, capsys)
    assert code == 0 and result["healthy"] is False and result["changed"] is False
    code, result = run_module(vllm_endpoint, args, capsys)
    assert code == 1
    assert (
        result["msg"]
        == "the endpoint does not serve (no answer to a one-token completion within 2 s)"
    )


def test_a_restart_between_two_calls_is_seen_through_the_baseline(endpoint, monkeypatch):
    """The start's wait polls in short calls: each judges against the first call's states."""
    monkeypatch.setattr(vllm_endpoint, "docker", FakeDocker)
    endpoint.health = 503
    first = vllm_endpoint.wait(
        params(endpoint.url, timeout=1, watch=["vllm"]),
        FakeDocker([{"running": True, "started": "t0"}]),
    )
    assert first["states"] == {"vllm": {"running": True, "restarts": 0, "started_at": "t0"}}
    later = FakeDocker([{"running": True, "started": "t1", "restarts": 1}])
    result = vllm_endpoint.wait(
        params(endpoint.url, timeout=60, watch=["vllm"], baseline=first["states"]), later
    )
    assert result["reason"] == "vllm restarted"


def test_logs_since_come_back_with_dockers_timestamps(monkeypatch):
    monkeypatch.setattr(vllm_endpoint, "docker", FakeDocker)
    client = FakeDocker([{"running": True, "started": "t0"}], logs="2026-12-01T10:00:01Z a\nb\n")
    logs = vllm_endpoint._logs_since(client, ["vllm"], 1796119200.7)
    assert logs == {"vllm": ["2026-12-01T10:00:01Z a", "b"]}
    assert client.log_calls == [{"timestamps": True, "since": 1796119200}]


def test_logs_from_the_start_ask_docker_for_no_since(monkeypatch):
    # The Docker SDK refuses since=0 ("since value should be datetime or positive int"): the
    # start's wait asks for every line with 0, which must reach Docker as no since at all.
    monkeypatch.setattr(vllm_endpoint, "docker", FakeDocker)
    client = FakeDocker([{"running": True, "started": "t0"}], logs="2026-12-01T10:00:01Z a\n")
    assert vllm_endpoint._logs_since(client, ["vllm"], 0.0) == {"vllm": ["2026-12-01T10:00:01Z a"]}
    assert client.log_calls == [{"timestamps": True}]


def test_logs_never_come_from_before_the_containers_current_run(monkeypatch):
    # A rollback starts the previous container again: its log still holds the earlier run,
    # up to "Application startup complete", which must not count as this start's progress.
    monkeypatch.setattr(vllm_endpoint, "docker", FakeDocker)
    client = FakeDocker([{"running": True, "started": "t0"}], logs="2026-12-01T10:17:22Z a\n")
    states = {"vllm": {"running": True, "restarts": 0,
                       "started_at": "2026-12-01T10:17:22.620377508Z"}}  # fmt: skip
    vllm_endpoint._logs_since(client, ["vllm"], 0.0, states)
    vllm_endpoint._logs_since(client, ["vllm"], 1796120300.0, states)
    vllm_endpoint._logs_since(client, ["vllm"], 1796124000.0, states)
    run = 1796120242  # 2026-12-01T10:17:22Z
    assert client.log_calls == [
        {"timestamps": True, "since": run},
        {"timestamps": True, "since": 1796120300},
        {"timestamps": True, "since": 1796124000},
    ]
    # Docker's "never started" time is no start at all.
    never = {"vllm": {"started_at": "0001-01-01T00:00:00Z"}}
    vllm_endpoint._logs_since(client, ["vllm"], 0.0, never)
    assert client.log_calls[-1] == {"timestamps": True}
