#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_soak
short_description: Keep a vLLM endpoint under streamed load for minutes and judge its stalls
version_added: "0.1.0"
description:
  - Opens O(streams) concurrent streams against a vLLM OpenAI-compatible endpoint; each asks
    for streamed completions of exactly O(max_tokens) tokens, one after the other, until
    O(minutes) have passed, and records when every token arrived.
  - Stops early when no token has arrived on any stream for longer than O(stall_s) (a wedged
    collective between the ranks shows that way), and reports that stall.
  - Never fails because of what the endpoint does; RV(passed) and RV(msg) carry the verdict,
    so the caller can print the per-minute figures before it fails. It fails only on bad
    arguments, naming the option and its range.
  - Puts load on the endpoint but changes nothing, so RV(ignore:changed) is false.
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Only asks for completions, so it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
extends_documentation_fragment:
  - dgx_spark.cluster.vllm_endpoint.address
options:
  model:
    description: Served model name the completions ask for.
    type: str
    required: true
  minutes:
    description: Whole minutes the load lasts (1 to 1440).
    type: int
    required: true
  stall_s:
    description:
      - Whole seconds without a token on any stream that fail the soak (1 to 3600).
    type: int
    required: true
  streams:
    description: Concurrent streams (1 to 64), each one request at a time.
    type: int
    default: 4
  max_tokens:
    description:
      - Tokens each completion generates (end-of-sequence ignored), so a stream asks again
        every O(max_tokens) tokens. Keep prompt and output within the served context length.
    type: int
    default: 256
  prompt:
    description: Prompt of every completion.
    type: str
    default: Tell a long story about two computers that share one large model.
seealso:
  - module: dgx_spark.cluster.vllm_endpoint_info
"""

EXAMPLES = r"""
- name: Keep the endpoint busy for half an hour, failing on a stall over a minute
  dgx_spark.cluster.vllm_soak:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_serve_api_key }}"
    model: "{{ vllm_serve_served_model_name }}"
    minutes: 30
    stall_s: 60
    streams: 8
  register: soak

- name: Print tokens/s per minute and the longest stall
  ansible.builtin.debug:
    msg: "{{ soak.table }}"

- name: Fail on a stall
  ansible.builtin.assert:
    that: soak.passed
    fail_msg: "{{ soak.msg }}"
"""

RETURN = r"""
passed:
  description: No stall longer than O(stall_s) for the whole of O(minutes).
  returned: always
  type: bool
msg:
  description:
    - The verdict in one line; on a failure the stall's start (UTC), how long it lasted,
      which streams were waiting on a request and the last request error meanwhile.
  returned: always
  type: str
  sample: >-
    soak failed: stall of at least 12.0 s, still stalled when the soak stopped (no token on
    any stream) from 2026-12-04 16:03:12 UTC, 31.4 s into the soak; limit soak_stall_s 10 s;
    streams 1, 2, 3, 4 waiting on a request
minutes:
  description: Tokens and tokens/s of each minute since the start (the last may be shorter).
  returned: always
  type: list
  elements: dict
  sample: [{minute: 1, seconds: 60.0, tokens: 5210, tokens_per_s: 86.8}]
longest_stall:
  description:
    - The longest time without a token on any stream, C(seconds) long from C(began) (UTC)
      C(began_after_s) into the soak; C(ongoing) when the soak stopped at it; C(streams) the
      streams that were waiting on a request meanwhile.
  returned: always
  type: dict
  sample: {seconds: 0.4, began: "2026-12-04 16:02:41 UTC", began_after_s: 0.0, ongoing: false,
           streams: [1, 2, 3, 4]}
table:
  description: The per-minute lines and the longest stall, for printing.
  returned: always
  type: list
  elements: str
tokens:
  description: Tokens generated during the soak.
  returned: always
  type: int
tokens_per_s:
  description: Tokens per second over the whole soak.
  returned: always
  type: float
seconds:
  description: How long the soak ran (less than O(minutes) when it stopped at a stall).
  returned: always
  type: float
requests:
  description: Completions that finished.
  returned: always
  type: int
failed_requests:
  description: Completions that ended in an error (no answer, an HTTP error, a broken stream).
  returned: always
  type: int
errors:
  description: The last failed requests' reasons, by stream.
  returned: always
  type: list
  elements: str
"""

# Ansible's layout puts the documentation before the imports, hence the noqa: E402.
import functools  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.urls import open_url  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (  # noqa: E402
    soak,
    vllm_client,
)

ARGUMENT_SPEC = {
    "url": vllm_client.ENDPOINT_OPTIONS["url"],
    "api_key": vllm_client.ENDPOINT_OPTIONS["api_key"],
    "model": {"type": "str", "required": True},
    "minutes": {"type": "int", "required": True},
    "stall_s": {"type": "int", "required": True},
    "streams": {"type": "int", "default": 4},
    # A count of tokens, not a secret.
    "max_tokens": {"type": "int", "default": 256, "no_log": False},
    "prompt": {
        "type": "str",
        "default": "Tell a long story about two computers that share one large model.",
    },
}

# Seconds in a minute of the soak (the unit tests shorten it).
MINUTE = 60.0
# How often the soak looks for a stall, in seconds.
TICK = 0.25
# After an error a stream waits this long before it asks again, so a refusing endpoint is
# not asked in a tight loop.
RETRY_S = 1.0


class Recorder:
    """The soak's records, shared by the streams (each append under one lock)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.tokens: list[soak.Token] = []
        self.requests: list[soak.Request] = []
        self.last_token: float | None = None
        # Each stream's request in flight: when it began.
        self.open: dict[int, float] = {}

    def begin(self, stream: int, started: float) -> None:
        with self.lock:
            self.open[stream] = started

    def token(self, stream: int, count: int) -> None:
        at = time.monotonic()
        with self.lock:
            self.tokens.append(soak.Token(at, stream, count))
            self.last_token = at

    def request(self, entry: soak.Request) -> None:
        with self.lock:
            self.requests.append(entry)
            self.open.pop(entry.stream, None)

    def everything(self, end: float) -> tuple[list[soak.Token], list[soak.Request]]:
        """The tokens up to ``end`` and every request, those still in flight open-ended."""
        with self.lock:
            tokens = [t for t in self.tokens if t.at <= end]
            flying = [soak.Request(stream, at) for stream, at in self.open.items()]
            return tokens, [*self.requests, *flying]


