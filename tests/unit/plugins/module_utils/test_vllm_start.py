"""The phases of a vLLM start read from its logs, and the stall verdict."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import vllm_start
from support.captures import KINDS, split, tool_output

FIXTURES = Path(__file__).resolve().parents[3] / "unit" / "fixtures" / "vllm_serve"
# The sim's own start (make demo, 2026-12-04): vLLM 0.32.0 prefixes a Ray actor's lines with
# Ray's coloured "(RayWorkerProc pid=…, ip=…)" and, inside it, the rank's "(Worker_TP1 pid=…)".
RAY_SIM = FIXTURES / "start_ray_sim_demo.log"
SPARK_GPU = FIXTURES / "start_spark_gpu_reconstructed.log"
STALLED = FIXTURES / "start_stalled_weights_sim.log"  # derived from RAY_SIM: cut at shard 0/2


def _lines(path: Path) -> list[str]:
    return tool_output(path).splitlines()


def _by_time(path: Path) -> list[str]:
    """The lines in the order of Docker's timestamps: what polls a second apart would see.
    Docker prints a container's two streams each in order but not merged by time; a line
    without a timestamp (tqdm's redraw) keeps the time of the line before it."""
    stamped, last = [], 0.0
    for index, line in enumerate(_lines(path)):
        if vllm_start.split_line(line)[0] is not None:
            last = vllm_start.split_line(line)[0]
        stamped.append((last, index, line))
    return [line for _t, _i, line in sorted(stamped)]


def _replay(path: Path, step: float = 1.0) -> tuple[vllm_start.StartProgress, list[dict]]:
    """Feed a log a line per poll, ``step`` seconds apart."""
    progress = vllm_start.StartProgress(started=0.0)
    events = []
    for index, line in enumerate(_lines(path)):
        events += progress.feed([line], now=(index + 1) * step)
    return progress, events


def test_the_reconstructed_spark_log_says_so():
    header, body = split(SPARK_GPU)
    assert header.startswith(KINDS[2]), header
    assert "Replace with a capture" in header
    assert body.strip()


def test_the_sim_logs_are_captured_or_cut_from_a_capture():
    assert split(RAY_SIM)[0].startswith("captured 2026-12-04 on the simulated pair")
    assert split(STALLED)[0].startswith("derived from `start_ray_sim_demo.log`")
    assert _lines(STALLED) == _lines(RAY_SIM)[: len(_lines(STALLED))]


def test_ray_start_goes_through_every_phase_in_order():
    progress = vllm_start.StartProgress(started=0.0)
    phases = []
    for index, line in enumerate(_by_time(RAY_SIM)):
        progress.feed([line], now=float(index))
        if not phases or phases[-1] != progress.phase:
            phases.append(progress.phase)
    assert phases == ["starting", "peers", "weights", "kv_cache", "server", "serving"]
    assert progress.summary() == "serving"


def test_read_in_dockers_order_the_start_never_goes_back():
    # uvicorn's "Application startup complete" comes on the other stream before the ranks'
    # lines Ray forwarded: the phase jumps to serving and stays there.
    progress = vllm_start.StartProgress(started=0.0)
    phases = []
    for index, line in enumerate(_lines(RAY_SIM)):
        progress.feed([line], now=float(index))
        if not phases or phases[-1] != progress.phase:
            phases.append(progress.phase)
    assert phases == ["starting", "peers", "weights", "serving"]


def test_ray_actor_lines_are_told_apart_by_rank_and_node():
    _progress, events = _replay(RAY_SIM)
    # Ray's outer prefix names the node of a rank on another node; vLLM's inner one the rank.
    loading = {e["rank"] for e in events if e["text"].startswith("Starting to load model")}
    assert loading == {"Worker_TP0", "Worker_TP1@172.30.241.12"}
    joined = {e["rank"] for e in events if e["text"].startswith("world_size=2 rank=")}
    assert joined == {"Worker", "Worker@172.30.241.12"}
    assert not any("\x1b" in e["text"] or "RayWorkerProc" in e["text"] for e in events)
    # Only rank 0 draws the shard bar; tqdm's carriage return puts it on a line of its own,
    # after Ray's prefix, so the bar carries no rank.
    assert [(e["rank"], e["bar"]["k"], e["bar"]["n"]) for e in events if e.get("bar")] == [
        ("", 0, 2),
        ("", 2, 2),
    ]


def test_shards_done_of_total_and_rate_in_the_summary():
    progress = vllm_start.StartProgress(started=0.0)
    lines = _lines(RAY_SIM)
    first = next(i for i, line in enumerate(lines) if "| 0/2 [" in line)
    progress.feed(lines[: first + 1], now=10.0)
    assert progress.phase == "weights"
    assert progress.summary() == "loading weights: driver 0/2 shards"
    done = next(i for i, line in enumerate(lines) if "| 2/2 [" in line)
    progress.feed(lines[first + 1 : done + 1], now=11.0)
    assert progress.summary() == "loading weights: driver 2/2 shards, 176.14it/s"


def test_waiting_for_rays_gpus_is_not_progress():
    # The capture's placement group was ready at once. vLLM 0.32.0 logs the wait from
    # vllm/v1/executor/ray_utils.py ("Waiting for creating a placement group of specs for %d
    # seconds. specs=%s. ..."); the lines below are the capture's own placement-group line
    # with that message in its place, at 10 s and again at 30 s.
    (found,) = [line for line in _lines(RAY_SIM) if "No current placement group found" in line]
    prefix = found[: found.index("No current placement group")]
    waits = [
        f"{prefix}Waiting for creating a placement group of specs for {s} seconds. "
        "specs=[{'GPU': 1.0, 'node:172.30.241.11': 0.001}, {'GPU': 1.0}]. Check `ray status` "
        "and `ray list nodes` to see if you have enough resources, and make sure the IP "
        "addresses used by ray cluster are the same as VLLM_HOST_IP environment variable "
        "specified in each node if you are running on a multi-node."
        for s in (10, 30)
    ]
    progress = vllm_start.StartProgress(started=0.0)
    progress.feed(waits[:1], now=5.0)
    assert progress.phase == "peers"
    assert progress.last_progress == 0.0
    assert "Waiting for creating a placement group of specs for 10 seconds" in progress.summary()
    assert progress.feed(waits[1:], now=40.0) == []
    assert progress.last_progress == 0.0
    assert len(progress.feed([found], now=41.0)) == 1
    assert progress.last_progress == 41.0


def test_a_line_seen_again_is_not_progress():
    progress = vllm_start.StartProgress(started=0.0)
    (line,) = [line for line in _lines(RAY_SIM) if "| 0/2 [" in line]
    assert len(progress.feed([line], now=1.0)) == 1
    assert progress.feed([line], now=2.0) == []
    assert progress.last_progress == 1.0


def test_gpu_start_fastsafetensors_compile_graphs_kv_cache():
    progress, events = _replay(SPARK_GPU)
    phases = [e["phase"] for e in events]
    assert phases.index("weights") < phases.index("compile") < phases.index("kv_cache")
    bars = [e["bar"] for e in events if e.get("bar")]
    weights = [b for b in bars if "Fastsafetensor" in b["desc"]]
    assert [(b["k"], b["n"]) for b in weights] == [(0, 39), (1, 39), (2, 39), (39, 39)]
    assert weights[1]["rate"] == "4.01s/it"
    graphs = [b for b in bars if b["desc"].startswith("Capturing CUDA graphs")]
    assert [(b["k"], b["n"]) for b in graphs] == [(0, 51), (25, 51), (51, 51)]
    assert progress.phase == "serving"


def test_a_capture_bar_is_summarised_as_graphs():
    progress = vllm_start.StartProgress(started=0.0)
    lines = [line for line in _lines(SPARK_GPU) if "25/51" in line]
    progress.feed(lines, now=1.0)
    assert progress.summary() == "compiling and capturing: driver 25/51 graphs, 2.41it/s"


def test_real_refused_start_shows_no_phase():
    """A real capture: vLLM refused its arguments before any rank started."""
    progress = vllm_start.StartProgress(started=0.0)
    text = tool_output(FIXTURES / "refusal_max_model_len.log")
    assert progress.feed(text.splitlines(), now=3.0) == []
    assert progress.phase == "starting"


def test_split_line_strips_docker_time_prefixes_and_ray_dedup():
    # A line of the capture (rank 1 on spark-2) with the suffix Ray's log deduplication adds
    # to a line that repeats across actors.
    (line,) = [
        line
        for line in _lines(RAY_SIM)
        if "(Worker_TP1 pid=94)" in line and "Loading weights took" in line
    ]
    assert line.startswith("2026-12-04T13:02:34.210147517Z \x1b[36m(RayWorkerProc pid=94, ip=")
    stamp, source, message = vllm_start.split_line(line + " [repeated 2x across cluster]\n")
    assert stamp == pytest.approx(1796389354.210147)
    assert source == "Worker_TP1@172.30.241.12"
    assert message == "Loading weights took 0.01 seconds"


def test_split_line_keeps_the_last_drawing_of_a_tqdm_line():
    _stamp, source, message = vllm_start.split_line(
        "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\r"
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:03<00:03, 3.0s/it]\r"
    )
    assert source == ""
    assert "1/2" in message


