# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""When a serving group is up, down, or refused: pure decisions for the serving role.

A serving group is the set of containers that hold the ranks of one model. It serves when
the head answers ``/health`` *and* a one-token completion; a container of the group that
stopped or restarted while we waited means vLLM refused its settings (or crashed), and
waiting longer would only wait for a timeout.
"""

from __future__ import annotations

import re

try:
    from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_log import parse
except ImportError:
    # Outside Ansible: the watchdog's directory on the head, where vllm_serve/tasks/watchdog.yml
    # installs this file and vllm_log.py side by side.
    from vllm_log import parse

# Lines in which vLLM (or Python) says why it stopped, most specific first.
_ERROR_LINE = re.compile(
    r"(error:|Error:|Error\b|Exception\b|Traceback|refused|invalid|must be|not supported"
    r"|out of memory|No such file|FAILED)",
)
# "ValueError: ...", "pydantic_core._pydantic_core.ValidationError: ...", "KeyboardInterrupt".
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:|$)")
# Log decorations that say nothing about the cause.
_NOISE = re.compile(
    r"^\s*(File \"|\^+$|~+$|raise |return |During handling|Traceback \(most recent)"
)
# Ray's wrapper of an exception raised inside a rank (a Ray actor), naming the exception's class
# and, for a rank on another node, that node's address:
# "ray.exceptions.RayTaskError(SafetensorError): ray::RayWorkerProc.initialize_worker() (pid=425,
# ip=172.30.241.12, ...)".
_RAY_TASK_ERROR = re.compile(r"RayTaskError\((?P<kind>\w+)\)(?:.*?\bip=(?P<ip>[0-9A-Fa-f.:]+))?")


def container_failure(before: dict, now: dict) -> str:
    """Why the group stopped serving while we waited, or '' while every container still runs.

    ``before`` and ``now`` map a container name to ``{"running": bool, "restarts": int,
    "started_at": str}`` (``now`` may lack a container that was removed).
    """
    reasons = []
    for name in sorted(before):
        state = now.get(name)
        if state is None:
            reasons.append(f"{name} is gone")
        elif not state.get("running"):
            reasons.append(f"{name} exited")
        elif int(state.get("restarts", 0)) > int(before[name].get("restarts", 0)) or (
            state.get("started_at") != before[name].get("started_at")
        ):
            reasons.append(f"{name} restarted")
    return "; ".join(reasons)


def _strip(raw: str) -> tuple[str, str]:
    """(level, text) of one log line, without the prefixes ``vllm_log`` reads."""
    line = parse(raw)
    return line.level, line.message


def _exception_blocks(entries: list[tuple[str, str]]) -> list[tuple[int, list[str]]]:
    """Each exception line with the detail lines that follow it (pydantic names the field),
    with the index of its line."""
    blocks: list[tuple[int, list[str]]] = []
    for i, (_level, text) in enumerate(entries):
        if text.startswith(" ") or not _EXCEPTION.match(text):
            continue
        block = [text.strip()]
        for level, detail in entries[i + 1 : i + 4]:
            if (
                not detail.strip()
                or level in ("DEBUG", "INFO", "WARNING")
                or _EXCEPTION.match(detail)
                or _NOISE.match(detail.strip())
                or detail.strip().startswith(("The above exception", "For further information"))
            ):
                break
            block.append(detail.strip())
        blocks.append((i, block))
    return blocks


def _rank_root_cause(entries, blocks) -> list[str]:
    """The exception a rank raised, when Ray reported one: the block of the class that the last
    RayTaskError names, after it, prefixed with the rank's node address when it gave one."""
    for index in range(len(entries) - 1, -1, -1):
        found = _RAY_TASK_ERROR.search(entries[index][1])
        if not found:
            continue
        kind = found.group("kind")
        for start, block in blocks:
            head = block[0].split(":", 1)[0]
            if start > index and (head == kind or head.endswith("." + kind)):
                where = f"the rank on {found.group('ip')}: " if found.group("ip") else "a rank: "
                return [where + block[0], *block[1:]]
        return []
    return []


def error_excerpt(log_text: str, max_blocks: int = 3, max_chars: int = 600) -> str:
    """vLLM's own reason for stopping, from the end of a container's log, trimmed.

    When a rank raised (Ray wraps it as a RayTaskError), that exception comes first, named
    with the rank's node: it is the root cause, and what the driver raises while shutting the
    group down follows it. Then the last distinct exceptions, oldest first: with chained
    exceptions across vLLM's processes the root cause comes before "Engine core initialization
    failed". Without an exception, the last lines logged at ERROR or that name an error.
    Joined by " | ".
    """
    entries = [_strip(raw) for raw in log_text.splitlines()]
    blocks = _exception_blocks(entries)
    root = _rank_root_cause(entries, blocks)
    picked: list[str] = []
    seen: set[str] = {root[0].split(": ", 1)[1]} if root else set()
    for _start, block in reversed(blocks):
        if block[0] in seen:
            continue
        seen.add(block[0])
        picked[:0] = block
        if len(seen) >= max_blocks:
            break
    picked[:0] = root
    if not picked:
        for level, line in reversed(entries):
            if level in ("DEBUG", "INFO", "WARNING"):
                continue
            line = line.strip()
            named = level in ("ERROR", "CRITICAL") or _ERROR_LINE.search(line)
            if not line or _NOISE.match(line) or not named or line in picked:
                continue
            picked.insert(0, line)
            if len(picked) >= 2 * max_blocks:
                break
    text = " | ".join(picked)
    if len(text) > max_chars:
        text = text[: max_chars - 3] + "..."
    return text


def completion_ok(status: int, body: dict | None) -> bool:
    """A completion answer that proves the ranks computed at least one token."""
    if status != 200 or not isinstance(body, dict):
        return False
    usage = body.get("usage") or {}
    choices = body.get("choices") or []
    return int(usage.get("completion_tokens") or 0) >= 1 and len(choices) >= 1
