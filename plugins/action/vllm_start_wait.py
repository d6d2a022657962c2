# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Wait for a vLLM start, printing its progress on the controller and judging it by stalls.

Polls the node in short calls of ``dgx_spark.cluster.vllm_endpoint`` (which asks the
endpoint, watches the serving containers and returns their new log lines), reads the start's
phase from those lines (``module_utils.vllm_start``) and prints a line on the controller at
each new phase or step and at least every ``report_every`` seconds. The documentation is in
``plugins/modules/vllm_start_wait.py``.
"""

from __future__ import annotations

import json
import os
import time

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.dgx_spark.cluster.plugins.module_utils import vllm_client, vllm_start

display = Display()

ENDPOINT = "dgx_spark.cluster.vllm_endpoint"

# The endpoint's options (shared with the vllm_endpoint and vllm_endpoint_info modules), then
# the wait's own.
ARGUMENT_SPEC = {
    **vllm_client.ENDPOINT_OPTIONS,
    "watch": {"type": "list", "elements": "str", "default": []},
    "stall_timeout": {"type": "int", "default": 900},
    "timeout": {"type": "int", "default": 3600},
    "poll": {"type": "int", "default": 10},
    "report_every": {"type": "int", "default": 60},
    "group": {"type": "str", "default": ""},
    "leader": {"type": "bool", "default": True},
    "fail_on_unhealthy": {"type": "bool", "default": True},
}
# The task's options that each poll passes on to the module unchanged.
PASSED_ON = (*vllm_client.ENDPOINT_OPTIONS, "watch")


def _verdict_path(group: str) -> str:
    # DEFAULT_LOCAL_TMP is made once per ansible-playbook run and shared by its forks.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group)
    return os.path.join(C.DEFAULT_LOCAL_TMP, f"vllm_start_{safe}.json")


def write_verdict(group: str, started: float, result: dict) -> None:
    path = _verdict_path(group)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"started": started, **{k: result.get(k) for k in ("healthy", "reason")}}, handle)
    os.replace(tmp, path)


def read_verdict(group: str, started: float) -> dict | None:
    """The leader's verdict on this start, if it gave one (a start's nodes begin together)."""
    try:
        with open(_verdict_path(group), encoding="utf-8") as handle:
            verdict = json.load(handle)
    except (OSError, ValueError):
        return None
    return verdict if verdict.get("started", 0) >= started - 120 else None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        validation = ArgumentSpecValidator(ARGUMENT_SPEC).validate(self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("; ".join(validation.error_messages))
        args = validation.validated_parameters
        for name in ("stall_timeout", "timeout", "poll", "report_every", "max_tokens"):
            if args[name] < 1:
                raise AnsibleActionFail(f"{name} must be at least 1, got {args[name]}")
        node = (task_vars or {}).get("inventory_hostname", "")
        result = self._wait(args, node, task_vars)
        if args["leader"] and args["group"]:
            write_verdict(args["group"], result["started"], result)
        # How long the start took to serve (or to be judged), as the wait saw it.
        result["seconds"] = round(time.time() - result.pop("started"), 1)
        if not result["healthy"] and args["fail_on_unhealthy"]:
            result["failed"] = True
            detail = f": {result['excerpt']}" if result.get("excerpt") else ""
            result["msg"] = f"the endpoint does not serve ({result['reason']}){detail}"
        return result

    def _poll(self, args: dict, baseline, since: float, task_vars) -> dict:
        module_args = {key: args[key] for key in PASSED_ON}
        module_args.update(
            timeout=args["poll"], fail_on_unhealthy=False, baseline=baseline, logs_since=since
        )
        return self._execute_module(
            module_name=ENDPOINT, module_args=module_args, task_vars=task_vars
        )

    @staticmethod
    def _show(result: dict, node: str, elapsed: int, summary: str) -> None:
        line = f"vLLM start, {elapsed // 60}m{elapsed % 60:02d}s: {summary}"
        result["progress"].append(line)
        # On stderr: the terminal shows it, and a JSON callback on stdout stays JSON.
        display.display(f"[{node}] {line}", stderr=True)

    def _wait(self, args: dict, node: str, task_vars) -> dict:
        started = time.time()
        progress = vllm_start.StartProgress(started)
        last_stamp: dict[str, float] = {}
        baseline = None
        since = 0.0
        shown = ("", "")
        last_print = started
        result = {"changed": False, "healthy": False, "reason": "", "excerpt": "", "text": "",
                  "phase": progress.phase, "progress": [], "started": started}  # fmt: skip
        while True:
            answer = self._poll(args, baseline, since, task_vars)
            if answer.get("failed"):
                raise AnsibleActionFail(answer.get("msg", f"{ENDPOINT} failed"), result=answer)
            now = time.time()
            baseline = answer.get("states") or baseline
            lines = []
            for name, raw in (answer.get("logs") or {}).items():
                for line in raw:
                    try:
                        stamp = vllm_start.split_line(line)[0] or 0.0
                    except ValueError:
                        stamp = 0.0
                    if stamp and stamp <= last_stamp.get(name, 0.0):
                        continue
                    last_stamp[name] = max(stamp, last_stamp.get(name, 0.0))
                    lines.append(line)
            if last_stamp:
                since = min(last_stamp.values())
            events = progress.feed(lines, now)
            summary = progress.summary()
            elapsed = int(now - started)
            if (
                events
                and (progress.phase, summary) != shown
                or now - last_print >= args["report_every"]
            ):
                self._show(result, node, elapsed, summary)
                shown, last_print = (progress.phase, summary), now
            result["phase"] = progress.phase
            for key in ("healthy", "reason", "excerpt", "text"):
                result[key] = answer.get(key, result[key])
            if answer.get("healthy"):
                result["reason"] = ""
                if progress.phase != "serving":
                    # The endpoint answered before its log line came: it serves all the same.
                    result["phase"] = "serving"
                    self._show(result, node, elapsed, "serving")
                return result
            if not answer.get("timed_out"):
                return result  # a container exited or restarted, or the key was refused
            result["reason"] = ""
            if not args["leader"] and args["group"]:
                verdict = read_verdict(args["group"], started)
                if verdict is not None:
                    result["healthy"] = bool(verdict.get("healthy"))
                    result["reason"] = verdict.get("reason") or ""
                    return result
            verdict = vllm_start.stall_verdict(
                now, started, progress.last_progress, args["stall_timeout"], args["timeout"]
            )
            if verdict != "progressing":
                result["reason"] = vllm_start.stall_reason(
                    verdict, progress, now, args["stall_timeout"], args["timeout"]
                )
                result["stalled"] = verdict == "stalled"
                return result
