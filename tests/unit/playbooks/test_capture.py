"""playbooks/capture.yml run on this machine as two local "Sparks": stand-in commands print
the fixtures' tool output (ibdev2netdev, ethtool, nvidia-smi, dpkg-query, docker logs), a
stand-in Docker API answers the docker modules, and the archive it leaves is read back: every
file a fixture would be, with a header the provenance check takes, no secret in it, absent tools
recorded as absent, and nothing written in check mode."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from support.capture_kit import CAPTURES, CONTEXT, parse
from support.captures import FIXTURES, load_json, provenance_errors, split, tool_output
from support.docker_stand_in import docker_api

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
# The inventory's secrets, and secrets no inventory names that the logs may still carry.
KEY, HF, RAY = (
    "inventory-api-key-3f9c1e",
    "hf_inventorytokenABCDEFGHIJ0123456",
    "ray-token-77d1e0a2",
)
STRANGERS = ("bearer-token-9d8e7f6a", "cli-key-5b4a3c2d", "hf_strangertokenZYXWVUTSRQ98765")
SERVING = "dgx-spark-vllm"
# Log lines that carry them, as vLLM's non-default args line and a proxied request would.
SECRET_LINES = (
    f"2026-12-04T13:02:13.700000000Z (APIServer pid=306) INFO 12-04 13:02:13 [utils.py:253] "
    f"non-default args: {{'api_key': ['{KEY}'], 'hf_token': '{HF}'}}",
    f"2026-12-04T13:02:13.800000000Z RAY_AUTH_TOKEN={RAY} HF_TOKEN={STRANGERS[2]}",
    f"2026-12-04T13:02:13.900000000Z GET /v1/models Authorization: Bearer {STRANGERS[0]}",
    f"2026-12-04T13:02:14.000000000Z vllm serve /m --api-key {STRANGERS[1]}",
)


def _stand_ins(tmp_path: Path) -> Path:
    """Commands that print what the Sparks' tools print (the fixtures without their header)."""
    out = tmp_path / "out"
    out.mkdir()
    shown = {
        "ibdev2netdev": tool_output(FIXTURES / "host_prep/ibdev2netdev_port1.txt"),
        "speed": tool_output(FIXTURES / "host_prep/ethtool_spark_200g_speed.txt"),
        "gpus": tool_output(FIXTURES / "host_prep/nvidia_smi_gb10.txt"),
        "apps": tool_output(FIXTURES / "vllm_serve/nvidia_smi_compute_apps_llama.txt"),
        "log": tool_output(FIXTURES / "vllm_serve/start_ray_sim_demo.log"),
        "secrets": "\n".join(SECRET_LINES) + "\n",
        "dpkg": "ethtool\t1:6.7-1\tii \nperftest\t24.01.0-1\tii \nlibnccl2\t2.28.9-1\trc \n",
        # The keys of DGX OS's release file; the serial number names the machine.
        "dgx-release": 'DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark"\n'
        'DGX_SWBUILD_VERSION="7.2.3"\nDGX_SERIAL_NUMBER="SERIAL-0000-TEST"\nDGX_OTA_VERSION="7.3.1"\n',
        "rdma": tool_output(FIXTURES / "host_prep/ib_write_bw_spark_rocep1s0f1.txt"),
        "rdma_server": tool_output(FIXTURES / "host_prep/ib_read_bw_memlock_64k.txt"),
        "all_gather_perf": tool_output(FIXTURES / "host_prep/all_gather_perf_spark_ib.txt"),
        # What host_prep leaves on a node: its comm.env, and nccl-tests' binary (a stand-in).
        "comm.env": "NCCL_SOCKET_IFNAME=eth0\nNCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1\n",
        "all_gather_perf_binary": "",
    }
    for name, text in shown.items():
        (out / name).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "ibdev2netdev": f"cat '{out}/ibdev2netdev'",
        "ethtool": f"printf 'Settings for %s:\\n' \"$1\"; cat '{out}/speed'",
        # The GPU list for --query-gpu, the GPU processes for --query-compute-apps.
        "nvidia-smi": f"case \"$1\" in --query-gpu=*) cat '{out}/gpus';; "
        f"*) cat '{out}/apps';; esac",
        "dpkg-query": f"cat '{out}/dpkg'; exit 1",
        # docker logs: the start on stdout, the secret lines on stderr (Docker's two streams).
        "docker": f"[ \"$1\" = logs ] && cat '{out}/log' && cat '{out}/secrets' >&2",
        # ib_write_bw: the client names the peer's address last; the server does not.
        "ib_write_bw": 'for last; do :; done; case "$last" in *.*.*.*) '
        f"cat '{out}/rdma';; *) cat '{out}/rdma_server' >&2;; esac",
        "mpirun": f"cat '{out}/all_gather_perf'",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _inventory(tmp_path: Path, hardware: bool, twin_ip: str | None) -> Path:
    """Two local nodes; their twins on documentation addresses (RFC 5737), which no interface
    here carries, or all on ``twin_ip``."""
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    nodes = {
        name: {
            **host,
            "spark_fast_ip": f"198.51.100.{last}",
            "host_prep_cx7_links": [
                {"address": f"{twin_ip or f'198.51.{net}.{last}'}/24"} for net in (100, 101)
            ],
        }
        for name, last in (("spark-1", 11), ("spark-2", 12))
    }
    inventory = {
        "all": {
            "vars": {
                "spark_hardware": hardware,
                "spark_gpus": 1,
                "ansible_user": "spark",
                "vllm_serve_api_key": KEY,
                "model_cache_hf_token": HF,
                "ray_cluster_auth_token": RAY,
            },
            "children": {
                "sparks": {
                    "children": {
                        "spark_head": {"hosts": {"spark-1": nodes["spark-1"]}},
                        "spark_workers": {"hosts": {"spark-2": nodes["spark-2"]}},
                    }
                }
            },
        }
    }
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


