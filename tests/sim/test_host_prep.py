"""playbooks/host_prep.yml on the simulated pair: what it sets up is checked on the nodes
themselves, a run on a prepared pair changes nothing, and bad inputs stop it before any node
changes."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from conftest import PlaybookRun, run_playbook

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (  # noqa: E402
    link_checks,
)

# Files host_prep writes; a refused run must leave every one of them as it was.
WATCHED = (
    "/etc/netplan/40-cx7.yaml",
    "/etc/dgx-spark/comm.env",
    "/etc/hosts",
    "/home/spark/.ssh/authorized_keys",
    "/home/spark/.ssh/known_hosts",
)
HARDWARE_ONLY = (
    "hardware-only: skipped RoCE discovery",
    "hardware-only: skipped netplan apply",
    "hardware-only: skipped NVIDIA container runtime",
    "hardware-only: skipped ethtool link speed",
    "hardware-only: skipped ibdev2netdev RoCE port state",
    "hardware-only: skipped RDMA write bandwidth",
    "hardware-only: skipped NCCL all_gather",
)


def playbook(*extra: str, path: str = "playbooks/host_prep.yml") -> PlaybookRun:
    return run_playbook(path, *extra)


@pytest.fixture(scope="module")
def runs(sim):
    """The stage's run, and a run on the pair it prepared: the same run where the pair was
    prepared before it (after molecule's converge, in `make test`), else a second one."""
    first = playbook()
    assert first.rc == 0, "\n".join(first.failures()) or first.raw[-4000:]
    second = playbook() if any(s["changed"] for s in first.stats.values()) else first
    assert second.rc == 0, "\n".join(second.failures()) or second.raw[-4000:]
    print(
        f"\nhost_prep: first run {first.seconds:.0f}s, on the prepared pair {second.seconds:.0f}s"
    )
    return first, second


def _iface_with(host, address: str) -> dict:
    for iface in json.loads(host.check_output("ip -j addr show")):
        if any(a.get("local") == address for a in iface.get("addr_info", [])):
            return iface
    pytest.fail(f"no interface carries {address}")


def test_a_run_on_the_prepared_pair_changes_nothing(runs):
    _first, second = runs
    changed = {host: s["changed"] for host, s in second.stats.items()}
    # localhost: the inventory check the stage playbook runs first.
    assert changed == {"localhost": 0, "spark-1": 0, "spark-2": 0}, [
        f"{host}: {name}" for name, host, res in second.results() if res.get("changed")
    ]


def test_hardware_only_steps_say_they_skipped(runs):
    text = runs[1].messages()
    for line in HARDWARE_ONLY:
        assert line in text, f"no '{line}' line in the run"


def test_fast_link_mtu_and_jumbo_frames_are_checked(runs):
    results = {(name, host): res for name, host, res in runs[1].results()}
    for host in ("spark-1", "spark-2"):
        mtu = results[("Require every twin up with its address and MTU", host)]
        assert not mtu.get("failed") and "MTU 9000 UP" in mtu["msg"], mtu
        ping = results[("Ping every peer over each twin with unfragmented jumbo frames", host)]
        assert [r["rc"] for r in ping["results"]] == [0]
        assert "-M do -s 8972" in " ".join(ping["results"][0]["cmd"])


def test_comm_env_file(runs, hosts, nodes):
    for node in nodes:
        host = hosts[node.name]
        env_file = host.file("/etc/dgx-spark/comm.env")
        assert (env_file.user, env_file.group, env_file.mode) == ("root", "root", 0o644)
        lines = [line for line in env_file.content_string.splitlines() if line[:1] not in ("#", "")]
        env = dict(line.split("=", 1) for line in lines)
        fast = _iface_with(host, node.fast_ip)["ifname"]
        assert env["VLLM_HOST_IP"] == node.fast_ip
        assert env["RAY_NODE_IP_ADDRESS"] == env["RAY_OVERRIDE_NODE_IP_ADDRESS"] == node.fast_ip
        for key in (
            "NCCL_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME",
            "TP_SOCKET_IFNAME",
            "UCX_NET_DEVICES",
            "OMPI_MCA_btl_tcp_if_include",
        ):
            assert env[key] == fast, f"{node.name}: {key}"
        assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env
        # NCCL settings of the GB10 itself, written on every node (fast_link.comm_env says why).
        assert env["NCCL_IGNORE_CPU_AFFINITY"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"


def test_netplan_file_a_spark_would_get(runs, hosts, nodes):
    for node in nodes:
        host = hosts[node.name]
        netplan = host.file("/etc/netplan/40-cx7.yaml")
        assert (netplan.user, netplan.group, netplan.mode) == ("root", "root", 0o600)
        data = yaml.safe_load(host.check_output("sudo cat /etc/netplan/40-cx7.yaml"))
        fast = _iface_with(host, node.fast_ip)["ifname"]
        assert data == {
            "network": {
                "version": 2,
                "ethernets": {
                    fast: {
                        "dhcp4": False,
                        "dhcp6": False,
                        "link-local": [],
                        "mtu": 9000,
                        "addresses": [f"{node.fast_ip}/24"],
                    }
                },
            }
        }


def test_fast_link_names_in_etc_hosts(runs, hosts, nodes):
    for node in nodes:
        host = hosts[node.name]
        for other in nodes:
            entry = f"{other.fast_ip} {other.name}-fast {other.name}-fast-1"
            assert entry in host.file("/etc/hosts").content_string.splitlines(), node.name
            resolved = host.check_output(f"getent hosts {other.name}-fast").split()
            assert resolved[0] == other.fast_ip


def test_node_to_node_ssh_over_fast_names(runs, owner_hosts, nodes):
    strict = "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=5"
    for node in nodes:
        for peer in nodes:  # its own fast names too, as mpirun may use them for the local rank
            for name in (f"{peer.name}-fast", f"{peer.name}-fast-1", peer.fast_ip, peer.name):
                got = owner_hosts[node.name].run(f"{strict} {name} hostname")
                assert got.rc == 0, f"{node.name} -> {name}: {got.stderr}"
                assert got.stdout.strip() == peer.name
            # Only the pinned names are trusted: the management address was never pinned.
            unpinned = owner_hosts[node.name].run(
                f"{strict} {peer.mgmt_ip} true 2>&1; echo exit=$?"
            )
            assert "Host key verification failed" in unpinned.stdout
            assert unpinned.stdout.strip().endswith("exit=255")


def test_docker_usable_by_the_owner_without_sudo(runs, owner_hosts):
    for name, host in owner_hosts.items():
        got = host.run("docker info --format '{{.ServerVersion}}'")
        assert got.rc == 0, f"{name}: {got.stderr}"
        assert "docker" in host.user("spark").groups


def test_nccl_check_script_runs_across_the_pair_with_the_comm_env(
    runs, ansible, hosts, nodes, images
):
    """The same script the role runs on GPUs, here on CPU (Gloo) with torchrun across the fast
    link, in a container that reads the node's comm.env: proves the script's two-host path and
    that the env file is usable as a Docker env_file."""
    for src in (
        ROOT / "roles/host_prep/files/nccl_allgather_busbw.py",
        ROOT / "plugins/module_utils/link_checks.py",
    ):
        done = ansible("sparks", "ansible.builtin.copy", f"src={src} dest=/tmp/host_prep_check/")
        assert not any(r.get("failed") for r in done.values()), done
    head = nodes[0]

    def run(rank: int, node):
        cmd = (
            "docker run --rm --network host --env-file /etc/dgx-spark/comm.env "
            "-v /tmp/host_prep_check:/checks:ro --entrypoint torchrun "
            f"{shlex.quote(images.DONOR_IMAGE)} --nnodes 2 --nproc-per-node 1 --node-rank {rank} "
            f"--master-addr {head.fast_ip} --master-port 29511 /checks/nccl_allgather_busbw.py "
            "--device cpu --size 16M --iters 3 --warmup 1 --all-ranks"
        )
        return hosts[node.name].run(f"timeout 120 {cmd}")

    try:
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            outputs = list(pool.map(run, range(len(nodes)), nodes))
    finally:
        for node in nodes:
            hosts[node.name].run("rm -rf /tmp/host_prep_check")
    for node, out in zip(nodes, outputs, strict=True):
        assert out.rc == 0, f"{node.name}: {out.stdout}{out.stderr}"
        data = link_checks.parse_busbw_json(out.stdout)
        assert data["world_size"] == 2 and data["hosts"] == sorted(n.name for n in nodes)
        assert data["wrong"] == 0 and data["backend"] == "gloo"
        assert data["env"]["VLLM_HOST_IP"] == node.fast_ip
        assert data["busbw_gbps"] > 0


def _fingerprint(hosts) -> dict[str, str]:
    paths = " ".join(WATCHED)
    return {name: host.check_output(f"sudo sha256sum {paths}") for name, host in hosts.items()}


BAD_INPUTS = {
    "missing address": (
        '{"host_prep_cx7_links": [{"netdev": "auto"}]}',
        "spark-1: host_prep_cx7_links[0].address is missing",
    ),
    "duplicate address": (
        '{"host_prep_cx7_links": [{"netdev": "auto", "address": "{{ spark_fast_ip }}/24"},'
        ' {"netdev": "docker0", "address": "172.30.242.5/24"}]}',
        "spark-2: host_prep_cx7_links[1].address 172.30.242.5 is already used by spark-1",
    ),
    "address outside its twin's subnet": (
        '{"host_prep_cx7_links": [{"netdev": "auto", "address": "{{ spark_fast_ip }}/24"},'
        ' {"netdev": "docker0", "address": "{{ \'172.30.242.11/24\' if inventory_hostname =='
        " 'spark-1' else '172.30.243.12/24' }}\"}]}",
        "spark-2: host_prep_cx7_links[1].address 172.30.243.12/24 is outside its twin's subnet "
        "172.30.242.0/24",
    ),
    "two twins in one subnet": (
        '{"host_prep_cx7_links": [{"netdev": "auto", "address": "{{ spark_fast_ip }}/24"},'
        ' {"netdev": "docker0", "address": "172.30.241.200/24"}]}',
        "have the same subnet 172.30.241.0/24",
    ),
    "MTU out of range": ("host_prep_mtu=12000", "spark-1: host_prep_mtu (12000) is out of range"),
    "interface the host does not have, on one node only": (
        '{"host_prep_cx7_links": [{"netdev": "{{ \'enp1s0f1np1\' if inventory_hostname =='
        ' \'spark-2\' else \'auto\' }}", "address": "{{ spark_fast_ip }}/24"}]}',
        "spark-2: host_prep_cx7_links[0].netdev enp1s0f1np1 is not an interface on spark-2",
    ),
    "unbounded NCCL buffer": (
        "host_prep_nccl_size_mib=16384",
        "host_prep_nccl_size_mib (16384) must be 1 to 8192",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_before_any_node_changes(runs, hosts, case):
    extra, message = BAD_INPUTS[case]
    before = _fingerprint(hosts)
    run = playbook("-e", extra)
    assert run.rc != 0
    assert any(message in f for f in run.failures()), run.failures()
    assert run.changed() == {"localhost": 0, "spark-1": 0, "spark-2": 0}, run.changed_tasks()
    ran = {name for name, _host, _res in run.results()}
    assert "Render the netplan file for the ConnectX-7 twins" not in ran
    assert _fingerprint(hosts) == before


STANDINS = Path(__file__).resolve().parent / "host_prep_standins"
STANDIN_DIR = "/tmp/host_prep_standins"
STANDIN_NETPLAN = "/etc/netplan/41-standin.yaml"
STANDIN_NCCL_IMAGE = "dgxsim-standin/nccl-check:latest"


REAL_NETPLAN = "/etc/netplan/40-cx7.yaml"
STANDIN_KEPT = f"{REAL_NETPLAN}.standin-kept"
STANDIN_INFINIBAND = f"{STANDIN_DIR}/infiniband"


def gid_tree(node, ifname: str) -> str:
    """A shell command writing the RoCE GID table host_prep reads for the stand-in device of
    ``ifname`` (roce_<ifname>, as the ibdev2netdev stand-in names it): the link-local default
    GIDs at 0 and 1, the fast-link address at 2 (RoCE v1) and 3 (RoCE v2), as a ConnectX-7
    shows them (tests/unit/fixtures/host_prep/gids_spark1.txt)."""
    a, b, c, d = (int(x) for x in node.fast_ip.split("."))
    mapped = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    local = "fe80:0000:0000:0000:0242:acff:fe1e:f100"
    port = f"{STANDIN_INFINIBAND}/roce_{ifname}/ports/1"
    entries = [
        (local, "IB/RoCE v1"),
        (local, "RoCE v2"),
        (mapped, "IB/RoCE v1"),
        (mapped, "RoCE v2"),
    ]
    lines = [f"mkdir -p {port}/gids {port}/gid_attrs/types {port}/gid_attrs/ndevs"]
    for index, (gid, kind) in enumerate(entries):
        lines += [
            f"echo {gid} > {port}/gids/{index}",
            f"echo '{kind}' > {port}/gid_attrs/types/{index}",
            f"echo {ifname} > {port}/gid_attrs/ndevs/{index}",
        ]
    return " && ".join(lines)


def install_standins(ansible, hosts, images, bundle, nodes=None) -> None:
    """Copy the stand-ins' folder to every node and build the NCCL stand-in's image there; with
    ``nodes``, also each node's stand-in GID table, and the real run's netplan file moved out
    of netplan's reach (another file defining the twins is a leftover host_prep refuses), put
    back by ``remove_standins``."""
    done = ansible(
        "sparks", "ansible.builtin.copy", f"src={bundle}/ dest={STANDIN_DIR}/ mode=preserve"
    )
    assert not any(r.get("failed") for r in done.values()), done
    for host in hosts.values():
        host.check_output(
            f"sudo docker build -q -t {STANDIN_NCCL_IMAGE} --build-arg BASE={images.CLUSTER_IMAGE} "
            f"-f {STANDIN_DIR}/Dockerfile.nccl {STANDIN_DIR}"
        )
    for node in nodes or []:
        host = hosts[node.name]
        host.check_output(f"sh -c '[ ! -e {REAL_NETPLAN} ] || mv {REAL_NETPLAN} {STANDIN_KEPT}'")
        fast = _iface_with(host, node.fast_ip)["ifname"]
        host.check_output(f"sh -c {shlex.quote(gid_tree(node, fast))}")


def remove_standins(hosts) -> None:
    for host in hosts.values():
        host.run(f"sh -c '[ ! -e {STANDIN_KEPT} ] || mv {STANDIN_KEPT} {REAL_NETPLAN}'")
        host.run(f"sudo rm -rf {STANDIN_DIR} {STANDIN_NETPLAN}*")
        host.run(f"sudo docker rmi -f {STANDIN_NCCL_IMAGE}")


def standin_run(tmp_path) -> tuple:
    """The stand-ins with the fixtures they print, in a folder to copy to the nodes, and a
    wrapper playbook that runs host_prep with spark_hardware true and them first on PATH."""
    fixtures = ROOT / "tests/unit/fixtures/host_prep"
    bundle = tmp_path / "standins"
    bundle.mkdir()
    for src in [*STANDINS.iterdir(), *(fixtures / n for n in (
        "ethtool_spark_200g_speed.txt", "ib_write_bw_spark_rocep1s0f1.txt",
        "nvidia_smi_gb10.txt"))]:  # fmt: skip
        shutil.copy2(src, bundle / src.name)
    wrapper = tmp_path / "hardware.yml"
    wrapper.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "host_prep with stand-ins for the Spark's tools",
                    "hosts": "sparks",
                    "gather_facts": False,
                    "any_errors_fatal": True,
                    "environment": {"PATH": f"{STANDIN_DIR}:/usr/sbin:/usr/bin:/sbin:/bin"},
                    "vars": {"spark_hardware": True},
                    "roles": [{"role": "dgx_spark.cluster.host_prep"}],
                }
            ]
        )
    )
    return bundle, wrapper


