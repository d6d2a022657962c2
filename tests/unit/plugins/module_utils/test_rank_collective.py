"""Tests for plugins/module_utils/rank_collective.py: what a rank's output says and what the
run decides from every rank's, on real NCCL_DEBUG=INFO captures (tests/unit/fixtures/host_prep,
each with its ``#|`` provenance header).

The captures come from nccl-tests under mpirun, where both hosts print into one stream; a node
runs its own rank here, so :func:`own_lines` keeps one host's lines of a capture. Where a case
needs what no capture shows (the script's result line, a hang's faulthandler line, a failed
rendezvous), the test adds it to a real capture and says so."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import rank_collective as rc
from support.captures import tool_output

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "tests/unit/fixtures/host_prep"
SCRIPT = ROOT / "roles/vllm_serve/files/rank_collective.py"
PORT1_HCA = "rocep1s0f1,roceP2p1s0f1"
PORT0_HCA = "rocep1s0f0,roceP2p1s0f0"


def capture(name: str) -> str:
    return tool_output(FIXTURES / name)


def own_lines(text: str, host: str) -> str:
    """One host's NCCL lines of a two-host capture."""
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith(host + ":"))


def result(backend: str, rank: int, **extra) -> str:
    """A result line as rank_collective.py prints it (made here: no capture has one yet)."""
    line = {"check": "rank_collective", "op": "all_reduce", "rank": rank, "world_size": 2,
            "backend": backend, "nccl_version": None, "nccl_library": "", "wrong": 0,
            "busbw_gbps": 0.4, "elapsed_s": 3.1}  # fmt: skip
    line.update(extra)
    return rc.MARK + json.dumps(line, sort_keys=True) + "\n"


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("all_gather_perf_spark_ib.txt", "2.28.9+cuda13.0"),
        ("all_gather_perf_spark_port0.txt", "2.28.9+cuda13.0"),
        ("all_gather_perf_h200x2_p2p.txt", "2.28.3+cuda13.0"),
        ("all_gather_perf_h200x2_socket.txt", "2.28.3+cuda13.0"),
        ("all_gather_perf_spark_nodebug.txt", ""),
    ],
)
def test_the_nccl_version_is_read_from_the_init_line(name, version):
    assert rc.nccl_version(capture(name)) == version


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2.28.9+cuda13.0", (2, 28, 9)), ("2.30.7", (2, 30, 7)), ("", ()), (None, ())],
)
def test_version_tuple(text, expected):
    assert rc.version_tuple(text) == expected


def test_one_spark_rank_reads_net_ib_on_both_twins():
    parsed = rc.parse_output(own_lines(capture("all_gather_perf_spark_ib.txt"), "spark-fb97"))
    assert parsed["transport"]["transport"] == "IB"
    assert parsed["nccl_version"] == "2.28.9+cuda13.0"
    assert parsed["result"] is None and not parsed["hung"]


def test_a_socket_fallback_reads_as_socket():
    parsed = rc.parse_output(capture("all_gather_perf_h200x2_socket.txt"))
    assert parsed["transport"]["transport"] == "Socket"
    assert parsed["transport"]["socket_ifaces"] == ["eth0"]


def test_the_result_line_is_found_after_the_nccl_lines():
    text = own_lines(capture("all_gather_perf_spark_ib.txt"), "spark-4440") + result(
        "nccl", 1, nccl_version="2.28.9", nccl_library="/opt/dgx-spark-nccl/libnccl.so.2"
    )
    parsed = rc.parse_output(text)
    assert parsed["result"]["rank"] == 1
    assert parsed["library"] == "/opt/dgx-spark-nccl/libnccl.so.2"
    # The init line's full version wins over torch's tuple.
    assert parsed["nccl_version"] == "2.28.9+cuda13.0"


def test_a_gloo_rank_has_no_nccl_transport():
    parsed = rc.parse_output(result("gloo", 0))
    assert parsed["backend"] == "gloo"
    assert parsed["transport"] == {"transport": "gloo"}
    assert parsed["nccl_version"] == ""


