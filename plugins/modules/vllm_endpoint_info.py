#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_endpoint_info
short_description: Ask a vLLM OpenAI endpoint once whether it serves, how fast, and how loaded
version_added: "0.1.0"
description:
  - In one task, asks a vLLM server for C(/health), C(/v1/models), a completion (timed) and
    C(/metrics), the latter twice around the completion so that token throughputs (which vLLM
    exports only as counters) become rates.
  - Asks once and never waits; RV(healthy) and RV(reason) make it the probe of a pair that
    should already serve. To wait until an endpoint serves, use
    M(dgx_spark.cluster.vllm_endpoint).
  - Never fails because the endpoint is down or answers badly; it reports what it saw, so a
    status report can list the problem. It fails only on bad arguments.
  - Sends only one tiny completion and reads; changes nothing, so RV(ignore:changed) is false.
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Only reads (and asks for one completion), so it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
extends_documentation_fragment:
  - dgx_spark.cluster.vllm_endpoint.address
  - dgx_spark.cluster.vllm_endpoint
options:
  completion:
    description:
      - Ask for the timed completion. Off, only health, models and metrics are read, and
        RV(healthy) follows C(/health) alone.
    type: bool
    default: true
  request_timeout:
    description: Seconds each request (health, models, the completion, each scrape) may take.
    type: int
    default: 60
    aliases: [timeout]
  metrics:
    description: Read C(/metrics). Off, RV(metrics) is empty (a probe needs none).
    type: bool
    default: true
  metrics_interval:
    description:
      - Seconds at least between the two C(/metrics) scrapes the throughputs are computed over.
      - 0 scrapes once and reports no throughput.
    type: float
    default: 1.0
seealso:
  - module: dgx_spark.cluster.vllm_endpoint
"""

EXAMPLES = r"""
- name: Ask the head's endpoint how it is
  dgx_spark.cluster.vllm_endpoint_info:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_serve_api_key }}"
    model: "{{ vllm_serve_served_model_name }}"
  register: endpoint

- name: Ask the running pair for one token, once
  dgx_spark.cluster.vllm_endpoint_info:
    api_key: "{{ vllm_serve_api_key }}"
    model: "{{ vllm_serve_served_model_name }}"
    request_timeout: 30
    metrics: false
  register: probe

- name: Restart when it does not serve
  ansible.builtin.debug:
    msg: "the pair does not serve: {{ probe.reason }}"
  when: not probe.healthy
"""

RETURN = r"""
healthy:
  description:
    - C(/health) answered 200 and, with O(completion), the completion brought back a token.
  returned: always
  type: bool
reason:
  description: Why RV(healthy) is false; empty when it is true.
  returned: always
  type: str
  sample: "the completion failed: no answer (timed out)"
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
      C(max_model_len); C(error) alone when C(/v1/models) did not answer.
  returned: always
  type: dict
  sample: {id: tiny-qwen3-moe, root: /var/lib/dgx-spark/models/tiny-qwen3-moe, max_model_len: 512}
completion:
  description:
    - The completion; C(latency_ms) from request to full answer, C(text) what came back.
    - C(error) says why it failed; V(not asked) without O(completion) or while C(/health) fails.
  returned: always
  type: dict
  sample: {ok: true, status: 200, text: " Paris", latency_ms: 61.2, prompt_tokens: 2,
           completion_tokens: 1, error: null}
metrics:
  description:
    - Running and waiting requests, KV-cache usage (C(kv_cache_usage) 0..1 and
      C(kv_cache_usage_pct)), prompt and generation token counters since start and their
      rates over C(interval_s) (C(prompt_tokens_per_s), C(generation_tokens_per_s); the
      completion's own tokens excluded).
    - Requests since start by how they ended, C(requests_finished) (stop, length),
      C(requests_aborted) and C(requests_errored), and vLLM's own split by C(finished_reason)
      in C(requests_by_reason).
    - Empty with C(error) set when C(/metrics) could not be read; empty without O(metrics).
  returned: always
  type: dict
"""

# Ansible's layout puts the documentation before the imports, hence the noqa: E402.
import functools  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.urls import open_url  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (  # noqa: E402
    vllm_client,
    vllm_metrics,
)

# The endpoint's options (shared with vllm_endpoint and the vllm_start_wait action), then this
# module's own. ``timeout`` is this module's earlier name of request_timeout.
ARGUMENT_SPEC = {
    **vllm_client.ENDPOINT_OPTIONS,
    "request_timeout": {**vllm_client.ENDPOINT_OPTIONS["request_timeout"], "aliases": ["timeout"]},
    "metrics": {"type": "bool", "default": True},
    "metrics_interval": {"type": "float", "default": 1.0},
}


def _scrape(endpoint, model):
    text, error = endpoint.metrics()
    if text is None:
        return None, error
    try:
        return vllm_metrics.summarize(text, model or None), None
    except vllm_metrics.MetricsError as exc:
        return None, str(exc)


def _completion(endpoint, params: dict, model: str) -> dict:
    answer = endpoint.complete(model, params["prompt"], params["max_tokens"])
    return {
        "ok": answer.ok,
        "status": answer.status or None,
        "text": answer.text,
        "latency_ms": answer.latency_ms,
        "prompt_tokens": answer.usage.get("prompt_tokens"),
        "completion_tokens": answer.usage.get("completion_tokens"),
        "error": answer.reason or None,
    }


def read(params: dict, opener) -> dict:
    """Everything the module returns but ``changed``: each request once, in order."""
    endpoint = vllm_client.Client(
        params["url"], params["api_key"], params["request_timeout"], opener=opener
    )
    status, why = endpoint.health()
    health = {"ok": status == 200, "status": status or None, "error": why or None}

    models, model = [], {}
    if health["ok"]:
        entries, error = endpoint.models()
        models = [entry.get("id") for entry in entries]
        wanted = params["model"] or (models[0] if models else "")
        for entry in entries:
            if entry.get("id") == wanted:
                model = {k: entry.get(k) for k in ("id", "root", "max_model_len")}
        if error:
            model = {"error": error}

    before, metrics_error, before_at = None, None, time.monotonic()
    if params["metrics"]:
        before, metrics_error = _scrape(endpoint, params["model"])

    completion = {"ok": False, "latency_ms": None, "error": "not asked"}
    if params["completion"] and health["ok"]:
        completion = _completion(endpoint, params, params["model"] or model.get("id") or "")

    metrics = {}
    if before is not None:
        metrics = dict(before)
        if params["metrics_interval"] > 0:
            remaining = params["metrics_interval"] - (time.monotonic() - before_at)
            if remaining > 0:
                time.sleep(remaining)
            after_at = time.monotonic()
            after, metrics_error = _scrape(endpoint, params["model"])
            if after is not None:
                probe = completion if completion.get("ok") else None
                metrics = dict(after)
                metrics.update(vllm_metrics.throughput(before, after, after_at - before_at, probe))
    if metrics_error:
        metrics["error"] = metrics_error

    reason = ""
    if not health["ok"]:
        reason = f"/health: {health['error']}"
    elif params["completion"] and not completion["ok"]:
        reason = f"the completion failed: {completion['error']}"
    return {
        "healthy": not reason,
        "reason": reason,
        "health": health,
        "models": models,
        "model": model,
        "completion": completion,
        "metrics": metrics,
    }


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    # http on loopback by default; a https URL may carry the node's own certificate.
    opener = functools.partial(open_url, validate_certs=False)
    module.exit_json(changed=False, **read(module.params, opener))


if __name__ == "__main__":
    main()