SERVING_CONTAINER = {
    "Id": "ab" * 32,
    "Names": [f"/{SERVING}"],
    "Image": "dgx-spark/vllm-serving:current",
    "State": "running",
    "Labels": {"dgx_spark.cluster.component": "vllm"},
    "inspect": {
        "Id": "ab" * 32,
        "Name": f"/{SERVING}",
        "Created": "2026-12-04T13:02:10.123456789Z",
        "State": {"Running": True, "Status": "running", "StartedAt": "2026-12-04T13:02:11Z"},
        "Config": {"Env": [f"VLLM_API_KEY={KEY}"]},
    },
}
# The base and the serving image; no donor (a base that serves as it is needs none).
SERVING_DIGEST = "dgx-spark/vllm-serving@sha256:" + "3" * 64
IMAGES = [
    {"Id": "sha256:" + "1" * 64, "RepoTags": ["vllm-node:latest"], "RepoDigests": [],
     "Created": "2026-11-01T00:00:00Z", "Architecture": "arm64", "Os": "linux", "Size": 1,
     "Config": {"Labels": {"org.opencontainers.image.title": "vllm-node"},
                "Env": [f"HF_TOKEN={HF}"]}},
    {"Id": "sha256:" + "2" * 64, "RepoTags": ["dgx-spark/vllm-serving:current"],
     "RepoDigests": [SERVING_DIGEST], "Created": "2026-11-02T00:00:00Z",
     "Architecture": "arm64", "Os": "linux", "Size": 2, "Config": {"Labels": None}},
]  # fmt: skip


