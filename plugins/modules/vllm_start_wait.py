#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_start_wait
short_description: Wait for a vLLM start, showing its phases, and judge it by stalls
version_added: "0.1.0"
description:
  - An action, run on the controller, that polls the node in short calls of
    M(dgx_spark.cluster.vllm_endpoint), which asks the endpoint, watches the serving
    containers O(watch) and returns their new log lines.
  - From vLLM's own log lines it knows the start's phase (waiting for the peers and Ray's
    GPUs, loading weights with each rank's shards done of total and the rate, compiling and
    capturing, the KV cache sized, the API server starting, serving) and prints a line on the
    controller at each new phase or step and at least every O(report_every) seconds. Under
    vLLM's Ray executor the worker ranks' lines come through the driver's log, each rank named
    by its address.
  - The start fails when its logs show no progress for O(stall_timeout) seconds, naming the
    phase it stalled in, or when it has not served after O(timeout) seconds however it
    progresses; it fails at once when a watched container exits or restarts, with vLLM's
    reason.
  - Run on several nodes at once (vLLM's multinode launcher, each node watching its own
    rank), the nodes share O(group); the O(leader)'s verdict ends the others' waits.
  - Changes nothing, so it always reports RV(ignore:changed=false).
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  action:
    support: full
    description: Runs on the controller; the node runs M(dgx_spark.cluster.vllm_endpoint).
  check_mode:
    support: full
    description: Only reads, so it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
requirements:
  - Docker SDK for Python (the C(docker) package) on the node.
extends_documentation_fragment:
  - dgx_spark.cluster.vllm_endpoint.address
  - dgx_spark.cluster.vllm_endpoint
options:
  watch:
    description: The serving containers on this node whose logs show the start.
    type: list
    elements: str
    default: []
  stall_timeout:
    description: Seconds without progress in the logs after which the start has failed.
    type: int
    default: 900
  timeout:
    description: Seconds after which a start that has not served has failed, however it progresses.
    type: int
    default: 3600
  poll:
    description: Seconds of one call on the node (the logs are read after each).
    type: int
    default: 10
  report_every:
    description: Seconds after which the current phase is printed again although nothing changed.
    type: int
    default: 60
  group:
    description: Names one start watched from several nodes; empty for a single node.
    type: str
    default: ""
  leader:
    description: This node's verdict ends the other nodes' waits in O(group) (the head's).
    type: bool
    default: true
  fail_on_unhealthy:
    description: Fail the task when the endpoint does not serve; off, only report.
    type: bool
    default: true
seealso:
  - module: dgx_spark.cluster.vllm_endpoint
"""

EXAMPLES = r"""
- name: Wait for the pair to serve, showing the start's progress
  dgx_spark.cluster.vllm_start_wait:
    url: http://127.0.0.1:8000
    model: Qwen3.5-122B-A10B-FP8
    api_key: "{{ vllm_serve_api_key }}"
    watch: [dgx-spark-vllm]
    stall_timeout: 900
    timeout: 3600
    fail_on_unhealthy: false
  register: _serving
"""

RETURN = r"""
seconds:
  description: Seconds from the start of the wait to its verdict.
  returned: always
  type: float
  sample: 74.2
healthy:
  description: The endpoint answered C(/health) and, with O(completion), a completion.
  returned: always
  type: bool
reason:
  description: Why the start does not serve (a stall names its phase); empty when RV(healthy).
  returned: always
  type: str
  sample: "the start stalled while loading weights: 10.0.0.2 1/2 shards: no progress in the
    logs for 900 s (vllm_serve_start_stall_timeout is 900 s)"
excerpt:
  description: vLLM's own words from the log of a container that stopped, trimmed.
  returned: always
  type: str
phase:
  description: The phase the start last reached (V(starting), V(peers), V(weights),
    V(compile), V(kv_cache), V(server), V(serving)).
  returned: always
  type: str
  sample: weights
progress:
  description: The progress lines the wait printed, in order (the last is V(serving) when it
    served).
  returned: always
  type: list
  elements: str
  sample: ["vLLM start, 0m40s: loading weights: 10.0.0.2 1/2 shards", "vLLM start, 1m02s: serving"]
stalled:
  description: The start ended because its logs showed no progress for O(stall_timeout).
  returned: when the start stalled or reached O(timeout)
  type: bool
text:
  description: The completion's text, when one came back.
  returned: always
  type: str
"""
