"""plugins/filter/vllm_serve.py: the failed start's message, as rollback.yml calls it."""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.filter import vllm_serve

FAILED_START = vllm_serve.OPERATIONS["failed_start"]
# vllm_start_wait's result for a start that exited, and the previous group's wait.
WAIT = {"healthy": False, "reason": "the serving container exited (code 1)", "excerpt": ""}
IMAGE = ("dgx-spark/vllm-serving:current", "sha256:" + "ab" * 32, "the key changed")


def test_each_rollback_branch_through_the_filter():
    back = FAILED_START(WAIT, *IMAGE, True, {"healthy": True, "reason": ""}, "")
    assert back.endswith("Rolled back: the previous containers serve again.")
    slow = FAILED_START(WAIT, *IMAGE, True, {"healthy": False, "reason": "no answer in 600 s"})
    assert "were started again but do not answer yet (no answer in 600 s)" in slow
    # No previous group: rollback.yml passes the skipped wait as {}.
    first = FAILED_START(WAIT, *IMAGE, False, {}, "")
    assert first.endswith("nothing to roll back to.")
    assert "(sha256:abababababab) after the restart (the key changed)" in first
    off = FAILED_START(WAIT, *IMAGE, False, {}, "", False)
    assert off.endswith("vllm_serve_rollback is false, so no previous containers were kept.")


def test_vllms_own_memory_refusal_is_named_with_the_setting_to_change():
    refused = {
        **WAIT,
        "excerpt": "ValueError: Free memory on device cuda:0 (86.21/121.69 GiB) on startup is "
        "less than desired GPU memory utilization (0.8, 97.35 GiB). Decrease GPU memory "
        "utilization or reduce GPU memory used by other processes.",
    }
    said = FAILED_START(refused, *IMAGE, False, {}, "")
    assert (
        ". vLLM's own memory check refused the start: it saw 86.21 GiB free of 121.69 GiB, and "
        "utilization 0.8 asks 97.35 GiB; set vllm_serve_gpu_memory_utilization to 0.70 or "
        "lower, or free memory on the node." in said
    ), said
    assert "memory check" not in FAILED_START(WAIT, *IMAGE, False, {}, "")


def test_a_head_that_failed_before_its_wait_is_named_not_left_blank():
    # rollback.yml on the other node: the head's wait never ran, so it passes {} and no ID.
    said = FAILED_START({}, "dgx-spark/vllm-serving:current", "", "the key changed", False, {})
    assert "(the key changed): its wait did not run, as a node failed before it" in said, said
    assert said.endswith("nothing to roll back to.")


def test_a_start_under_the_ray_executor_says_what_ray_saw():
    from pathlib import Path

    from support.captures import tool_output

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "operate"
    stalled = {"healthy": False, "reason": "the start stalled while waiting for the peers and "
               "Ray's GPUs: no progress in the logs for 120 s", "excerpt": ""}  # fmt: skip
    ray = {"text": tool_output(fixtures / "ray_status_one_node.txt"), "nodes": 2}
    said = FAILED_START(stalled, *IMAGE, False, {}, "", True, ray)
    assert (
        "no progress in the logs for 120 s. Ray then: 1 of 2 nodes alive, 0 of 1 GPUs in use; "
        "waiting for resources: {'GPU': 1.0} * 2 (PACK): 1+ pending placement groups. "
        "Nothing served before this run" in said
    ), said
    # Not read (another backend, or check mode): nothing is added.
    assert "Ray then" not in FAILED_START(stalled, *IMAGE, False, {}, "", True, None)