def capture(
    tmp_path: Path,
    *extra: str,
    hardware: bool = True,
    tools: bool = True,
    docker: str = "serving",
    twin_ip: str | None = None,
):
    """Run the playbook; (the CompletedProcess, the archive's folder unpacked or None).
    ``docker``: ``serving`` (the serving container and two images), ``idle`` (the images, no
    container) or ``none`` (no daemon answers)."""
    bin_dir = _stand_ins(tmp_path) if tools else tmp_path / "none"
    if tools:
        extra = ("-e", f"_operate_capture_release_file={tmp_path}/out/dgx-release", *extra)
    dest = tmp_path / "captures"
    dest.mkdir()
    inventory = _inventory(tmp_path, hardware, twin_ip)
    # Nothing here needs root, and sudo may ask for a password: become is off.
    argv = [
        str(BIN / "ansible-playbook"), "playbooks/capture.yml", "-i", str(inventory),
        "-e", "ansible_become=false", "-e", f"capture_dir={dest}", *extra,
    ]  # fmt: skip
    containers = [SERVING_CONTAINER] if docker == "serving" else []
    with docker_api(containers, IMAGES if docker != "none" else []) as host:
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCALHOST_WARNING": "0",
            # No daemon answers there when Docker is to be absent.
            "DOCKER_HOST": host if docker != "none" else f"unix://{tmp_path}/no-docker.sock",
            "PATH": f"{bin_dir}:{BIN}:/usr/bin:/bin",
        }
        proc = subprocess.run(
            argv, cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=600,
        )  # fmt: skip
    archives = sorted(dest.glob("dgx-spark-capture-*.tar.gz"))
    if not archives:
        return proc, None
    with tarfile.open(archives[0]) as tar:
        tar.extractall(dest, filter="data")
    return proc, dest / archives[0].name.removesuffix(".tar.gz")


@pytest.fixture(scope="module")
def on_sparks(tmp_path_factory):
    """One run as on two Sparks with their tools, a serving container and two of three images."""
    proc, archive = capture(tmp_path_factory.mktemp("sparks"), "-e", "capture_log_lines=100")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc, archive


def test_each_node_has_every_capture_a_spark_gives_without_the_benchmarks(on_sparks):
    _proc, archive = on_sparks
    for node in ("spark-1", "spark-2"):
        files = sorted(p.name for p in (archive / node).iterdir())
        assert files == sorted([
            "captures.json", "images.json", "images.json.source", "ibdev2netdev.txt",
            "ethtool_enP2p1s0f0np0.txt", "ethtool_enP2p1s0f1np1.txt", "ethtool_enp1s0f0np0.txt",
            "ethtool_enp1s0f1np1.txt", "meminfo.txt", "nvidia_smi_compute_apps.txt",
            "nvidia_smi_gpus.txt", "vllm_start.log",
        ]), node  # fmt: skip


def test_every_capture_reads_as_the_fixture_it_replaces(on_sparks):
    """Each file is what a fixture holds: a header the provenance check takes, then the tool's
    output, which the fixture's parser reads."""
    _proc, archive = on_sparks
    for path in sorted((archive / "spark-1").iterdir()):
        if path.name in CONTEXT:
            continue
        assert provenance_errors(path) == [], path.name
        header = split(path)[0]
        assert header.startswith("captured ") and " on spark-1 (" in header, header
        assert "(DGX OS 7.2.3 (OTA 7.3.1), " in header, header
        assert "Docker 26.1.5" in header and "driver 580.173.02" in header, header
        # The start log's NCCL lines are the second entry for it: this start has none.
        (entry, *_nccl) = [c for c in CAPTURES if Path(path.name).match(c.name)]
        parsed = parse(entry, tool_output(path))
        assert entry.shows is None or entry.shows(parsed), path.name


def test_the_output_is_the_tools_own(on_sparks):
    _proc, archive = on_sparks
    node = archive / "spark-2"
    assert tool_output(node / "ibdev2netdev.txt") == tool_output(
        FIXTURES / "host_prep/ibdev2netdev_port1.txt"
    )
    assert tool_output(node / "nvidia_smi_gpus.txt") == "NVIDIA GB10, 580.173.02\n"
    assert tool_output(node / "ethtool_enp1s0f1np1.txt") == (
        "Settings for enp1s0f1np1:\n\tSpeed: 200000Mb/s\n"
    )
    assert (
        "`ethtool enp1s0f1np1` as root, ethtool 1:6.7-1."
        in split(node / "ethtool_enp1s0f1np1.txt")[0]
    )
    assert "MemTotal:" in tool_output(node / "meminfo.txt")


