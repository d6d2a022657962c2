"""vllm_client against a real HTTP server on loopback, through urllib and Ansible's open_url."""

from __future__ import annotations

import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible.module_utils.urls import open_url
from ansible_collections.dgx_spark.cluster.plugins.module_utils import vllm_client
from support.captures import tool_output
from support.http_stand_in import HttpStandIn

KEY = "test-key-0123"
METRICS = Path(__file__).resolve().parents[2] / "fixtures/operate/metrics_vllm_0.32_idle.txt"
# What vLLM and the role's auth middleware (roles/vllm_serve/files/dgx_spark_auth.py) answer.
UNAUTHORIZED = {"error": {"message": "Unauthorized", "type": "invalid_request_error", "code": 401}}
ENGINE_DEAD = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) "
                         "for the root cause.", "type": "InternalServerError", "param": None,
                         "code": 500}}  # fmt: skip
MODELS = {
    "object": "list",
    "data": [
        {"id": "tiny-qwen3-moe", "root": "/var/lib/dgx-spark/models/tiny", "max_model_len": 512}
    ],
}


class StandIn(HttpStandIn):
    """A vLLM stand-in: routes behind the key as vLLM's are, answers the test may change, and
    a record of every request (method, path, headers, JSON body)."""

    def __init__(self):
        self.routes: dict[str, tuple[int, object, str]] = {
            "/health": (200, "", "text/plain"),
            "/v1/models": (200, MODELS, "application/json"),
            "/metrics": (200, tool_output(METRICS), "text/plain"),
            "/v1/completions": (200, {"choices": [{"text": " Paris"}], "usage": {
                "prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}},
                "application/json"),
        }  # fmt: skip
        self.public = {"/health", "/metrics"}
        self.delay = 0.0
        super().__init__(self._respond)
        self.seen = self.requests

    def _respond(self, _method, path, headers, _body):
        time.sleep(self.delay)
        status, body, kind = self.routes.get(
            path, (404, {"detail": "Not Found"}, "application/json")
        )
        if path not in self.public and headers.get("Authorization") != f"Bearer {KEY}":
            status, body, kind = 401, UNAUTHORIZED, "application/json"
        return status, body, kind


@pytest.fixture
def vllm():
    stand_in = StandIn()
    yield stand_in
    stand_in.close()


def urllib_open(url, data=None, headers=None, method=None, timeout=30.0):
    """The opener of the callers outside Ansible (the watchdog, the drills) as they write it."""
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    return urllib.request.urlopen(request, timeout=timeout)


# Every test runs with both openers: urllib outside Ansible, open_url in the modules.
@pytest.fixture(params=[urllib_open, open_url], ids=["urllib", "open_url"])
def opener(request):
    return request.param


def client(vllm, opener, key=KEY, **options):
    return vllm_client.Client(vllm.url + "/", key, opener=opener, **options)


def test_a_completion_is_asked_greedily_with_the_key(vllm, opener):
    answer = client(vllm, opener).complete("tiny-qwen3-moe", "The capital of France is")
    assert answer.ok and answer.text == " Paris" and answer.reason == ""
    assert answer.status == 200 and answer.usage["completion_tokens"] == 1
    assert answer.latency_ms is not None and answer.latency_ms >= 0
    [seen] = vllm.seen
    assert (seen["method"], seen["path"]) == ("POST", "/v1/completions")
    assert seen["headers"]["Authorization"] == f"Bearer {KEY}"
    assert seen["headers"]["Content-Type"] == "application/json"
    assert seen["body"] == {"model": "tiny-qwen3-moe", "prompt": "The capital of France is",
                            "max_tokens": 1, "temperature": 0}  # fmt: skip


def test_more_tokens_can_be_asked(vllm, opener):
    vllm.routes["/v1/completions"] = (200, {"choices": [{"text": " Paris."}],
                                            "usage": {"completion_tokens": 2}},
                                      "application/json")  # fmt: skip
    answer = client(vllm, opener).complete("m", "p", max_tokens=8)
    assert answer.ok and answer.text == " Paris."
    assert vllm.seen[0]["body"]["max_tokens"] == 8


def test_without_a_key_no_authorization_is_sent(vllm, opener):
    answer = client(vllm, opener, key="").complete("m")
    assert not answer.ok and answer.status == 401
    assert answer.reason == "HTTP 401: Unauthorized"
    assert "Authorization" not in vllm.seen[0]["headers"]


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (
            500,
            ENGINE_DEAD,
            "HTTP 500: EngineCore encountered an issue. See stack trace (above) "
            "for the root cause.",
        ),  # fmt: skip
        (404, {"detail": "Not Found"}, "HTTP 404: Not Found"),
        # vLLM before its {"error": {...}} answers.
        (
            400,
            {"object": "error", "message": "max_tokens must be at least 1", "code": 400},
            "HTTP 400: max_tokens must be at least 1",
        ),
        (503, "", "HTTP 503"),
        (
            200,
            {"choices": [{"text": ""}], "usage": {"completion_tokens": 0}},
            "the completion's answer holds no token",
        ),
        (
            200,
            {"choices": [], "usage": {"completion_tokens": 1}},
            "the completion's answer holds no token",
        ),
        (200, "plain text", "the completion's answer is not JSON"),
    ],
)
def test_a_completion_that_proves_nothing_says_why(vllm, opener, status, body, reason):
    kind = "application/json" if isinstance(body, dict) else "text/plain"
    vllm.routes["/v1/completions"] = (status, body, kind)
    answer = client(vllm, opener).complete("m")
    assert (answer.ok, answer.status, answer.text, answer.reason) == (False, status, "", reason)


