#!/usr/bin/env python3
"""Bring the simulated DGX Spark pair up or down.

Two node containers, each with its own sshd and its own Docker daemon, on a
management network and a fast-link network (MTU 9000) made here. Node
addresses come from inventories/sim/hosts.yml. Every image, network, volume
and container the sim makes carries the label ``dgx_spark.sim``; ``down``
removes those and nothing else. The images the pair uses are made by
sim_images.py beside this file.

The monitoring image (Prometheus, promtool and the node exporter from Debian's packages) is
made only when asked for: ``monitoring`` builds it and loads it into the nodes,
``monitoring --build-only`` builds it on this machine's Docker alone (for promtool), and
``up --monitoring-image`` builds it too, once the node image is made (`make test`).

Usage: simctl.py preflight | up [--monitoring-image] | down [--purge] | status |
       monitoring [--build-only]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

# Its neighbours import by name however this file is loaded: run, imported, or by path (tests).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import sim_common  # noqa: E402
from sim_common import INPUTS_LABEL, LABEL, ROOT, STATE, Node, SimError, docker, log  # noqa: E402
from sim_images import (  # noqa: E402
    CLUSTER_IMAGE,
    DONOR_IMAGE,
    MONITORING_IMAGE,
    MONITORING_PACKAGES,
    OLD_CLUSTER_IMAGE,
    build_cluster_image,
    build_donor_image,
    build_node_image,
    build_old_cluster_image,
    build_rootfs_image,
    digest,
    finish_tiny_models,
    image_id,
    load_into_nodes,
    start_fixture_inputs,
    start_tiny_models,
)

INVENTORY = ROOT / "inventories" / "sim" / "hosts.yml"

MGMT_NETWORK = "dgxsim-mgmt"
FAST_NETWORK = "dgxsim-fast"
NETWORKS = {
    MGMT_NETWORK: {"subnet": "172.30.240.0/24", "mtu": 1500},
    FAST_NETWORK: {"subnet": "172.30.241.0/24", "mtu": 9000},
}

# Docker-in-Docker without --privileged (SIM.md: the daemon refuses it here).
DIND_FLAGS = [
    "--cap-add", "ALL",
    "--cap-drop", "SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined",
    "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run:rw,exec,mode=755",
]  # fmt: skip

# The nodes' image store: containerd's (Docker 29's on a fresh install) unless asked otherwise.
IMAGE_STORES = ("containerd", "classic")


def image_store() -> str:
    store = os.environ.get("DGXSIM_IMAGE_STORE", "containerd")
    if store not in IMAGE_STORES:
        raise SimError(f"DGXSIM_IMAGE_STORE is {store!r}; allowed: {', '.join(IMAGE_STORES)}")
    return store


MIN_FREE_GB_COLD = 30
MIN_FREE_GB_WARM = 2


def read_nodes(inventory: Path = INVENTORY) -> list[Node]:
    """The nodes of the sim inventory, checked against the sim's networks."""
    data = yaml.safe_load(inventory.read_text(encoding="utf-8"))
    hosts: dict[str, dict] = {}

    def walk(group: dict) -> None:
        for name, hostvars in (group.get("hosts") or {}).items():
            hosts[name] = hostvars or {}
        for child in (group.get("children") or {}).values():
            walk(child or {})

    walk(data["all"])
    nodes = []
    for name, hv in sorted(hosts.items()):
        node = Node(name, str(hv.get("ansible_host", "")), str(hv.get("spark_fast_ip", "")))
        for addr, net in ((node.mgmt_ip, MGMT_NETWORK), (node.fast_ip, FAST_NETWORK)):
            subnet = ipaddress.ip_network(NETWORKS[net]["subnet"])
            try:
                inside = ipaddress.ip_address(addr) in subnet
            except ValueError:
                inside = False
            if not inside:
                raise SimError(
                    f"{inventory}: {name} needs an address in {subnet} ({net}), got {addr!r}"
                )
        nodes.append(node)
    if len(nodes) < 2:
        raise SimError(f"{inventory} must list at least two nodes, found {len(nodes)}")
    return nodes


# ---------------------------------------------------------------- preflight


def docker_root_free_gb() -> float:
    root = docker("info", "-f", "{{.DockerRootDir}}").stdout.strip() or "/var/lib/docker"
    probe = Path(root)
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free / 1e9