@pytest.mark.parametrize(
    ("now", "last", "expected"),
    [
        (100.0, 0.0, "progressing"),  # still within the stall time of the start
        (900.0, 0.0, "stalled"),  # nothing since the start for the stall time
        (1500.0, 1000.0, "progressing"),  # long start, progress 500 s ago
        (1900.0, 1000.0, "stalled"),
        (3600.0, 3599.0, "ceiling"),  # progressing, but past the ceiling
    ],
)
def test_stall_verdict(now, last, expected):
    assert vllm_start.stall_verdict(now, 0.0, last, stall=900, ceiling=3600) == expected


def test_a_slow_start_that_progresses_outlives_the_old_deadline():
    """Shards every 300 s: a start of 39 shards (~3.3 h) never stalls at a 900 s stall time."""
    progress = vllm_start.StartProgress(started=0.0)
    for k in range(40):
        now = 300.0 * k + 1
        progress.feed([f"Loading safetensors checkpoint shards: 0% Completed | {k}/39 [...]"], now)
        assert vllm_start.stall_verdict(now + 299, 0.0, progress.last_progress, 900, 1e9) == (
            "progressing"
        )


def test_stalled_start_names_the_phase_and_the_shards():
    progress, _events = _replay(STALLED)
    now = progress.last_progress + 900
    verdict = vllm_start.stall_verdict(now, 0.0, progress.last_progress, 900, 3600)
    assert verdict == "stalled"
    reason = vllm_start.stall_reason(verdict, progress, now, 900, 3600)
    assert reason == (
        "the start stalled while loading weights: driver 0/2 shards: no progress in the logs "
        "for 900 s (vllm_serve_start_stall_timeout is 900 s)"
    )