def test_hardware_path_with_stand_ins(runs, ansible, hosts, nodes, images, tmp_path):
    """The hardware-only tasks run as Ansible tasks with stand-ins for the Spark's tools
    (host_prep_standins/): netplan apply, the peer check and the rollback, ethtool,
    ibdev2netdev, ib_write_bw, the NVIDIA runtime and the NCCL check. Files go to other paths
    than the real run's, and are removed afterwards."""
    bundle, wrapper = standin_run(tmp_path)
    install_standins(ansible, hosts, images, bundle, nodes)
    extra = [
        *("-e", f"_host_prep_infiniband_dir={STANDIN_INFINIBAND}"),
        *("-e", f"host_prep_netplan_file={STANDIN_NETPLAN}"),
        *("-e", f"host_prep_comm_env_file={STANDIN_DIR}/comm.env"),
        *("-e", f"host_prep_check_dir={STANDIN_DIR}/checks"),
        *("-e", f"spark_stamp_dir={STANDIN_DIR}/stamps"),
        *("-e", f"host_prep_nccl_image={STANDIN_NCCL_IMAGE}"),
        # docker.io is installed: nothing for apt to fetch.
        *("-e", "host_prep_nvidia_runtime_package=docker.io"),
        *("-e", "host_prep_rdma_package=docker.io"),
        # The pair's Docker has no nvidia runtime; runc stands in for it.
        *("-e", "host_prep_nvidia_runtime=runc"),
        *("-e", "host_prep_rdma_duration_s=1"),
        # The trust phase is the same as in the real run above.
        *("--skip-tags", "host_prep_trust"),
    ]
    try:
        # Asked for: the benchmarks run even if the pair is serving right now.
        run = playbook(*extra, "-e", "host_prep_link_check=always", path=str(wrapper))
        assert run.rc == 0, "\n".join(run.failures()) or run.raw[-4000:]
        text = run.messages()
        for words in (
            "1 x NVIDIA GB10, driver 580.173.02",
            "link benchmarks (RDMA write, NCCL all_gather): run: host_prep_link_check=always",
            "link up at 200000Mb/s",
            "RoCE devices up: roce_",
            "RDMA write 111.71 Gb/s, at least host_prep_rdma_min_gbps (90)",
        ):
            assert words in text, words
        # NCCL's devices (the stand-in's) are the twins comm.env names, as the check asks.
        assert re.search(r"over NET/IB \(roce_[\w.-]+\): pass", text), text
        applied = [h for n, h, r in run.results() if n == "Apply the netplan configuration"]
        assert sorted(applied) == ["spark-1", "spark-2"]
        env = hosts["spark-1"].file(f"{STANDIN_DIR}/comm.env").content_string
        assert "NCCL_IB_HCA=roce_" in env and "NCCL_IB_DISABLE=0" in env
        for name, host in hosts.items():
            stamp = json.loads(host.check_output(f"sudo cat {STANDIN_DIR}/stamps/link-check.json"))
            assert stamp["name"] == "link-check" and stamp["inputs"]["mtu"] == 9000, name
            assert stamp["passed_at"].endswith("Z") and "nccl" in stamp["result"], name

        # A rerun with unchanged settings does not measure again, and changes nothing.
        again = playbook(*extra, path=str(wrapper))
        assert again.rc == 0, "\n".join(again.failures()) or again.raw[-4000:]
        assert "not run: spark-1: skipped: link-check passed " in again.messages()
        nccl = "Start the NCCL all_gather on every node"
        assert not [h for n, h, _r in again.results() if n == nccl]
        assert {h: s["changed"] for h, s in again.stats.items()} == {"spark-1": 0, "spark-2": 0}

        # Changed settings while a serving container holds the GPUs: due, but not measured.
        hosts["spark-2"].check_output(
            "sudo docker run -d --name host-prep-test-serving "
            "--label dgx_spark.cluster.component=vllm --entrypoint sleep "
            f"{shlex.quote(images.CLUSTER_IMAGE)} 600"
        )
        try:
            serving = playbook(*extra, "-e", "host_prep_rdma_min_gbps=80", path=str(wrapper))
        finally:
            hosts["spark-2"].run("sudo docker rm -f host-prep-test-serving")
        assert serving.rc == 0, "\n".join(serving.failures()) or serving.raw[-4000:]
        said = serving.messages()
        assert "runs: rdma.min_gbps changed from 90.0 to 80.0" in said, said
        assert "host-prep-test-serving on spark-2 holds the GPUs" in said, said
        assert "not measured automatically while serving" in said
        ran = {n for n, _h, _r in serving.results()}
        assert "Measure RDMA write bandwidth to each peer over each twin" not in ran

        # A change that cuts the peers off is rolled back to the previous file.
        for host in hosts.values():
            host.check_output(f"sudo touch {STANDIN_DIR}/ping-fails")
        cut_off = ("-e", "host_prep_mtu=8000", "-e", "host_prep_peer_wait_s=3")
        bad = playbook(*extra, *cut_off, "--tags", "host_prep_network", path=str(wrapper))
        assert bad.rc != 0
        assert any(
            "did not reach the peers" in f and "the previous configuration is back in place" in f
            for f in bad.failures()
        ), bad.failures()
        for name, host in hosts.items():
            kept = yaml.safe_load(host.check_output(f"sudo cat {STANDIN_NETPLAN}"))
            assert [e["mtu"] for e in kept["network"]["ethernets"].values()] == [9000], name
            left = host.check_output(f"sudo sh -c 'ls {STANDIN_NETPLAN}*'").split()
            assert left == [STANDIN_NETPLAN], f"{name}: a backup was left: {left}"
    finally:
        remove_standins(hosts)