def preflight(cold: bool = True) -> None:
    """Stop early, with what to do, when this machine cannot host the pair."""
    if shutil.which(sim_common.DOCKER) is None:
        raise SimError(
            "no Docker here: the docker client is not on PATH. Install Docker Engine "
            "(Debian: apt-get install docker.io), start dockerd, then rerun make sim-up."
        )
    proc = docker("info", "-f", "{{.ServerVersion}}", check=False)
    if proc.returncode != 0:
        raise SimError(
            "the Docker daemon does not answer ("
            + (proc.stderr or proc.stdout).strip().splitlines()[-1]
            + "). Start it (systemctl start docker, or dockerd & as root) and rerun make sim-up."
        )
    need = float(
        os.environ.get("DGXSIM_MIN_FREE_GB", MIN_FREE_GB_COLD if cold else MIN_FREE_GB_WARM)
    )
    free = docker_root_free_gb()
    if free < need:
        raise SimError(
            f"too little disk: the Docker root has {free:.1f} GB free, "
            f"the pair needs {need:.0f} GB "
            "(fixture images are loaded into each node's own daemon). Free space, then rerun."
        )
    for tool in ("ssh-keygen", "ssh-keyscan"):
        if shutil.which(tool) is None:
            raise SimError(
                f"{tool} is missing: install the OpenSSH client (apt-get install openssh-client)."
            )


