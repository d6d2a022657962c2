"""Which libnccl the ranks load (spark_nccl_library: auto), on the simulated pair.

Preflight (ray_cluster's tasks/nccl_choice.yml) reads the NCCL version in the serving image and
in the file name of each node's libnccl, and dgx_spark.cluster.nccl_choice decides for the pair.
The sim's serving image is a CPU build (its torch has no NCCL) and its nodes have no libnccl, so
each case is set up here: images derived from the serving alias carry a pip NCCL wheel's
metadata (nvidia-nccl-cu13 at the version wanted; the probe reads it when torch has none), and a
real shared object (the node's libz, which any process can preload harmlessly) lies on every
node under versioned libnccl file names. The choice alone runs through a wrapper playbook that
includes only nccl_choice.yml (seconds); one whole deploy proves that the ranks in the Ray
containers really load the chosen file, and one more puts the inventory's settings back.
"""

from __future__ import annotations

import pytest
import yaml
from conftest import on_node, run_playbook

HOST_DIR = "/opt/dgx-spark-sim-nccl"
# The nodes' libraries: new outside the hang range, old inside it (vLLM issue 42354's 2.28.9).
HOST_LIBS = {"new": "2.30.7", "old": "2.28.9"}
IMAGES = {v: f"dgxsim-nccl/serving:{v}" for v in ("2.28.9", "2.30.7")}
ALIAS = "dgx-spark/vllm-serving:current"
IN_CONTAINER = "/opt/dgx-spark-nccl/libnccl.so.2"
RAY = "dgx-spark-ray"
SERVING = "dgx-spark-vllm"
SAY = "Say the choice"
HANG_REPORT = "https://github.com/vllm-project/vllm/issues/42354"


def dockerfile(version: str) -> bytes:
    # Only the wheel's metadata: what pip leaves in site-packages for nvidia-nccl-cu13.
    return (
        f"FROM {ALIAS}\n"
        'RUN d="$(python3 -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')'
        f'/nvidia_nccl_cu13-{version}.dist-info" && mkdir -p "$d" && '
        f"printf 'Metadata-Version: 2.1\\nName: nvidia-nccl-cu13\\nVersion: {version}\\n' "
        '> "$d/METADATA"\n'
    ).encode()


@pytest.fixture(scope="module")
def versions(deployed_pair, nodes):
    """Every node holds both images and both libraries; all are removed afterwards."""
    libs = " ".join(f"{name}:{v}" for name, v in HOST_LIBS.items())
    script = (
        "set -e; lib=$(ldconfig -p | awk '/libz[.]so[.]1 /{print $NF; exit}'); "
        f'for pair in {libs}; do d={HOST_DIR}/"${{pair%%:*}}"; v="${{pair#*:}}"; '
        'mkdir -p "$d"; cp -L "$lib" "$d/libnccl.so.$v"; ln -sf "libnccl.so.$v" "$d/libnccl.so.2"; '
        "done"
    )
    for node in nodes:
        on_node(node, "sh", "-c", script)
        for version, tag in IMAGES.items():
            on_node(node, "docker", "build", "-q", "-t", tag, "-", data=dockerfile(version))
    yield nodes
    for node in nodes:
        on_node(node, "rm", "-rf", HOST_DIR)
        on_node(node, "docker", "rmi", *IMAGES.values(), check=False)


def host_lib(name: str) -> str:
    return f"{HOST_DIR}/{name}/libnccl.so.2"


def choose(tmp_path, image: str, host: str, *extra: str):
    """Preflight's NCCL tasks alone, with the serving image and the nodes' libnccl given."""
    wrapper = tmp_path / "nccl_choice.yml"
    wrapper.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "The NCCL choice alone",
                    "hosts": "sparks",
                    "gather_facts": False,
                    "any_errors_fatal": True,
                    "tasks": [
                        {
                            "name": "Decide as preflight does",
                            "ansible.builtin.include_role": {
                                "name": "dgx_spark.cluster.ray_cluster",
                                "tasks_from": "nccl_choice",
                            },
                        },
                        {
                            "name": SAY,
                            "ansible.builtin.debug": {
                                "msg": "{{ _spark_nccl_resolved | default('unset') }}"
                            },
                        },
                    ],
                }
            ]
        )
    )
    return run_playbook(
        str(wrapper),
        *("-e", f"ray_cluster_image={IMAGES[image]}"),
        *("-e", f"spark_nccl_host_library={host_lib(host)}"),
        *extra,
    )


def chosen(run) -> dict[str, str]:
    return {host: str(res.get("msg")) for name, host, res in run.results() if name == SAY}