def test_ceiling_reason_names_the_setting():
    progress, _events = _replay(STALLED)
    reason = vllm_start.stall_reason("ceiling", progress, 3600.0, 900, 3600)
    assert reason.startswith("the start did not serve within vllm_serve_health_timeout (3600 s)")
    assert "loading weights" in reason


@pytest.mark.parametrize(
    ("stall", "ceiling", "load_format", "expected"),
    [
        (900, 3600, "auto", []),
        ("900", "3600.0", "fastsafetensors", []),
        (30, 3600, "auto", ["vllm_serve_start_stall_timeout is 30; allowed: whole seconds "
                            "60-7200"]),
        (True, 3600, "auto", ["vllm_serve_start_stall_timeout is True; allowed: whole seconds "
                              "60-7200"]),
        (900, 600, "auto", ["vllm_serve_health_timeout is 600; allowed: whole seconds from "
                            "vllm_serve_start_stall_timeout (900) to 86400"]),
        (900, "x", "auto", ["vllm_serve_health_timeout is 'x'; allowed: whole seconds from "
                            "vllm_serve_start_stall_timeout (900) to 86400"]),
    ],
)  # fmt: skip
def test_setting_errors(stall, ceiling, load_format, expected):
    assert vllm_start.setting_errors(stall, ceiling, load_format) == expected


@pytest.mark.parametrize("load_format", ["", "Fast Loader", None, "--load-format"])
def test_setting_errors_name_the_load_format(load_format):
    (error,) = vllm_start.setting_errors(900, 3600, load_format)
    assert error.startswith(f"vllm_serve_load_format is {load_format!r}; allowed: auto")