def probe_capabilities(image: str) -> None:
    """The node containers need the daemon to grant Docker-in-Docker capabilities."""
    proc = docker(
        "run", "--rm", "--label", f"{LABEL}=probe", *DIND_FLAGS, "--entrypoint", "/bin/sh",
        image, "-c", "mount -t tmpfs probe /mnt && ip link set dev lo mtu 65535",
        check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SimError(
            "the Docker daemon refuses the capabilities a node needs to run its own dockerd "
            f"(flags: {' '.join(DIND_FLAGS)}): {(proc.stderr or proc.stdout).strip()}. "
            "Use a rootful Docker Engine that allows --cap-add ALL with seccomp and AppArmor "
            "unconfined (rootless Docker and user-namespace remapping do not)."
        )


# ---------------------------------------------------------------- pair


def ensure_networks() -> None:
    for name, spec in NETWORKS.items():
        proc = docker("network", "inspect", name, check=False)
        if proc.returncode == 0:
            info = json.loads(proc.stdout)[0]
            if (info.get("Labels") or {}).get(LABEL) is None:
                raise SimError(
                    f"a Docker network named {name} exists and was not made by the sim; remove it."
                )
            subnets = [c.get("Subnet") for c in (info.get("IPAM") or {}).get("Config") or []]
            mtu = (info.get("Options") or {}).get("com.docker.network.driver.mtu", "1500")
            if spec["subnet"] in subnets and str(spec["mtu"]) == mtu:
                continue
            raise SimError(f"network {name} exists with other settings; run make sim-down first.")
        docker(
            "network", "create", "--driver", "bridge", "--label", f"{LABEL}=network",
            "--subnet", spec["subnet"],
            # Named, so every Docker version records it (20.10 leaves it out of IPAM otherwise).
            "--gateway", str(ipaddress.ip_network(spec["subnet"])[1]),
            "-o", f"com.docker.network.driver.mtu={spec['mtu']}", name,
        )  # fmt: skip
        log(f"network {name}: created ({spec['subnet']}, MTU {spec['mtu']})")


def container_state(name: str) -> dict | None:
    proc = docker("container", "inspect", name, check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def node_args(node: Node, image: str) -> list[str]:
    """How a node container is made; a change here recreates the node on the next up."""
    return [
        "--name", node.container, "--hostname", node.name,
        "--restart", "unless-stopped", *DIND_FLAGS,
        # An init that reaps: the containerd shims a node's dockerd leaves are otherwise
        # zombies under it (dockerd is no reaper).
        "--init",
        # vLLM's shared-memory queues and --ipc host in inner containers need room.
        "--shm-size", "4g",
        "-e", f"DGXSIM_IMAGE_STORE={image_store()}",
        "-v", f"{node.volume}:/var/lib/docker",
        "--network", MGMT_NETWORK, "--ip", node.mgmt_ip, image,
    ]  # fmt: skip


def ensure_node(node: Node, image: str) -> None:
    args = node_args(node, image)
    inputs = digest(*args, image_id(image) or image, node.fast_ip)
    state = container_state(node.container)
    if state is not None:
        labels = state["Config"].get("Labels") or {}
        if labels.get(LABEL) is None:
            raise SimError(
                f"a container named {node.container} exists and was not made by the sim."
            )
        if labels.get(INPUTS_LABEL) == inputs:
            if not state["State"]["Running"]:
                docker("start", node.container)
                log(f"{node.name}: started")
            else:
                log(f"{node.name}: running")
            return
        # A fresh host has a fresh Docker: containers kept in the old volume would restart
        # against configuration the new node lacks (and leave bind-mount directories behind).
        log(f"{node.name}: node image or settings changed, recreating it with an empty Docker")
        docker("rm", "-f", node.container)
    # Also when only the container was gone: its volume's Docker belongs to the old node.
    docker("volume", "rm", "-f", node.volume, check=False)
    docker("volume", "create", "--label", f"{LABEL}=volume", node.volume)
    docker("create", "--label", f"{LABEL}=node", "--label", f"{INPUTS_LABEL}={inputs}", *args)
    docker("network", "connect", "--ip", node.fast_ip, FAST_NETWORK, node.container)
    docker("start", node.container)
    log(f"{node.name}: created ({node.mgmt_ip} management, {node.fast_ip} fast link)")


def authorize(node: Node, pubkey: Path) -> None:
    """The owner's key of this checkout, written in place so a new checkout (another key)
    reuses the running pair instead of recreating it."""
    docker(
        "exec", "-i", node.container, "sh", "-c",
        "umask 022 && cat > /etc/ssh/authorized_keys/spark.new"
        " && mv /etc/ssh/authorized_keys/spark.new /etc/ssh/authorized_keys/spark",
        input=pubkey.read_text(),
    )  # fmt: skip


def wait_ready(node: Node, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = "docker info >/dev/null && pgrep -x sshd >/dev/null"
        ok = docker("exec", node.container, "sh", "-c", ready, check=False)
        if ok.returncode == 0:
            return
        time.sleep(1)
    logs = docker("logs", "--tail", "30", node.container, check=False)
    raise SimError(
        f"{node.name}: dockerd or sshd did not come up in {timeout:.0f}s:\n"
        f"{logs.stdout}{logs.stderr}"
    )


def ssh_key() -> Path:
    key = STATE / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dgxsim", "-f", str(key)],
            check=True,
        )
    os.chmod(key.with_suffix(".pub"), 0o644)
    return key


def write_known_hosts(nodes: list[Node]) -> None:
    lines = []
    for node in nodes:
        for _ in range(30):
            proc = subprocess.run(["ssh-keyscan", "-T", "2", "-t", "ed25519", node.mgmt_ip],
                                  text=True, capture_output=True, check=False)  # fmt: skip
            if proc.stdout.strip():
                lines.append(proc.stdout.strip())
                break
            time.sleep(1)
        else:
            raise SimError(f"{node.name}: sshd at {node.mgmt_ip} did not answer ssh-keyscan")
    ssh_dir = STATE / "ssh"
    (ssh_dir / "known_hosts").write_text("\n".join(lines) + "\n")
    # For plain ssh and testinfra's ssh backend: `ssh -F .sim/ssh/config spark-1`.
    (ssh_dir / "config").write_text(
        "".join(
            f"Host {n.name}\n  HostName {n.mgmt_ip}\n  User spark\n"
            f"  IdentityFile {ssh_dir / 'id_ed25519'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {ssh_dir / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
            for n in nodes
        )
    )


def old_cluster_into_nodes(fixture_inputs, nodes: list[Node]) -> None:
    """The older base (small) built, then loaded into every node once its dockerd answers."""
    build_old_cluster_image(fixture_inputs)
    for node in nodes:
        wait_ready(node)
    load_into_nodes([OLD_CLUSTER_IMAGE], nodes)


def up(monitoring_image: bool = False) -> None:
    started = time.monotonic()
    nodes = read_nodes()
    cold = image_id(CLUSTER_IMAGE) is None or image_id(DONOR_IMAGE) is None
    preflight(cold=cold)
    key = ssh_key()
    # On a fresh machine: the fixtures' Debian base, wheels and source tree are made while the
    # node image is; the older base (small) is built and loaded into the nodes while the donor
    # builds (its pip install holds one core); the base adds Ray to the donor's layers, and
    # both go to the nodes in one stream while the tiny models train.
    with ThreadPoolExecutor(max_workers=6, thread_name_prefix="sim") as pool:
        fixture_inputs = start_fixture_inputs(pool)
        node_image = build_node_image()
        # Its debootstrap after the node image's, which every later step waits on: a third
        # one beside the node image's and the fixture base's slowed all of them down.
        monitoring_job = (
            pool.submit(build_rootfs_image, MONITORING_IMAGE, MONITORING_PACKAGES)
            if monitoring_image
            else None
        )
        probe_capabilities(node_image)
        ensure_networks()
        for node in nodes:
            ensure_node(node, node_image)
        old_cluster_job = pool.submit(old_cluster_into_nodes, fixture_inputs, nodes)
        build_donor_image(fixture_inputs)
        models = start_tiny_models()
        build_cluster_image(fixture_inputs)
        old_cluster_job.result()
        load_into_nodes([DONOR_IMAGE, CLUSTER_IMAGE], nodes)
        if monitoring_job is not None:
            monitoring_job.result()
    for node in nodes:
        authorize(node, key.with_suffix(".pub"))
    write_known_hosts(nodes)
    finish_tiny_models(models)
    log(
        f"pair up in {time.monotonic() - started:.0f}s: "
        + ", ".join(f"{n.name}={n.mgmt_ip}" for n in nodes)
    )


def monitoring(build_only: bool) -> None:
    """The monitoring image: built when its packages changed, loaded where it differs."""
    build_rootfs_image(MONITORING_IMAGE, MONITORING_PACKAGES)
    if not build_only:
        load_into_nodes([MONITORING_IMAGE], read_nodes())


def down(purge: bool) -> None:
    for kind in ("container", "network", "volume"):
        flag = "-aq" if kind == "container" else "-q"
        ids = docker(kind, "ls", flag, "--filter", f"label={LABEL}").stdout.split()
        if ids:
            docker(kind, "rm", *(["-f"] if kind == "container" else []), *ids)
            log(f"removed {len(ids)} {kind}(s)")
    if purge:
        # An image that another one is built on goes only once that one has: a base and the
        # image over it, removed in one call, can leave the base behind. Again, until none is.
        removed: set[str] = set()
        for _ in range(4):
            ids = set(docker("image", "ls", "-q", "--filter", f"label={LABEL}").stdout.split())
            if not ids:
                break
            docker("image", "rm", "-f", *sorted(ids), check=False)
            removed |= ids
        left = set(docker("image", "ls", "-q", "--filter", f"label={LABEL}").stdout.split())
        if removed:
            log(f"removed {len(removed - left)} image(s)")
        if left:
            log(f"could not remove {len(left)} image(s): {' '.join(sorted(left))}")
        shutil.rmtree(STATE, ignore_errors=True)


def status() -> None:
    for node in read_nodes():
        state = container_state(node.container)
        print(
            f"{node.name}: "
            f"{'running' if state and state['State']['Running'] else 'absent or stopped'}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("preflight")
    up_p = sub.add_parser("up")
    up_p.add_argument(
        "--monitoring-image",
        action="store_true",
        help="also build the monitoring image here (loaded into no node)",
    )
    down_p = sub.add_parser("down")
    down_p.add_argument(
        "--purge", action="store_true", help="also remove the sim's images and .sim/"
    )
    sub.add_parser("status")
    mon_p = sub.add_parser("monitoring")
    mon_p.add_argument(
        "--build-only", action="store_true", help="build the image here, load it into no node"
    )
    args = parser.parse_args()
    try:
        if args.cmd == "preflight":
            preflight()
            log("preflight: ok")
        elif args.cmd == "up":
            up(args.monitoring_image)
        elif args.cmd == "down":
            down(args.purge)
        elif args.cmd == "monitoring":
            monitoring(args.build_only)
        else:
            status()
    except SimError as exc:
        print(f"sim: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