# --------------------------------------------------------------------------- the decision


def spark_nodes(name: str, tail0: str = "", tail1: str = "", rc0=0, rc1=0, hung=False) -> dict:
    text = capture(name)
    return {
        "spark-1": {"output": own_lines(text, "spark-fb97") + tail0, "rc": rc0, "timed_out": hung},
        "spark-2": {"output": own_lines(text, "spark-4440") + tail1, "rc": rc1, "timed_out": hung},
    }


def test_two_ranks_over_net_ib_on_the_configured_twins_pass():
    nodes = spark_nodes("all_gather_perf_spark_ib.txt", result("nccl", 0), result("nccl", 1))
    hca = {"spark-1": PORT1_HCA, "spark-2": PORT1_HCA}
    decision = rc.decide(nodes, require_ib=True, ib_hca=hca)
    assert decision["passed"], decision["message"]
    assert "NCCL 2.28.9+cuda13.0, transport IB" in decision["message"]


def test_a_hang_names_the_version_the_transport_and_what_to_try():
    # The faulthandler line the script prints at its deadline, added to a real capture.
    hang = "Timeout (0:03:00)!\nThread 0x0000ffff (most recent call first):\n"
    nodes = spark_nodes("all_gather_perf_spark_ib.txt", hang, hang, rc0=None, rc1=None)
    decision = rc.decide(nodes, require_ib=True, nccl_library="image", image="dgx/x:current")
    assert not decision["passed"]
    assert decision["failed"] == ["spark-1", "spark-2"]
    message = decision["message"]
    assert "did not finish within the timeout (a hang)" in message
    assert "NCCL 2.28.9+cuda13.0, transport IB" in message
    assert "spark_nccl_library: host" in message
    assert "NCCL >= 2.30.7" in message
    assert "vllm_serve_collective_timeout" in message
    assert message.endswith("Nothing serving was touched: the running group keeps serving.")


def test_with_the_hosts_nccl_the_advice_is_a_newer_host_nccl():
    hang = "Timeout (0:03:00)!\n"
    nodes = spark_nodes("all_gather_perf_spark_ib.txt", hang, hang, rc0=None, rc1=None)
    message = rc.decide(nodes, nccl_library="host")["message"]
    assert "spark_nccl_library: host (the ranks" not in message
    assert "NCCL >= 2.30.7" in message and "(spark_nccl_library: host)" in message


def test_with_auto_a_hang_on_2_28_advises_the_hosts_nccl_and_names_the_reports():
    hang = "Timeout (0:03:00)!\n"
    nodes = spark_nodes("all_gather_perf_spark_ib.txt", hang, hang, rc0=None, rc1=None)
    message = rc.decide(nodes, nccl_library="auto")["message"]
    assert "spark_nccl_library: host (the ranks" in message
    assert "NCCL >= 2.30.7 (2.28.x has public deadlock reports on GB10 pairs)" in message
    assert "(spark_nccl_library: auto)" in message


def test_the_cable_in_port_0_with_port_1s_twins_configured_fails_on_the_devices():
    # The port-0 capture (NET/IB on rocep1s0f0/roceP2p1s0f0) with NCCL_IB_HCA of port 1.
    nodes = spark_nodes("all_gather_perf_spark_port0.txt", result("nccl", 0), result("nccl", 1))
    hca = {"spark-1": PORT1_HCA, "spark-2": PORT1_HCA}
    decision = rc.decide(nodes, require_ib=True, ib_hca=hca)
    assert not decision["passed"]
    assert "NCCL used NET/IB on rocep1s0f0" in decision["message"]
    assert "NCCL_IB_HCA in comm.env naming the cabled port's RoCE devices" in decision["message"]
    # Named right, the same capture passes.
    good = rc.decide(nodes, require_ib=True, ib_hca={"spark-1": PORT0_HCA, "spark-2": PORT0_HCA})
    assert good["passed"], good["message"]


