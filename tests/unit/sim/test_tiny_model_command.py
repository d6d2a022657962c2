"""sim/sim_images.tiny_model_command: the one docker run that makes the tiny model, used by
sim-up and by tests/sim/test_tiny_model.py (two builds, the same bytes)."""

from __future__ import annotations

from pathlib import Path


def test_the_build_writes_into_the_given_folder_offline_in_the_donor_image(sim_images):
    cmd = sim_images.tiny_model_command(Path("/tmp/x/one/tiny"))
    assert cmd[:3] == [sim_images.sim_common.DOCKER, "run", "--rm"]
    assert cmd[cmd.index("--network") + 1] == "none"
    assert "/tmp/x/one:/out" in cmd
    assert f"{sim_images.SIM / 'models'}:/models:ro" in cmd
    assert cmd[-3:] == [sim_images.DONOR_IMAGE, "/models/make_tiny_model.py", "/out/tiny"]
    assert cmd.count("-e") == 1  # HOME only


def test_settings_reach_the_container_before_the_image(sim_images):
    cmd = sim_images.tiny_model_command(Path("/o/t"), ("OMP_NUM_THREADS=2", "A=b"))
    at = cmd.index("OMP_NUM_THREADS=2")
    assert cmd[at - 1] == "-e" and cmd[at + 1 : at + 3] == ["-e", "A=b"]
    assert at < cmd.index(sim_images.DONOR_IMAGE)


def test_sim_up_makes_the_model_with_the_same_command(sim_images, monkeypatch, tmp_path):
    seen = []

    class Proc:
        def __init__(self, cmd, **_kw):
            seen.append(cmd)

    monkeypatch.setattr(sim_images, "TINY_MODEL", tmp_path / "models" / "tiny")
    monkeypatch.setattr(sim_images, "tiny_model_inputs", lambda: "abc")
    monkeypatch.setattr(sim_images.subprocess, "Popen", Proc)
    job = sim_images.start_tiny_model()
    assert job is not None and job.inputs == "abc"
    assert seen == [sim_images.tiny_model_command(tmp_path / "models" / "tiny")]