def _running_containers(hosts) -> dict[str, dict[str, tuple[str, str]]]:
    """Each node's running containers: name -> (ID, start time)."""
    out = {}
    for name, host in hosts.items():
        text = host.check_output(
            "sudo docker ps -q | xargs -r sudo docker inspect "
            "--format '{{.Name}} {{.Id}} {{.State.StartedAt}}'"
        )
        rows = [line.split() for line in text.splitlines() if line.strip()]
        out[name] = {row[0].lstrip("/"): (row[1], row[2]) for row in rows}
    return out


# A second twin made for the drill on each node (a veth pair, so it is up while its peer end
# is): taking down the sim's only fast link would cut the serving group's own traffic, and the
# serving containers could restart because of the drill rather than host_prep.
DRILL_TWIN = "twin1"
DRILL_TWIN_LINKS = (
    '{"host_prep_cx7_links": [{"netdev": "auto", "address": "{{ spark_fast_ip }}/24"},'
    ' {"netdev": "twin1", "address": "{{ \'172.30.243.11/24\' if inventory_hostname =='
    " 'spark-1' else '172.30.243.12/24' }}\"}]}"
)
DRILL_TWIN_ADDRESS = {"spark-1": "172.30.243.11/24", "spark-2": "172.30.243.12/24"}
BAD_HCA = "roce_nosuch0"


