"""sim/sim_images.tiny_model_command: the one docker run that makes a tiny model, used by
sim-up and by tests/sim/test_tiny_model.py (two builds, the same bytes); and sim-up's start
and finish of the tiny models (each in its own container, each stamped apart)."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_the_build_writes_into_the_given_folder_offline_in_the_donor_image(sim_images):
    cmd = sim_images.tiny_model_command(Path("/tmp/x/one/tiny"))
    assert cmd[:3] == [sim_images.sim_common.DOCKER, "run", "--rm"]
    assert cmd[cmd.index("--network") + 1] == "none"
    assert "/tmp/x/one:/out" in cmd
    assert f"{sim_images.SIM / 'models'}:/models:ro" in cmd
    assert cmd[-4:] == [
        sim_images.DONOR_IMAGE, "/models/make_tiny_model.py", "/out/tiny", "tiny-qwen3-moe",
    ]  # fmt: skip
    assert cmd.count("-e") == 1  # HOME only


def test_the_name_picks_the_model(sim_images):
    cmd = sim_images.tiny_model_command(Path("/o/dense"), name="tiny-qwen3")
    assert cmd[-2:] == ["/out/dense", "tiny-qwen3"]


def test_both_tiny_models_live_beside_each_other_in_the_state_folder(sim_images):
    assert list(sim_images.TINY_MODELS) == ["tiny-qwen3-moe", "tiny-qwen3"]
    assert {p.parent for p in sim_images.TINY_MODELS.values()} == {sim_images.TINY_MODEL.parent}
    assert sim_images.TINY_MODELS["tiny-qwen3-moe"] == sim_images.TINY_MODEL
    assert all(p.name == name for name, p in sim_images.TINY_MODELS.items())


def test_the_model_names_are_the_generators(sim_images):
    """make_tiny_model.py runs only in the donor image (it imports torch): its MODELS names
    are read from the source, not imported."""
    source = (sim_images.SIM / "models" / "make_tiny_model.py").read_text(encoding="utf-8")
    for name in sim_images.TINY_MODELS:
        assert f'    "{name}": {{' in source, name


def test_settings_reach_the_container_before_the_image(sim_images):
    cmd = sim_images.tiny_model_command(Path("/o/t"), ("OMP_NUM_THREADS=2", "A=b"))
    at = cmd.index("OMP_NUM_THREADS=2")
    assert cmd[at - 1] == "-e" and cmd[at + 1 : at + 3] == ["-e", "A=b"]
    assert at < cmd.index(sim_images.DONOR_IMAGE)


@pytest.fixture()
def models(sim_images, monkeypatch, tmp_path):
    """TINY_MODELS under tmp_path, inputs "abc", and the docker runs recorded (each exits
    with the code in ``codes``, by model, 0 if unnamed)."""
    folders = {name: tmp_path / "models" / name for name in ("tiny-qwen3-moe", "tiny-qwen3")}
    monkeypatch.setattr(sim_images, "TINY_MODELS", folders)
    monkeypatch.setattr(sim_images, "ROOT", tmp_path)
    monkeypatch.setattr(sim_images, "tiny_model_inputs", lambda: "abc")
    seen, codes = [], {}

    class Proc:
        def __init__(self, cmd, **_kw):
            seen.append(cmd)
            self.returncode = codes.get(cmd[-1], 0)

        def communicate(self):
            return f"output of {seen[-1][-1]}", None

    monkeypatch.setattr(sim_images.subprocess, "Popen", Proc)
    return folders, seen, codes


def test_sim_up_makes_each_model_with_the_same_command_at_once(sim_images, models):
    folders, seen, _ = models
    jobs = sim_images.start_tiny_models()
    assert [job.name for job in jobs] == ["tiny-qwen3-moe", "tiny-qwen3"]
    assert all(job.inputs == "abc" for job in jobs)
    # Both are started before either is waited for.
    assert seen == [sim_images.tiny_model_command(p, name=n) for n, p in folders.items()]
    for path in folders.values():
        path.mkdir(parents=True)
    sim_images.finish_tiny_models(jobs)
    assert all((p / ".inputs").read_text() == "abc" for p in folders.values())


def test_a_model_whose_stamp_matches_is_not_made_again(sim_images, models):
    folders, seen, _ = models
    moe = folders["tiny-qwen3-moe"]
    moe.mkdir(parents=True)
    (moe / ".inputs").write_text("abc")
    (moe / "config.json").write_text("{}")
    jobs = sim_images.start_tiny_models()
    assert [job.name for job in jobs] == ["tiny-qwen3"]
    assert seen == [sim_images.tiny_model_command(folders["tiny-qwen3"], name="tiny-qwen3")]
    assert (moe / "config.json").exists()


def test_a_failed_model_is_not_stamped_and_fails_sim_up_after_the_other_ends(sim_images, models):
    folders, _, codes = models
    codes["tiny-qwen3-moe"] = 1
    jobs = sim_images.start_tiny_models()
    for path in folders.values():
        path.mkdir(parents=True)
    with pytest.raises(sim_images.SimError, match="making tiny-qwen3-moe failed"):
        sim_images.finish_tiny_models(jobs)
    assert not (folders["tiny-qwen3-moe"] / ".inputs").exists()
    assert (folders["tiny-qwen3"] / ".inputs").read_text() == "abc"
