"""sim/simctl.py: what it refuses on a machine that cannot host the pair (with what to do), and
the nodes it reads from the sim inventory."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest


def fake_docker(tmp_path: Path, body: str) -> str:
    """A stand-in docker client: a shell script answering as a broken setup would."""
    path = tmp_path / "docker"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def test_no_docker_client(simctl, monkeypatch, tmp_path):
    monkeypatch.setattr(simctl.sim_common, "DOCKER", str(tmp_path / "missing" / "docker"))
    with pytest.raises(simctl.SimError, match=r"no Docker here.*apt-get install docker\.io"):
        simctl.preflight()


def test_daemon_not_running(simctl, monkeypatch, tmp_path):
    docker = fake_docker(
        tmp_path,
        """
        echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2
        exit 1
        """,
    )
    monkeypatch.setattr(simctl.sim_common, "DOCKER", docker)
    with pytest.raises(simctl.SimError, match=r"daemon does not answer.*Cannot connect.*Start it"):
        simctl.preflight()


def test_too_little_disk(simctl, monkeypatch, tmp_path):
    docker = fake_docker(
        tmp_path,
        f"""
        case "$*" in
          *ServerVersion*) echo 20.10.24 ;;
          *DockerRootDir*) echo {tmp_path} ;;
        esac
        """,
    )
    monkeypatch.setattr(simctl.sim_common, "DOCKER", docker)
    monkeypatch.setenv("DGXSIM_MIN_FREE_GB", "1000000")
    with pytest.raises(simctl.SimError, match=r"too little disk: .* needs 1000000 GB"):
        simctl.preflight()


def test_enough_disk_passes(simctl, monkeypatch, tmp_path):
    calls = tmp_path / "calls"
    docker = fake_docker(
        tmp_path,
        f"""
        echo "$*" >> {calls}
        case "$*" in
          *ServerVersion*) echo 20.10.24 ;;
          *DockerRootDir*) echo {tmp_path} ;;
        esac
        """,
    )
    monkeypatch.setattr(simctl.sim_common, "DOCKER", docker)
    # Half of what the Docker root (tmp_path here) has free: enough, and not a zero that
    # would pass whatever the check read.
    free = shutil.disk_usage(tmp_path).free / 1e9
    monkeypatch.setenv("DGXSIM_MIN_FREE_GB", f"{free / 2:.3f}")
    assert simctl.preflight() is None
    # It asked the daemon for its version and its root, and measured that root.
    assert calls.read_text().splitlines() == [
        "info -f {{.ServerVersion}}",
        "info -f {{.DockerRootDir}}",
    ]
    assert simctl.docker_root_free_gb() == pytest.approx(free, rel=0.05)


def test_daemon_refusing_capabilities(simctl, monkeypatch, tmp_path):
    docker = fake_docker(
        tmp_path,
        """
        echo "docker: Error response from daemon: privileged mode is incompatible" \
          "with user namespaces." >&2
        exit 125
        """,
    )
    monkeypatch.setattr(simctl.sim_common, "DOCKER", docker)
    with pytest.raises(
        simctl.SimError, match=r"refuses the capabilities.*user namespaces.*rootful"
    ):
        simctl.probe_capabilities("dgxsim-node:bookworm")


def test_inventory_addresses_must_be_on_the_sim_networks(simctl, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    sparks:\n      hosts:\n"
        "        a: {ansible_host: 172.30.240.11, spark_fast_ip: 172.30.241.11}\n"
        "        b: {ansible_host: 10.1.2.3, spark_fast_ip: 172.30.241.12}\n"
    )
    with pytest.raises(simctl.SimError, match=r"b needs an address in 172\.30\.240\.0/24"):
        simctl.read_nodes(inventory)


def test_sim_inventory_matches_the_sim_networks(simctl):
    nodes = simctl.read_nodes()
    assert [n.name for n in nodes] == ["spark-1", "spark-2"]
    assert len({n.fast_ip for n in nodes}) == 2


def test_purge_removes_a_base_left_behind_by_the_image_over_it(
    simctl, monkeypatch, tmp_path, capsys
):
    """Docker refuses to remove an image another one is built on; in one call naming both, the
    base can be tried first and stay. sim-clean tries again until no sim image is left."""
    store = tmp_path / "images"
    store.mkdir()
    for image in ("aaa-base", "bbb-over-base", "ccc-alone"):
        (store / image).touch()
    docker = fake_docker(
        tmp_path,
        f"""
        cd {store}
        case "$1 $2" in
          "container ls"|"network ls"|"volume ls") exit 0 ;;
          "image ls") ls ;;
          "image rm")
            shift 3
            for id in "$@"; do
              if [ "$id" = aaa-base ] && [ -e bbb-over-base ]; then
                echo "conflict: unable to delete $id: image has dependent child images" >&2
                failed=1
              else
                rm -f "$id"
              fi
            done
            exit ${{failed:-0}} ;;
        esac
        """,
    )
    monkeypatch.setattr(simctl.sim_common, "DOCKER", docker)
    monkeypatch.setattr(simctl, "STATE", tmp_path / "state")
    simctl.down(purge=True)
    assert list(store.iterdir()) == []
    assert "[sim] removed 3 image(s)" in capsys.readouterr().out


@pytest.fixture()
def up_steps(simctl, monkeypatch):
    """simctl.up with every step a stand-in that records its name (a load: with its image, a
    debootstrap: with its tag), in the order they ran."""
    calls: list[str] = []

    def record(name, result=None):
        def step(*args, **kwargs):
            if name == "rootfs":
                calls.append(f"rootfs {args[0]}")
            elif name == "load_into_nodes":
                calls.append(f"load {' '.join(args[0])}")
            else:
                calls.append(name)
            return result

        return step

    for name in ("preflight", "probe_capabilities", "ensure_networks", "ensure_node",
                 "build_donor_image", "build_cluster_image", "build_old_cluster_image",
                 "wait_ready", "authorize",
                 "write_known_hosts", "load_into_nodes", "finish_tiny_models",
                 "start_fixture_inputs", "start_tiny_models", "image_id"):  # fmt: skip
        monkeypatch.setattr(simctl, name, record(name))
    monkeypatch.setattr(simctl, "build_node_image", record("build_node_image", "node"))
    monkeypatch.setattr(simctl, "build_rootfs_image", record("rootfs"))
    monkeypatch.setattr(simctl, "ssh_key", record("ssh_key", simctl.Path("/nonexistent/key")))
    return SimpleNamespace(calls=calls, record=record)


@pytest.mark.parametrize("asked", [True, False])
def test_up_builds_the_monitoring_image_after_the_node_image_only_when_asked(
    simctl, up_steps, asked
):
    """`make test` asks for the monitoring image at the pair's start: its debootstrap begins
    once the node image (which every later step waits on) is made, and ends before the pair is
    said to be up; the demo's plain `up` builds none."""
    simctl.up(monitoring_image=asked)
    calls = up_steps.calls
    monitoring = f"rootfs {simctl.MONITORING_IMAGE}"
    assert (monitoring in calls) is asked, calls
    if asked:
        assert calls.index("build_node_image") < calls.index(monitoring), calls
        assert calls.index(monitoring) < calls.index("finish_tiny_models"), calls