@pytest.mark.drill
def test_link_gate_refuses_before_serving_is_touched(
    serving_pair, ansible, hosts, nodes, images, tmp_path
):
    """The link gate on the stand-ins, which read the node's own interfaces
    (host_prep_standins/README.md), refuses (a) comm.env's NCCL_IB_HCA naming a device the
    node lacks: NCCL falls back to NET/Socket and the NCCL check fails naming it; (b) a twin
    down on one node: the check that every pinned twin's RoCE device is Up (ibdev2netdev,
    in the validation that runs before any change) fails naming it. Neither refusal stops or
    starts a serving container."""
    bundle, wrapper = standin_run(tmp_path)
    extra = [
        *("-e", f"_host_prep_infiniband_dir={STANDIN_INFINIBAND}"),
        *("-e", f"host_prep_netplan_file={STANDIN_NETPLAN}"),
        *("-e", f"host_prep_comm_env_file={STANDIN_DIR}/comm.env"),
        *("-e", f"host_prep_check_dir={STANDIN_DIR}/checks"),
        *("-e", f"spark_stamp_dir={STANDIN_DIR}/stamps"),
        *("-e", f"host_prep_nccl_image={STANDIN_NCCL_IMAGE}"),
        *("-e", "host_prep_nvidia_runtime_package=docker.io"),
        *("-e", "host_prep_rdma_package=docker.io"),
        *("-e", "host_prep_nvidia_runtime=runc"),
        *("-e", "host_prep_rdma_duration_s=1"),
        *("--skip-tags", "host_prep_trust"),
    ]
    before = _running_containers(hosts)
    # The pair serves (serving_pair): a Ray container on each node, vLLM on the head.
    assert "dgx-spark-vllm" in before["spark-1"], before
    assert all("dgx-spark-ray" in running for running in before.values()), before
    try:
        install_standins(ansible, hosts, images, bundle, nodes)

        # (a) comm.env names a RoCE device the node lacks: NCCL runs on sockets.
        bad = playbook(
            *extra,
            *("-e", "host_prep_link_check=always"),
            *("-e", json.dumps({"host_prep_comm_env_extra": {"NCCL_IB_HCA": BAD_HCA}})),
            path=str(wrapper),
        )
        assert bad.rc != 0
        gate = "Require the NCCL all_gather over NET/IB on the configured twins, above the floor"
        failed = {(n, h) for n, h, r in bad.results() if r.get("failed")}
        assert failed == {(gate, "spark-1"), (gate, "spark-2")}, bad.failures()
        for node in nodes:
            fast = _iface_with(hosts[node.name], node.fast_ip)["ifname"]
            said = [f for f in bad.failures() if f.startswith(f"{node.name}: ")]
            assert any(
                f"over Socket transport: FAIL: NCCL used NET/Socket over {fast}, but NCCL_IB_HCA "
                f"in comm.env names {BAD_HCA} over NET/IB" in f
                for f in said
            ), said
        assert "Record the passed link check" not in {n for n, _h, _r in bad.results()}
        assert _running_containers(hosts) == before

        # (b) One twin down on one node: ibdev2netdev shows it Down and the check refuses.
        for name, host in hosts.items():
            host.check_output(
                f"sudo sh -c 'ip link add {DRILL_TWIN} type veth peer name {DRILL_TWIN}-peer"
                f" && ip addr add {DRILL_TWIN_ADDRESS[name]} dev {DRILL_TWIN}"
                f" && ip link set {DRILL_TWIN}-peer mtu 9000 up"
                f" && ip link set {DRILL_TWIN} mtu 9000 up'"
            )
        hosts["spark-2"].check_output(f"sudo ip link set {DRILL_TWIN} down")
        down = playbook(*extra, "-e", DRILL_TWIN_LINKS, path=str(wrapper))
        assert down.rc != 0
        gate = "Require the cabled port's twins Up, and every pinned name Up"
        failed = {(n, h) for n, h, r in down.results() if r.get("failed")}
        assert failed == {(gate, "spark-2")}, down.failures()
        assert any(
            f"spark-2: host_prep_cx7_links[1].netdev is pinned to {DRILL_TWIN}, which "
            "ibdev2netdev shows Down" in f
            for f in down.failures()
        ), down.failures()
        # The same check passed where the twin is up: the refusal is the down state's.
        head = [r for n, h, r in down.results() if (n, h) == (gate, "spark-1")]
        passed = [bool(r.get("failed")) for r in head]
        assert passed == [False], passed
        assert down.changed() == {"spark-1": 0, "spark-2": 0}, down.changed_tasks()
        assert "Render the netplan file for the ConnectX-7 twins" not in {
            n for n, _h, _r in down.results()
        }
        assert _running_containers(hosts) == before
    finally:
        for host in hosts.values():
            host.run(f"sudo ip link del {DRILL_TWIN}")
        remove_standins(hosts)
