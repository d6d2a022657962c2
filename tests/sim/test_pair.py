"""The simulated pair itself: SSH, per-node Docker daemons, the fast link, fixtures. That the
donor's vLLM serves the tiny model is shown where the collection uses it: molecule's images
scenario serves it from the seed design's overlay, test_profiles from the second profile's."""

from __future__ import annotations

import json

import pytest


def test_both_nodes_answer_ansible_over_ssh(ansible, nodes):
    results = ansible("sparks", "ansible.builtin.command", "id -un")
    assert sorted(results) == sorted(n.name for n in nodes)
    for name, res in results.items():
        assert not res.get("unreachable"), f"{name}: {res.get('msg')}"
        assert res["stdout"] == "spark", f"{name} should be reached as the owner's account"


def test_become_works_for_the_owner(ansible):
    results = ansible("sparks", "ansible.builtin.command", "id -u", "--become")
    assert {name: res["stdout"] for name, res in results.items()} == {
        "spark-1": "0",
        "spark-2": "0",
    }


def test_node_image_carries_no_trust(sim, images):
    """Node-to-node trust is host_prep's job: the sim's node image must not ship any."""
    out = sim.docker(
        "run", "--rm", "--entrypoint", "/bin/sh", images.NODE_IMAGE,
        # Files only: Debian 13 makes an empty /root/.ssh, which holds no trust.
        "-c", "find /home/spark/.ssh /root/.ssh /etc/ssh -name 'ssh_host_*' -o -type f "
        "-path '*/.ssh/*' 2>/dev/null; true",
    ).stdout  # fmt: skip
    assert out.strip() == "", f"the node image ships keys: {out}"


def test_each_node_runs_its_own_dockerd(hosts, images):
    daemon_ids = set()
    for name, host in hosts.items():
        info = host.run("sudo docker info -f '{{.ID}} {{.Name}}'")
        assert info.rc == 0, f"{name}: {info.stderr}"
        daemon_id, daemon_host = info.stdout.split()
        assert daemon_host == name
        daemon_ids.add(daemon_id)
        bridge = host.run(f"sudo docker run --rm {images.CLUSTER_IMAGE} python3 -c 'print(6 * 7)'")
        assert bridge.rc == 0 and bridge.stdout.strip() == "42", f"{name}: {bridge.stderr}"
    assert len(daemon_ids) == len(hosts), "each node must have a Docker daemon of its own"


def test_inner_container_sees_the_fast_link_on_host_network(hosts, nodes, images):
    for node in nodes:
        out = hosts[node.name].check_output(
            f"sudo docker run --rm --network host {images.CLUSTER_IMAGE} "
            "python3 -c 'import socket; print(socket.gethostname())'"
        )
        assert out.strip() == node.name


def _interfaces(host) -> list[dict]:
    return json.loads(host.check_output("ip -j addr show"))


def _iface_with(host, address: str) -> dict:
    for iface in _interfaces(host):
        if any(a.get("local") == address for a in iface.get("addr_info", [])):
            return iface
    pytest.fail(f"no interface carries {address}")


def test_fast_link_has_mtu_9000_on_both(hosts, nodes):
    for node in nodes:
        assert _iface_with(hosts[node.name], node.fast_ip)["mtu"] == 9000, node.name
        assert _iface_with(hosts[node.name], node.mgmt_ip)["mtu"] == 1500, node.name


def test_fast_link_reaches_the_peer_with_jumbo_frames(hosts, nodes):
    first, second = nodes[0], nodes[1]
    # 8972 bytes of payload + 28 of headers = 9000; -M do forbids fragmentation.
    ping = hosts[first.name].run(f"ping -c 1 -W 2 -M do -s 8972 {second.fast_ip}")
    assert ping.rc == 0, ping.stdout + ping.stderr
    too_big = hosts[first.name].run(f"ping -c 1 -W 2 -M do -s 8973 {second.fast_ip}")
    assert too_big.rc != 0


@pytest.mark.parametrize("image_attr", ["CLUSTER_IMAGE", "DONOR_IMAGE", "OLD_CLUSTER_IMAGE"])
def test_fixture_images_present_on_both(hosts, images, image_attr):
    """Known by the inputs label: in the nodes' containerd image store a loaded image has
    another ID than on this machine's Docker, but the same one on both nodes."""
    image = getattr(images, image_attr)
    wanted = images.image_label(image)
    assert wanted, f"{image} was not built on the host"
    form = f'{{{{index .Config.Labels "{images.INPUTS_LABEL}"}}}} {{{{.Id}}}}'
    ids = set()
    for name, host in hosts.items():
        got = host.run(f"docker image inspect -f '{form}' {image}")
        assert got.rc == 0, f"{image} missing on {name}"
        label, image_id = got.stdout.split()
        assert label == wanted, f"{name} has another {image}"
        ids.add(image_id)
    assert len(ids) == 1, ids


def test_nodes_keep_images_in_the_containerd_store(hosts):
    """As Docker 29 does on a fresh install (DGX OS): the sim's default image store."""
    for name, host in hosts.items():
        status = host.check_output("docker info --format '{{json .DriverStatus}}'")
        assert "io.containerd.snapshotter.v1" in status, f"{name}: {status}"


def test_older_base_has_ray_and_old_vllm_registry_in_a_virtualenv(hosts, images):
    out = hosts["spark-1"].check_output(
        f"docker run --rm {images.OLD_CLUSTER_IMAGE} python3 -c "
        "'import importlib.metadata as m, sys; "
        'print(m.version("ray"), m.version("vllm"), sys.prefix)\''
    )
    assert out.split() == [images.RAY_VERSION, images.OLD_VLLM_VERSION, "/opt/ray"]


def test_base_is_a_cuda_images_layout_with_ray_and_vllm_in_the_system_python(hosts, images):
    """As the base owners build: NVIDIA's entrypoint script, no virtualenv, Ray and a vLLM that
    imports the served architecture in the system Python's dist-packages."""
    out = hosts["spark-1"].check_output(
        f"docker run --rm {images.CLUSTER_IMAGE} python3 -c "
        "'import os, sys, ray, vllm; print(ray.__version__, vllm.__file__, sys.prefix, "
        'os.environ.get("VIRTUAL_ENV", "-"))\''
    )
    assert out.split() == [
        images.RAY_VERSION,
        "/usr/local/lib/python3.11/dist-packages/vllm/__init__.py",
        "/usr",
        "-",
    ]
    entrypoint = hosts["spark-1"].check_output(
        f"docker image inspect -f '{{{{json .Config.Entrypoint}}}}' {images.CLUSTER_IMAGE}"
    )
    assert json.loads(entrypoint) == ["/opt/nvidia/nvidia_entrypoint.sh"]
