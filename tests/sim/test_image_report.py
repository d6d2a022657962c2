"""The images stage's report of what the serving image holds, on the simulated pair, and what
status prints of it (issue 43, "Images known by what they hold").

The sim's serving image is a vLLM 0.32.0 CPU build: no CUDA, NCCL, flashinfer, fastsafetensors
or libibverbs, all reported absent. The pair has no RoCE (comm.env says NCCL_IB_DISABLE=1), so
the refusal of an image without libibverbs is shown with a comm.env written for the test.
"""

from __future__ import annotations

import json
import re

from conftest import on_node, run_playbook

REPORT_DIR = "/var/lib/dgx-spark/images"
STAMP_DIR = "/var/lib/dgx-spark/stamps"
ROCE_ENV = "/tmp/dgxsim-test-roce-comm.env"


def _reports(run) -> dict[str, dict]:
    return {
        host: res
        for name, host, res in run.results()
        if name == "Read what the serving image holds" and "report" in res
    }


def test_the_images_stage_reports_what_the_serving_image_holds(pair_with_images, images):
    run = run_playbook("playbooks/images.yml")
    assert run.rc == 0, run.failures() or run.raw[-4000:]
    reports = _reports(run)
    assert set(reports) == {n.name for n in pair_with_images}
    for node in pair_with_images:
        result = reports[node.name]
        report = result["report"]
        assert re.fullmatch(r"0\.\d+\.\d+\+cpu", report["vllm"]), report["vllm"]
        assert report["torch"].endswith("+cpu") and report["ray"] == images.RAY_VERSION
        assert report["absent"] == ["cuda", "nccl", "flashinfer", "fastsafetensors", "libibverbs"]
        assert report["wanted"] and set(report["wanted"].values()) == {"present"}
        assert set(report["wanted"]) <= set(report["architectures"])
        assert result["refusals"] == []  # sockets only: nothing loads libibverbs
        # Kept on the node beside the image, by its ID, for status and the benchmark.
        path = f"{REPORT_DIR}/{result['image_id'].removeprefix('sha256:')}.json"
        kept = json.loads(on_node(node, "cat", path).stdout)
        assert kept == report
        # What the probe read is stamped by image ID and request; the read says whence it came.
        assert result["reason"].startswith(("skipped: registry-", "runs: ")), result["reason"]
        stamps = on_node(node, "ls", STAMP_DIR).stdout.split()
        name = f"registry-{result['image_id'].removeprefix('sha256:')[:12]}-static-"
        assert [s for s in stamps if s.startswith(name)], stamps
    print(
        "\nimage report: "
        + "\n  ".join(f"{h}: {r['report']['summary']}" for h, r in reports.items())
    )


def test_an_image_without_libibverbs_is_refused_on_the_roce_path(pair_with_images):
    for node in pair_with_images:
        on_node(
            node,
            "sh",
            "-c",
            f"printf 'NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0\\nNCCL_IB_DISABLE=0\\n' > {ROCE_ENV}",
        )
    try:
        run = run_playbook("playbooks/images.yml", "-e", f"hybrid_image_comm_env_file={ROCE_ENV}")
    finally:
        for node in pair_with_images:
            on_node(node, "rm", "-f", ROCE_ENV)
    assert run.rc != 0
    failures = "\n".join(run.failures())
    assert "has no libibverbs" in failures and "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0" in failures
    # Refused before the alias moved: nothing was tagged.
    assert not [t for t in run.changed_tasks() if "alias" in t], run.changed_tasks()


def test_status_prints_the_report_and_the_ranks_nccl(pair_with_images, tmp_path):
    path = tmp_path / "status.json"
    run = run_playbook("playbooks/status.yml", "-e", f"status_json={path}", json_report=False)
    assert run.rc == 0, run.raw[-4000:]
    for node in pair_with_images:
        assert re.search(rf"{node.name} image \w+: vLLM 0\.\d+\.\d+\+cpu, torch ", run.stdout)
        assert f"{node.name} ranks load no libnccl (no rank holds NCCL" in run.stdout
    status = json.loads(path.read_text())
    for node in pair_with_images:
        entry = status["nodes"][node.name]
        assert entry["image_report"]["image_id"] == entry["ray"]["image_id"]
        assert entry["nccl"] == {"library": None, "version": None, "paths": [], "build": None}