def stream_once(client, body: dict, stream: int, recorder: Recorder, halt) -> soak.Request:
    """One streamed completion, every token recorded as it arrives; its record (open when
    the soak halted it)."""
    started = time.monotonic()
    recorder.begin(stream, started)
    headers = {"Content-Type": "application/json"}
    if client.api_key:
        headers["Authorization"] = f"Bearer {client.api_key}"
    seen = 0
    try:
        answer = client.opener(client.url + "/v1/completions", data=json.dumps(body).encode(),
                               headers=headers, method="POST", timeout=client.timeout)  # fmt: skip
        with answer:
            for line in answer:
                if halt.is_set():
                    return soak.Request(stream, started)
                data = soak.sse_data(line)
                if data == "[DONE]":
                    break
                if isinstance(data, dict) and data.get("error"):
                    return soak.Request(stream, started, time.monotonic(),
                                        f"the stream said: {vllm_client.detail(data)}")  # fmt: skip
                count, seen = soak.chunk_tokens(data, seen)
                if count:
                    recorder.token(stream, count)
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read() or b""
        except (OSError, ValueError):
            raw = b""
        reason = vllm_client.problem(int(exc.code), vllm_client.parse(raw))
        return soak.Request(stream, started, time.monotonic(), reason)
    except Exception as exc:  # refused, timed out, reset: no (more) answer
        if halt.is_set():
            return soak.Request(stream, started)
        return soak.Request(stream, started, time.monotonic(),
                            vllm_client.problem(0, str(exc) or type(exc).__name__))  # fmt: skip
    if seen == 0:
        return soak.Request(stream, started, time.monotonic(), "the completion brought no token")
    return soak.Request(stream, started, time.monotonic())


def worker(client, body: dict, stream: int, recorder: Recorder, halt) -> None:
    while not halt.is_set():
        done = stream_once(client, body, stream, recorder, halt)
        recorder.request(done)
        if done.reason:
            halt.wait(RETRY_S)


def run(params: dict, opener) -> dict:
    """The soak: streams until the minutes pass or a stall exceeds stall_s; its report."""
    # A stream's read waits at most this long, so a stream of a frozen pair ends after the
    # verdict is in (the soak itself stops at stall_s).
    read_timeout = params["stall_s"] + 30
    client = vllm_client.Client(params["url"], params["api_key"], read_timeout, opener=opener)
    body = soak.request_body(params["model"], params["prompt"], params["max_tokens"])
    recorder, halt = Recorder(), threading.Event()
    wall_start, start = time.time(), time.monotonic()
    deadline = start + params["minutes"] * MINUTE
    threads = [threading.Thread(target=worker, args=(client, body, n, recorder, halt), daemon=True)
               for n in range(1, params["streams"] + 1)]  # fmt: skip
    for thread in threads:
        thread.start()
    stopped_early = False
    while True:
        now = time.monotonic()
        if now >= deadline:
            now = deadline
            break
        with recorder.lock:
            last = recorder.last_token
        if soak.over_limit(last, start, now, params["stall_s"]):
            stopped_early = True
            break
        time.sleep(min(TICK, deadline - now))
    end = now
    halt.set()
    # Streams between two requests end at once; one blocked on a frozen endpoint stays
    # behind (daemon) when the two seconds are up: the verdict is in.
    joined_by = time.monotonic() + 2
    for thread in threads:
        thread.join(timeout=max(joined_by - time.monotonic(), 0))
    tokens, requests = recorder.everything(end)
    return soak.judge(tokens, requests, start, end, stall_s=params["stall_s"],
                      streams=params["streams"], wall_start=wall_start,
                      stopped_early=stopped_early)  # fmt: skip


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    values = {setting: module.params[option] for setting, option in soak.OPTIONS.items()}
    errors = soak.setting_errors(values)
    if errors:
        # Named as the playbook's settings (soak_minutes, ...), with this module's options.
        named = [f"{e} (option {soak.OPTIONS[e.split(' ', 1)[0]]})" for e in errors]
        module.fail_json(msg="; ".join(named))
    if module.params["max_tokens"] < 1:
        module.fail_json(msg=f"max_tokens is {module.params['max_tokens']}; allowed: 1 or more")
    # http on loopback by default; a https URL may carry the node's own certificate.
    opener = functools.partial(open_url, validate_certs=False)
    module.exit_json(changed=False, **run(module.params, opener))


if __name__ == "__main__":
    main()