def test_the_start_log_is_both_streams_in_time_order_and_bounded(on_sparks):
    _proc, archive = on_sparks
    log = tool_output(archive / "spark-1/vllm_start.log").splitlines()
    # The stand-in's 98 lines of the start and 4 lines on the other stream, cut at 100.
    assert len(log) == 100
    stamps = [line.split(" ", 1)[0] for line in log if line[:4] == "2026"]
    assert stamps == sorted(stamps)
    assert log[9].startswith("2026-12-04T13:02:13.700000000Z (APIServer pid=306)")
    header = split(archive / "spark-1/vllm_start.log")[0]
    assert "docker logs --timestamps --until 2026-12-04T14:02:10Z dgx-spark-vllm" in header, header
    assert "vLLM 0.32.0, its first 100 lines" in header


def test_no_secret_leaves_a_node(on_sparks):
    _proc, archive = on_sparks
    text = "\n".join(p.read_text() for p in archive.rglob("*") if p.is_file())
    for secret in (KEY, HF, RAY, *STRANGERS, "SERIAL-0000-TEST"):
        assert secret not in text
    log = tool_output(archive / "spark-1/vllm_start.log")
    assert (
        "'api_key': '********', 'hf_token': '********'" in log
        and "Authorization: Bearer ********" in log
    )
    assert "RAY_AUTH_TOKEN=******** HF_TOKEN=********" in log and "--api-key ********" in log


def test_the_images_say_which_are_there(on_sparks):
    _proc, archive = on_sparks
    images = load_json(archive / "spark-1/images.json")
    assert [(i["role"], i["ref"], i["present"]) for i in images] == [
        ("base", "vllm-node:latest", True),
        ("donor", "hellohal2064/vllm-qwen3.5-gb10:latest", False),
        ("serving", "dgx-spark/vllm-serving:current", True),
    ]
    assert images[2]["Id"] == "sha256:" + "2" * 64
    assert images[2]["RepoDigests"] == [SERVING_DIGEST]
    assert provenance_errors(archive / "spark-1/images.json") == []


def test_the_benchmarks_are_held_back_beside_a_serving_container(on_sparks):
    proc, archive = on_sparks
    listed = json.loads((archive / "spark-1/captures.json").read_text())
    held = {f["file"]: f["reason"] for f in listed["files"] if f["status"] == "held back"}
    assert set(held) == {"ib_write_bw_*.txt", "nccl_check_torch.txt"}
    assert (
        "spark-1: dgx-spark-vllm serving (host_prep never measures beside it)"
        in held["nccl_check_torch.txt"]
    )
    assert listed["packages"] == {"ethtool": "1:6.7-1", "perftest": "24.01.0-1"}
    assert listed["dgx_release"] == {
        "DGX_NAME": "DGX Spark",
        "DGX_PRETTY_NAME": "NVIDIA DGX Spark",
        "DGX_SWBUILD_VERSION": "7.2.3",
        "DGX_OTA_VERSION": "7.3.1",
    }
    assert "ib_write_bw: spark-1: dgx-spark-vllm serving" in proc.stdout


def test_off_hardware_without_the_tools_everything_is_recorded_absent(tmp_path):
    proc, archive = capture(tmp_path, hardware=False, tools=False, docker="none")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert sorted(p.name for p in (archive / "spark-1").iterdir()) == [
        "captures.json",
        "images.json",
        "images.json.source",
        "meminfo.txt",
    ]
    listed = {
        f["file"]: f for f in json.loads((archive / "spark-1/captures.json").read_text())["files"]
    }
    for name in ("ibdev2netdev.txt", "nvidia_smi_gpus.txt", "nvidia_smi_compute_apps.txt"):
        assert listed[name]["status"] == "absent", listed[name]
        assert listed[name]["reason"].startswith("not on this node: "), listed[name]
    assert listed["ethtool_*.txt"]["status"] == "held back"
    assert listed["vllm_start.log"]["status"] == "held back"
    assert listed["vllm_start.log"]["reason"].startswith("Docker does not answer")
    assert listed["nccl_check_torch.txt"]["reason"] == "hardware-only (spark_hardware is false)"
    header = split(archive / "spark-1/meminfo.txt")[0]
    assert "no /etc/dgx-release" in header or "DGX OS" in header
    assert "no NVIDIA driver answered" in header and "no Docker answered" in header


