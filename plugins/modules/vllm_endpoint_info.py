#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_endpoint_info
short_description: Ask a vLLM OpenAI endpoint whether it serves, how fast, and how loaded
version_added: "0.1.0"
description:
  - In one task, asks a vLLM server for C(/health), C(/v1/models), a one-token completion
    (timed) and C(/metrics), the latter twice around the completion so that token
    throughputs (which vLLM exports only as counters) become rates.
  - Never fails because the endpoint is down or answers badly; it reports what it saw, so a
    status report can list the problem. It fails only on bad arguments.
  - Sends only one tiny completion and reads; changes nothing, so RV(ignore:changed) is false.
author:
  - dgx_spark.cluster developers (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Only reads (and asks for one token), so it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
options:
  url:
    description: Base URL of the server, without C(/v1).
    type: str
    default: http://127.0.0.1:8000
  api_key:
    description:
      - The server's API key (C(vllm_serve_api_key)); sent as a bearer token to C(/v1) routes.
    type: str
    default: ""
  model:
    description:
      - Served model name to ask for the completion; empty takes the first model of C(/v1/models).
    type: str
    default: ""
  prompt:
    description: Prompt of the one-token completion.
    type: str
    default: Hello
  completion:
    description: Ask for the timed completion. Off, only health, models and metrics are read.
    type: bool
    default: true
  metrics_interval:
    description:
      - Seconds at least between the two C(/metrics) scrapes the throughputs are computed over.
      - 0 scrapes once and reports no throughput.
    type: float
    default: 1.0
  timeout:
    description: Seconds each request may take.
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: Ask the head's endpoint how it is
  dgx_spark.cluster.vllm_endpoint_info:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_serve_api_key }}"
    model: "{{ vllm_serve_served_model_name }}"
  register: endpoint
  no_log: true
"""

RETURN = r"""
health:
  description: C(/health) answer.
  returned: always
  type: dict
  sample: {ok: true, status: 200, error: null}
models:
  description: IDs of the served models.
  returned: always
  type: list
  elements: str
  sample: [tiny-qwen3-moe]
model:
  description:
    - The asked (or first) model of C(/v1/models) with its C(root) (the model path) and
      C(max_model_len).
  returned: always
  type: dict
  sample: {id: tiny-qwen3-moe, root: /var/lib/dgx-spark/models/tiny-qwen3-moe, max_model_len: 512}
completion:
  description: The one-token completion; C(latency_ms) from request to full answer.
  returned: always
  type: dict
  sample: {ok: true, latency_ms: 61.2, prompt_tokens: 2, completion_tokens: 1, error: null}
metrics:
  description:
    - Running and waiting requests, KV-cache usage (C(kv_cache_usage) 0..1 and
      C(kv_cache_usage_pct)), prompt and generation token counters since start and their
      rates over C(interval_s) (C(prompt_tokens_per_s), C(generation_tokens_per_s); the
      completion's own tokens excluded).
    - Requests since start by how they ended, C(requests_finished) (stop, length),
      C(requests_aborted) and C(requests_errored), and vLLM's own split by C(finished_reason)
      in C(requests_by_reason).
    - Empty with C(error) set when C(/metrics) could not be read.
  returned: always
  type: dict
"""

# Ansible's layout puts the documentation before the imports, hence the noqa: E402.
import contextlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.urls import open_url  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (  # noqa: E402
    vllm_metrics,
)


def _request(url, timeout, headers=None, body=None):
    """(status, text, error): HTTP errors and refused connections are answers, not failures."""
    data = None if body is None else json.dumps(body).encode()
    all_headers = dict(headers or {})
    if body is not None:
        all_headers["Content-Type"] = "application/json"
    try:
        response = open_url(
            url,
            data=data,
            headers=all_headers,
            method="POST" if body is not None else "GET",
            timeout=timeout,
            validate_certs=False,
        )
        return response.getcode(), response.read().decode("utf-8", "replace"), None
    except Exception as exc:  # HTTPError, URLError, timeouts: all mean "not serving well"
        status = getattr(exc, "code", None)
        detail = str(exc)
        if hasattr(exc, "read"):
            # The body is only a detail of the message.
            with contextlib.suppress(Exception):
                detail = f"{detail}: {exc.read().decode('utf-8', 'replace')[:200]}"
        return status, "", detail


def _scrape(base, timeout, model, headers):
    status, text, error = _request(f"{base}/metrics", timeout, headers=headers)
    if error or status != 200:
        return None, error or f"HTTP {status}"
    try:
        return vllm_metrics.summarize(text, model or None), None
    except vllm_metrics.MetricsError as exc:
        return None, str(exc)


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "default": "http://127.0.0.1:8000"},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "model": {"type": "str", "default": ""},
            "prompt": {"type": "str", "default": "Hello"},
            "completion": {"type": "bool", "default": True},
            "metrics_interval": {"type": "float", "default": 1.0},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    params = module.params
    base = params["url"].rstrip("/")
    timeout = params["timeout"]
    auth = {"Authorization": f"Bearer {params['api_key']}"} if params["api_key"] else {}

    status, _body, error = _request(f"{base}/health", timeout)
    health = {"ok": status == 200 and not error, "status": status, "error": error}

    models, model = [], {}
    if health["ok"]:
        status, text, error = _request(f"{base}/v1/models", timeout, headers=auth)
        if status == 200:
            try:
                data = json.loads(text).get("data") or []
            except ValueError:
                data = []
            models = [m.get("id") for m in data]
            wanted = params["model"] or (models[0] if models else "")
            for entry in data:
                if entry.get("id") == wanted:
                    model = {k: entry.get(k) for k in ("id", "root", "max_model_len")}
        else:
            model = {"error": error or f"HTTP {status}"}

    before_at = time.monotonic()
    before, metrics_error = _scrape(base, timeout, params["model"], auth)

    completion = {"ok": False, "latency_ms": None, "error": "not asked"}
    if params["completion"] and health["ok"]:
        body = {
            "model": params["model"] or model.get("id") or "",
            "prompt": params["prompt"],
            "max_tokens": 1,
            "temperature": 0,
        }
        started = time.monotonic()
        status, text, error = _request(f"{base}/v1/completions", timeout, headers=auth, body=body)
        latency = (time.monotonic() - started) * 1000
        usage = {}
        if status == 200:
            try:
                usage = json.loads(text).get("usage") or {}
            except ValueError:
                error = "the completion's answer is not JSON"
        completion = {
            "ok": status == 200 and not error and usage.get("completion_tokens", 0) >= 1,
            "status": status,
            "latency_ms": round(latency, 1),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "error": error or (None if status == 200 else f"HTTP {status}"),
        }

    metrics = {}
    if before is not None:
        metrics = dict(before)
        if params["metrics_interval"] > 0:
            remaining = params["metrics_interval"] - (time.monotonic() - before_at)
            if remaining > 0:
                time.sleep(remaining)
            after_at = time.monotonic()
            after, metrics_error = _scrape(base, timeout, params["model"], auth)
            if after is not None:
                probe = completion if completion.get("ok") else None
                metrics = dict(after)
                metrics.update(vllm_metrics.throughput(before, after, after_at - before_at, probe))
    if metrics_error:
        metrics["error"] = metrics_error

    module.exit_json(
        changed=False,
        health=health,
        models=models,
        model=model,
        completion=completion,
        metrics=metrics,
    )


if __name__ == "__main__":
    main()