def test_a_socket_fallback_fails_where_net_ib_is_required():
    text = capture("all_gather_perf_h200x2_socket.txt")
    nodes = {"a": {"output": text + result("nccl", 0), "rc": 0}}
    decision = rc.decide(nodes, require_ib=True, ib_hca={"a": PORT1_HCA})
    assert not decision["passed"]
    assert "NET/Socket over eth0" in decision["message"]
    assert "transport Socket" in decision["message"]
    # Off hardware (no RDMA required) the same run passes.
    assert rc.decide(nodes, require_ib=False)["passed"]


def test_wrong_values_fail():
    nodes = {"a": {"output": result("gloo", 0, wrong=7), "rc": 0}}
    decision = rc.decide(nodes)
    assert not decision["passed"]
    assert "7 wrong values" in decision["message"]


def test_a_gloo_pair_passes_and_says_so():
    nodes = {
        "sim-1": {"output": result("gloo", 0), "rc": 0},
        "sim-2": {"output": result("gloo", 1), "rc": 0},
    }
    decision = rc.decide(nodes)
    assert decision["passed"]
    assert decision["message"].splitlines() == [
        "sim-1: all_reduce over 2 ranks, backend gloo, transport gloo, busbw 0.4 GB/s, 3.1 s",
        "sim-2: all_reduce over 2 ranks, backend gloo, transport gloo, busbw 0.4 GB/s, 3.1 s",
    ]


def test_a_failed_rendezvous_names_the_address_to_check():
    # What torch raises when the head's address does not answer (made here, not captured).
    text = "torch.distributed.DistNetworkError: The client socket has timed out after 30s\n"
    decision = rc.decide({"sim-2": {"output": text, "rc": 1}}, backend="gloo")
    assert not decision["passed"]
    assert "failed (exit 1): torch.distributed.DistNetworkError" in decision["message"]
    assert "the head's fast-link address" in decision["message"]
    assert "; backend gloo (spark_nccl_library: image)" in decision["message"]
    # Where NCCL was expected, the message says no NCCL line came.
    nccl = rc.decide({"a": {"output": text, "rc": 1}}, backend="nccl")["message"]
    assert "NCCL unknown (no NCCL init line), transport unknown" in nccl


def test_a_rank_without_output_fails():
    decision = rc.decide({"a": {"output": "", "rc": None, "timed_out": False}})
    assert not decision["passed"]
    assert "no result line" in decision["message"]


# --------------------------------------------------------------------------- plan and stamp

SKIP = {"valid": True, "reason": "skipped: collective passed 2026-12-01T00:00:00Z (1 d ago)"}


def node(image="sha256:aa", stamp=None) -> dict:
    return {"image_id": image, "stamp": stamp or {"valid": False, "reason": "runs: no stamp"}}


def test_the_first_pass_runs():
    plan = rc.plan(True, {"a": node(), "b": node()})
    assert plan["run"]
    assert plan["stale"] == {"a": "runs: no stamp", "b": "runs: no stamp"}


def test_nothing_changed_skips():
    plan = rc.plan(True, {"a": node(stamp=SKIP), "b": node(stamp=SKIP)})
    assert not plan["run"]
    assert "a: skipped: collective passed 2026-12-01T00:00:00Z" in plan["reason"]


def test_a_changed_comm_setting_on_one_node_runs():
    changed = {"valid": False, "reason": "runs: comm_env changed from A=1 to A=2"}
    plan = rc.plan(True, {"a": node(stamp=SKIP), "b": node(stamp=changed)})
    assert plan["run"]
    assert plan["stale"] == {"b": "runs: comm_env changed from A=1 to A=2"}


def test_switched_off_or_without_the_image_it_does_not_run():
    assert not rc.plan(False, {"a": node()})["run"]
    plan = rc.plan(True, {"a": node(image=""), "b": node()})
    assert not plan["run"] and "not on a" in plan["reason"]


def test_the_stamp_keeps_what_the_pass_showed():
    kept = rc.stamp_result(rc.parse_output(result("gloo", 0)))
    assert kept["backend"] == "gloo" and kept["op"] == "all_reduce" and kept["elapsed_s"] == 3.1
    assert kept["transport"] == "gloo"