def test_health_needs_no_key_and_says_why_not(vllm, opener):
    assert client(vllm, opener, key="").health() == (200, "")
    vllm.routes["/health"] = (503, "", "text/plain")
    assert client(vllm, opener).health() == (503, "HTTP 503")
    assert [s["method"] for s in vllm.seen] == ["GET", "GET"]


def test_models_are_the_entries_of_v1_models(vllm, opener):
    entries, error = client(vllm, opener).models()
    assert error == "" and entries == MODELS["data"]
    assert client(vllm, opener, key="wrong").models() == ([], "HTTP 401: Unauthorized")
    vllm.routes["/v1/models"] = (200, {"object": "list"}, "application/json")
    assert client(vllm, opener).models() == ([], "the answer of /v1/models holds no data")
    vllm.routes["/v1/models"] = (404, {"detail": "Not Found"}, "application/json")
    assert client(vllm, opener).models() == ([], "HTTP 404: Not Found")


def test_metrics_come_back_as_text(vllm, opener):
    text, error = client(vllm, opener).metrics()
    assert error == "" and text == tool_output(METRICS)
    vllm.routes["/metrics"] = (500, "boom", "text/plain")
    assert client(vllm, opener).metrics() == (None, "HTTP 500: boom")


def test_request_returns_json_parsed_and_text_as_text(vllm, opener):
    endpoint = client(vllm, opener)
    assert endpoint.request("/v1/models") == (200, MODELS)
    status, text = endpoint.request("/metrics")
    assert status == 200 and text.startswith("# HELP")
    assert endpoint.request("/health") == (200, "")


def test_any_method_can_be_asked(vllm, opener):
    status, answer = client(vllm, opener, key="").request("/v1/models", method="DELETE")
    assert (status, answer) == (401, UNAUTHORIZED)
    status, _answer = client(vllm, opener).request("/v1/completions", {}, method="PUT")
    assert status == 200
    assert [s["method"] for s in vllm.seen] == ["DELETE", "PUT"]
    assert vllm.seen[1]["body"] == {}


def test_nothing_listening_is_status_zero_with_the_error(opener):
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as closed:
        url = f"http://127.0.0.1:{closed.server_address[1]}"
    endpoint = vllm_client.Client(url, KEY, timeout=2, opener=opener)
    status, why = endpoint.health()
    assert status == 0 and why.startswith("no answer (") and "refused" in why.lower(), why
    answer = endpoint.complete("m")
    assert not answer.ok and answer.status == 0 and answer.reason.startswith("no answer (")


def test_a_request_past_its_timeout_is_no_answer(vllm, opener):
    vllm.delay = 1.5
    started = time.monotonic()
    answer = client(vllm, opener, timeout=30).complete("m", timeout=0.3)
    assert time.monotonic() - started < 1.4
    assert not answer.ok and answer.status == 0
    assert "timed out" in answer.reason, answer.reason


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"error": {"message": "Unauthorized"}}, "Unauthorized"),
        ({"error": "Unauthorized"}, "Unauthorized"),
        ({"detail": "Not Found"}, "Not Found"),
        ({"error": {"code": 500}}, '{"code": 500}'),
        ("  text\n", "text"),
        ("x" * 300, "x" * 200),
    ],
)
def test_detail_is_the_short_word_of_an_error(answer, expected):
    assert vllm_client.detail(answer) == expected