@pytest.mark.parametrize(
    ("setting", "modules", "expected"),
    [
        ("auto", {"fastsafetensors": {"version": "0.1.14", "error": None},
                  "instanttensor": {"version": None, "error": "ModuleNotFoundError: x"}},
         ("fastsafetensors", "the serving image carries fastsafetensors (0.1.14)")),
        ("auto", {"fastsafetensors": {"version": None, "error": "ModuleNotFoundError: x"},
                  "instanttensor": {"version": None, "error": None}},
         ("instanttensor", "the serving image carries instanttensor (version unknown)")),
        ("auto", {"fastsafetensors": {"version": None, "error": "ModuleNotFoundError: x"},
                  "instanttensor": {"version": None, "error": "ModuleNotFoundError: y"}},
         ("", "the serving image carries neither fastsafetensors nor instanttensor: vLLM's "
              "default loader")),
        ("auto", {}, ("", "the serving image carries neither fastsafetensors nor instanttensor: "
                          "vLLM's default loader")),
        ("safetensors", {"fastsafetensors": {"version": "1", "error": None}},
         ("safetensors", "vllm_serve_load_format is safetensors")),
    ],
)  # fmt: skip
def test_choose_load_format(setting, modules, expected):
    assert vllm_start.choose_load_format(setting, modules) == expected


CAPTURED = FIXTURES / "start_ray_sim_captured.log"


def test_a_captured_ray_start_goes_through_every_phase_in_order():
    header, _body = split(CAPTURED)
    assert header.startswith(KINDS[0]), header
    # The ranks' lines interleave (rank 1 says it joined after rank 0 began loading): the
    # start's phase follows its furthest line and never goes back.
    progress = vllm_start.StartProgress(started=0.0)
    phases = []
    for index, line in enumerate(_lines(CAPTURED)):
        progress.feed([line], now=float(index))
        if not phases or phases[-1] != progress.phase:
            phases.append(progress.phase)
    assert phases == ["starting", "peers", "weights", "kv_cache", "server", "serving"]
    assert progress.summary() == "serving"


def test_a_captured_ray_start_tells_the_ranks_apart_by_node():
    # Ray's coloured outer prefix names the node of the rank on the worker; vLLM's inner one
    # names the rank: both are kept.
    _progress, events = _replay(CAPTURED)
    loading = {e["rank"] for e in events if e["text"].startswith("Loading weights took")}
    assert loading == {"Worker_TP0", "Worker_TP1@172.30.241.12"}
    assert not any("\x1b" in e["text"] for e in events)
    bars = [e["bar"] for e in events if e.get("bar")]
    assert [(b["k"], b["n"]) for b in bars] == [(0, 2), (2, 2)]


@pytest.mark.parametrize(
    ("interval", "failures", "restarts", "window", "expected"),
    [
        (30, 3, 3, 1800, []),  # the role's defaults
        (10, 3, 3, 1800, []),  # the sim's
        (0, 3, 3, 1800, ["vllm_serve_watchdog_interval is 0; allowed: whole seconds 2-600"]),
        (1.5, 3, 3, 1800, ["vllm_serve_watchdog_interval is 1.5; allowed: whole seconds 2-600"]),
        ("30", 3, 3, 1800, []),  # from an extra var, as a string
        (30, 0, 3, 1800, ["vllm_serve_watchdog_failures is 0; allowed: whole probes 1-20"]),
        (30, 3, -1, 1800, ["vllm_serve_watchdog_max_restarts is -1; allowed: whole restarts 1-20"]),
        (30, 3, 3, 10, ["vllm_serve_watchdog_window is 10; allowed: whole seconds 60-86400"]),
        (True, 3, 3, 1800, ["vllm_serve_watchdog_interval is True; allowed: whole seconds 2-600"]),
        (
            600, 20, 3, 3600,
            ["vllm_serve_watchdog_window is 3600; allowed: at least vllm_serve_watchdog_interval "
             "x vllm_serve_watchdog_failures (12000 s), the time one failure takes to judge"],
        ),
    ],
)  # fmt: skip
def test_watchdog_setting_errors(interval, failures, restarts, window, expected):
    assert vllm_start.watchdog_setting_errors(interval, failures, restarts, window) == expected


