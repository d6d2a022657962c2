"""sim/sim_common.py: how a long step reports its progress, which lines reach the phase log,
and what a missing docker client or a failing docker command says."""

from __future__ import annotations

import pytest


def test_a_long_step_prints_its_steps_and_a_line_while_it_runs(sim_common, capsys, monkeypatch):
    monkeypatch.setattr(sim_common, "HEARTBEAT_S", 1)
    script = "echo 'Step 1/2 : FROM base'; sleep 2.5; echo noise; echo 'Step 2/2 : RUN x'; exit 4"
    proc = sim_common.run_step(["sh", "-c", script], "img: build", steps=r"^Step \d+/\d+ : ")
    assert proc.returncode == 4
    assert proc.stdout == "Step 1/2 : FROM base\nnoise\nStep 2/2 : RUN x\n"
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "[sim] img: build: Step 1/2 : FROM base"
    assert said[-1] == "[sim] img: build: Step 2/2 : RUN x"
    assert "[sim] img: build: still running, 1 s so far" in said
    assert not any("noise" in line for line in said)


def test_only_timed_lines_reach_the_phase_log(sim_common, monkeypatch, tmp_path, capsys):
    phases = tmp_path / "phases.log"
    monkeypatch.setenv("DGX_SPARK_PHASES", str(phases))
    for line in ("vllm-node:x: building", "vllm-node:x: built in 42s", "pair up in 7s: a=b"):
        sim_common.log(line)
    assert phases.read_text() == "[sim] vllm-node:x: built in 42s\n[sim] pair up in 7s: a=b\n"
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_a_missing_docker_client_says_what_to_install(sim_common, monkeypatch, tmp_path):
    monkeypatch.setattr(sim_common, "DOCKER", str(tmp_path / "docker"))
    with pytest.raises(sim_common.SimError, match=r"'.*docker' is not installed.*docker\.io"):
        sim_common.docker("info")


def test_a_failing_docker_command_names_itself_and_its_error(sim_common, monkeypatch, tmp_path):
    docker = tmp_path / "docker"
    docker.write_text("#!/bin/sh\necho 'Error: No such image: nothing:here' >&2\nexit 1\n")
    docker.chmod(0o755)
    monkeypatch.setattr(sim_common, "DOCKER", str(docker))
    with pytest.raises(
        sim_common.SimError, match=r"^docker image inspect nothing:here failed: Error: No such"
    ):
        sim_common.docker("image", "inspect", "nothing:here", "--extra")
    assert sim_common.docker("image", "inspect", "x", check=False).returncode == 1


def test_a_node_names_its_container_and_volume_and_is_the_one_simctl_and_sim_images_use(
    sim_common, simctl
):
    node = sim_common.Node("spark-1", "10.0.0.1", "192.168.100.1")
    assert node.container == "dgxsim-spark-1"
    assert node.volume == "dgxsim-spark-1-docker"
    assert simctl.Node is sim_common.Node
    assert simctl.read_nodes()[0].__class__ is sim_common.Node