def test_up_loads_the_older_base_into_the_nodes_while_the_donor_builds(
    simctl, up_steps, monkeypatch
):
    """The older base is small: it is built, and loaded once each node's dockerd answers,
    during the donor's build (a donor that waits for that load would otherwise never end).
    The base (Ray over the donor's layers) is built after the donor, and both are loaded in one
    stream, the tiny models training meanwhile."""
    import threading

    old_loaded = threading.Event()
    load = up_steps.record("load_into_nodes")

    def load_into_nodes(images, nodes):
        load(images, nodes)
        if images == [simctl.OLD_CLUSTER_IMAGE]:
            old_loaded.set()

    def build_donor_image(_inputs):
        assert old_loaded.wait(10), "the older base waited for the donor"
        up_steps.calls.append("build_donor_image")

    monkeypatch.setattr(simctl, "load_into_nodes", load_into_nodes)
    monkeypatch.setattr(simctl, "build_donor_image", build_donor_image)
    simctl.up()
    calls = up_steps.calls
    old = f"load {simctl.OLD_CLUSTER_IMAGE}"
    both = f"load {simctl.DONOR_IMAGE} {simctl.CLUSTER_IMAGE}"
    assert calls.count(old) == calls.count(both) == 1, calls
    first_ready = calls.index("wait_ready")
    assert calls.index("ensure_node") < calls.index("build_old_cluster_image") < first_ready
    assert calls[first_ready : calls.index(old)].count("wait_ready") == 2, calls
    assert calls.index(old) < calls.index("build_donor_image") < calls.index("build_cluster_image")
    assert calls.index("build_cluster_image") < calls.index(both), calls
    assert calls.index("start_tiny_models") < calls.index(both) < calls.index("finish_tiny_models")
    assert calls.index(both) < calls.index("authorize"), calls


@pytest.mark.parametrize("store", ["containerd", "classic"])
def test_the_nodes_image_store_is_a_setting_of_the_node(simctl, monkeypatch, store):
    """containerd's image store by default (Docker 29 on a fresh install); a change recreates
    the nodes, since the node's arguments are its inputs."""
    monkeypatch.setenv("DGXSIM_IMAGE_STORE", store)
    node = simctl.Node("spark-1", "172.30.240.11", "172.30.241.11")
    assert f"DGXSIM_IMAGE_STORE={store}" in simctl.node_args(node, "dgxsim-node:trixie")


def test_an_unknown_image_store_is_refused(simctl, monkeypatch):
    monkeypatch.setenv("DGXSIM_IMAGE_STORE", "zfs")
    with pytest.raises(
        simctl.SimError, match="DGXSIM_IMAGE_STORE is 'zfs'; allowed: containerd, classic"
    ):
        simctl.image_store()