def test_check_mode_runs_to_the_end_and_writes_nothing(tmp_path):
    proc, archive = capture(tmp_path, "--check")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert archive is None
    assert "check mode: nothing written" in proc.stdout
    assert list((tmp_path / "captures").iterdir()) == []


def _local_address() -> str | None:
    """This machine's IPv4 address on its default route (a UDP socket connects without
    sending anything), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            return probe.getsockname()[0]
    except OSError:
        return None


def test_where_nothing_serves_the_link_benchmarks_run_as_host_prep_runs_them(tmp_path):
    """No serving container, every twin on an address of this machine, perftest installed,
    host_prep's comm.env and nccl-tests' binary in place: ib_write_bw runs from the first node
    to each twin of the other, whose servers answer, and all_gather_perf through mpirun."""
    address = _local_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address on a default route")
    out = tmp_path / "out"
    extra = [
        *("-e", "host_prep_rdma_duration_s=1", "-e", "host_prep_nccl_check=nccl-tests"),
        *("-e", f"host_prep_comm_env_file={out}/comm.env"),
        *("-e", f"host_prep_nccl_tests_binary={out}/all_gather_perf_binary"),
    ]
    proc, archive = capture(tmp_path, *extra, docker="idle", twin_ip=address)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "ib_write_bw: runs" in proc.stdout and "NCCL check (nccl-tests): runs" in proc.stdout
    first = {p.name for p in (archive / "spark-1").iterdir()}
    assert {"ib_write_bw_rocep1s0f1_to_spark-2.txt", "ib_write_bw_roceP2p1s0f1_to_spark-2.txt",
            "all_gather_perf.txt"} <= first  # fmt: skip
    assert not {n for n in first if n.startswith("ib_write_bw_server_")}
    second = {p.name for p in (archive / "spark-2").iterdir()}
    assert {n for n in second if n.startswith(("ib_write_bw", "all_gather"))} == {
        "ib_write_bw_server_rocep1s0f1.txt",
        "ib_write_bw_server_roceP2p1s0f1.txt",
    }
    client = archive / "spark-1/ib_write_bw_roceP2p1s0f1_to_spark-2.txt"
    assert (
        f"`ib_write_bw -d roceP2p1s0f1 -F --report_gbits -q 4 -s 1048576 -D 1 -p 18516 {address}`"
        " as root, perftest 24.01.0-1." in split(client)[0]
    )
    # The servers' bound, host_prep's: 60 s and, per twin of each node, the run's 1 s + 10 s.
    server = split(archive / "spark-2/ib_write_bw_server_rocep1s0f1.txt")[0]
    assert (
        "`timeout 104 ib_write_bw -d rocep1s0f1 -F --report_gbits -q 4 -s 1048576 -D 1 -p 18515`"
        in server
    )
    for node in ("spark-1", "spark-2"):
        for path in sorted((archive / node).glob("*")):
            if path.name in CONTEXT:
                continue
            assert provenance_errors(path) == [], path
            (entry, *_nccl) = [c for c in CAPTURES if Path(path.name).match(c.name)]
            parsed = parse(entry, tool_output(path))
            assert entry.shows is None or entry.shows(parsed), path.name
    mpirun = split(archive / "spark-1/all_gather_perf.txt")[0]
    assert "-x NCCL_SOCKET_IFNAME -x NCCL_IB_HCA -x NCCL_DEBUG" in mpirun, mpirun
    # The servers' async jobs were reaped, and Ansible's records of them removed.
    cleanup = proc.stdout.split("Remove the servers' job records]", 1)[1].split("TASK [", 1)[0]
    assert "ok: [spark-2] => (item=rocep1s0f1)" in cleanup, cleanup
    assert "ok: [spark-2] => (item=roceP2p1s0f1)" in cleanup, cleanup
