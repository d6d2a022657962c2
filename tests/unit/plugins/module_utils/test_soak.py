"""plugins/module_utils/soak.py: the soak's settings, per-minute figures, stalls and verdict;
and playbooks/soak.yml refusing settings out of range before it contacts any node."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ansible_collections.dgx_spark.cluster.plugins.module_utils import soak
from ansible_collections.dgx_spark.cluster.plugins.module_utils.soak import Request, Token

ROOT = Path(__file__).resolve().parents[4]
BIN = Path(sys.executable).parent
# 2026-12-04 16:00:00 UTC: the wall clock at the start of the soaks below.
WALL = 1796400000.0


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"soak_minutes": 0}, ["soak_minutes is 0; allowed: whole minutes 1-1440"]),
        ({"soak_minutes": "1.5"}, ["soak_minutes is '1.5'; allowed: whole minutes 1-1440"]),
        ({"soak_stall_s": "abc"}, ["soak_stall_s is 'abc'; allowed: whole seconds 1-3600"]),
        ({"soak_streams": 65}, ["soak_streams is 65; allowed: whole streams 1-64"]),
        ({"soak_minutes": 30, "soak_stall_s": 60, "soak_streams": 8}, []),
        ({"soak_minutes": "1", "soak_stall_s": 3600.0, "soak_streams": "64"}, []),
    ],
)
def test_settings_out_of_range_are_named_with_their_range(values, named):
    assert soak.setting_errors(values) == named


def test_every_setting_has_a_module_option():
    assert set(soak.OPTIONS) == set(soak.RANGES)


def _playbook() -> dict:
    return yaml.safe_load((ROOT / "playbooks/soak.yml").read_text())[0]


def test_the_playbook_checks_the_same_ranges():
    ranges = _playbook()["vars"]["_soak_ranges"]
    assert {name: tuple(bounds) for name, bounds in ranges.items()} == soak.RANGES


def _run_playbook(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    # TEST-NET addresses (RFC 5737) no test may reach: the refusal must come before any task
    # that connects.
    hosts = {"all": {"children": {"sparks": {"children": {
        "spark_head": {"hosts": {"head": {"ansible_host": "192.0.2.1"}}},
        "spark_workers": {"hosts": {"worker": {"ansible_host": "192.0.2.2"}}},
    }}}}}  # fmt: skip
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump(hosts))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/soak.yml", "-i", str(inventory), *extra],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["-e", "soak_minutes=0"], ["soak_minutes is 0; allowed: whole minutes 1-1440"]),
        (
            ["-e", "soak_stall_s=-5", "-e", "soak_streams=100"],
            [
                "soak_stall_s is -5; allowed: whole seconds 1-3600",
                "soak_streams is 100; allowed: whole streams 1-64",
            ],
        ),  # fmt: skip
        (["-e", '{"soak_minutes": 2.5}'], ["soak_minutes is 2.5; allowed: whole minutes 1-1440"]),
    ],
)
def test_the_playbook_refuses_bad_settings_before_it_connects(tmp_path, extra, said):
    run = _run_playbook(tmp_path, *extra)
    out = " ".join((run.stdout + run.stderr).split())
    assert run.returncode != 0, out
    for words in said:
        assert words in out, out
    assert "unreachable=0" in out and "failed=1" in out, out
    assert "Read the serving settings" not in out, out


@pytest.mark.parametrize(
    ("chunk", "seen", "expected"),
    [
        # vLLM with continuous_usage_stats: the request's running count in every chunk.
        ({"choices": [{"index": 0, "text": " the"}],
          "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}, 2, (1, 3)),
        # Two tokens in one chunk (speculative decoding accepted one).
        ({"choices": [{"text": " a b"}], "usage": {"completion_tokens": 7}}, 5, (2, 7)),
        # The last chunk with include_usage: no choices, the final count.
        ({"choices": [], "usage": {"completion_tokens": 7}}, 7, (0, 7)),
        # Without usage: a chunk with text is one token, one without none.
        ({"choices": [{"text": "x"}]}, 4, (1, 5)),
        ({"choices": [{"text": "", "finish_reason": "length"}]}, 4, (0, 4)),
        ("[DONE]", 4, (0, 4)),
    ],
)  # fmt: skip
def test_tokens_of_a_chunk(chunk, seen, expected):
    assert soak.chunk_tokens(chunk, seen) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'data: {"choices": [{"text": "hi"}]}\n', {"choices": [{"text": "hi"}]}),
        (b"data: [DONE]\n", "[DONE]"),
        (b"\n", None),
        (b": keep-alive\n", None),
        (b"data: {not json\n", None),
    ],
)
def test_server_sent_event_lines(line, expected):
    assert soak.sse_data(line) == expected


def test_the_request_streams_exactly_max_tokens_with_running_usage():
    body = soak.request_body("tiny-qwen3-moe", "Once", 64)
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 64
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def _steady(start: float, end: float, every: float, streams: int = 2) -> list[Token]:
    tokens, at = [], start + every
    while at <= end:
        tokens += [Token(at, n) for n in range(1, streams + 1)]
        at += every
    return tokens


def test_per_minute_counts_each_minute_and_a_short_last_one():
    tokens = _steady(0.0, 150.0, 0.5)  # two tokens every half second: 4 tokens/s
    minutes = soak.per_minute(tokens, 0.0, 150.0)
    assert [m["minute"] for m in minutes] == [1, 2, 3]
    assert [m["seconds"] for m in minutes] == [60.0, 60.0, 30.0]
    assert [m["tokens_per_s"] for m in minutes] == [pytest.approx(4.0, abs=0.1)] * 3
    assert sum(m["tokens"] for m in minutes) == len(tokens)


def test_per_minute_shows_a_minute_without_tokens():
    tokens = [t for t in _steady(0.0, 180.0, 1.0) if not 60 <= t.at < 120]
    assert [m["tokens"] for m in soak.per_minute(tokens, 0.0, 180.0)] == [118, 0, 122]


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([1.0, 2.0, 3.0], (3.0, 7.0)),  # from the last token to the end
        ([6.0, 7.0, 9.5], (0.0, 6.0)),  # from the start to the first token
        ([1.0, 2.0, 6.5, 9.0], (2.0, 4.5)),  # between two tokens
        ([], (0.0, 10.0)),  # no token at all
    ],
)
def test_longest_stall(times, expected):
    tokens = [Token(at, 1) for at in times]
    began, seconds = soak.longest_stall(tokens, 0.0, 10.0)
    assert (began, round(seconds, 6)) == expected


def test_waiting_streams_are_those_with_a_request_open_during_the_stall():
    requests = [
        Request(1, 0.0, 5.0),  # ended before the stall
        Request(1, 5.0, None),  # open throughout
        Request(2, 4.0, 20.0),  # ended after it began
        Request(3, 11.0, 12.0, "no answer (timed out)"),  # failed inside it
        Request(4, 30.0, None),  # began after it
    ]
    assert soak.waiting_streams(requests, 10.0, 25.0) == [1, 2, 3]


def test_a_steady_soak_passes_and_reports_its_longest_stall():
    tokens = _steady(0.0, 120.0, 0.25, streams=4)
    # One slow moment: 1.5 s without a token, 70 s in.
    tokens = [t for t in tokens if not 70.0 < t.at < 71.5]
    requests = [Request(n, 0.0, 120.0) for n in range(1, 5)]
    report = soak.judge(tokens, requests, 0.0, 120.0, stall_s=10, streams=4, wall_start=WALL)
    assert report["passed"]
    assert report["longest_stall"] == {"seconds": 1.5, "began": "2026-12-04 16:01:10 UTC",
                                       "began_after_s": 70.0, "ongoing": False,
                                       "streams": [1, 2, 3, 4]}  # fmt: skip
    assert [m["tokens_per_s"] for m in report["minutes"]] == [15.9, 15.7]
    assert report["msg"].startswith("soak passed: 2 min 0 s under 4 streams")
    assert "longest stall 1.5 s from 2026-12-04 16:01:10 UTC" in report["msg"]
    assert report["table"][0] == "minute    1:     15.9 tokens/s (956 tokens)"
    assert report["table"][-1] == "longest stall: 1.5 s from 2026-12-04 16:01:10 UTC"


def test_a_frozen_rank_fails_the_soak_naming_the_stall():
    # Tokens for 95 s, then none: the soak stopped at the limit, 12 s later.
    tokens = _steady(0.0, 95.0, 0.5, streams=3)
    requests = [Request(n, 90.0 + n, None) for n in (1, 2, 3)]
    requests.append(Request(3, 80.0, 91.0))
    report = soak.judge(tokens, requests, 0.0, 107.0, stall_s=10, streams=3, wall_start=WALL,
                        stopped_early=True)  # fmt: skip
    assert not report["passed"]
    stall = report["longest_stall"]
    assert (stall["seconds"], stall["began_after_s"], stall["ongoing"]) == (12.0, 95.0, True)
    assert stall["streams"] == [1, 2, 3]
    assert report["msg"] == (
        "soak failed: stall of at least 12.0 s, still stalled when the soak stopped (no token on "
        "any stream) from 2026-12-04 16:01:35 UTC, 1 min 35 s into the soak; limit soak_stall_s "
        "10 s; streams 1, 2, 3 waiting on a request"
    )
    assert report["table"][-1].endswith("(ongoing)")


def test_a_stall_that_ended_fails_with_the_errors_meanwhile():
    tokens = [t for t in _steady(0.0, 60.0, 0.5, streams=1) if not 20.0 < t.at < 45.0]
    requests = [Request(1, 0.0, 20.0), Request(1, 20.0, 30.0, "no answer (timed out)"),
                Request(1, 31.0, 60.0)]  # fmt: skip
    report = soak.judge(tokens, requests, 0.0, 60.0, stall_s=20, streams=1, wall_start=WALL)
    assert not report["passed"]
    assert report["longest_stall"]["ongoing"] is False
    assert "stall of 25.0 s (no token on any stream) from 2026-12-04 16:00:20 UTC" in report["msg"]
    assert report["msg"].endswith(
        "stream 1 waiting on a request; requests failed meanwhile, the last: stream 1: "
        "no answer (timed out)"
    )
    assert report["failed_requests"] == 1 and report["requests"] == 2
    assert report["errors"] == ["stream 1: no answer (timed out)"]


def test_a_soak_of_an_endpoint_that_refuses_names_the_refusal():
    requests = [Request(n, float(i), i + 0.01, "HTTP 401: Unauthorized") for i in range(6)
                for n in (1, 2)]  # fmt: skip
    report = soak.judge([], requests, 0.0, 5.5, stall_s=5, streams=2, wall_start=WALL,
                        stopped_early=True)  # fmt: skip
    assert not report["passed"] and report["tokens"] == 0
    assert report["msg"].endswith("the last: stream 2: HTTP 401: Unauthorized")


@pytest.mark.parametrize(
    ("last", "now", "over"),
    [(None, 10.0, False), (None, 10.5, True), (5.0, 15.0, False), (5.0, 15.1, True)],
)
def test_the_soak_stops_once_no_token_came_for_longer_than_the_limit(last, now, over):
    assert soak.over_limit(last, 0.0, now, 10) is over


def test_utc_times_follow_the_wall_clock_at_the_start():
    assert soak.utc(WALL, 100.0, 165.0) == "2026-12-04 16:01:05 UTC"
    assert time.gmtime(WALL).tm_hour == 16