def printed(run) -> str:
    return "\n".join(
        str(res.get("msg")) for name, _h, res in run.results()
        if name == "Print both NCCL versions and the choice"
    )  # fmt: skip


def test_auto_takes_the_nodes_newer_nccl_over_the_image_in_the_hang_range(versions, tmp_path):
    run = choose(tmp_path, "2.28.9", "new", "-e", "spark_nccl_library=auto")
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    assert chosen(run) == {n.name: "host" for n in versions}
    text = printed(run)
    for node in versions:
        assert f"{node.name}: NCCL on the node: 2.30.7 ({host_lib('new')})" in text
    assert "2.28.9 (the nvidia-nccl-cu13 wheel; torch has none)" in text
    assert "spark_nccl_library: auto chose the nodes' NCCL 2.30.7 over the image's 2.28.9" in text


def test_auto_keeps_an_image_outside_the_hang_range(versions, tmp_path):
    run = choose(tmp_path, "2.30.7", "old", "-e", "spark_nccl_library=auto")
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    assert chosen(run) == {n.name: "image" for n in versions}
    assert "auto chose the image's: its version is outside the 2.28.x range" in printed(run)


def test_auto_refuses_when_neither_is_outside_the_range_and_an_explicit_choice_goes_on(
    versions, tmp_path
):
    refused = choose(tmp_path, "2.28.9", "old", "-e", "spark_nccl_library=auto")
    assert refused.rc != 0
    failures = "\n".join(refused.failures())
    assert "spark_nccl_library: auto refuses to start the ranks" in failures, failures
    assert HANG_REPORT in failures and "NCCL >= 2.30.7" in failures
    assert not chosen(refused), "the play went on past the refusal"
    for library in ("host", "image"):
        run = choose(tmp_path, "2.28.9", "old", "-e", f"spark_nccl_library={library}")
        assert run.rc == 0, run.failures() or run.raw[-3000:]
        assert chosen(run) == {n.name: library for n in versions}


def rank_maps(node) -> dict[str, bool]:
    """Each rank process in the node's Ray container (a Ray actor whose title starts with
    ray::RayWorker) -> whether its memory maps hold the library mounted for the ranks."""
    script = (
        "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); "
        'case "$c" in ray::RayWorker*) '
        f'if grep -q {IN_CONTAINER} $p/maps 2>/dev/null; then echo "${{p#/proc/}} yes"; '
        'else echo "${p#/proc/} no"; fi;; esac; done'
    )
    got = on_node(node, "docker", "exec", RAY, "sh", "-c", script)
    return dict(line.split() for line in got.stdout.splitlines())


def env_of(node, container: str) -> dict[str, str]:
    got = on_node(node, "docker", "inspect", "--format", "{{json .Config.Env}}", container)
    return dict(item.split("=", 1) for item in yaml.safe_load(got.stdout))


# Two whole deploys (about three minutes): a drill, run by `make test-drills`, not `make test`.
@pytest.mark.drill
def test_the_ranks_load_the_library_auto_chose(versions):
    """One whole deploy with the image in the hang range and the nodes offering 2.30.7: the
    choice made in preflight reaches the Ray and serving containers, and every rank process
    maps the node's file; the next deploy with the inventory's settings takes it away."""
    extra = [
        *("-e", "spark_nccl_library=auto"),
        *("-e", f"ray_cluster_image={IMAGES['2.28.9']}"),
        *("-e", f"spark_nccl_host_library={host_lib('new')}"),
    ]
    try:
        run = run_playbook("deploy.yml", *extra)
        assert run.rc == 0, run.failures() or run.raw[-4000:]
        assert "auto chose the nodes' NCCL 2.30.7 over the image's 2.28.9" in run.messages()
        for index, node in enumerate(versions):
            # The serving container (the driver) runs on the head only.
            for container in (RAY, SERVING) if index == 0 else (RAY,):
                env = env_of(node, container)
                assert env.get("LD_PRELOAD") == IN_CONTAINER, (node.name, container, env)
                assert env.get("VLLM_NCCL_SO_PATH") == IN_CONTAINER
            ranks = rank_maps(node)
            assert ranks, f"{node.name}: no rank process in {RAY}"
            assert set(ranks.values()) == {"yes"}, f"{node.name}: {ranks}"
    finally:
        back = run_playbook("deploy.yml")
    assert back.rc == 0, back.failures() or back.raw[-4000:]
    for node in versions:
        assert "LD_PRELOAD" not in env_of(node, RAY)
        ranks = rank_maps(node)
        assert ranks and set(ranks.values()) == {"no"}, f"{node.name}: {ranks}"