# --------------------------------------------------------------------------- the rank's script


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("rank_collective_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_and_the_parser_agree_on_the_mark(script):
    assert script.MARK == rc.MARK


@pytest.mark.parametrize(
    "argv",
    [
        ["--rank", "0", "--master-addr", "a", "--master-port", "1", "--size-mib", "0"],
        ["--rank", "0", "--master-addr", "a", "--master-port", "1", "--size-mib", "2048"],
        ["--rank", "2", "--master-addr", "a", "--master-port", "1"],
        ["--rank", "0", "--world-size", "1", "--master-addr", "a", "--master-port", "1"],
    ],
)
def test_the_script_refuses_unbounded_or_impossible_runs(script, argv):
    with pytest.raises(SystemExit):
        script.arguments(argv)


def test_the_script_finds_no_nccl_in_a_process_without_it(script):
    assert script.loaded_nccl() == ""


# The script's value check (it counts the elements that differ from the expected sum with
# torch; what it decides from that count is value_check, pure), and the controller's verdict.


@pytest.mark.parametrize(("world", "expected"), [(2, 3.0), (3, 6.0), (4, 10.0)])
def test_the_expected_sum_is_one_plus_two_up_to_the_world(script, world, expected):
    assert script.expected_sum(world) == expected


def test_a_right_sum_passes_with_no_message(script):
    assert script.value_check(1, 2, 0) == {"expected": 3.0, "wrong": 0, "got": None, "message": ""}


def test_a_wrong_sum_names_the_rank_what_it_read_and_what_it_should_have(script):
    verdict = script.value_check(1, 2, 16777216, 2.0)
    assert verdict["wrong"] == 16777216
    assert verdict["got"] == 2.0
    assert verdict["message"] == (
        "rank 1 of 2: 16777216 values after the all_reduce read 2.0 instead of 3"
    )


def result_line(script, rank: int, wrong: int, got: float | None) -> str:
    """The line main() prints, with the fields decide() reads (made here: torch is absent)."""
    verdict = script.value_check(rank, 2, wrong, got)
    line = {"check": "rank_collective", "op": "all_reduce", "rank": rank, "world_size": 2,
            "backend": "gloo", "nccl_version": None, "nccl_library": "",
            "wrong": verdict["wrong"], "wrong_message": verdict["message"],
            "busbw_gbps": 0.4, "elapsed_s": 3.1}  # fmt: skip
    return script.MARK + json.dumps(line, sort_keys=True) + "\n"


def test_the_controller_refuses_the_rank_that_summed_wrong_and_only_it(script):
    nodes = {
        "spark-head": {"output": result_line(script, 0, 0, None), "rc": 0},
        "spark-worker": {"output": result_line(script, 1, 5, 2.0), "rc": 0},
    }
    verdict = rc.decide(nodes, image="img", backend="gloo")
    assert verdict["passed"] is False
    assert verdict["failed"] == ["spark-worker"]
    refused = [line for line in verdict["message"].splitlines() if "wrong values" in line]
    assert len(refused) == 1
    assert refused[0].startswith("spark-worker: the two-rank collective in img: 5 wrong values")


def test_the_controller_passes_when_every_rank_summed_right(script):
    nodes = {
        "spark-head": {"output": result_line(script, 0, 0, None), "rc": 0},
        "spark-worker": {"output": result_line(script, 1, 0, None), "rc": 0},
    }
    verdict = rc.decide(nodes, image="img", backend="gloo")
    assert verdict["passed"] is True and verdict["failed"] == []


def test_main_uses_the_value_check_on_the_expected_sum(script):
    # main() needs torch and a peer; what it must not do is compute its own sum or verdict.
    source = SCRIPT.read_text()
    body = source[source.index("def main(") :]
    assert "expected = expected_sum(world)" in body
    assert "value_check(args.rank, world, wrong, first_wrong)" in body
    assert '"wrong": verdict["wrong"]' in body
