#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_endpoint
short_description: Wait until a vLLM endpoint serves, or learn why it does not
version_added: "0.1.0"
description:
  - Polls the endpoint on the node it runs on until C(/health) answers 200 and, with
    O(completion), a completion comes back; only then is RV(healthy) true.
  - It only waits. To ask the endpoint once (a probe of a pair that already serves), use
    M(dgx_spark.cluster.vllm_endpoint_info).
  - Watches the serving containers of this node (O(watch)) while it waits. When one of them
    exits, restarts or disappears, vLLM refused its settings or crashed, so it stops waiting
    at once and returns vLLM's own reason from the container's log (RV(excerpt)).
  - Changes nothing, so it always reports RV(ignore:changed=false).
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Only reads, so it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
requirements:
  - Docker SDK for Python (the C(docker) package) on the node, when O(watch) is not empty.
extends_documentation_fragment:
  - dgx_spark.cluster.vllm_endpoint.address
  - dgx_spark.cluster.vllm_endpoint
options:
  timeout:
    description: Seconds to wait in all.
    type: int
    default: 300
  watch:
    description: Names of the serving containers on this node to watch while waiting.
    type: list
    elements: str
    default: []
  fail_on_unhealthy:
    description: Fail the task when the endpoint does not serve; off, only report.
    type: bool
    default: true
  baseline:
    description:
      - The states of the watched containers (RV(states) of an earlier call) to judge a
        restart or an exit against; by default their states when this call begins.
      - The C(dgx_spark.cluster.vllm_start_wait) action polls in short calls and passes the
        first call's states on, so a container that restarted between two calls is seen.
    type: dict
  logs_since:
    description:
      - With a value of 0 or more, also return the watched containers' log lines written
        since that time (seconds since the epoch, whole seconds), each with Docker's
        timestamp (RV(logs)). Lines from before a container's current run never come back
        (a container started again keeps its earlier run's log).
    type: float
    default: -1
"""

EXAMPLES = r"""
- name: Wait for the pair to serve, watching the head's serving container
  dgx_spark.cluster.vllm_endpoint:
    url: http://127.0.0.1:8000
    model: Qwen3.5-122B-A10B-FP8
    api_key: "{{ vllm_serve_api_key }}"
    watch: [dgx-spark-vllm]
    timeout: 1200
    fail_on_unhealthy: false
  register: _serving

- name: Wait up to 30 s for a first token of the smoke prompt
  dgx_spark.cluster.vllm_endpoint:
    model: tiny-qwen3-moe
    prompt: The capital of France is
    timeout: 30
"""

RETURN = r"""
healthy:
  description: The endpoint answered C(/health) and, with O(completion), a completion.
  returned: always
  type: bool
seconds:
  description: How long the module waited.
  returned: always
  type: float
reason:
  description: Why the endpoint does not serve; empty when RV(healthy).
  returned: always
  type: str
  sample: "dgx-spark-vllm exited"
excerpt:
  description: vLLM's own words from the log of a container that stopped, trimmed.
  returned: always
  type: str
  sample: "ValueError: max_model_len must be at least 1"
text:
  description: The completion's text, when one came back.
  returned: always
  type: str
timed_out:
  description: The call ended because O(timeout) passed, not for a reason of its own.
  returned: always
  type: bool
states:
  description: The watched containers' states the call judged against (see O(baseline)).
  returned: always
  type: dict
logs:
  description:
    - The watched containers' log lines since O(logs_since), by container, each starting with
      Docker's timestamp; empty unless O(logs_since) is 0 or more.
  returned: always
  type: dict
  sample: {"dgx-spark-vllm": ["2026-12-01T10:00:46.3Z (APIServer pid=1) INFO ..."]}
"""

# Ansible's layout puts the documentation before the imports, hence the noqa: E402.
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible.module_utils.urls import open_url  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (  # noqa: E402
    vllm_client,
    vllm_health,
    vllm_log,
)

try:
    import docker
except ImportError:
    docker = None

# The endpoint's options (shared with vllm_endpoint_info and the vllm_start_wait action), then
# this module's own.
ARGUMENT_SPEC = {
    **vllm_client.ENDPOINT_OPTIONS,
    "timeout": {"type": "int", "default": 300},
    "watch": {"type": "list", "elements": "str", "default": []},
    "fail_on_unhealthy": {"type": "bool", "default": True},
    "baseline": {"type": "dict"},
    "logs_since": {"type": "float", "default": -1},
}

# At most this many log lines come back from one call (a poll sees a few seconds of them).
LOG_LINES = 2000


def _states(client, names: list[str]) -> dict:
    states = {}
    for name in names:
        try:
            attrs = client.api.inspect_container(name)
        except docker.errors.NotFound:
            continue
        states[name] = {
            "running": bool(attrs["State"].get("Running")),
            "restarts": int(attrs.get("RestartCount") or 0),
            "started_at": attrs["State"].get("StartedAt", ""),
        }
    return states


def _log_excerpt(client, names: list[str]) -> str:
    parts = []
    for name in names:
        try:
            logs = client.api.logs(name, tail=400).decode("utf-8", "replace")
        except docker.errors.APIError:
            continue
        excerpt = vllm_health.error_excerpt(logs)
        if excerpt:
            parts.append(f"{name}: {excerpt}")
    return " || ".join(parts)


def _run_start(state: dict) -> int:
    """The whole second the container's current run started (0 when Docker does not say)."""
    try:
        return max(int(vllm_log.docker_time(state.get("started_at") or "")), 0)
    except ValueError:
        return 0


def _logs_since(client, names: list[str], since: float, states: dict | None = None) -> dict:
    """Each container's log lines since ``since``, and never from before its current run: a
    container started again (a rollback starts the previous one) keeps its earlier run's log,
    whose lines would tell an old start's progress as the new one's."""
    logs = {}
    for name in names:
        after = max(int(since), _run_start((states or {}).get(name) or {}))
        # The Docker SDK takes only a positive since: 0 (from the start) is no since at all.
        try:
            raw = client.api.logs(
                name, timestamps=True, tail=LOG_LINES, **({"since": after} if after > 0 else {})
            )
        except docker.errors.APIError:
            continue
        logs[name] = raw.decode("utf-8", "replace").splitlines()
    return logs


def wait(params: dict, client, opener=open_url) -> dict:
    """Poll until the endpoint serves, a watched container stops, or the timeout passes.

    ``client`` is Docker's (None: nothing watched); ``opener`` makes the HTTP requests."""
    endpoint = vllm_client.Client(params["url"], params["api_key"], opener=opener)
    started = time.monotonic()
    deadline = started + params["timeout"]
    before = params.get("baseline") or (_states(client, params["watch"]) if client else {})
    missing = sorted(set(params["watch"]) - set(before))
    result = {"healthy": False, "reason": "", "excerpt": "", "text": "", "states": before,
              "timed_out": False}  # fmt: skip
    if missing:
        result["reason"] = f"{', '.join(missing)} not found"
        return result
    while True:
        if client:
            failure = vllm_health.container_failure(before, _states(client, params["watch"]))
            if failure:
                result["reason"] = failure
                result["excerpt"] = _log_excerpt(client, params["watch"])
                return result
        remaining = deadline - time.monotonic()
        status = endpoint.health(max(1.0, min(5.0, remaining)))[0]
        if status == 200 and not params["completion"]:
            result["healthy"] = True
            return result
        if status == 200:
            budget = max(1.0, min(float(params["request_timeout"]), deadline - time.monotonic()))
            answer = endpoint.complete(
                params["model"], params["prompt"], params["max_tokens"], budget
            )
            if answer.ok:
                result["healthy"] = True
                result["text"] = answer.text
                return result
            if answer.status in (401, 403, 404):
                result["reason"] = f"the completion was refused with HTTP {answer.status}"
                return result
        if time.monotonic() >= deadline:
            what = "/health"
            if params["completion"]:
                what = "a one-token completion" if params["max_tokens"] == 1 else "a completion"
            result["reason"] = f"no answer to {what} within {params['timeout']} s"
            result["timed_out"] = True
            return result
        time.sleep(2)


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("completion", True, ("model",))],
        supports_check_mode=True,
    )
    if module.params["max_tokens"] < 1:
        module.fail_json(msg=f"max_tokens must be at least 1, got {module.params['max_tokens']}")
    client = None
    if module.params["watch"]:
        if docker is None:
            module.fail_json(msg=missing_required_lib("docker"))
        client = docker.from_env()
    started = time.monotonic()
    result = wait(module.params, client)
    result["seconds"] = round(time.monotonic() - started, 1)
    result["logs"] = {}
    if client and module.params["logs_since"] >= 0:
        result["logs"] = _logs_since(
            client,
            module.params["watch"],
            module.params["logs_since"],
            _states(client, module.params["watch"]),
        )
    if not result["healthy"] and module.params["fail_on_unhealthy"]:
        detail = f": {result['excerpt']}" if result["excerpt"] else ""
        module.fail_json(msg=f"the endpoint does not serve ({result['reason']}){detail}", **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
