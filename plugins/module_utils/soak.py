# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""A soak judged from token timestamps: tokens/s per minute, the longest stall, the verdict.

Pure: the vllm_soak module streams completions on several streams and records when each
token arrived (``Token``) and when each request began and ended (``Request``); everything
here reads those records. Times are seconds on one monotonic clock; ``wall_start`` (the wall
clock at the soak's start, seconds since the epoch) turns them into UTC times for messages.

Why a soak: two Sparks at TP 2 on the pip-bundled NCCL 2.28 wedged in a collective after
20-26 minutes under load (vLLM issue 42354, project issue #43); a short check cannot see it,
and a wedged collective shows as no token on any stream.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

try:
    from ansible_collections.dgx_spark.cluster.plugins.module_utils.setting_ranges import (
        range_errors,
    )
except ImportError:  # loaded by its path (the sim's tests): setting_ranges.py beside it
    from setting_ranges import range_errors

# The playbook's settings: (lowest, highest, unit), whole numbers. Thirty minutes is the check
# owners need after a first deploy or an upgrade (the hang came at 20-26 minutes, vLLM issue
# 42354); a day is the longest a run of ansible-playbook should hold the endpoint.
RANGES: dict[str, tuple[int, int, str]] = {
    "soak_minutes": (1, 1440, "minutes"),
    "soak_stall_s": (1, 3600, "seconds"),
    "soak_streams": (1, 64, "streams"),
}
# The vllm_soak module's option for each setting.
OPTIONS = {"soak_minutes": "minutes", "soak_stall_s": "stall_s", "soak_streams": "streams"}


def setting_errors(values: dict) -> list[str]:
    """One message per setting out of its range, naming the setting and the range; ``values``
    by setting name (absent names are not checked)."""
    return range_errors(values, RANGES)


@dataclass(frozen=True)
class Token:
    """``count`` tokens of stream ``stream`` arrived at ``at``."""

    at: float
    stream: int
    count: int = 1


@dataclass(frozen=True)
class Request:
    """One streamed completion of ``stream``: open from ``started`` until ``ended`` (None: still
    open when the soak stopped); ``reason`` says why it failed, empty when it did not."""

    stream: int
    started: float
    ended: float | None = None
    reason: str = ""


def chunk_tokens(chunk, seen: int) -> tuple[int, int]:
    """(tokens this streamed chunk brings, tokens of the request so far). vLLM's
    ``continuous_usage_stats`` puts the request's running ``completion_tokens`` in every
    chunk; without it a chunk with text counts as one token (speculative decoding may bring
    more in one chunk, so the usage is preferred)."""
    if not isinstance(chunk, dict):
        return 0, seen
    usage = chunk.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        total = usage["completion_tokens"]
        return max(total - seen, 0), max(total, seen)
    choices = chunk.get("choices") or []
    text = choices[0].get("text") if choices and isinstance(choices[0], dict) else None
    return (1, seen + 1) if text else (0, seen)


def sse_data(line: bytes | str):
    """The payload of one server-sent-events line: the JSON of ``data: {...}``, the string
    ``[DONE]``, or None for anything else (blank lines, comments, other fields)."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    text = text.strip()
    if not text.startswith("data:"):
        return None
    payload = text[5:].strip()
    if payload == "[DONE]":
        return payload
    try:
        return json.loads(payload)
    except ValueError:
        return None


def request_body(model: str, prompt: str, max_tokens: int) -> dict:
    """A streamed completion of exactly ``max_tokens`` tokens (``ignore_eos``, a vLLM extra)
    with the running token count in every chunk."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


def per_minute(tokens: list[Token], start: float, end: float) -> list[dict]:
    """Tokens and tokens/s of each minute from ``start`` to ``end``; the last minute may be
    shorter (its rate is over its own seconds)."""
    minutes = []
    edge = start
    index = 1
    while edge < end:
        upper = min(edge + 60.0, end)
        count = sum(t.count for t in tokens if edge <= t.at < upper or (upper == end == t.at))
        seconds = upper - edge
        rate = round(count / seconds, 1) if seconds > 0 else 0.0
        minutes.append(
            {"minute": index, "seconds": round(seconds, 1), "tokens": count, "tokens_per_s": rate}
        )
        edge, index = upper, index + 1
    return minutes


def longest_stall(tokens: list[Token], start: float, end: float) -> tuple[float, float]:
    """(began, seconds) of the longest time without a token on any stream between ``start``
    and ``end``: from the start to the first token, between two tokens, or from the last
    token to the end."""
    times = sorted(t.at for t in tokens if start <= t.at <= end)
    began, longest = start, 0.0
    previous = start
    for at in [*times, end]:
        if at - previous > longest:
            began, longest = previous, at - previous
        previous = at
    return began, longest


def waiting_streams(requests: list[Request], began: float, ended: float) -> list[int]:
    """The streams with a request open during [began, ended]: they asked and got nothing."""
    return sorted({r.stream for r in requests
                   if r.started < ended and (r.ended is None or r.ended > began)})  # fmt: skip


def failures(requests: list[Request], began: float | None = None, ended: float | None = None):
    """The failed requests (those that ended within [began, ended] when given), oldest first."""
    return [
        r
        for r in requests
        if r.reason
        and r.ended is not None
        and (began is None or began <= r.ended)
        and (ended is None or r.ended <= ended)
    ]


def utc(wall_start: float, start: float, at: float) -> str:
    """The UTC time of monotonic ``at``, given the wall clock ``wall_start`` at ``start``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall_start + (at - start)))


def duration(seconds: float) -> str:
    """'42.3 s' under a minute, else '3 min 12 s'."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    return f"{whole // 60} min {whole % 60} s"


def _streams(numbers: list[int]) -> str:
    if not numbers:
        return "no stream had a request open (each was waiting to ask again after an error)"
    label = "stream" if len(numbers) == 1 else "streams"
    return f"{label} {', '.join(str(n) for n in numbers)} waiting on a request"


def judge(
    tokens: list[Token],
    requests: list[Request],
    start: float,
    end: float,
    *,
    stall_s: float,
    streams: int,
    wall_start: float,
    stopped_early: bool = False,
) -> dict:
    """The soak's report: ``passed``, ``msg`` (the verdict in one line), ``minutes`` (tokens/s
    per minute), ``longest_stall`` (when it began, how long, which streams waited), token and
    request counts. A stall longer than ``stall_s`` fails it; ``stopped_early`` means the
    soak stopped at that stall (so it was still going on at ``end``)."""
    began, seconds = longest_stall(tokens, start, end)
    ended = began + seconds
    ongoing = stopped_early and abs(ended - end) < 1e-6
    waiting = waiting_streams(requests, began, ended)
    failed = failures(requests)
    stall = {
        "seconds": round(seconds, 1),
        "began": utc(wall_start, start, began),
        "began_after_s": round(began - start, 1),
        "ongoing": ongoing,
        "streams": waiting,
    }
    total = sum(t.count for t in tokens)
    elapsed = max(end - start, 1e-9)
    report = {
        "passed": seconds <= stall_s,
        "minutes": per_minute(tokens, start, end),
        "longest_stall": stall,
        "tokens": total,
        "tokens_per_s": round(total / elapsed, 1),
        "seconds": round(end - start, 1),
        "streams": streams,
        "requests": sum(1 for r in requests if r.ended is not None and not r.reason),
        "failed_requests": len(failed),
        "errors": [f"stream {r.stream}: {r.reason}" for r in failed[-5:]],
    }
    if report["passed"]:
        report["msg"] = (
            f"soak passed: {duration(end - start)} under {streams} streams, {total} tokens "
            f"({report['tokens_per_s']} tokens/s), longest stall {duration(seconds)} from "
            f"{stall['began']}, within soak_stall_s {stall_s:g} s"
        )
        report["table"] = minutes_table(report)
        return report
    lasted = f"at least {duration(seconds)}, still stalled when the soak stopped" if ongoing \
        else duration(seconds)  # fmt: skip
    message = (
        f"soak failed: stall of {lasted} (no token on any stream) from {stall['began']}, "
        f"{duration(began - start)} into the soak; limit soak_stall_s {stall_s:g} s; "
        f"{_streams(waiting)}"
    )
    during = failures(requests, began, ended)
    if during:
        message += f"; requests failed meanwhile, the last: stream {during[-1].stream}: " \
            f"{during[-1].reason}"  # fmt: skip
    report["msg"] = message
    report["table"] = minutes_table(report)
    return report


def over_limit(last_token: float | None, start: float, now: float, stall_s: float) -> bool:
    """Whether no token has come for longer than ``stall_s`` by ``now`` (none yet: since the
    start): the soak stops there."""
    return now - (start if last_token is None else max(last_token, start)) > stall_s


def minutes_table(report: dict) -> list[str]:
    """The per-minute lines and the longest stall, as the playbook prints them."""
    lines = [f"minute {m['minute']:>4}: {m['tokens_per_s']:>8.1f} tokens/s ({m['tokens']} tokens"
             + (f" in {m['seconds']:g} s)" if m["seconds"] != 60 else ")")
             for m in report["minutes"]]  # fmt: skip
    stall = report["longest_stall"]
    lines.append(
        f"longest stall: {duration(stall['seconds'])} from {stall['began']}"
        + (" (ongoing)" if stall["ongoing"] else "")
    )
    return lines
