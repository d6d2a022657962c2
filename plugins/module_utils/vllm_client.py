# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one client of vLLM's OpenAI-compatible endpoint: builds the requests, reads the answers.

Standard library only, so every caller shares it: the modules, the head's watchdog
(``roles/vllm_serve/files/dgx_spark_watchdog.py``, which runs in the serving image with this
file and ``vllm_health.py`` beside it) and the simulated pair's tests and benchmarks (which
load it by path). The caller passes the opener that carries the requests: the modules
Ansible's ``open_url``, the others urllib's (the same few lines in each).

An HTTP error is an answer (its status and body); no answer at all (refused, timed out,
unreachable) is status 0 with the error's text as the body.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_health import (
        completion_ok,
    )
except ImportError:
    # Outside Ansible: the watchdog's directory on the head, where vllm_serve/tasks/watchdog.yml
    # installs this file and vllm_health.py side by side.
    from vllm_health import completion_ok

DEFAULT_URL = "http://127.0.0.1:8000"

# The options of every task that asks the endpoint, one default each: the argument spec of
# the vllm_endpoint and vllm_endpoint_info modules and of the vllm_start_wait action, as
# plugins/doc_fragments/vllm_endpoint.py documents it (a unit test holds the two together).
ENDPOINT_OPTIONS: dict[str, dict] = {
    "url": {"type": "str", "default": DEFAULT_URL},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "model": {"type": "str"},
    "completion": {"type": "bool", "default": True},
    "prompt": {"type": "str", "default": "Hello"},
    # A count of tokens, not a secret.
    "max_tokens": {"type": "int", "default": 1, "no_log": False},
    "request_timeout": {"type": "int", "default": 60},
}


def parse(raw: bytes) -> Any:
    """A body as JSON when it is a JSON object or list, else as text."""
    text = raw.decode("utf-8", "replace")
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def detail(answer: Any, limit: int = 200) -> str:
    """What an error answer says, short: the message of vLLM's ``{"error": {"message": ...}}``
    (older releases: ``{"object": "error", "message": ...}``), FastAPI's ``detail``, or the text."""
    if isinstance(answer, dict):
        error = answer.get("error", answer)
        if isinstance(error, dict):
            error = error.get("message") or error.get("detail") or error
        answer = error if isinstance(error, str) else json.dumps(error)
    return str(answer).strip()[:limit]


def problem(status: int, answer: Any) -> str:
    """Why a request got no good answer: 'no answer (...)' or 'HTTP 401: ...'."""
    if status == 0:
        return f"no answer ({answer})"
    said = detail(answer)
    return f"HTTP {status}: {said}" if said else f"HTTP {status}"


@dataclass
class Completion:
    """One completion's outcome. ``ok``: at least one token came back; else ``reason`` says why."""

    ok: bool
    status: int = 0
    text: str = ""
    reason: str = ""
    latency_ms: float | None = None
    usage: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "status": self.status, "text": self.text, "reason": self.reason,
                "latency_ms": self.latency_ms, "usage": dict(self.usage)}  # fmt: skip


def judge_completion(status: int, answer: Any, latency_ms: float | None = None) -> Completion:
    """A completion answer read: its text and token counts, or why it does not prove serving."""
    usage = (answer.get("usage") or {}) if isinstance(answer, dict) else {}
    done = Completion(False, status, latency_ms=latency_ms, usage=dict(usage))
    if status != 200:
        done.reason = problem(status, answer)
    elif not isinstance(answer, dict):
        done.reason = "the completion's answer is not JSON"
    elif not completion_ok(status, answer):
        done.reason = "the completion's answer holds no token"
    else:
        first = answer["choices"][0]
        done.ok = True
        done.text = str((first.get("text") if isinstance(first, dict) else "") or "")
    return done


class Client:
    """The endpoint at ``url`` (without ``/v1``), asked with ``api_key`` as a bearer token.

    ``opener`` takes the arguments of Ansible's ``open_url`` that matter here, ``(url, data=,
    headers=, method=, timeout=)``, and returns a response with ``status`` and ``read()``,
    raising ``urllib.error.HTTPError`` for an HTTP error (as ``open_url`` and urllib do);
    ``timeout`` is each request's, in seconds.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str = "",
        timeout: float = 30.0,
        *,
        opener: Callable,
    ):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.opener = opener

    def request(
        self,
        path: str,
        body: dict | None = None,
        timeout: float | None = None,
        method: str | None = None,
    ):
        """(status, answer): the answer parsed as JSON, else its text; status 0 and the error's
        text when nothing answered. Without ``method``, a body makes it a POST, else a GET."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            answer = self.opener(
                self.url + path,
                data=data,
                headers=headers,
                method=method or ("POST" if body is not None else "GET"),
                timeout=self.timeout if timeout is None else timeout,
            )
            with answer:
                return int(answer.status), parse(answer.read())
        except urllib.error.HTTPError as exc:
            try:
                raw = exc.read() or b""
            except (OSError, ValueError):
                raw = b""
            return int(exc.code), parse(raw)
        except Exception as exc:  # refused, timed out, TLS, Ansible's ConnectionError: no answer
            return 0, str(exc) or type(exc).__name__

    def health(self, timeout: float | None = None) -> tuple[int, str]:
        """(status, why not): ``/health`` answers 200 once the engine is up; ``why not`` is
        empty then."""
        status, answer = self.request("/health", timeout=timeout)
        return status, "" if status == 200 else problem(status, answer)

    def models(self, timeout: float | None = None) -> tuple[list[dict], str]:
        """(the entries of ``/v1/models``, why none): each with ``id``, ``root`` (the model's
        path) and ``max_model_len``."""
        status, answer = self.request("/v1/models", timeout=timeout)
        if status != 200:
            return [], problem(status, answer)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            return [], "the answer of /v1/models holds no data"
        return [entry for entry in data if isinstance(entry, dict)], ""

    def complete(
        self, model: str, prompt: str = "ping", max_tokens: int = 1, timeout: float | None = None
    ) -> Completion:
        """A greedy completion (one token unless asked for more), timed."""
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        started = time.monotonic()
        status, answer = self.request("/v1/completions", body, timeout)
        latency = round((time.monotonic() - started) * 1000, 1)
        return judge_completion(status, answer, latency)

    def metrics(self, timeout: float | None = None) -> tuple[str | None, str]:
        """(the Prometheus text of ``/metrics``, why none)."""
        status, answer = self.request("/metrics", timeout=timeout)
        if status != 200:
            return None, problem(status, answer)
        return answer if isinstance(answer, str) else json.dumps(answer), ""