@pytest.mark.parametrize(
    ("busy_limit", "expected"),
    [
        (600, []),  # the role's default
        (0, []),  # never wait for a busy server
        ("900", []),
        (-1, ["vllm_serve_watchdog_busy_limit is -1; allowed: whole seconds 0-86400"]),
        (90000, ["vllm_serve_watchdog_busy_limit is 90000; allowed: whole seconds 0-86400"]),
    ],
)
def test_the_watchdog_s_busy_limit_is_checked(busy_limit, expected):
    assert vllm_start.watchdog_setting_errors(30, 3, 3, 1800, busy_limit) == expected


# --------------------------------------------------------------------------- failed start
FAILED = {
    "image": "dgx-spark/vllm-serving:current",
    "image_id": "sha256:0123456789abcdef0123456789",
    "restart_reason": "the serving image changed",
    "reason": "the serving container exited (code 1)",
    "excerpt": "ValueError: current platform cpu does not support ray",
}


def test_a_failed_start_with_a_group_that_served_before_rolls_back_and_says_so():
    said = vllm_start.failed_start_message(**FAILED, rolled_back=True, back_healthy=True)
    assert said == (
        "The serving group did not serve on dgx-spark/vllm-serving:current "
        "(sha256:0123456789ab) after the restart (the serving image changed): the serving "
        "container exited (code 1): ValueError: current platform cpu does not support ray. "
        "Rolled back: the previous containers serve again."
    )
    moved = vllm_start.failed_start_message(
        **FAILED, rolled_back=True, back_healthy=True,
        previous_image="dgx-spark/vllm-serving:previous",
    )  # fmt: skip
    assert moved.endswith(
        "Rolled back: the previous containers serve again on dgx-spark/vllm-serving:previous, "
        "every Ray container with them."
    )


def test_a_previous_group_that_does_not_answer_yet_points_at_what_both_share():
    said = vllm_start.failed_start_message(
        **FAILED, rolled_back=True, back_healthy=False,
        back_reason="no answer within 600 s",
    )  # fmt: skip
    assert "Rolled back: the previous containers were started again but do not answer yet " in said
    assert "(no answer within 600 s)" in said
    assert "playbooks/model.yml -e model_cache_verify=checksum" in said
    assert "serve again" not in said


def test_a_first_start_that_fails_has_nothing_to_roll_back_to():
    said = vllm_start.failed_start_message(**FAILED, rolled_back=False, back_healthy=True)
    assert said.endswith("Nothing served before this run, so there is nothing to roll back to.")
    assert "Rolled back" not in said
    bare = vllm_start.failed_start_message(**{**FAILED, "excerpt": ""}, rolled_back=False)
    assert "(code 1). Nothing served" in bare


def test_with_rollback_off_the_message_says_so_instead_of_blaming_the_pair():
    said = vllm_start.failed_start_message(**FAILED, rolled_back=False, rollback_enabled=False)
    assert said.endswith("vllm_serve_rollback is false, so no previous containers were kept.")
    assert "Nothing served before" not in said


WATCHDOG_ARGS = ["/etc/dgx-spark-watchdog/dgx_spark_watchdog.py", "--url=http://127.0.0.1:8000",
                 "--interval=10", "--grace=900", "--stall=60", "--window=1800"]  # fmt: skip


def test_a_rolled_back_group_keeps_the_longer_limits_it_was_watched_with():
    # This run lowered the ceiling to 60 s; the group it rolls back to was watched with 900.
    assert vllm_start.rollback_watch_limits(WATCHDOG_ARGS, 60, 60) == {"stall": 60, "grace": 900}
    # This run's limits win where they are the longer ones.
    assert vllm_start.rollback_watch_limits(WATCHDOG_ARGS, 120, 3600) == {
        "stall": 120,
        "grace": 3600,
    }


def test_without_a_previous_watchdog_the_runs_own_limits_hold():
    assert vllm_start.rollback_watch_limits([], 900, 3600) == {"stall": 900, "grace": 3600}
    assert vllm_start.rollback_watch_limits(None, "900", "3600") == {"stall": 900, "grace": 3600}
    # Arguments that are not whole seconds are not limits.
    odd = ["--grace=soon", "--stall=", "--grace", "--interval=7200"]
    assert vllm_start.rollback_watch_limits(odd, 900, 3600) == {"stall": 900, "grace": 3600}
