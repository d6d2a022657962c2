# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""How far a vLLM start has come, read from the ranks' container logs, and when it stalled.

Pure and standard library only: the deploy's wait (the ``vllm_start_wait`` action) and the
watchdog (``roles/vllm_serve/files/dgx_spark_watchdog.py``, which runs inside the serving
image with this file beside it) share it.

A start goes through phases; each is recognised by lines vLLM itself logs (vLLM 0.14 to
0.32, read from their sources; the unit tests carry the captures):

``peers``
    the ranks find each other: Ray places one rank per GPU (vLLM says it is "Waiting for
    creating a placement group" while Ray lacks the GPUs) and torch.distributed joins the
    ranks (``world_size=2 rank=1 ... distributed_init_method=...``).
``weights``
    ``Starting to load model``, then a progress bar per checkpoint shard
    (``Loading safetensors checkpoint shards:  50% Completed | 1/2 [...]``; fastsafetensors,
    InstantTensor and the multi-thread loader print the same bar under their own names),
    ``Loading weights took``, ``Model loading took``.
``compile``
    torch.compile (``Dynamo bytecode transform``, ``Compiling a graph for compile range``,
    ``torch.compile took``), FlashInfer's JIT, and the CUDA graph capture bar.
``kv_cache``
    the memory profile and the KV cache's size (``Available KV cache memory``, ``KV cache
    size: N tokens``, ``# GPU blocks``).
``server``
    the engine is up (``init engine (profile, create kv cache, warmup model) took``) and the
    API server starts.
``serving``
    ``Application startup complete``.

Progress is a milestone not seen before in this start: a new phase, one more shard, a new
compile step. A line that only says it still waits (Ray's placement group) is not progress.
Under vLLM's Ray executor the worker ranks are Ray actors whose lines Ray forwards to the
driver's log with a ``(RayWorkerWrapper pid=…, ip=…)`` prefix (and, for lines that repeat
across actors, a ``[repeated Nx across cluster]`` suffix); each rank is told apart by it.
"""

from __future__ import annotations

import re

try:
    from ansible_collections.dgx_spark.cluster.plugins.module_utils.setting_ranges import (
        range_errors,
        whole,
    )
    from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_log import parse
except ImportError:
    # Outside Ansible: the watchdog's directory on the head, where vllm_serve/tasks/watchdog.yml
    # installs this file, setting_ranges.py and vllm_log.py side by side.
    from setting_ranges import range_errors, whole
    from vllm_log import parse

PHASES = ("starting", "peers", "weights", "compile", "kv_cache", "server", "serving")
PHASE_LABELS = {
    "starting": "starting the processes",
    "peers": "waiting for the peers and Ray's GPUs",
    "weights": "loading weights",
    "compile": "compiling and capturing",
    "kv_cache": "sizing the KV cache",
    "server": "starting the API server",
    "serving": "serving",
}

# tqdm with vLLM's bar format: "<desc>: <pct>% Completed | k/n [elapsed<remaining, rate]";
# plain tqdm (CUDA graphs): "<desc>: <pct>%|<bar>| k/n [elapsed<remaining, rate]".
_BAR = re.compile(
    r"^(?P<desc>[^:|]+?):\s+(?P<pct>\d+)%(?: Completed \||\|[^|]*\|)\s*(?P<k>\d+)/(?P<n>\d+)"
    r"(?:\s*\[(?P<elapsed>[^<\]]*)<(?P<remaining>[^,\]]*)(?:,\s*(?P<rate>[^\]]*))?\])?"
)
_WEIGHT_BARS = re.compile(r"checkpoint shards|loading shards|Fastsafetensor|InstantTensor|Streamer")

# (phase, pattern, is progress). First match wins; a pattern's groups go into the detail.
_LINES: tuple[tuple[str, re.Pattern, bool], ...] = tuple(
    (phase, re.compile(pattern), progress)
    for phase, pattern, progress in (
        ("peers", r"Waiting for creating a placement group of specs for (\d+) seconds", False),
        ("peers", r"No current placement group found|Using the existing placement group", True),
        ("peers", r"world_size=(\d+) rank=(\d+) .*distributed_init_method=", True),
        ("peers", r"rank (\d+) in world size (\d+) is assigned as", True),
        ("weights", r"Starting to load model|Loading model from scratch", True),
        ("weights", r"Loading weights took ([\d.]+) seconds", True),
        ("weights", r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds", True),
        ("compile", r"Starting torch\.compile|Dynamo bytecode transform time: ([\d.]+) s", True),
        ("compile", r"Compiling a graph for compile range (\S+) takes ([\d.]+) s", True),
        ("compile", r"Directly load the compiled graph|Cache the graph of compile range", True),
        ("compile", r"torch\.compile (?:takes|took) ([\d.]+) s in total", True),
        ("compile", r"(?i)flashinfer.*\bJIT\b|\bJIT\b.*flashinfer", True),
        ("compile", r"Graph capturing finished in (\d+) secs", True),
        ("kv_cache", r"Memory profiling takes ([\d.]+) seconds", True),
        ("kv_cache", r"Available KV cache memory: ([\d.]+) GiB", True),
        ("kv_cache", r"KV cache size: ([\d,]+) tokens", True),
        ("kv_cache", r"# (?:GPU|CPU) blocks: (\d+)|GiB for KV cache", True),
        ("server", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)", True),
        ("server", r"Starting vLLM (?:API )?server", True),
        ("serving", r"Application startup complete", True),
    )
)


def split_line(raw: str) -> tuple[float | None, str, str]:
    """(Docker's timestamp or None, the rank that said it, vLLM's message) of one log line.

    The rank is the Ray actor's address (``RayWorkerWrapper@10.0.0.2``), vLLM's process
    (``EngineCore``) or '' for lines without a prefix (tqdm bars of a single process); the
    grammar is ``vllm_log``'s.
    """
    line = parse(raw)
    return line.stamp, line.source, line.message.strip()


def classify(message: str) -> dict | None:
    """What one message says about the start, or None when it says nothing about it.

    ``{"phase", "progress", "text"}``; a progress bar adds ``bar`` (``desc``, ``k``, ``n``,
    ``rate``).
    """
    meter = _BAR.match(message)
    if meter:
        desc = meter.group("desc").strip()
        if _WEIGHT_BARS.search(desc):
            phase = "weights"
        elif "graph" in desc.lower():
            phase = "compile"
        else:
            return None
        info = {
            "desc": desc,
            "k": int(meter.group("k")),
            "n": int(meter.group("n")),
            "rate": (meter.group("rate") or "").strip(),
            "elapsed": (meter.group("elapsed") or "").strip(),
        }
        return {"phase": phase, "progress": True, "text": message, "bar": info}
    for phase, pattern, progress in _LINES:
        if pattern.search(message):
            return {"phase": phase, "progress": progress, "text": message}
    return None


def _rank_name(source: str) -> str:
    return source.split("@", 1)[1] if "@" in source else (source or "driver")


class StartProgress:
    """What the logs of one start said so far, fed a poll at a time.

    ``feed(lines, now)`` takes the new lines of every watched container and the time of the
    poll (the observer's clock: the stall is judged on it, never on the node's), and returns
    the milestones it had not seen. ``last_progress`` is when the last one was seen.
    """

    def __init__(self, started: float):
        self.started = started
        self.last_progress = started
        self.phase = "starting"
        self.last_text = ""
        self.bars: dict[tuple[str, str], dict] = {}
        self.waiting = ""
        self._seen: set = set()

    def feed(self, lines: list[str], now: float, node: str = "") -> list[dict]:
        new = []
        for raw in lines:
            _stamp, source, message = split_line(raw)
            event = classify(message)
            if event is None:
                continue
            who = f"{node}:{source}" if node else source
            if not event["progress"]:
                self.waiting = message
                if PHASES.index(event["phase"]) >= PHASES.index(self.phase):
                    self.phase = event["phase"]
                continue
            meter = event.get("bar")
            if meter:
                key = (who, meter["desc"], meter["k"], meter["n"])
                self.bars[(who, meter["desc"])] = {**meter, "phase": event["phase"], "rank": who}
            else:
                key = (who, event["phase"], re.sub(r"[\d.,]+", "#", message))
            if key in self._seen:
                continue
            self._seen.add(key)
            self.waiting = ""
            # Ranks' lines interleave (Ray forwards a remote rank's late): the start is as far
            # as its furthest line, and never goes back.
            if PHASES.index(event["phase"]) >= PHASES.index(self.phase):
                self.phase = event["phase"]
            self.last_text = message
            self.last_progress = now
            new.append({**event, "rank": who})
        return new

    def summary(self) -> str:
        """One line: the phase and, while loading or capturing, each rank's k/n and rate."""
        text = PHASE_LABELS[self.phase]
        if self.phase == "serving":
            return text
        bars = [b for b in self.bars.values() if b["phase"] == self.phase]
        if bars:
            parts = []
            for meter in sorted(bars, key=lambda b: b["rank"]):
                rate = f", {meter['rate']}" if meter["rate"] and "?" not in meter["rate"] else ""
                what = "shards" if self.phase == "weights" else "graphs"
                parts.append(f"{_rank_name(meter['rank'])} {meter['k']}/{meter['n']} {what}{rate}")
            text += ": " + "; ".join(parts)
        elif self.waiting:
            text += f" ({self.waiting[:160]})"
        elif self.last_text:
            text += f" ({self.last_text[:160]})"
        return text


def stall_verdict(
    now: float, started: float, last_progress: float, stall: float, ceiling: float
) -> str:
    """'progressing', 'stalled' or 'ceiling' for a start that does not serve yet.

    Stalled: no progress for ``stall`` seconds (counted from the start until the first
    milestone). Ceiling: ``ceiling`` seconds since the start, however it progresses.
    """
    if now - started >= ceiling:
        return "ceiling"
    if now - max(started, last_progress) >= stall:
        return "stalled"
    return "progressing"


def stall_reason(
    verdict: str, progress: StartProgress, now: float, stall: float, ceiling: float
) -> str:
    """The user's words for a verdict that ends a start, naming the phase it stopped in."""
    quiet = int(now - max(progress.started, progress.last_progress))
    where = progress.summary()
    if verdict == "ceiling":
        return (
            f"the start did not serve within vllm_serve_health_timeout ({int(ceiling)} s) although "
            f"it still progressed; it was at: {where}"
        )
    return (
        f"the start stalled while {where}: no progress in the logs for {quiet} s "
        f"(vllm_serve_start_stall_timeout is {int(stall)} s)"
    )


# The stall time: a phase can legitimately print nothing for minutes (one shard of a slow
# disk, one FlashInfer JIT build on SM121), never for hours. The ceiling: at least the stall.
STALL_RANGE = (60, 7200)
CEILING_MAX = 86400
LOAD_FORMAT_WORD = re.compile(r"^[a-z][a-z0-9_]*$")


def setting_errors(stall_timeout, health_timeout, load_format="auto") -> list[str]:
    """What the start's own settings refuse, each message naming its variable and the range."""
    errors = []
    stall = whole(stall_timeout)
    low, high = STALL_RANGE
    if stall is None or not low <= stall <= high:
        errors.append(
            f"vllm_serve_start_stall_timeout is {stall_timeout!r}; allowed: whole seconds "
            f"{low}-{high}"
        )
        stall = low
    ceiling = whole(health_timeout)
    if ceiling is None or not stall <= ceiling <= CEILING_MAX:
        errors.append(
            f"vllm_serve_health_timeout is {health_timeout!r}; allowed: whole seconds from "
            f"vllm_serve_start_stall_timeout ({stall}) to {CEILING_MAX}"
        )
    if not isinstance(load_format, str) or not LOAD_FORMAT_WORD.match(load_format):
        errors.append(
            f"vllm_serve_load_format is {load_format!r}; allowed: auto (the image's fast loader "
            "if it has one) or a --load-format value of vLLM such as safetensors, fastsafetensors, "
            "instanttensor"
        )
    return errors


# The watchdog's settings, whole numbers each: seconds between probes (a probe waits as long
# at most), unanswered probes before a restart, restarts before it gives up, and the seconds
# over which it counts them.
WATCHDOG_RANGES = {
    "vllm_serve_watchdog_interval": (2, 600, "seconds"),
    "vllm_serve_watchdog_failures": (1, 20, "probes"),
    "vllm_serve_watchdog_max_restarts": (1, 20, "restarts"),
    "vllm_serve_watchdog_window": (60, 86400, "seconds"),
    # 0: never wait for a busy server (restart as soon as the probes fail).
    "vllm_serve_watchdog_busy_limit": (0, 86400, "seconds"),
}


def watchdog_setting_errors(interval, failures, max_restarts, window, busy_limit=0) -> list[str]:
    """What the watchdog's settings refuse, each message naming its variable and the range.
    The window must hold at least one judged failure (interval x failures): a shorter one
    could never count a second restart, and max_restarts would mean nothing."""
    given = {
        "vllm_serve_watchdog_interval": interval,
        "vllm_serve_watchdog_failures": failures,
        "vllm_serve_watchdog_max_restarts": max_restarts,
        "vllm_serve_watchdog_window": window,
        "vllm_serve_watchdog_busy_limit": busy_limit,
    }
    errors = range_errors(given, WATCHDOG_RANGES)
    judged = (whole(interval) or 0) * (whole(failures) or 0)
    if not errors and whole(window) < judged:
        errors.append(
            f"vllm_serve_watchdog_window is {window!r}; allowed: at least "
            f"vllm_serve_watchdog_interval x vllm_serve_watchdog_failures ({judged} s), the time "
            "one failure takes to judge"
        )
    return errors


# The fast loaders vLLM knows by --load-format, most preferred first, with the module each
# needs in the serving image.
FAST_LOADERS = (("fastsafetensors", "fastsafetensors"), ("instanttensor", "instanttensor"))


def choose_load_format(setting: str, modules: dict) -> tuple[str, str]:
    """(the --load-format to use, '' for vLLM's default; why), from the role's setting and
    what the serving image imported (``{module: {"version", "error"}}``)."""
    if setting != "auto":
        return setting, f"vllm_serve_load_format is {setting}"
    missing = []
    for load_format, module in FAST_LOADERS:
        found = modules.get(module) or {}
        if found and not found.get("error"):
            version = found.get("version") or "version unknown"
            return load_format, f"the serving image carries {module} ({version})"
        missing.append(module)
    return "", (f"the serving image carries neither {' nor '.join(missing)}: vLLM's default loader")


def rollback_watch_limits(previous_args, stall, grace) -> dict:
    """The start limits a watchdog judges a rolled-back group by: each the larger of this
    run's (``stall``, ``grace``) and those of the watchdog that watched that group before the
    run (its command line, ``previous_args``; None or empty when there was none).

    The rolled-back group starts as it did when it last served, which this run's limits may
    not cover: a run that lowered vllm_serve_health_timeout below that group's start would
    otherwise have the watchdog restart it before it serves, until it gives up.
    """
    limits = {"stall": whole(stall), "grace": whole(grace)}
    for arg in previous_args or []:
        name, _sep, value = str(arg).partition("=")
        key = {"--stall": "stall", "--grace": "grace"}.get(name)
        number = whole(value) if key else None
        if number is not None and (limits[key] is None or number > limits[key]):
            limits[key] = number
    return limits


def failed_start_message(
    *,
    image: str,
    image_id: str,
    restart_reason: str,
    reason: str,
    excerpt: str = "",
    cause: str = "",
    rolled_back: bool,
    back_healthy: bool = False,
    back_reason: str = "",
    previous_image: str = "",
    rollback_enabled: bool = True,
) -> str:
    """What a serving run says when the restarted group did not serve, by rollback branch.

    ``rolled_back``: the previous containers were kept and started again (a group served
    before this run); without one there is nothing to roll back to. ``back_healthy``: the
    previous group answered again within the wait. ``previous_image``: set when the Ray
    containers moved back with it (the new image was the one that failed).
    ``rollback_enabled``: vllm_serve_rollback; when false nothing was kept to go back to.
    ``cause``: a known cause named in words (vLLM's own memory refusal), after the excerpt.
    """
    said = (
        f"The serving group did not serve on {image} ({image_id[:19]}) after the restart "
        f"({restart_reason}): {reason}{': ' + excerpt if excerpt else ''}."
        + (f" {cause}." if cause else "")
    )
    if not rolled_back and not rollback_enabled:
        return f"{said} vllm_serve_rollback is false, so no previous containers were kept."
    if not rolled_back:
        return f"{said} Nothing served before this run, so there is nothing to roll back to."
    if back_healthy:
        back = "serve again"
    else:
        back = (
            f"were started again but do not answer yet ({back_reason}): what failed may be "
            "common to both, such as a node or the model files; playbooks/model.yml -e "
            "model_cache_verify=checksum reads every copy and replaces what differs"
        )
    with_ray = f" on {previous_image}, every Ray container with them" if previous_image else ""
    return f"{said} Rolled back: the previous containers {back}{with_ray}."
