# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The vLLM metrics an operator reads, from the Prometheus text of ``/metrics``.

Pure functions: the vllm_endpoint_info module scrapes ``/metrics`` twice and asks these for
the gauges (running and waiting requests, KV-cache usage) and the token throughputs, which
vLLM exports only as counters and which are therefore a difference over a known interval.
"""

from __future__ import annotations

import math
import re

# name{labels} value [timestamp]; label values may hold escaped quotes.
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[^{}\"]|\"(?:[^\"\\]|\\.)*\")*)\})?"
    r"\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# What the status report shows, by the name vLLM exports (v1 engine, 0.10 and later).
GAUGES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
}
COUNTERS = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    # Speculative decoding (vLLM's spec_decode counters; absent where it is off).
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
# vLLM counts every request that left the engine in request_success_total, by finished_reason:
# stop, length and repetition ended as asked; abort (the client went away or the server gave
# up on it) and error did not, and are counted apart.
REQUESTS = "vllm:request_success_total"
REQUESTS_NOT_FINISHED = {"abort": "requests_aborted", "error": "requests_errored"}


class MetricsError(ValueError):
    """The text is not Prometheus exposition format."""


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition as (name, labels, value)."""
    samples = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise MetricsError(f"line {number} is not a Prometheus sample: {line[:120]!r}")
        try:
            value = float(match["value"])
        except ValueError as exc:
            raise MetricsError(f"line {number} has no numeric value: {line[:120]!r}") from exc
        labels = dict(_LABEL.findall(match["labels"] or ""))
        samples.append((match["name"], labels, value))
    return samples


def _total(samples, name: str, model: str | None) -> float | None:
    """Sum of a metric over its label sets (engines, finish reasons), for one model."""
    values = [
        value
        for sample_name, labels, value in samples
        if sample_name == name and (model is None or labels.get("model_name", model) == model)
    ]
    if not values:
        return None
    return sum(v for v in values if not math.isnan(v))


def requests_by_reason(samples, model: str | None = None) -> dict[str, int] | None:
    """Requests that left the engine since it started, by ``finished_reason`` (summed over
    engines); None when vLLM exports no ``request_success_total``."""
    counts: dict[str, int] = {}
    for name, labels, value in samples:
        if name != REQUESTS or (model is not None and labels.get("model_name", model) != model):
            continue
        if math.isnan(value):
            continue
        reason = labels.get("finished_reason", "")
        counts[reason] = counts.get(reason, 0) + int(value)
    return counts or None


def summarize(text: str, model: str | None = None) -> dict:
    """The gauges and counters that matter, None where vLLM does not export one.

    ``kv_cache_usage`` stays vLLM's fraction (0..1); ``kv_cache_usage_pct`` is the same in
    percent, rounded for display. ``requests_finished`` counts the requests that ended as
    asked (stop, length, ...); ``requests_aborted`` and ``requests_errored`` the ones that did
    not; ``requests_by_reason`` has vLLM's own split.
    """
    samples = parse_samples(text)
    result: dict = {}
    for key, name in {**GAUGES, **COUNTERS}.items():
        result[key] = _total(samples, name, model)
    for key in (
        "running",
        "waiting",
        "preemptions",
        "spec_drafts",
        "spec_draft_tokens",
        "spec_accepted_tokens",
    ):
        if result[key] is not None:
            result[key] = int(result[key])
    by_reason = requests_by_reason(samples, model)
    result["requests_by_reason"] = by_reason
    for key in ("requests_finished", *REQUESTS_NOT_FINISHED.values()):
        result[key] = None if by_reason is None else 0
    for reason, count in (by_reason or {}).items():
        key = REQUESTS_NOT_FINISHED.get(reason, "requests_finished")
        result[key] += count
    usage = result["kv_cache_usage"]
    result["kv_cache_usage_pct"] = None if usage is None else round(usage * 100, 1)
    return result


def throughput(before: dict, after: dict, seconds: float, probe: dict | None = None) -> dict:
    """Prompt and generation tokens per second between two ``summarize`` results.

    ``probe`` is the ``usage`` of requests the caller sent itself in the interval (a health
    completion); its tokens are not the clients' and are subtracted.
    """
    probe = probe or {}
    own = {
        "prompt_tokens": probe.get("prompt_tokens", 0) or 0,
        "generation_tokens": probe.get("completion_tokens", 0) or 0,
    }
    rates = {}
    for key, rate_key in (
        ("prompt_tokens", "prompt_tokens_per_s"),
        ("generation_tokens", "generation_tokens_per_s"),
    ):
        first, second = before.get(key), after.get(key)
        if first is None or second is None or seconds <= 0:
            rates[rate_key] = None
            continue
        # A counter that went down belongs to a restarted server: no rate over a restart.
        delta = second - first - own[key] if second >= first else 0.0
        rates[rate_key] = round(max(delta, 0.0) / seconds, 2)
    rates["interval_s"] = round(seconds, 3)
    return rates


def speculative(before: dict, after: dict) -> dict | None:
    """Speculative decoding between two ``summarize`` results: drafts, draft and accepted
    tokens, the share of draft tokens accepted and the mean acceptance length (tokens a
    verification step gives: 1 + accepted per draft). None where vLLM counts no drafts (off),
    or the server restarted in between (a counter went down)."""
    keys = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")
    if any(before.get(k) is None or after.get(k) is None for k in keys):
        return None
    delta = {k: after[k] - before[k] for k in keys}
    if any(v < 0 for v in delta.values()):
        return None
    drafts, drafted, accepted = (delta[k] for k in keys)
    return {
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 2) if drafts else None,
    }


def busy_reason(before: dict | None, after: dict | None, seconds: float) -> str:
    """Why a server whose probe went unanswered is busy rather than dead, or '' (not busy).

    ``before`` and ``after`` are ``summarize`` results of two reads ``seconds`` apart (None: no
    ``/metrics`` answered). Tokens generated or prefilled between the reads mean the engine
    steps; requests running mean it holds work. A frozen rank generates nothing, and the probe
    it never answered is not counted as running (vLLM updates the gauge after a step, which a
    frozen rank never finishes), but a rank that froze in the middle of a load keeps the last
    count: the watchdog bounds how long it believes a busy verdict.
    """
    if after is None:
        return ""
    reasons = []
    if before is not None:
        for key, what in (("generation_tokens", "generated"), ("prompt_tokens", "prefilled")):
            first, second = before.get(key), after.get(key)
            # A counter that went down belongs to a restarted server: no progress over it.
            if first is not None and second is not None and second > first:
                reasons.append(f"{int(second - first)} tokens {what} in {seconds:.0f} s")
    if after.get("running"):
        reasons.append(f"{after['running']} requests running, {after.get('waiting') or 0} waiting")
    return "; ".join(reasons)
